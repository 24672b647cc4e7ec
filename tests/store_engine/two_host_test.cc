// "Two hosts": two network namespaces joined by a veth pair, 10.213.7.1/24 and 10.213.7.2/24,
// addresses that exist only inside them. etcd runs in the first on its veth address; an engine
// in each (MC_TCP_BIND_ADDRESS = its veth address) finds the other by name through that etcd
// and moves data over TCP across the veth. Nothing leaves the two namespaces: they have no
// route but the veth subnet, and the test process reaches everything through pipes (it reads
// keys with `store_peer storeget` run inside a namespace).
// Skipped, with the reason, where namespaces cannot be made (no CAP_NET_ADMIN, no `ip`:
// Debian package iproute2). The namespaces are removed even when the test fails; ones left by
// a killed run are removed by the next.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "harness.h"
#include "store_server.h"

namespace mooncake::store_engine {
namespace {

constexpr char kIpA[] = "10.213.7.1";
constexpr char kIpB[] = "10.213.7.2";
constexpr char kPrefix[] = "mcse-";

std::string N(uint64_t v) { return std::to_string(v); }

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Two namespaces and a veth pair between them, created inside them (never in ours).
class TwoNamespaces {
 public:
  // Null with *why set when they cannot be made.
  static std::unique_ptr<TwoNamespaces> Create(std::string* why) {
    std::string ip;
    if (Shell("command -v ip", &ip) != 0 || Trim(ip).empty()) {
      *why = "no `ip` binary (Debian package iproute2)";
      return nullptr;
    }
    RemoveStale();
    std::unique_ptr<TwoNamespaces> ns(new TwoNamespaces);
    ns->ip_ = Trim(ip);
    const std::string id = N(::getpid());
    ns->a_ = kPrefix + id + "-a";
    ns->b_ = kPrefix + id + "-b";
    ns->veth_a_ = "mcse" + id + "a";
    ns->veth_b_ = "mcse" + id + "b";
    std::string out;
    if (Shell(ns->ip_ + " netns add " + ns->a_, &out) != 0) {
      *why = "cannot create a network namespace (needs CAP_NET_ADMIN): " + Trim(out);
      return nullptr;
    }
    ns->made_a_ = true;
    const std::vector<std::string> steps = {
        "netns add " + ns->b_,
        "-n " + ns->a_ + " link add " + ns->veth_a_ + " type veth peer name " + ns->veth_b_ +
            " netns " + ns->b_,
        "-n " + ns->a_ + " addr add " + kIpA + "/24 dev " + ns->veth_a_,
        "-n " + ns->b_ + " addr add " + kIpB + "/24 dev " + ns->veth_b_,
        "-n " + ns->a_ + " link set " + ns->veth_a_ + " up",
        "-n " + ns->b_ + " link set " + ns->veth_b_ + " up",
        "-n " + ns->a_ + " link set lo up",
        "-n " + ns->b_ + " link set lo up",
    };
    for (const std::string& step : steps) {
      if (Shell(ns->ip_ + " " + step, &out) != 0) {
        *why = "`ip " + step + "` failed (needs CAP_NET_ADMIN): " + Trim(out);
        return nullptr;  // the destructor removes what was made
      }
      if (step == steps[0]) ns->made_b_ = true;
    }
    return ns;
  }

  ~TwoNamespaces() {
    // Deleting a namespace destroys its end of the veth, and with it the pair.
    if (made_a_) Shell(ip_ + " netns del " + a_);
    if (made_b_) Shell(ip_ + " netns del " + b_);
  }

  // argv prefix that runs a command in namespace a or b.
  std::vector<std::string> In(bool a) const { return {ip_, "netns", "exec", a ? a_ : b_}; }
  std::string Shell(bool a, const std::string& cmd, std::string* out = nullptr) const {
    std::string o;
    ::mooncake::store_engine::Shell(ip_ + " netns exec " + (a ? a_ : b_) + " " + cmd, &o);
    if (out) *out = o;
    return Trim(o);
  }
  const std::string& veth(bool a) const { return a ? veth_a_ : veth_b_; }

