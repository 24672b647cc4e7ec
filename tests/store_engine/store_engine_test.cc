// Store-mode integration suite: engines in separate processes (store_peer) find each other by
// name through a real etcd, redis or mooncake_http_metadata_server on 127.0.0.1, and move data
// with every byte verified. Each test runs against each store (the parameter) with a server of
// its own. Every engine process runs with MC_TCP_BIND_ADDRESS=127.0.0.1.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "harness.h"
#include "store_server.h"

namespace mooncake::store_engine {
namespace {

using ::mooncake::testing::StoreServer;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1 << 20;

std::string Words(std::initializer_list<std::string> w) {
  std::string s;
  for (const auto& x : w) s += (s.empty() ? "" : " ") + x;
  return s;
}

std::string N(uint64_t v) { return std::to_string(v); }

// "OK <id> <transport> <buffers> <addr0> <len0>" from OPEN.
struct Opened {
  bool ok = false;
  std::string transport;
  uint64_t buffers = 0, addr = 0, length = 0;
};
Opened ParseOpened(const std::string& line) {
  Opened o;
  std::istringstream in(line);
  std::string word, id;
  in >> word >> id >> o.transport >> o.buffers >> o.addr >> o.length;
  o.ok = word == "OK";
  return o;
}

// Writes and reads `len` bytes at `off` between `from` and the segment `to`, both ways, every
// byte checked on the side that holds it.
void RoundTrip(Peer& from, Peer& to, const std::string& to_name, uint64_t off, uint64_t len,
               int seed) {
  EXPECT_EQ(from.proc->Command(Words({"PUT", to_name, N(off), N(len), N(seed)})), "OK");
  EXPECT_EQ(to.proc->Command(Words({"CHECK", N(off), N(len), N(seed)})), "OK");
  EXPECT_EQ(to.proc->Command(Words({"FILL", N(off), N(len), N(seed + 1)})), "OK");
  EXPECT_EQ(from.proc->Command(Words({"GET", to_name, N(off), N(len), N(seed + 1)})), "OK");
}

class StoreEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string error;
    server_ = StoreServer::Start(GetParam(), "", &error);
    if (!server_) {
      if (::mooncake::testing::StoreServersRequired()) {
        FAIL() << "cannot start " << GetParam() << " server: " << error;
      }
      GTEST_SKIP() << "cannot start " << GetParam() << " server: " << error;
    }
    conn_ = server_->ConnString();
  }

  // An engine named `name`; fails the test (and returns a peer whose ready.ok is false) when
  // it does not come up.
  Peer Start(const std::string& name, const std::map<std::string, std::string>& extra_env = {},
             const std::vector<std::string>& args = {"--transport", "tcp"}) {
    Peer p = StartPeer(MC_STORE_PEER_PATH, conn_, name, EngineEnv(extra_env),
                       dir_.path() + "/" + name + "." + N(++started_) + ".err", args);
    EXPECT_TRUE(p.ready.ok) << name << " did not start: " << p.ready.line << "\n"
                            << (p.proc ? p.proc->Stderr() : "");
    return p;
  }

  // QUIT: a clean shutdown; expects BYE and exit 0 within `bound_s`.
  void Quit(Peer& p, double bound_s = 10) {
    auto t0 = Clock::now();
    EXPECT_EQ(p.proc->Command("QUIT", bound_s), "BYE") << p.proc->Stderr();
    EXPECT_EQ(p.proc->Wait(bound_s), 0);
    EXPECT_LT(Since(t0), bound_s);
  }

  std::unique_ptr<StoreServer> server_;
  std::string conn_;
  TempDir dir_;
  int started_ = 0;
};

