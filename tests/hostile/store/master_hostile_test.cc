// Issue 14, points 6 and 7 against a real mooncake_master: RPCs a hostile client can send
// (RemoveByRegex patterns that crashed or froze std::regex, keys and batches far over the
// bounds) must be refused or served in bounded time while other clients keep being served;
// and idle or slow connections to /metrics must not delay a real scrape.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "master.pb.h"
#include "master_process.h"
#include "store/testing/rpc_frames.h"
#include "mooncake/store/store_client.h"
#include "mooncake/store/error_code.h"
#include "store/rpc/rpc_client.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_master;  // NOLINT

class MasterHostileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rpc_port_ = FreePort();
    metrics_port_ = FreePort();
    master_ = std::make_unique<MasterProcess>(std::vector<std::string>{
        "--rpc_address=127.0.0.1", "--rpc_port=" + std::to_string(rpc_port_),
        "--metrics_port=" + std::to_string(metrics_port_)});
    ASSERT_TRUE(master_->WaitReady(seconds(20))) << master_->Log();
    rpc_ = std::make_unique<RpcClient>("127.0.0.1:" + std::to_string(rpc_port_));
  }
  void TearDown() override {
    if (master_) {
      ::kill(master_->pid(), SIGTERM);
      master_->WaitExit(seconds(10));
    }
  }
  std::unique_ptr<StoreClient> Client() { return MakeClient(rpc_port_, 64 * MiB); }
  Status Rpc(MasterMethod method, const google::protobuf::MessageLite& req,
             google::protobuf::MessageLite* resp, int timeout_s = 60) {
    return rpc_->Call(method, req, resp, std::chrono::seconds(timeout_s));
  }
  bool Alive() { return !master_->WaitExit(milliseconds(0)).has_value(); }

  int rpc_port_ = -1, metrics_port_ = -1;
  std::unique_ptr<MasterProcess> master_;
  std::unique_ptr<RpcClient> rpc_;
};