 private:
  TwoNamespaces() = default;
  static int Shell(const std::string& cmd, std::string* out = nullptr) {
    return ::mooncake::store_engine::Shell(cmd, out);
  }
  // Namespaces of earlier runs whose process is gone (e.g. killed by a test timeout).
  static void RemoveStale() {
    std::string list;
    if (Shell("ip netns list", &list) != 0) return;
    std::istringstream in(list);
    std::string name;
    while (in >> name) {
      if (name.rfind(kPrefix, 0) != 0) continue;
      std::string pid = name.substr(std::string(kPrefix).size());
      pid = pid.substr(0, pid.find('-'));
      pid_t p = static_cast<pid_t>(std::atol(pid.c_str()));
      if (p > 0 && ::kill(p, 0) != 0) Shell("ip netns del " + name);
    }
  }

  std::string ip_, a_, b_, veth_a_, veth_b_;
  bool made_a_ = false, made_b_ = false;
};

TEST(TwoHosts, EnginesInTwoNamespacesFindEachOtherThroughEtcd) {
  TempDir dir;
  std::string why;
  auto ns = TwoNamespaces::Create(&why);
  if (!ns) GTEST_SKIP() << "two-host test skipped: " << why;

  std::string etcd;
  if (Shell("command -v etcd", &etcd) != 0 || Trim(etcd).empty()) {
    // store_servers.sh installs etcd-server when it is missing.
    std::string error;
    auto installer = ::mooncake::testing::StoreServer::Start("etcd", "", &error);
    if (!installer || Shell("command -v etcd", &etcd) != 0) {
      if (::mooncake::testing::StoreServersRequired()) FAIL() << error;
      GTEST_SKIP() << "no etcd: " << error;
    }
  }
  etcd = Trim(etcd);
  std::map<std::string, std::string> etcd_env;
  std::string arch;
  if (Shell("uname -m", &arch) == 0 && Trim(arch) != "x86_64") {
    Shell("dpkg --print-architecture", &arch);
    etcd_env["ETCD_UNSUPPORTED_ARCH"] = Trim(arch);
  }
  const std::string client = std::string("http://") + kIpA + ":2379";
  std::vector<std::string> etcd_argv = ns->In(true);
  for (const std::string& a :
       {etcd, std::string("--name"), std::string("mc2h"), std::string("--data-dir"),
        dir.path() + "/etcd.data", std::string("--listen-client-urls"), client,
        std::string("--advertise-client-urls"), client, std::string("--listen-peer-urls"),
        std::string("http://127.0.0.1:2380"), std::string("--initial-advertise-peer-urls"),
        std::string("http://127.0.0.1:2380"), std::string("--initial-cluster"),
        std::string("mc2h=http://127.0.0.1:2380")}) {
    etcd_argv.push_back(a);
  }
  std::string error;
  auto etcd_proc = Proc::Start(etcd_argv, etcd_env, dir.path() + "/etcd.log", &error);
  ASSERT_TRUE(etcd_proc) << error;

  // Ready when namespace b reads a key through the veth.
  const std::string conn = std::string("etcd://") + kIpA + ":2379";
  const std::string peer = MC_STORE_PEER_PATH;
  auto store_get = [&](const std::string& key) {
    std::string out = ns->Shell(false, peer + " storeget --metadata " + conn + " --key " + key);
    return out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
  };
  auto t0 = std::chrono::steady_clock::now();
  std::string probe;
  while (Since(t0) < 15 && (probe = store_get("mooncake/probe")) != "NOTFOUND") {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_EQ(probe, "NOTFOUND") << "etcd in namespace a not reachable from b: " << probe << "\n"
                               << etcd_proc->Stderr();

  Peer a = StartPeer(peer, conn, "prefill-0", EngineEnv({{"MC_TCP_BIND_ADDRESS", kIpA}}),
                     dir.path() + "/a.err", {}, ns->In(true));
  ASSERT_TRUE(a.ready.ok) << a.ready.line << "\n" << (a.proc ? a.proc->Stderr() : "");
  Peer b = StartPeer(peer, conn, "decode-3", EngineEnv({{"MC_TCP_BIND_ADDRESS", kIpB}}),
                     dir.path() + "/b.err", {}, ns->In(false));
  ASSERT_TRUE(b.ready.ok) << b.ready.line << "\n" << (b.proc ? b.proc->Stderr() : "");
  EXPECT_EQ(a.ready.rpc_address, std::string(kIpA) + ":" + N(a.ready.rpc_port));
  EXPECT_EQ(b.ready.rpc_address, std::string(kIpB) + ":" + N(b.ready.rpc_port));

  // Each publishes its veth address.
  auto json_of = [](const std::string& line) {
    return line.rfind("VALUE ", 0) == 0
               ? nlohmann::json::parse(line.substr(6), nullptr, /*allow_exceptions=*/false)
               : nlohmann::json();
  };
  nlohmann::json rpc_a = json_of(store_get("mooncake/rpc_meta/prefill-0"));
  EXPECT_EQ(rpc_a, (nlohmann::json{{"ip_or_host_name", kIpA}, {"rpc_port", a.ready.rpc_port}}));
  nlohmann::json desc_b = json_of(store_get("mooncake/ram/decode-3"));
  EXPECT_EQ(desc_b["tcp_data_host"], kIpB) << desc_b.dump();

  // By name, both ways, over TCP (different namespaces: not the same host).
  constexpr uint64_t kMiB = 1 << 20;
  std::string open = b.proc->Command("OPEN prefill-0");
  ASSERT_EQ(open.rfind("OK ", 0), 0u) << open;
  EXPECT_NE(open.find(" tcp "), std::string::npos) << open;
  EXPECT_EQ(b.proc->Command("PUT prefill-0 0 " + N(4 * kMiB) + " 21"), "OK");
  EXPECT_EQ(a.proc->Command("CHECK 0 " + N(4 * kMiB) + " 21"), "OK");
  EXPECT_EQ(a.proc->Command("FILL 0 " + N(4 * kMiB) + " 22"), "OK");
  EXPECT_EQ(b.proc->Command("GET prefill-0 0 " + N(4 * kMiB) + " 22"), "OK");
  open = a.proc->Command("OPEN decode-3");
  ASSERT_EQ(open.rfind("OK ", 0), 0u) << open;
  EXPECT_NE(open.find(" tcp "), std::string::npos) << open;
  EXPECT_EQ(a.proc->Command("PUT decode-3 4097 " + N(3 * kMiB) + " 31"), "OK");
  EXPECT_EQ(b.proc->Command("CHECK 4097 " + N(3 * kMiB) + " 31"), "OK");
  EXPECT_EQ(b.proc->Command("FILL 4097 " + N(3 * kMiB) + " 32"), "OK");
  EXPECT_EQ(a.proc->Command("GET decode-3 4097 " + N(3 * kMiB) + " 32"), "OK");

  // The bytes crossed the veth; b's connections all go to a's address (etcd and engine a).
  const std::string stats = "/sys/class/net/" + ns->veth(false) + "/statistics/";
  uint64_t rx = std::stoull("0" + ns->Shell(false, "cat " + stats + "rx_bytes"));
  uint64_t tx = std::stoull("0" + ns->Shell(false, "cat " + stats + "tx_bytes"));
  std::cout << "[ info ] veth of namespace b: rx " << rx << " bytes, tx " << tx << " bytes\n";
  EXPECT_GE(rx, 7 * kMiB);
  EXPECT_GE(tx, 7 * kMiB);
  for (const TcpSocket& s : TcpSocketsOf(b.proc->pid())) {
    if (s.state == "ESTABLISHED") {
      EXPECT_EQ(s.remote.rfind(std::string(kIpA) + ":", 0), 0u) << s.remote;
    }
  }

  // Clean shutdowns remove the keys.
  for (Peer* p : {&a, &b}) {
    EXPECT_EQ(p->proc->Command("QUIT"), "BYE");
    EXPECT_EQ(p->proc->Wait(10), 0);
  }
  EXPECT_EQ(store_get("mooncake/rpc_meta/prefill-0"), "NOTFOUND");
  EXPECT_EQ(store_get("mooncake/ram/decode-3"), "NOTFOUND");
}

}  // namespace
}  // namespace mooncake::store_engine