// Two engines named like a prefill and a decode instance find each other by name, in both
// directions, and move data (aligned and unaligned ranges); their keys are upstream's.
TEST_P(StoreEngineTest, TwoEnginesFindEachOtherByName) {
  Peer a = Start("prefill-0");
  Peer b = Start("decode-3");
  ASSERT_TRUE(a.ready.ok && b.ready.ok);
  EXPECT_EQ(a.ready.name, "prefill-0");
  EXPECT_EQ(b.ready.rpc_address, "127.0.0.1:" + N(b.ready.rpc_port));

  Opened o = ParseOpened(a.proc->Command("OPEN decode-3"));
  ASSERT_TRUE(o.ok);
  EXPECT_EQ(o.transport, "tcp");
  EXPECT_EQ(o.addr, b.ready.addr);
  EXPECT_EQ(o.length, b.ready.size);
  RoundTrip(a, b, "decode-3", 0, 4 * kMiB, 21);
  RoundTrip(a, b, "decode-3", 4097, kMiB + 3, 40);  // unaligned
  ASSERT_TRUE(ParseOpened(b.proc->Command("OPEN prefill-0")).ok);
  RoundTrip(b, a, "prefill-0", 0, 4 * kMiB, 60);
  // Our own name is the local segment (no store round trip).
  EXPECT_EQ(a.proc->Command("OPEN prefill-0").rfind("OK 0 ", 0), 0u);

  // Nothing here talks to anything but 127.0.0.1.
  for (Peer* p : {&a, &b}) {
    for (const TcpSocket& s : TcpSocketsOf(p->proc->pid())) {
      if (s.state != "ESTABLISHED") continue;
      EXPECT_EQ(s.remote.rfind("127.0.0.1:", 0), 0u) << "connection to " << s.remote;
    }
  }
  StoreReader store(conn_);
  ASSERT_TRUE(store.ok()) << store.error();
  auto rpc = store.GetJson("mooncake/rpc_meta/prefill-0");
  ASSERT_TRUE(rpc.ok()) << rpc.status().ToString();
  EXPECT_EQ((*rpc)["ip_or_host_name"], "127.0.0.1");
  EXPECT_EQ((*rpc)["rpc_port"], a.ready.rpc_port);
  EXPECT_TRUE(store.Get("mooncake/ram/prefill-0").ok());
  Quit(a);
  Quit(b);
}

// With auto transport choice, two engines of one host still find each other by name through
// the store, and the same-host transport moves the bytes.
TEST_P(StoreEngineTest, AutoTransportByName) {
  Peer a = Start("prefill-1", {}, {"--transport", "auto"});
  Peer b = Start("decode-1", {}, {"--transport", "auto"});
  ASSERT_TRUE(a.ready.ok && b.ready.ok);
  Opened o = ParseOpened(a.proc->Command("OPEN decode-1"));
  ASSERT_TRUE(o.ok);
  std::cout << "[ info ] transport chosen between two engines of this host: " << o.transport
            << "\n";
  const char* no_shm = std::getenv("MC_DISABLE_SHM");
  const char* tcp_only = std::getenv("MC_FORCE_TCP");
  EXPECT_EQ(o.transport, (no_shm && *no_shm) || (tcp_only && *tcp_only) ? "tcp" : "shm");
  RoundTrip(a, b, "decode-1", 0, 4 * kMiB, 80);
  RoundTrip(a, b, "decode-1", 1, 3 * kMiB - 7, 90);
  Quit(a);
  Quit(b);
}

