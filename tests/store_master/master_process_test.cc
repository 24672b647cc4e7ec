// Smoke test of the real mooncake_master binary (MC_MASTER_PATH) with the client library:
// start on free ports, put / get through staging and zero copy, /metrics over HTTP, a client
// in a forked child killed with SIGKILL loses its segment after --client_ttl, a port in use
// is refused with a clear message, SIGTERM stops the master with exit status 0; upsert,
// ranged reads, get sessions and batch_replica_clear through the client library.
//
// The child role runs in this same binary: the forked child execs /proc/self/exe with
// --store-child (no gRPC state is inherited across the fork that way).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "master_process.h"
#include "mooncake/store/store_client.h"
#include "mooncake/store/error_code.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_master;  // NOLINT
using std::chrono::milliseconds;
using std::chrono::seconds;

StoreClientOptions ClientOptions(int rpc_port, uint64_t segment = 16 * MiB) {
  StoreClientOptions o;
  o.master_server_addr = "127.0.0.1:" + std::to_string(rpc_port);
  o.local_hostname = "127.0.0.1";
  o.global_segment_size = segment;
  o.local_buffer_size = 4 * MiB;
  o.heartbeat_interval = milliseconds(200);  // well inside --client_ttl=2 even when loaded
  return o;
}

std::vector<char> Pattern(size_t n, uint64_t seed) {
  std::vector<char> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<char>(x);
  }
  return v;
}

class MasterProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rpc_port_ = FreePort();
    metrics_port_ = FreePort();
    ASSERT_GT(rpc_port_, 0);
    ASSERT_GT(metrics_port_, 0);
    master_ = std::make_unique<MasterProcess>(std::vector<std::string>{
        "--rpc_address=127.0.0.1", "--rpc_port=" + std::to_string(rpc_port_),
        "--metrics_port=" + std::to_string(metrics_port_), "--client_ttl=2"});
    ASSERT_TRUE(master_->WaitReady(seconds(20))) << "master did not start:\n" << master_->Log();
  }
  void TearDown() override {
    if (master_) {
      ::kill(master_->pid(), SIGTERM);
      master_->WaitExit(seconds(10));
    }
  }
  std::unique_ptr<StoreClient> Client(uint64_t segment = 16 * MiB) {
    int code = 0;
    std::string msg;
    auto c = StoreClient::Create(ClientOptions(rpc_port_, segment), &code, &msg);
    EXPECT_NE(c, nullptr) << code << ": " << msg;
    return c;
  }
  std::string Metrics() { return HttpGet(metrics_port_, "/metrics"); }

  int rpc_port_ = -1;
  int metrics_port_ = -1;
  std::unique_ptr<MasterProcess> master_;
};

