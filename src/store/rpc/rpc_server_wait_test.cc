// RpcServer's waiting requests (rpc_server.h, "Waiting requests"): a handler's kWaitForWake
// answered when its topic is woken, or with "nothing" at its deadline (bounded by
// Options::max_wait); other topics, other connections and the connection's next requests;
// a wake just before the wait begins; closes and Stop while waiting.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store/rpc/rpc_server.h"
#include "store/testing/loopback_http.h"
#include "store/testing/rpc_frames.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_rpc;     // NOLINT
using namespace testing_master;  // NOLINT
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr uint16_t kEcho = 1;        // "re:" + payload
constexpr uint16_t kWait = 2;        // payload a topic: "got:<topic>:<value>" once it has one
constexpr uint16_t kWakeFirst = 3;   // as kWait, but its first run makes the value and wakes
constexpr uint16_t kSlowWait = 11;   // as kWait, on the worker

std::mutex g_mu;
std::map<std::string, std::string> g_values;  // topic -> value
std::atomic<int> g_runs{0};                   // kWait / kWakeFirst handler runs
std::atomic<int64_t> g_wait_ms{5000};         // what the handler asks to wait
RpcServer* g_server = nullptr;

void SetValue(const std::string& topic, const std::string& value) {
  std::lock_guard<std::mutex> l(g_mu);
  g_values[topic] = value;
}

RpcStatus Handle(uint16_t method, const char* data, size_t n, std::string* out) {
  const std::string p(data, n);
  if (method == kEcho) {
    out->append("re:" + p);
    return RpcStatus::kOk;
  }
  const int run = ++g_runs;
  if (method == kWakeFirst && run == 1) {
    // The value comes, and its wake, after this run looked and before its wait begins.
    SetValue(p, "late");
    g_server->WakeWaiting(p);
  } else {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_values.find(p);
    if (it != g_values.end()) {
      out->append("got:" + p + ":" + it->second);
      return RpcStatus::kOk;
    }
  }
  RpcServer::AskToWait(out, p, milliseconds(g_wait_ms.load()));
  return RpcServer::kWaitForWake;
}

// The next reply on fd within `timeout` (failing the test if none): its payload.
std::string Reply(int fd, uint32_t seq, uint16_t method, milliseconds timeout = milliseconds(2000)) {
  auto r = ReadReply(fd, timeout);
  EXPECT_TRUE(r.has_value()) << "no reply for seq " << seq;
  if (!r) return "<none>";
  EXPECT_EQ(r->header.seq, seq);
  EXPECT_EQ(r->header.method, method);
  EXPECT_EQ(r->header.status, static_cast<uint16_t>(RpcStatus::kOk)) << r->payload;
  return r->payload;
}

bool Silent(int fd, milliseconds d = milliseconds(200)) { return ReadUpTo(fd, 1, d).empty(); }

class WaitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::lock_guard<std::mutex> l(g_mu);
    g_values.clear();
    g_runs = 0;
    g_wait_ms = 5000;
  }
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
    if (server_) server_->Stop();
    g_server = nullptr;
  }
  void Start(milliseconds max_wait = milliseconds(10000), int threads = 2,
             size_t max_connections = 4096) {
    RpcServer::Options o;
    o.threads = threads;
    o.max_connections = max_connections;
    o.max_wait = max_wait;
    o.slow = [](uint16_t m) { return m == kSlowWait; };
    server_ = std::make_unique<RpcServer>(o, &Handle);
    g_server = server_.get();
    ASSERT_TRUE(server_->Start("127.0.0.1", 0).ok());
  }
  int Open() {
    const int fd = ConnectLoopback(server_->port());
    EXPECT_GE(fd, 0);
    fds_.push_back(fd);
    return fd;
  }
  bool WaitingBecomes(size_t n, milliseconds within = milliseconds(2000)) {
    const auto end = Clock::now() + within;
    while (server_->waiting_requests() != n) {
      if (Clock::now() > end) return false;
      std::this_thread::sleep_for(milliseconds(2));
    }
    return true;
  }
  std::unique_ptr<RpcServer> server_;
  std::vector<int> fds_;
};