// Keys under upstream's names with MC_METADATA_CLUSTER_ID: mooncake/<id>/ram/<name> and
// mooncake/<id>/rpc_meta/<name>; republished on register and unregister (and the initiator
// follows); another cluster id does not see them; a clean shutdown removes them.
TEST_P(StoreEngineTest, KeysUnderUpstreamNamesFollowRegistrations) {
  const std::string cluster = "mc-it-" + N(::getpid());
  const std::string prefix = "mooncake/" + cluster + "/";
  Peer a = Start("prefill-0", {{"MC_METADATA_CLUSTER_ID", cluster}});
  Peer b = Start("decode-3", {{"MC_METADATA_CLUSTER_ID", cluster}});
  ASSERT_TRUE(a.ready.ok && b.ready.ok);
  StoreReader store(conn_);
  ASSERT_TRUE(store.ok()) << store.error();

  auto rpc = store.GetJson(prefix + "rpc_meta/decode-3");
  ASSERT_TRUE(rpc.ok()) << rpc.status().ToString();
  EXPECT_EQ(*rpc, (nlohmann::json{{"ip_or_host_name", "127.0.0.1"},
                                  {"rpc_port", b.ready.rpc_port}}));
  auto desc = store.GetJson(prefix + "ram/decode-3");
  ASSERT_TRUE(desc.ok()) << desc.status().ToString();
  EXPECT_EQ((*desc)["name"], "decode-3");
  EXPECT_EQ((*desc)["protocol"], "tcp");
  EXPECT_EQ((*desc)["tcp_data_host"], "127.0.0.1");
  EXPECT_GT((*desc)["tcp_data_port"].get<int>(), 0);
  ASSERT_EQ((*desc)["buffers"].size(), 1u) << desc->dump();
  EXPECT_EQ((*desc)["buffers"][0]["addr"], b.ready.addr);
  EXPECT_EQ((*desc)["buffers"][0]["length"], b.ready.size);
  EXPECT_EQ((*desc)["buffers"][0]["name"], "decode-3");
  // Only under the cluster's prefix.
  EXPECT_TRUE(store.Get("mooncake/ram/decode-3").status().IsNotFound());
  EXPECT_TRUE(store.Get("mooncake/rpc_meta/decode-3").status().IsNotFound());
  Peer other = Start("prefill-9");  // no cluster id
  ASSERT_TRUE(other.ready.ok);
  std::string miss = other.proc->Command("OPEN decode-3");
  EXPECT_EQ(miss.rfind("ERR NotFound", 0), 0u) << miss;

  ASSERT_TRUE(ParseOpened(a.proc->Command("OPEN decode-3")).ok);
  RoundTrip(a, b, "decode-3", 0, kMiB, 3);

  // A second buffer: published at once, and the initiator's cached descriptor follows (the
  // submit refreshes it from the store when a range is unknown).
  std::string reg = b.proc->Command("REG2 1048576");
  ASSERT_EQ(reg.rfind("OK ", 0), 0u) << reg;
  const uint64_t addr2 = std::stoull(reg.substr(3));
  desc = store.GetJson(prefix + "ram/decode-3");
  ASSERT_TRUE(desc.ok());
  ASSERT_EQ((*desc)["buffers"].size(), 2u) << desc->dump();
  EXPECT_EQ((*desc)["buffers"][1]["addr"], addr2);
  EXPECT_EQ(a.proc->Command(Words({"PUTAT", "decode-3", N(addr2), N(kMiB), "61"})), "OK");
  EXPECT_EQ(b.proc->Command(Words({"CHECK2", "0", N(kMiB), "61"})), "OK");
  EXPECT_EQ(b.proc->Command("UNREG2"), "OK");
  desc = store.GetJson(prefix + "ram/decode-3");
  ASSERT_TRUE(desc.ok());
  EXPECT_EQ((*desc)["buffers"].size(), 1u) << desc->dump();
  std::string refused = a.proc->Command(Words({"PUTAT", "decode-3", N(addr2), N(kMiB), "62"}));
  EXPECT_EQ(refused.rfind("ERR", 0), 0u) << refused;

  // A clean shutdown removes both keys, at once.
  Quit(b);
  EXPECT_TRUE(store.Get(prefix + "rpc_meta/decode-3").status().IsNotFound());
  EXPECT_TRUE(store.Get(prefix + "ram/decode-3").status().IsNotFound());
  EXPECT_TRUE(store.Get(prefix + "ram/prefill-0").ok());
  Quit(a);
  EXPECT_TRUE(store.Get(prefix + "rpc_meta/prefill-0").status().IsNotFound());
  EXPECT_TRUE(store.Get(prefix + "ram/prefill-0").status().IsNotFound());
  Quit(other);
}