// A legitimate client gets one small object in a loop; records the slowest get.
class Prober {
 public:
  explicit Prober(StoreClient* c) : c_(c) {
    std::vector<char> v(1000, 'p');
    EXPECT_EQ(c_->Put("probe", {{v.data(), v.size()}}, {}), 0);
    thread_ = std::thread([this] {
      std::vector<char> out(1000);
      while (!stop_) {
        const auto t0 = Clock::now();
        const int64_t got = c_->Get("probe", {{out.data(), out.size()}});
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (got != 1000) ++failures_;
        if (ms > worst_ms_) worst_ms_ = ms;
        ++gets_;
      }
    });
    // The first get done before the test goes on: from then on the probe is leased, so the
    // test's unforced regex removes (which match "probe") must leave it (under ASan the
    // thread's first get could come after them, and the object was gone).
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (gets_ == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ~Prober() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  double worst_ms() const { return worst_ms_; }
  int failures() const { return failures_; }
  int gets() const { return gets_; }

 private:
  StoreClient* c_;
  std::atomic<bool> stop_{false};
  std::atomic<double> worst_ms_{0};
  std::atomic<int> failures_{0}, gets_{0};
  std::thread thread_;
};

TEST_F(MasterHostileTest, HostileRpcsAreRefusedOrBoundedAndOthersKeepBeingServed) {
  auto client = Client();
  ASSERT_TRUE(client);
  Prober prober(client.get());
  // Keys that took std::regex down: a 50,000-character key (stack overflow on "^a.*") and a
  // 33-character one ("^(a|a)*$": exponential backtracking).
  {
    rpc::PutStartRequest req;
    req.set_client_id("hostile");
    for (const std::string& key : {std::string(50000, 'a'), std::string(33, 'a') + "b"}) {
      auto* item = req.add_items();
      item->set_key(key);
      item->set_size(16);
    }
    rpc::PutStartResponse resp;
    ASSERT_TRUE(Rpc(MasterMethod::kPutStart, req, &resp).ok());
    ASSERT_EQ(resp.results_size(), 2);
    EXPECT_EQ(resp.results(0).code(), ToInt(ErrorCode::INVALID_KEY)) << resp.results(0).message();
    EXPECT_EQ(resp.results(1).code(), 0);
    rpc::KeysRequest end;
    end.set_client_id("hostile");
    end.add_keys(std::string(33, 'a') + "b");
    rpc::CodesResponse codes;
    ASSERT_TRUE(Rpc(MasterMethod::kPutEnd, end, &codes).ok());
  }
  for (const char* pattern : {"^a.*", "^(a|a)*$", "^(a|a)*b$", "(a*)*$"}) {
    SCOPED_TRACE(pattern);
    rpc::RemoveByRegexRequest req;
    req.set_client_id("hostile");
    req.set_regex(pattern);
    rpc::CountResponse resp;
    const auto t0 = Clock::now();
    Status s = Rpc(MasterMethod::kRemoveByRegex, req, &resp);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_LT(Clock::now() - t0, seconds(1));
    ASSERT_TRUE(Alive()) << master_->Log();
  }
  {
    rpc::RemoveByRegexRequest req;
    req.set_client_id("hostile");
    req.set_regex(std::string(100000, 'a'));
    rpc::CountResponse resp;
    ASSERT_TRUE(Rpc(MasterMethod::kRemoveByRegex, req, &resp).ok());
    EXPECT_EQ(resp.code(), ToInt(ErrorCode::INVALID_PARAMS));
    EXPECT_NE(resp.message().find("limit"), std::string::npos) << resp.message();
  }
  // 200,000 items in one PutStart: refused up front, nothing created, and an answer.
  {
    rpc::PutStartRequest req;
    req.set_client_id("hostile");
    for (int i = 0; i < 200000; ++i) {
      auto* item = req.add_items();
      item->set_key("flood/" + std::to_string(i));
      item->set_size(1);
    }
    rpc::PutStartResponse resp;
    Status s = Rpc(MasterMethod::kPutStart, req, &resp);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(resp.code(), ToInt(ErrorCode::INVALID_PARAMS)) << resp.message();
    rpc::StatsResponse stats;
    ASSERT_TRUE(Rpc(MasterMethod::kGetStats, rpc::StatsRequest(), &stats).ok());
    EXPECT_LT(stats.keys(), 10u);
  }
  ASSERT_TRUE(Alive()) << master_->Log();
  prober.Stop();
  EXPECT_EQ(prober.failures(), 0);
  EXPECT_GT(prober.gets(), 10);
  EXPECT_LT(prober.worst_ms(), 1000.0) << "a legitimate get waited that long";
  // The client library splits a batch over the bound: 5,000 keys work.
  std::vector<std::string> keys;
  for (int i = 0; i < 5000; ++i) keys.push_back("many/" + std::to_string(i));
  std::vector<char> one(8, 'x');
  std::vector<std::vector<Span>> parts(keys.size(), {{one.data(), one.size()}});
  for (int rc : client->BatchPut(keys, parts, {})) ASSERT_EQ(rc, 0);
  for (int64_t n : client->BatchGetSize(keys)) ASSERT_EQ(n, 8);
  for (int rc : client->BatchRemove(keys, true)) ASSERT_EQ(rc, 0);
}

// The RPC port against clients that are not this Store's library: hundreds idle, some
// stalled half-way through a request that announced 60 MiB, some foreign (HTTP/2, as an
// older gRPC client of this project would be), some announcing 2 GiB, some pipelining
// requests and never reading the replies. The master stays up, holds no memory for what was
// only announced, and a legitimate client's gets stay prompt throughout.
TEST_F(MasterHostileTest, RpcPortServesOthersDespiteIdleStalledForeignAndGreedyConnections) {
  using namespace testing_rpc;  // NOLINT
  auto client = Client();
  ASSERT_TRUE(client);
  Prober prober(client.get());
  std::vector<int> fds;
  for (int i = 0; i < 300; ++i) {
    int fd = ConnectLoopback(rpc_port_);
    if (fd >= 0) fds.push_back(fd);
  }
  EXPECT_GE(fds.size(), 250u);
  for (int i = 0; i < 16; ++i) {  // stalled: a header announcing 60 MiB and a few bytes
    int fd = ConnectLoopback(rpc_port_);
    ASSERT_GE(fd, 0);
    EXPECT_TRUE(SendAll(fd, Frame(uint16_t(MasterMethod::kPutStart), 1, "abc", 60u << 20)));
    fds.push_back(fd);
  }
  for (int i = 0; i < 8; ++i) {  // foreign bytes: closed at once
    int fd = ConnectLoopback(rpc_port_);
    ASSERT_GE(fd, 0);
    EXPECT_TRUE(SendAll(fd, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
    EXPECT_TRUE(ClosedWithin(fd, milliseconds(2000)));
    ::close(fd);
  }
  for (int i = 0; i < 4; ++i) {  // over the limit: refused with a reply, then closed
    int fd = ConnectLoopback(rpc_port_);
    ASSERT_GE(fd, 0);
    EXPECT_TRUE(SendAll(fd, Frame(uint16_t(MasterMethod::kPing), 5, "", 0x7fffffffu)));
    auto r = ReadReply(fd, milliseconds(2000));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->header.status, uint16_t(RpcStatus::kTooLarge));
    EXPECT_TRUE(ClosedWithin(fd, milliseconds(2000)));
    ::close(fd);
  }
  rpc::StatsRequest stats_req;
  const std::string stats_frame =
      Frame(uint16_t(MasterMethod::kGetStats), 1, stats_req.SerializeAsString());
  for (int i = 0; i < 4; ++i) {  // greedy: 20,000 requests sent, no reply read
    int fd = ConnectLoopback(rpc_port_);
    ASSERT_GE(fd, 0);
    std::string many;
    for (int k = 0; k < 20000; ++k) many += stats_frame;
    std::thread([fd, many] { (void)SendAll(fd, many); }).detach();
    fds.push_back(fd);
  }
  std::this_thread::sleep_for(seconds(2));
  ASSERT_TRUE(Alive()) << master_->Log();
  rpc::StatsResponse stats;
  ASSERT_TRUE(Rpc(MasterMethod::kGetStats, stats_req, &stats, 5).ok());
  prober.Stop();
  std::printf("legitimate gets beside the hostile connections: %d, the slowest %.1f ms\n",
              prober.gets(), prober.worst_ms());
  EXPECT_EQ(prober.failures(), 0);
  EXPECT_GT(prober.gets(), 50);
  EXPECT_LT(prober.worst_ms(), 500.0) << "a legitimate get waited that long";
  for (int fd : fds) ::shutdown(fd, SHUT_RDWR), ::close(fd);
}

// A legitimate client's ping in a loop; records the slowest and the failures.
class PingProber {
 public:
  explicit PingProber(int port) : rpc_("127.0.0.1:" + std::to_string(port)) {
    thread_ = std::thread([this] {
      while (!stop_) {
        rpc::PingRequest q;
        q.set_client_id("prober");
        rpc::PingResponse r;
        const auto t0 = Clock::now();
        Status s = rpc_.Call(MasterMethod::kPing, q, &r, seconds(5));
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (!s.ok()) {
          ++failures_;
          std::lock_guard<std::mutex> l(mu_);
          last_error_ = s.ToString();
        }
        if (ms > worst_ms_) worst_ms_ = ms;
        ++pings_;
        std::this_thread::sleep_for(milliseconds(2));
      }
    });
  }
  ~PingProber() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  double worst_ms() const { return worst_ms_; }
  int failures() const { return failures_; }
  int pings() const { return pings_; }
  std::string last_error() {
    std::lock_guard<std::mutex> l(mu_);
    return last_error_;
  }

 private:
  RpcClient rpc_;
  std::atomic<bool> stop_{false};
  std::atomic<double> worst_ms_{0};
  std::atomic<int> failures_{0}, pings_{0};
  std::mutex mu_;
  std::string last_error_;
  std::thread thread_;
};

// Whether the master's resident memory is what it holds: not under ASan, whose quarantine
// and shadow keep freed memory resident (the master built with the same flags as this test).
// And how long a ping may wait beside the hostile clients: 100 ms (5-20 ms is usual, a
// master that parsed or buffered what it should refuse stalls for seconds); 400 ms under ASan,
// where the master's and the senders' 64 MiB buffers go through ASan's allocator and
// quarantine with two cores shared with the other tests (138 ms seen once in CI).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kRssIsMeaningful = false;
constexpr double kPromptPingMs = 400.0;
#else
constexpr bool kRssIsMeaningful = true;
constexpr double kPromptPingMs = 100.0;
#endif

// Resident bytes of process `pid` (VmRSS).
size_t ResidentOf(pid_t pid) {
  const std::string status = ReadFile("/proc/" + std::to_string(pid) + "/status");
  const size_t at = status.find("VmRSS:");
  return at == std::string::npos ? 0 : std::stoull(status.substr(at + 6)) * 1024;
}

// Issue 28, items 4-7, against a real mooncake_master with its default bounds (4096
// connections, a 1 GiB budget): each attack as the hostile tester made it, while a
// legitimate client pings (and a Store client gets); none may fail, none may wait 100 ms.
TEST_F(MasterHostileTest, NoOneClientStopsTheMasterWithPendingBytesHogsIdleBuffersOrEmptyKeys) {
  using namespace testing_rpc;  // NOLINT
  auto client = Client();
  ASSERT_TRUE(client);
  const pid_t pid = master_->pid();
  const size_t base_rss = ResidentOf(pid);
  const std::string ping = Frame(uint16_t(MasterMethod::kPing), 1, "");  // 16 bytes
  // Item 4: connections past the cap, each keeping a header byte pending and completing a
  // ping every 500 ms (so the request deadline restarts).
  std::vector<int> slow;
  for (int i = 0; i < 4200; ++i) {
    const int fd = ConnectLoopback(rpc_port_);
    if (fd < 0) break;
    (void)!::send(fd, ping.data(), 1, MSG_NOSIGNAL);
    slow.push_back(fd);
  }
  EXPECT_GE(slow.size(), 4096u);
  std::atomic<bool> stop{false};
  std::thread refresher([&] {
    const std::string again = ping.substr(1) + ping.substr(0, 1);
    char sink[256];
    while (!stop) {
      for (int fd : slow) {
        (void)!::send(fd, again.data(), again.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        while (::recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
        }
      }
      for (int t = 0; t < 5 && !stop; ++t) std::this_thread::sleep_for(milliseconds(100));
    }
  });
  std::this_thread::sleep_for(milliseconds(1500));
  {
    PingProber pinger(rpc_port_);
    Prober prober(client.get());
    std::this_thread::sleep_for(milliseconds(500));
    auto fresh = Client();  // a new Store client's setup at the cap
    EXPECT_TRUE(fresh) << "a new client could not set up beside 4096 pending connections";
    std::this_thread::sleep_for(milliseconds(1000));
    pinger.Stop();
    prober.Stop();
    std::printf("beside %zu connections keeping a byte pending: %d pings (slowest %.1f ms, %d "
                "failed), %d gets (%d failed)\n", slow.size(), pinger.pings(), pinger.worst_ms(),
                pinger.failures(), prober.gets(), prober.failures());
    EXPECT_EQ(pinger.failures(), 0) << pinger.last_error();
    EXPECT_EQ(prober.failures(), 0);
    EXPECT_LT(pinger.worst_ms(), kPromptPingMs);
  }
  stop = true;
  refresher.join();
  for (int fd : slow) ::close(fd);
  std::this_thread::sleep_for(milliseconds(500));
  ASSERT_TRUE(Alive()) << master_->Log();
  // Item 5: 16 connections holding ~1 GiB of incomplete 64 MiB requests.
  {
    PingProber pinger(rpc_port_);
    std::vector<int> hogs;
    const std::string part = Frame(uint16_t(MasterMethod::kPutStart), 1,
                                   std::string((64u << 20) - 64, 'h'), 64u << 20);
    for (int i = 0; i < 16; ++i) {
      const int fd = ConnectLoopback(rpc_port_);
      ASSERT_GE(fd, 0);
      (void)SendAll(fd, part);  // some are closed part-way: the hogs past the budget
      hogs.push_back(fd);
    }
    std::this_thread::sleep_for(milliseconds(500));
    pinger.Stop();
    std::printf("beside 16 x 64 MiB incomplete requests: %d pings (slowest %.1f ms, %d failed), "
                "master resident %zu MiB\n", pinger.pings(), pinger.worst_ms(),
                pinger.failures(), ResidentOf(pid) >> 20);
    EXPECT_EQ(pinger.failures(), 0) << pinger.last_error();
    EXPECT_LT(pinger.worst_ms(), kPromptPingMs);
    if (kRssIsMeaningful) {
      EXPECT_LT(ResidentOf(pid), base_rss + (1300u << 20));
    }
    for (int fd : hogs) ::close(fd);
  }
  // Item 6: 20 idle connections after one 64 MiB request each.
  {
    std::vector<int> idle;
    const std::string big = Frame(999, 1, std::string((64u << 20) - 16, 'b'));
    for (int i = 0; i < 20; ++i) {
      const int fd = ConnectLoopback(rpc_port_);
      ASSERT_GE(fd, 0);
      ASSERT_TRUE(SendAll(fd, big));
      ASSERT_TRUE(ReadReply(fd, seconds(10)));
      idle.push_back(fd);
    }
    std::this_thread::sleep_for(milliseconds(300));
    const size_t rss = ResidentOf(pid);
    std::printf("master resident: %zu MiB at the start, %zu MiB with 20 idle connections after "
                "a 64 MiB request each\n", base_rss >> 20, rss >> 20);
    if (kRssIsMeaningful) {
      EXPECT_LT(rss, base_rss + (300u << 20));
    }
    for (int fd : idle) ::close(fd);
  }
  // Item 7: 64 MiB requests of 33.5 M empty keys from 3 connections.
  {
    PingProber pinger(rpc_port_);
    std::string keys;
    keys.reserve(64u << 20);
    while (keys.size() + 2 <= (64u << 20)) keys += std::string("\x12\x00", 2);
    const std::string frame = Frame(uint16_t(MasterMethod::kExistKey), 1, keys);
    std::atomic<size_t> peak{0};
    std::vector<std::thread> senders;
    for (int i = 0; i < 3; ++i) {
      senders.emplace_back([&] {
        const int fd = ConnectLoopback(rpc_port_);
        for (int k = 0; k < 2; ++k) {
          if (!SendAll(fd, frame)) break;
          auto r = ReadReply(fd, seconds(30));
          EXPECT_TRUE(r);
          if (!r) break;
          rpc::ExistResponse resp;
          EXPECT_TRUE(resp.ParseFromString(r->payload));
          EXPECT_EQ(resp.code(), ToInt(ErrorCode::INVALID_PARAMS));
          peak = std::max(peak.load(), ResidentOf(pid));
        }
        ::close(fd);
      });
    }
    for (auto& t : senders) t.join();
    pinger.Stop();
    std::printf("beside 3 x 2 requests of 33.5 M empty keys: %d pings (slowest %.1f ms, %d "
                "failed), master resident at most %zu MiB\n", pinger.pings(), pinger.worst_ms(),
                pinger.failures(), peak.load() >> 20);
    EXPECT_EQ(pinger.failures(), 0) << pinger.last_error();
    EXPECT_LT(pinger.worst_ms(), kPromptPingMs);
    if (kRssIsMeaningful) {
      EXPECT_LT(peak.load(), base_rss + (700u << 20));
    }
  }
  ASSERT_TRUE(Alive()) << master_->Log();
}

TEST_F(MasterHostileTest, MetricsAnswerPromptlyDespiteIdleAndSlowConnections) {
  std::vector<int> idle;
  for (int i = 0; i < 256; ++i) {
    int fd = ConnectLoopback(metrics_port_);
    if (fd >= 0) idle.push_back(fd);
  }
  EXPECT_GE(idle.size(), 200u);
  // 16 slow clients: a request one byte per second.
  std::atomic<bool> stop{false};
  std::vector<std::thread> slow;
  for (int i = 0; i < 16; ++i) {
    slow.emplace_back([&] {
      int fd = ConnectLoopback(metrics_port_);
      const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
      for (size_t k = 0; fd >= 0 && k < req.size() && !stop; ++k) {
        if (::send(fd, &req[k], 1, MSG_NOSIGNAL) != 1) break;
        for (int t = 0; t < 10 && !stop; ++t) std::this_thread::sleep_for(milliseconds(100));
      }
      if (fd >= 0) ::close(fd);
    });
  }
  std::this_thread::sleep_for(milliseconds(1500));
  for (int round = 0; round < 3; ++round) {
    const auto t0 = Clock::now();
    const std::string reply = HttpGet(metrics_port_, "/metrics");
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::printf("GET /metrics with %zu idle and 16 slow connections: %.1f ms\n", idle.size(), ms);
    EXPECT_NE(reply.find("200 OK"), std::string::npos) << "no answer within 5 s";
    EXPECT_NE(reply.find("master_key_count"), std::string::npos);
    EXPECT_LT(ms, 1000.0);
    std::this_thread::sleep_for(milliseconds(700));
  }
  stop = true;
  for (auto& t : slow) t.join();
  for (int fd : idle) ::close(fd);
  // Malformed and foreign requests get an answer, not a hang.
  EXPECT_NE(HttpGet(metrics_port_, "/other").find("404"), std::string::npos);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