TEST_F(MasterProcessTest, PutGetThroughStagingAndZeroCopy) {
  auto a = Client();
  // 64 MiB + 1 does not fit a 16 MiB segment: a second client contributes a larger one.
  auto big = Client(96 * MiB);
  ASSERT_TRUE(a && big);
  EXPECT_EQ(a->HealthCheck(), 0);
  ReplicateConfig on_big;
  on_big.preferred_segments = {big->segment_name()};
  ReplicateConfig on_a;
  on_a.preferred_segments = {a->segment_name()};
  uint64_t seed = 1;
  for (size_t size : {size_t{1}, size_t{MiB}, size_t{64 * MiB + 1}}) {
    for (const auto* cfg : {&on_big, &on_a}) {
      if (size > 16 * MiB && cfg == &on_a) continue;
      const std::string key =
          "obj-" + std::to_string(size) + (cfg == &on_big ? "-remote" : "-local");
      SCOPED_TRACE(key);
      // Plain, unregistered memory: moved through the 4 MiB staging buffer.
      std::vector<char> in = Pattern(size, seed++);
      ASSERT_EQ(a->Put(key, {{in.data(), in.size()}}, *cfg), 0);
      EXPECT_EQ(a->GetSize(key), static_cast<int64_t>(size));
      std::vector<char> out(size + 7, 0);
      ASSERT_EQ(a->Get(key, {{out.data(), out.size()}}), static_cast<int64_t>(size));
      out.resize(size);
      EXPECT_TRUE(in == out) << "data differ";
      // The other client reads it too.
      std::vector<char> out2(size, 0);
      ASSERT_EQ(big->Get(key, {{out2.data(), out2.size()}}), static_cast<int64_t>(size));
      EXPECT_TRUE(in == out2) << "data differ (read by the other client)";
      // A buffer too small is refused.
      if (size > 1) {
        std::vector<char> small(size - 1);
        EXPECT_EQ(a->Get(key, {{small.data(), small.size()}}), ToInt(ErrorCode::INVALID_PARAMS));
      }
    }
  }
  // Registered memory: no staging.
  const size_t n = 3 * MiB + 5;
  std::vector<char> src = Pattern(n, 99), dst(n, 0);
  ASSERT_EQ(a->RegisterBuffer(src.data(), src.size()), 0);
  ASSERT_EQ(a->RegisterBuffer(dst.data(), dst.size()), 0);
  ASSERT_EQ(a->Put("zero-copy", {{src.data(), src.size()}}, on_big), 0);
  ASSERT_EQ(a->Get("zero-copy", {{dst.data(), dst.size()}}), static_cast<int64_t>(n));
  EXPECT_TRUE(src == dst);
  EXPECT_EQ(a->UnregisterBuffer(src.data()), 0);
  EXPECT_EQ(a->UnregisterBuffer(dst.data()), 0);
  EXPECT_EQ(a->UnregisterBuffer(dst.data()), ToInt(ErrorCode::INVALID_PARAMS));

  // Put of an existing key does not overwrite; a missing key is OBJECT_NOT_FOUND.
  std::vector<char> other = Pattern(1, 1234);
  EXPECT_EQ(a->Put("obj-1-remote", {{other.data(), 1}}, on_big),
            ToInt(ErrorCode::OBJECT_ALREADY_EXISTS));
  char byte = 0;
  EXPECT_EQ(a->Get("missing", {{&byte, 1}}), ToInt(ErrorCode::OBJECT_NOT_FOUND));

  // /metrics counts the objects: 5 puts plus zero-copy.
  const std::string metrics = Metrics();
  ASSERT_NE(metrics.find("200 OK"), std::string::npos) << metrics;
  auto keys = MetricValue(metrics, "master_key_count");
  ASSERT_TRUE(keys.has_value()) << metrics;
  EXPECT_EQ(*keys, 6u);
  EXPECT_EQ(MetricValue(metrics, "master_mounted_segments"), std::optional<uint64_t>(2));
  EXPECT_EQ(MetricValue(metrics, "master_active_clients"), std::optional<uint64_t>(2));
  EXPECT_EQ(MetricValue(metrics, "master_total_capacity_bytes"),
            std::optional<uint64_t>(112 * MiB));

  EXPECT_EQ(a->RemoveAll(true), 6);
  EXPECT_EQ(big->Close(), 0);
  EXPECT_EQ(a->Close(), 0);
  EXPECT_EQ(MetricValue(Metrics(), "master_mounted_segments"), std::optional<uint64_t>(0));
}

// The child role: a client that puts `n` keys into its own segment, says READY, and waits.
int ChildMain(int rpc_port, int n) {
  int code = 0;
  std::string msg;
  auto c = StoreClient::Create(ClientOptions(rpc_port), &code, &msg);
  if (!c) {
    std::fprintf(stderr, "child: Create failed: %d %s\n", code, msg.c_str());
    return 2;
  }
  ReplicateConfig own;
  own.preferred_segments = {c->segment_name()};
  for (int i = 0; i < n; ++i) {
    std::vector<char> v = Pattern(1000 + i, static_cast<uint64_t>(i));
    int rc = c->Put("child-" + std::to_string(i), {{v.data(), v.size()}}, own);
    if (rc != 0) {
      std::fprintf(stderr, "child: put failed: %d\n", rc);
      return 3;
    }
  }
  std::printf("READY %s\n", c->segment_name().c_str());
  std::fflush(stdout);
  while (true) ::pause();  // until SIGKILL
}