// A target restarts under the same name on a new port, `cycles` times (disjoint port ranges
// make each port new for sure); the initiator, still running, finds each incarnation again.
// Prints what the initiator's first transfer after each restart does; when it fails, an
// immediate retry (RETRYPUT, as an application would) must succeed. Returns the initiator's
// thread count after the first transfer and after the last cycle in *threads.
void RestartCycles(const std::string& conn, const std::string& dir, const std::string& label,
                   bool crash, int cycles, std::pair<int, int>* threads) {
  const std::string log_dir = dir + "/" + (crash ? "crash" : "clean");
  Shell("mkdir -p '" + log_dir + "'");
  auto start = [&](const std::string& name, int incarnation,
                   std::map<std::string, std::string> env) {
    Peer p = StartPeer(MC_STORE_PEER_PATH, conn, name, EngineEnv(env),
                       log_dir + "/" + name + "." + N(incarnation) + ".err",
                       {"--transport", "tcp"});
    return p;
  };
  const int base = 15000 + static_cast<int>(::getpid() % 4) * 400;
  auto range = [base](int incarnation) {
    int lo = base + 100 * (incarnation % 4);
    return std::map<std::string, std::string>{{"MC_MIN_RPC_PORT", N(lo)},
                                              {"MC_MAX_RPC_PORT", N(lo + 99)}};
  };
  Peer a = start("prefill-0", 0, {});
  ASSERT_TRUE(a.ready.ok) << a.ready.line;
  Peer b = start("decode-3", 0, range(0));
  ASSERT_TRUE(b.ready.ok) << b.ready.line;
  ASSERT_TRUE(ParseOpened(a.proc->Command("OPEN decode-3")).ok);
  RoundTrip(a, b, "decode-3", 0, kMiB, 11);
  threads->first = ThreadCount(a.proc->pid());
  StoreReader store(conn);
  ASSERT_TRUE(store.ok()) << store.error();

  for (int cycle = 1; cycle <= cycles; ++cycle) {
    if (crash) {
      b.proc->Kill();
    } else {
      EXPECT_EQ(b.proc->Command("QUIT"), "BYE");
      EXPECT_EQ(b.proc->Wait(10), 0);
    }
    const bool stale = store.Get("mooncake/rpc_meta/decode-3").ok();
    Peer b2 = start("decode-3", cycle, range(cycle));
    ASSERT_TRUE(b2.ready.ok)
        << "the restarted engine (same name, new port) did not start; its rpc_meta key was "
        << (stale ? "still in the store" : "gone") << ": " << b2.ready.line;
    const int lo = base + 100 * (cycle % 4);
    EXPECT_NE(b2.ready.rpc_port, b.ready.rpc_port);
    EXPECT_GE(b2.ready.rpc_port, lo);
    EXPECT_LE(b2.ready.rpc_port, lo + 99);
    auto rpc = store.GetJson("mooncake/rpc_meta/decode-3");
    ASSERT_TRUE(rpc.ok()) << rpc.status().ToString();
    EXPECT_EQ((*rpc)["rpc_port"], b2.ready.rpc_port);
    auto desc = store.GetJson("mooncake/ram/decode-3");
    ASSERT_TRUE(desc.ok()) << desc.status().ToString();
    EXPECT_GE((*desc)["tcp_data_port"].get<int>(), lo);
    EXPECT_EQ((*desc)["buffers"][0]["addr"], b2.ready.addr);

    auto t0 = Clock::now();
    // One request, so one slice on one stream: the failure and the retry are as close as an
    // application can make them.
    std::string r = a.proc->Command(Words({"RETRYPUT", "decode-3", "0", "65536", N(cycle)}));
    const double secs = Since(t0);
    std::cout << "[ info ] " << label << ", restart " << cycle << " after a "
              << (crash ? "crash" : "clean shutdown")
              << (stale ? " (stale keys left)" : " (keys removed)")
              << ": first transfer, retry, first reply: " << r << " (" << secs << " s)\n";
    ::testing::Test::RecordProperty("restart_" + N(cycle), r);
    EXPECT_LT(secs, 5) << "a stale peer must fail fast";
    const bool first_ok = r.rfind("OK ", 0) == 0;
    if (!first_ok) {
      EXPECT_EQ(r.rfind("ERR OK ", 0), 0u)
          << "GAP: the immediate retry after the failed first transfer must reach the new "
             "incarnation, but it used the stale descriptor again: the TCP stream fails the "
             "requests (FailAll) before it drops the cached descriptor (on_failure_): " << r;
    }
    if (r.rfind("ERR OK ", 0) != 0 && !first_ok) {
      EXPECT_EQ(a.proc->Command(Words({"PUT", "decode-3", "0", "65536", N(cycle)})), "OK");
    }
    EXPECT_EQ(b2.proc->Command(Words({"CHECK", "0", "65536", N(cycle)})), "OK");
    RoundTrip(a, b2, "decode-3", 0, 2 * kMiB, 13 + cycle);
    b = std::move(b2);
  }
  threads->second = ThreadCount(a.proc->pid());
  EXPECT_EQ(b.proc->Command("QUIT"), "BYE");
  EXPECT_EQ(a.proc->Command("QUIT"), "BYE");
  EXPECT_EQ(b.proc->Wait(10), 0);
  EXPECT_EQ(a.proc->Wait(10), 0);
}