TEST_F(WaitTest, AWaitingRequestIsAnsweredWhenItsTopicIsWoken) {
  Start();
  const int fd = Open();
  ASSERT_TRUE(SendAll(fd, Frame(kWait, 7, "a")));
  ASSERT_TRUE(WaitingBecomes(1));
  EXPECT_TRUE(Silent(fd));
  EXPECT_EQ(g_runs.load(), 1);
  SetValue("a", "1");
  const auto woken = Clock::now();
  server_->WakeWaiting("a");
  EXPECT_EQ(Reply(fd, 7, kWait), "got:a:1");
  EXPECT_LT(Clock::now() - woken, milliseconds(1000));
  EXPECT_EQ(server_->waiting_requests(), 0u);
  // The connection serves its next request as before.
  ASSERT_TRUE(SendAll(fd, Frame(kEcho, 8, "x")));
  EXPECT_EQ(Reply(fd, 8, kEcho), "re:x");
}

TEST_F(WaitTest, AWakeOfAnotherTopicLeavesItWaitingUntilItsDeadline) {
  Start();
  g_wait_ms = 600;
  const int fd = Open();
  const auto sent = Clock::now();
  ASSERT_TRUE(SendAll(fd, Frame(kWait, 1, "a")));
  ASSERT_TRUE(WaitingBecomes(1));
  SetValue("b", "2");
  server_->WakeWaiting("b");
  EXPECT_TRUE(Silent(fd, milliseconds(300)));
  EXPECT_EQ(g_runs.load(), 1);  // not run again for b
  // The deadline: "nothing" (an empty payload, kOk).
  EXPECT_EQ(Reply(fd, 1, kWait), "");
  const auto took = Clock::now() - sent;
  EXPECT_GE(took, milliseconds(550));
  EXPECT_LT(took, milliseconds(3000));
  EXPECT_EQ(server_->waiting_requests(), 0u);
}

TEST_F(WaitTest, AWokenRequestWithStillNothingWaitsAgainUntilItsFirstDeadline) {
  Start();
  g_wait_ms = 800;
  const int fd = Open();
  const auto sent = Clock::now();
  ASSERT_TRUE(SendAll(fd, Frame(kWait, 1, "a")));
  ASSERT_TRUE(WaitingBecomes(1));
  server_->WakeWaiting("a");  // no value yet: run again, waits again
  const auto end = Clock::now() + milliseconds(1000);
  while (g_runs.load() < 2 && Clock::now() < end) std::this_thread::sleep_for(milliseconds(2));
  EXPECT_EQ(g_runs.load(), 2);
  EXPECT_EQ(server_->waiting_requests(), 1u);
  EXPECT_EQ(Reply(fd, 1, kWait), "");
  EXPECT_LT(Clock::now() - sent, milliseconds(1600));  // not a fresh 800 ms from the wake
}

TEST_F(WaitTest, MaxWaitBoundsWhatAHandlerAsks) {
  Start(milliseconds(200));
  const int fd = Open();
  const auto sent = Clock::now();
  ASSERT_TRUE(SendAll(fd, Frame(kWait, 3, "a")));  // asks 5 s
  EXPECT_EQ(Reply(fd, 3, kWait), "");
  const auto took = Clock::now() - sent;
  EXPECT_GE(took, milliseconds(150));
  EXPECT_LT(took, milliseconds(1500));
}

TEST_F(WaitTest, WithoutMaxWaitOrOnTheWorkerNothingWaits) {
  Start(milliseconds(0));
  int fd = Open();
  ASSERT_TRUE(SendAll(fd, Frame(kWait, 1, "a")));
  EXPECT_EQ(Reply(fd, 1, kWait, milliseconds(300)), "");
  EXPECT_EQ(server_->waiting_requests(), 0u);
  server_->Stop();
  server_.reset();
  Start();
  fd = Open();
  ASSERT_TRUE(SendAll(fd, Frame(kSlowWait, 2, "a")));
  EXPECT_EQ(Reply(fd, 2, kSlowWait, milliseconds(300)), "");
  EXPECT_EQ(server_->waiting_requests(), 0u);
}