TEST_F(MasterProcessTest, UpsertRangesSessionsAndReplicaClear) {
  auto a = Client();
  auto b = Client();
  ASSERT_TRUE(a && b);
  ReplicateConfig on_b;
  on_b.preferred_segments = {b->segment_name()};
  std::vector<char> v1 = Pattern(MiB, 1), v2 = Pattern(2 * MiB + 3, 2);
  ASSERT_EQ(a->Upsert("u", {{v1.data(), v1.size()}}, on_b), 0);  // new key: a put
  ASSERT_EQ(a->Upsert("u", {{v2.data(), v2.size()}}, on_b), 0);  // replaced, another size
  std::vector<char> out(v2.size());
  ASSERT_EQ(b->Get("u", {{out.data(), out.size()}}), static_cast<int64_t>(v2.size()));
  EXPECT_TRUE(out == v2);
  EXPECT_EQ(a->Put("u", {{v1.data(), v1.size()}}, on_b), ToInt(ErrorCode::OBJECT_ALREADY_EXISTS));

  // Ranges into unregistered memory (staged), one of them past the end.
  std::vector<char> r(300, 0);
  auto got = a->GetRanges({"u", "missing"}, {{0, 10, {r.data(), 100}},
                                             {0, v2.size() - 200, {r.data() + 100, 200}},
                                             {1, 0, {r.data(), 1}},
                                             {0, v2.size(), {r.data(), 1}}});
  EXPECT_EQ(got, (std::vector<int64_t>{100, 200, ToInt(ErrorCode::OBJECT_NOT_FOUND),
                                       ToInt(ErrorCode::INVALID_PARAMS)}));
  EXPECT_TRUE(std::equal(v2.begin() + 10, v2.begin() + 110, r.begin()));
  EXPECT_TRUE(std::equal(v2.end() - 200, v2.end(), r.begin() + 100));

  // A get session: one lookup, then ranges with no master round trip.
  EXPECT_EQ(a->GetSessionStart({"u", "missing"}),
            (std::vector<int>{0, ToInt(ErrorCode::OBJECT_NOT_FOUND)}));
  std::vector<char> sbuf(64, 0);
  EXPECT_EQ(a->GetSessionRanges({"u"}, {{0, 5, {sbuf.data(), 32}}, {0, MiB, {sbuf.data() + 32, 32}}}),
            std::vector<int64_t>{64});
  EXPECT_TRUE(std::equal(v2.begin() + 5, v2.begin() + 37, sbuf.begin()));
  EXPECT_TRUE(std::equal(v2.begin() + MiB, v2.begin() + MiB + 32, sbuf.begin() + 32));
  EXPECT_EQ(a->Remove("u"), ToInt(ErrorCode::OBJECT_HAS_LEASE));  // the session's lease
  EXPECT_EQ(a->GetSessionEnd({"u"}), 0);
  EXPECT_EQ(a->GetSessionRanges({"u"}, {{0, 0, {sbuf.data(), 1}}}),
            std::vector<int64_t>{ToInt(ErrorCode::INVALID_PARAMS)});

  // batch_replica_clear: a's own key only, and not while leased (the get above leased it).
  EXPECT_TRUE(a->BatchReplicaClear({"u"}, "").empty());
  std::vector<char> w = Pattern(100, 3);
  ASSERT_EQ(b->Put("theirs", {{w.data(), w.size()}}, on_b), 0);
  EXPECT_TRUE(a->BatchReplicaClear({"theirs"}, "").empty());
}