TEST_P(StoreEngineTest, PeerRestartedAfterCrashWithNewPortIsFoundAgain) {
  std::pair<int, int> threads;
  RestartCycles(conn_, dir_.path(), GetParam(), /*crash=*/true, 3, &threads);
}

TEST_P(StoreEngineTest, PeerRestartedCleanlyWithNewPortIsFoundAgain) {
  std::pair<int, int> threads;
  RestartCycles(conn_, dir_.path(), GetParam(), /*crash=*/false, 3, &threads);
}

// The store dies while two engines that know each other run: their transfers keep working,
// registrations still succeed, an unknown peer fails fast naming the store, the loss is
// logged once per engine (not once per registration or keep-alive), and both still shut down
// in bounded time.
TEST_P(StoreEngineTest, StoreLostWhileRunning) {
  const std::map<std::string, std::string> env = {{kLeaseTtlEnv, "2"}};
  Peer a = Start("prefill-0", env);
  Peer b = Start("decode-3", env);
  ASSERT_TRUE(a.ready.ok && b.ready.ok);
  ASSERT_TRUE(ParseOpened(a.proc->Command("OPEN decode-3")).ok);
  ASSERT_TRUE(ParseOpened(b.proc->Command("OPEN prefill-0")).ok);
  RoundTrip(a, b, "decode-3", 0, kMiB, 1);
  const size_t a_mark = a.proc->Stderr().size(), b_mark = b.proc->Stderr().size();

  server_->Kill();
  for (int round = 0; round < 3; ++round) {
    RoundTrip(a, b, "decode-3", round * 4096, kMiB, 20 + 2 * round);
    RoundTrip(b, a, "prefill-0", round * 4096, kMiB, 40 + 2 * round);
    for (Peer* p : {&a, &b}) {
      EXPECT_EQ(p->proc->Command("REG2 65536").rfind("OK ", 0), 0u);
      EXPECT_EQ(p->proc->Command("UNREG2"), "OK");
    }
  }
  auto t0 = Clock::now();
  std::string unknown = a.proc->Command("OPEN nobody-7");
  EXPECT_LT(Since(t0), 5);
  EXPECT_EQ(unknown.rfind("ERR", 0), 0u) << unknown;
  EXPECT_NE(unknown.find("127.0.0.1:" + N(server_->port())), std::string::npos)
      << "the error should name the store: " << unknown;
  // Long enough for several etcd keep-alive rounds once the lease TTL can be set short.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  RoundTrip(a, b, "decode-3", 0, 2 * kMiB, 70);

  const std::string store_addr = "127.0.0.1:" + N(server_->port());
  struct Side {
    Peer* peer;
    size_t mark;
    const char* who;
  };
  for (const Side& side : {Side{&a, a_mark, "prefill-0"}, Side{&b, b_mark, "decode-3"}}) {
    const char* who = side.who;
    const std::string log = side.peer->proc->Stderr().substr(side.mark);
    const int lost = CountLines(log, "metadata store " + conn_ + " unreachable");
    const int keepalive = CountLines(log, "keep-alive failed");
    const int mentions = CountLines(log, store_addr);
    std::cout << "[ info ] " << who << " after the store died: " << mentions
              << " log lines name the store (" << lost << " 'unreachable', " << keepalive
              << " keep-alive)\n";
    EXPECT_EQ(lost, 1) << who << "'s log:\n" << log;
    EXPECT_LE(keepalive, 1) << log;
    EXPECT_LE(mentions, 3) << "the loss is logged in a loop:\n" << log;
  }
  Quit(a, 10);
  Quit(b, 10);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreEngineTest, ::testing::Values("etcd", "redis", "http"),
                         [](const auto& info) { return info.param; });