TEST_F(WaitTest, AWakeBetweenTheHandlerAndTheWaitIsNotLost) {
  Start();
  const int fd = Open();
  const auto sent = Clock::now();
  ASSERT_TRUE(SendAll(fd, Frame(kWakeFirst, 1, "a")));  // waits 5 s unless rerun
  EXPECT_EQ(Reply(fd, 1, kWakeFirst, milliseconds(1000)), "got:a:late");
  EXPECT_LT(Clock::now() - sent, milliseconds(1000));
  EXPECT_EQ(g_runs.load(), 2);
}

TEST_F(WaitTest, OtherConnectionsAreServedAndTheWaitingOnesNextRequestWaitsItsTurn) {
  Start(milliseconds(10000), 1);  // one loop: the waiting request must not hold it
  const int waiting = Open();
  const int other = Open();
  ASSERT_TRUE(SendAll(waiting, Frame(kWait, 1, "a") + Frame(kEcho, 2, "behind")));
  ASSERT_TRUE(WaitingBecomes(1));
  for (uint32_t i = 0; i < 20; ++i) {
    ASSERT_TRUE(SendAll(other, Frame(kEcho, 100 + i, std::to_string(i))));
    EXPECT_EQ(Reply(other, 100 + i, kEcho, milliseconds(500)), "re:" + std::to_string(i));
  }
  EXPECT_TRUE(Silent(waiting));  // its pipelined echo comes after its waiting request
  SetValue("a", "1");
  server_->WakeWaiting("a");
  EXPECT_EQ(Reply(waiting, 1, kWait), "got:a:1");
  EXPECT_EQ(Reply(waiting, 2, kEcho), "re:behind");
}

TEST_F(WaitTest, ManyWaitOnOneTopicAndOneWakeAnswersThemAll) {
  Start();
  std::vector<int> fds;
  for (int i = 0; i < 12; ++i) {
    fds.push_back(Open());
    ASSERT_TRUE(SendAll(fds.back(), Frame(kWait, static_cast<uint32_t>(i), "t")));
  }
  ASSERT_TRUE(WaitingBecomes(12));
  SetValue("t", "v");
  server_->WakeWaiting("t");
  for (int i = 0; i < 12; ++i) EXPECT_EQ(Reply(fds[i], static_cast<uint32_t>(i), kWait), "got:t:v");
  EXPECT_EQ(server_->waiting_requests(), 0u);
}

TEST_F(WaitTest, AClosedConnectionDropsItsWaitingRequestAndStopEndsTheRest) {
  Start();
  const int gone = ConnectLoopback(server_->port());
  ASSERT_GE(gone, 0);
  ASSERT_TRUE(SendAll(gone, Frame(kWait, 1, "a")));
  const int stays = Open();
  ASSERT_TRUE(SendAll(stays, Frame(kWait, 2, "b")));
  ASSERT_TRUE(WaitingBecomes(2));
  ::close(gone);
  EXPECT_TRUE(WaitingBecomes(1));  // dropped when its close is seen, not at its deadline
  SetValue("a", "1");
  server_->WakeWaiting("a");  // nothing left to answer for it
  EXPECT_EQ(g_runs.load(), 2);
  const auto stopping = Clock::now();
  server_->Stop();
  EXPECT_LT(Clock::now() - stopping, milliseconds(2000));
  EXPECT_TRUE(ClosedWithin(stays, milliseconds(2000)));
  server_.reset();
  g_server = nullptr;
}

TEST_F(WaitTest, AtTheCapAWaitingConnectionMakesRoomAsAnIdleOneWould) {
  Start(milliseconds(10000), 1, 3);
  std::vector<int> waiting;
  for (uint32_t i = 0; i < 3; ++i) {
    waiting.push_back(Open());
    ASSERT_TRUE(SendAll(waiting.back(), Frame(kWait, i, "a")));
  }
  ASSERT_TRUE(WaitingBecomes(3));
  const int fresh = Open();  // a 4th: one waiting connection goes, not the new one
  ASSERT_TRUE(SendAll(fresh, Frame(kEcho, 9, "in")));
  EXPECT_EQ(Reply(fresh, 9, kEcho), "re:in");
  EXPECT_EQ(server_->waiting_requests(), 2u);
  int closed = 0;
  for (int fd : waiting) closed += ClosedWithin(fd, milliseconds(50)) ? 1 : 0;
  EXPECT_EQ(closed, 1);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