TEST_F(MasterProcessTest, KilledClientLosesItsSegmentAfterClientTtl) {
  auto a = Client();
  ASSERT_TRUE(a);
  constexpr int kKeys = 5;
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const std::string port = std::to_string(rpc_port_);
  const std::string nkeys = std::to_string(kKeys);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::dup2(pipefd[1], 1);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    const char* argv[] = {"/proc/self/exe", "--store-child", port.c_str(), nkeys.c_str(),
                          nullptr};
    ::execv(argv[0], const_cast<char* const*>(argv));
    _exit(127);
  }
  ::close(pipefd[1]);
  // READY line, with a deadline.
  std::string line;
  {
    const auto deadline = Clock::now() + seconds(30);
    ::fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
    char ch;
    while (line.find('\n') == std::string::npos && Clock::now() < deadline) {
      ssize_t r = ::read(pipefd[0], &ch, 1);
      if (r == 1) {
        line.push_back(ch);
      } else if (r == 0) {
        break;  // the child exited
      } else {
        std::this_thread::sleep_for(milliseconds(20));
      }
    }
    ::close(pipefd[0]);
  }
  if (line.rfind("READY ", 0) != 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    FAIL() << "the child did not get ready: '" << line << "'";
  }
  // The child's keys are readable while it lives.
  for (int i = 0; i < kKeys; ++i) {
    std::vector<char> out(2000);
    ASSERT_EQ(a->Get("child-" + std::to_string(i), {{out.data(), out.size()}}), 1000 + i);
    out.resize(1000 + i);
    EXPECT_TRUE(out == Pattern(1000 + i, static_cast<uint64_t>(i)));
  }
  EXPECT_EQ(MetricValue(Metrics(), "master_mounted_segments"), std::optional<uint64_t>(2));
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  const auto killed = Clock::now();
  // --client_ttl=2: within about 5 s every key of the child is gone.
  std::vector<int64_t> sizes;
  while (Clock::now() < killed + seconds(8)) {
    std::vector<std::string> keys;
    for (int i = 0; i < kKeys; ++i) keys.push_back("child-" + std::to_string(i));
    sizes = a->BatchGetSize(keys);
    bool all_gone = true;
    for (int64_t s : sizes) all_gone &= (s == ToInt(ErrorCode::OBJECT_NOT_FOUND));
    if (all_gone) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  const double waited =
      std::chrono::duration<double>(Clock::now() - killed).count();
  for (int64_t s : sizes) EXPECT_EQ(s, ToInt(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_LT(waited, 5.5) << "the segment was dropped only after " << waited << " s";
  EXPECT_GT(waited, 1.0) << "dropped before --client_ttl=2 could have passed";
  char byte;
  EXPECT_EQ(a->Get("child-0", {{&byte, 1}}), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  const std::string metrics = Metrics();
  EXPECT_EQ(MetricValue(metrics, "master_mounted_segments"), std::optional<uint64_t>(1));
  EXPECT_EQ(MetricValue(metrics, "master_expired_clients_total"), std::optional<uint64_t>(1));
  // The surviving client is unaffected.
  std::vector<char> v = Pattern(4096, 7), out(4096);
  EXPECT_EQ(a->Put("after", {{v.data(), v.size()}}, {}), 0);
  EXPECT_EQ(a->Get("after", {{out.data(), out.size()}}), 4096);
  EXPECT_TRUE(v == out);
}

TEST_F(MasterProcessTest, PortInUseIsRefusedWithAClearMessage) {
  // The RPC port of the running master.
  MasterProcess second({"--rpc_address=127.0.0.1", "--rpc_port=" + std::to_string(rpc_port_),
                        "--metrics_port=" + std::to_string(FreePort())});
  auto rc = second.WaitExit(seconds(20));
  ASSERT_TRUE(rc.has_value()) << "a second master on port " << rpc_port_
                              << " kept running:\n" << second.Log();
  EXPECT_NE(*rc, 0);
  EXPECT_NE(second.Log().find("cannot listen on 127.0.0.1:" + std::to_string(rpc_port_)),
            std::string::npos)
      << second.Log();
  // The metrics port of the running master.
  MasterProcess third({"--rpc_address=127.0.0.1", "--rpc_port=" + std::to_string(FreePort()),
                       "--metrics_port=" + std::to_string(metrics_port_)});
  rc = third.WaitExit(seconds(20));
  ASSERT_TRUE(rc.has_value()) << third.Log();
  EXPECT_NE(*rc, 0);
  EXPECT_NE(third.Log().find("cannot serve metrics on port " + std::to_string(metrics_port_)),
            std::string::npos)
      << third.Log();
  // The first master is unharmed.
  auto c = Client();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->HealthCheck(), 0);
}

TEST_F(MasterProcessTest, PortHeldByAnotherProgramIsRefused) {
  // A plain listening socket (no SO_REUSEPORT) holds the port.
  int port = 0;
  const int fd = HoldLoopbackPort(&port);
  ASSERT_GE(fd, 0);
  MasterProcess m({"--rpc_address=127.0.0.1", "--rpc_port=" + std::to_string(port),
                   "--metrics_port=" + std::to_string(FreePort())});
  auto rc = m.WaitExit(seconds(20));
  ::close(fd);
  ASSERT_TRUE(rc.has_value()) << m.Log();
  EXPECT_NE(*rc, 0);
  EXPECT_NE(m.Log().find("cannot listen on"), std::string::npos) << m.Log();
}

TEST_F(MasterProcessTest, SigtermStopsWithExitZero) {
  {
    auto c = Client();
    ASSERT_TRUE(c);
    std::vector<char> v(100, 'x');
    ASSERT_EQ(c->Put("k", {{v.data(), v.size()}}, {}), 0);
  }
  ASSERT_EQ(::kill(master_->pid(), SIGTERM), 0);
  auto rc = master_->WaitExit(seconds(10));
  ASSERT_TRUE(rc.has_value()) << "still running 10 s after SIGTERM:\n" << master_->Log();
  EXPECT_EQ(*rc, 0) << master_->Log();
  EXPECT_NE(master_->Log().find("Master service stopping"), std::string::npos);
  // Nothing listens there any more.
  EXPECT_EQ(HttpGet(metrics_port_, "/metrics"), "");
}

TEST(MasterProcessFlagsTest, InvalidFlagsExitNonZero) {
  for (const char* bad : {"--rpc_port=-1", "--client_ttl=0", "--eviction_high_watermark_ratio=1.5"}) {
    MasterProcess m({bad, "--metrics_port=" + std::to_string(FreePort())});
    auto rc = m.WaitExit(seconds(20));
    ASSERT_TRUE(rc.has_value()) << bad;
    EXPECT_NE(*rc, 0) << bad;
    EXPECT_NE(m.Log().find("must be"), std::string::npos) << bad << ":\n" << m.Log();
  }
}

}  // namespace
}  // namespace store
}  // namespace mooncake

int main(int argc, char** argv) {
  if (argc >= 4 && std::strcmp(argv[1], "--store-child") == 0) {
    return mooncake::store::ChildMain(std::atoi(argv[2]), std::atoi(argv[3]));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