// A SIGKILLed engine cannot remove its keys: under etcd they expire with its lease.
TEST(StoreEngineEtcd, SigkilledEngineKeysExpireWithTheLease) {
  std::string error;
  auto server = StoreServer::Start("etcd", "", &error);
  if (!server) {
    if (::mooncake::testing::StoreServersRequired()) FAIL() << error;
    GTEST_SKIP() << "cannot start etcd: " << error;
  }
  TempDir dir;
  const int ttl = 2;
  Peer b = StartPeer(MC_STORE_PEER_PATH, server->ConnString(), "decode-3",
                     EngineEnv({{kLeaseTtlEnv, N(ttl)}}), dir.path() + "/b.err",
                     {"--transport", "tcp"});
  ASSERT_TRUE(b.ready.ok) << b.ready.line;
  StoreReader store(server->ConnString());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(store.Get("mooncake/ram/decode-3").ok());
  b.proc->Kill();
  auto t0 = Clock::now();
  // Still there: the process could not remove them; only the lease does.
  EXPECT_TRUE(store.Get("mooncake/rpc_meta/decode-3").ok());
  double gone_after = -1;
  while (Since(t0) < 15) {
    if (store.Get("mooncake/ram/decode-3").status().IsNotFound() &&
        store.Get("mooncake/rpc_meta/decode-3").status().IsNotFound()) {
      gone_after = Since(t0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::cout << "[ info ] the killed engine's keys expired after " << gone_after << " s\n";
  ASSERT_GE(gone_after, 0) << "the killed engine's keys never expired";
  EXPECT_LE(gone_after, 10 + 3) << "not within the default lease TTL (10 s)";
  EXPECT_LE(gone_after, ttl + 2.5)
      << "GAP: " << kLeaseTtlEnv << "=" << ttl
      << " is not honoured: the engine's etcd lease TTL is fixed at StoreOptions.lease_ttl_s "
         "(10 s); StoreOptionsFromEnvironment (src/metadata/stores/store_env.cc) reads no "
         "variable for it";
}

// A store that cannot be reached at start: Init fails fast (refused) or within the store
// client's timeouts (a server that accepts and never answers), with a message naming the
// store, and the process exits non-zero. All six cases run at once.
TEST(StoreEngineInit, UnreachableStoreFailsInitNamingTheStore) {
  TempDir dir;
  const uint16_t refused = ::mooncake::testing::RefusingPort();
  // A listener that never accepts: connections complete in the backlog, requests get no reply.
  int silent_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(silent_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(silent_fd, 16), 0);
  ASSERT_EQ(::getsockname(silent_fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const uint16_t silent = ntohs(addr.sin_port);

  struct Case {
    std::string kind, conn, where;
    double bound_s;
    std::unique_ptr<Proc> proc;
    Clock::time_point start;
  };
  std::vector<Case> cases;
  for (const std::string kind : {"etcd", "redis", "http"}) {
    for (uint16_t port : {refused, silent}) {
      std::string hp = "127.0.0.1:" + N(port);
      std::string conn = kind == "http" ? "http://" + hp + "/metadata" : kind + "://" + hp;
      // Refused: at once. Silent: the store client's request timeout (3 s) and no retry loop.
      cases.push_back({kind, conn, kind + " " + hp, port == refused ? 1.0 : 5.0, nullptr, {}});
    }
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    Case& c = cases[i];
    std::string error;
    c.start = Clock::now();
    c.proc = Proc::Start({MC_STORE_PEER_PATH, "serve", "--metadata", c.conn, "--name",
                          "prefill-0", "--transport", "tcp"},
                         EngineEnv(), dir.path() + "/" + N(i) + ".err", &error);
    ASSERT_TRUE(c.proc) << error;
  }
  const auto all = Clock::now();
  for (Case& c : cases) {
    std::string line = c.proc->ReadLine(15);
    int rc = c.proc->Wait(5);
    // store_peer appends how long Init took: "(after <s> s)".
    double secs = 1e9;
    size_t at = line.rfind("(after ");
    if (at != std::string::npos) secs = std::atof(line.c_str() + at + 7);
    std::cout << "[ info ] " << c.conn << ": " << line << " (exit " << rc << ")\n";
    EXPECT_EQ(line.rfind("FAIL ", 0), 0u) << c.conn << ": " << line;
    EXPECT_NE(line.find(c.where), std::string::npos) << "should name " << c.where << ": " << line;
    EXPECT_NE(line.find("metadata store '" + c.conn + "'"), std::string::npos) << line;
    EXPECT_NE(rc, 0);
    EXPECT_LT(secs, c.bound_s) << c.conn << ": Init took too long";
  }
  EXPECT_LT(Since(all), 10);
  ::close(silent_fd);
}

// MC_TCP_BIND_ADDRESS=127.0.0.1 is meant to keep the engine off every other address: its
// listeners (handshake/RPC and TCP data) should then bind 127.0.0.1, not the wildcard.
TEST(StoreEngineBind, ListenersBindOnlyTheBindAddress) {
  std::string error;
  auto server = StoreServer::Start("http", "", &error);
  if (!server) {
    if (::mooncake::testing::StoreServersRequired()) FAIL() << error;
    GTEST_SKIP() << "cannot start the http metadata server: " << error;
  }
  TempDir dir;
  Peer b = StartPeer(MC_STORE_PEER_PATH, server->ConnString(), "decode-3", EngineEnv(),
                     dir.path() + "/b.err", {"--transport", "tcp"});
  ASSERT_TRUE(b.ready.ok) << b.ready.line;
  int listeners = 0;
  for (const TcpSocket& s : TcpSocketsOf(b.proc->pid())) {
    if (s.state != "LISTEN") continue;
    ++listeners;
    EXPECT_EQ(s.local.rfind("127.0.0.1:", 0), 0u)
        << "GAP: listener on " << s.local
        << " although MC_TCP_BIND_ADDRESS=127.0.0.1 (the variable only sets the published "
           "address; ListenTcpInRange is called without a bind address)";
  }
  EXPECT_EQ(listeners, 2) << "expected the RPC listener and the TCP data listener";
  b.proc->Kill();
}

// Each restart of a peer must not leave the initiator with the dead incarnation's TCP
// streams (a thread each) forever: four restarts, and the initiator's thread count must not
// grow with them. (Store-independent; run against redis.)
TEST(StoreEngineRestart, RestartedPeersLeaveNoThreadsBehind) {
  std::string error;
  auto server = StoreServer::Start("redis", "", &error);
  if (!server) {
    if (::mooncake::testing::StoreServersRequired()) FAIL() << error;
    GTEST_SKIP() << "cannot start redis: " << error;
  }
  TempDir dir;
  std::pair<int, int> threads{-1, -1};
  RestartCycles(server->ConnString(), dir.path(), "redis", /*crash=*/true, 4, &threads);
  std::cout << "[ info ] initiator threads: " << threads.first << " after the first transfer, "
            << threads.second << " after 4 restarts of its peer\n";
  ASSERT_GT(threads.first, 0);
  EXPECT_LE(threads.second, threads.first + 2)
      << "GAP: the dead incarnations' TCP streams are never dropped: the failed connection "
         "only invalidates the cached descriptor (SegmentCache::InvalidateByName), so the "
         "refetch finds no old descriptor to compare and Transport::DropPeer is never called";
}

}  // namespace
}  // namespace mooncake::store_engine
