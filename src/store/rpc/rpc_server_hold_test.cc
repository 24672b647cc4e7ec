// RpcServer's held replies (rpc_server.h: Options::hold_position, ReleaseHeld, FailHeld,
// ResetHeld): a reply waits for its log position to be durable, off the loop thread, its
// connection kept in order; the inline and the worker path; FailHeld's kNotLeader; closes
// while held; and a race of releases against replies being parked.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <optional>
#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "master.pb.h"
#include "store/rpc/rpc_client.h"
#include "store/rpc/rpc_server.h"
#include "store/testing/rpc_frames.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_rpc;  // NOLINT
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Methods of the test's handler (numbers only: the server does not care what they mean).
constexpr uint16_t kEcho = 1;   // inline; replies "re:" + payload
constexpr uint16_t kBig = 2;    // inline; payload "<pos>:<bytes>:<char>": that many chars
constexpr uint16_t kFails = 3;  // inline; kBadRequest (hold_position answers 0 for it)
constexpr uint16_t kSlow = 11;  // on the worker; replies "re:" + payload

// The handler's position for its reply, read by hold_position on the same thread: the
// payload's leading number, else g_default_pos (an RpcClient's protobuf payload).
thread_local uint64_t t_pos = 0;
thread_local bool t_handled = false;
std::atomic<uint64_t> g_default_pos{0};
std::array<std::atomic<int>, 16> g_calls{};
std::atomic<int> g_wrong_thread{0};

RpcStatus Handle(uint16_t method, const char* data, size_t n, std::string* out) {
  ++g_calls[method % g_calls.size()];
  const std::string p(data, n);
  t_handled = true;
  t_pos = !p.empty() && p[0] >= '0' && p[0] <= '9' ? std::strtoull(p.c_str(), nullptr, 10)
                                                    : g_default_pos.load();
  switch (method) {
    case kEcho:
    case kSlow:
      if (p.empty() || p[0] < '0' || p[0] > '9') return RpcStatus::kOk;  // a PingResponse
      out->append("re:" + p);
      return RpcStatus::kOk;
    case kBig: {
      const size_t colon = p.find(':');
      char* end = nullptr;
      const size_t bytes = std::strtoull(p.c_str() + colon + 1, &end, 10);
      out->append(bytes, end[1]);
      return RpcStatus::kOk;
    }
    default:
      out->append("refused");
      return RpcStatus::kBadRequest;
  }
}

uint64_t HoldPosition(uint16_t, RpcStatus status) {
  if (!t_handled) ++g_wrong_thread;  // not right after a handler on this thread
  t_handled = false;
  return status == RpcStatus::kOk ? t_pos : 0;
}

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

template <class Pred>
bool WaitFor(Pred pred, milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (!pred()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

// Expects the next reply on fd to be (seq, status, payload) within 2 s.
void ExpectReply(int fd, uint32_t seq, RpcStatus status, const std::string& payload,
                 uint16_t method = kEcho) {
  auto r = ReadReply(fd, milliseconds(2000));
  ASSERT_TRUE(r.has_value()) << "no reply for seq " << seq;
  EXPECT_EQ(r->header.seq, seq);
  EXPECT_EQ(r->header.method, method);
  EXPECT_EQ(r->header.status, static_cast<uint16_t>(status)) << r->payload;
  EXPECT_EQ(r->payload, payload);
}

// True when nothing arrives on fd within `d`.
bool Silent(int fd, milliseconds d = milliseconds(200)) {
  return ReadUpTo(fd, 1, d).empty();
}

class HoldTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto& c : g_calls) c = 0;
    g_default_pos = 0;
    g_wrong_thread = 0;
  }
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
    if (server_) server_->Stop();
    EXPECT_EQ(g_wrong_thread.load(), 0) << "hold_position not called right after a handler";
  }
  void Start(int threads = 1) {
    RpcServer::Options o;
    o.threads = threads;
    o.slow = [](uint16_t m) { return m == kSlow; };
    o.hold_position = &HoldPosition;
    server_ = std::make_unique<RpcServer>(o, &Handle);
    ASSERT_TRUE(server_->Start("127.0.0.1", 0).ok());
  }
  int Open() {
    const int fd = Connect(server_->port());
    EXPECT_GE(fd, 0);
    fds_.push_back(fd);
    return fd;
  }
  std::unique_ptr<RpcServer> server_;
  std::vector<int> fds_;
};

TEST_F(HoldTest, AHeldReplyIsSentOnlyOnceItsPositionIsDurable) {
  Start();
  const int fd = Open();
  ASSERT_TRUE(SendAll(fd, Frame(kEcho, 7, "5:a")));
  EXPECT_TRUE(Silent(fd));
  EXPECT_EQ(g_calls[kEcho].load(), 1);  // handled: only its reply waits
  EXPECT_EQ(server_->held_replies(), 1u);
  server_->ReleaseHeld(4);  // not yet
  EXPECT_TRUE(Silent(fd));
  EXPECT_EQ(server_->held_replies(), 1u);
  server_->ReleaseHeld(5);
  ExpectReply(fd, 7, RpcStatus::kOk, "re:5:a");
  EXPECT_EQ(server_->held_replies(), 0u);
  // The connection serves again, unheld (position 0).
  ASSERT_TRUE(SendAll(fd, Frame(kEcho, 8, "0:b")));
  ExpectReply(fd, 8, RpcStatus::kOk, "re:0:b");
}

TEST_F(HoldTest, ASmallerDurableValueIsIgnoredAndDurablePositionsAreNotHeld) {
  Start();
  const int fd = Open();
  server_->ReleaseHeld(10);
  server_->ReleaseHeld(3);  // ignored: durable stays 10
  ASSERT_TRUE(SendAll(fd, Frame(kEcho, 1, "10:a")));
  ExpectReply(fd, 1, RpcStatus::kOk, "re:10:a");
  ASSERT_TRUE(SendAll(fd, Frame(kEcho, 2, "5:b")));
  ExpectReply(fd, 2, RpcStatus::kOk, "re:5:b");
  EXPECT_EQ(server_->held_replies(), 0u);
  ASSERT_TRUE(SendAll(fd, Frame(kEcho, 3, "12:c")));
  EXPECT_TRUE(Silent(fd));
  server_->ReleaseHeld(11);
  EXPECT_TRUE(Silent(fd));
  server_->ReleaseHeld(9);  // smaller: nothing
  EXPECT_TRUE(Silent(fd));
  EXPECT_EQ(server_->held_replies(), 1u);
  server_->ReleaseHeld(20);
  ExpectReply(fd, 3, RpcStatus::kOk, "re:12:c");
  // A handler's failure (hold_position answers 0 for it) is never held.
  ASSERT_TRUE(SendAll(fd, Frame(kFails, 4, "30:d")));
  ExpectReply(fd, 4, RpcStatus::kBadRequest, "refused", kFails);
}

TEST_F(HoldTest, PipelinedRequestsKeepTheirOrderAndWaitBehindAHeldReply) {
  Start();
  const int fd = Open();
  ASSERT_TRUE(SendAll(fd, Frame(kEcho, 1, "0:a") + Frame(kEcho, 2, "3:b") +
                              Frame(kEcho, 3, "0:c") + Frame(kEcho, 4, "0:d")));
  ExpectReply(fd, 1, RpcStatus::kOk, "re:0:a");  // before the held one
  EXPECT_TRUE(Silent(fd, milliseconds(300)));
  EXPECT_EQ(g_calls[kEcho].load(), 2) << "a request after the held one was handled";
  server_->ReleaseHeld(3);
  ExpectReply(fd, 2, RpcStatus::kOk, "re:3:b");
  ExpectReply(fd, 3, RpcStatus::kOk, "re:0:c");
  ExpectReply(fd, 4, RpcStatus::kOk, "re:0:d");
  EXPECT_EQ(g_calls[kEcho].load(), 4);
}

TEST_F(HoldTest, OtherConnectionsAreServedWhileOneIsHeld) {
  Start(1);  // one loop: the held connection shares it with the others
  const int a = Open();
  const int b = Open();
  ASSERT_TRUE(SendAll(a, Frame(kEcho, 1, "5:a")));
  ASSERT_TRUE(WaitFor([&] { return server_->held_replies() == 1; }, milliseconds(2000)));
  for (uint32_t i = 0; i < 20; ++i) {
    ASSERT_TRUE(SendAll(b, Frame(kEcho, 100 + i, "0:x")));
    ExpectReply(b, 100 + i, RpcStatus::kOk, "re:0:x");
  }
  // An RpcClient too.
  RpcClient client("127.0.0.1:" + std::to_string(server_->port()));
  rpc::PingRequest q;
  q.set_client_id("c");
  rpc::PingResponse r;
  EXPECT_TRUE(client.Call(MasterMethod::kPing, q, &r, milliseconds(2000)).ok());
  // b held at 2 beside a at 5: releasing 2 sends b's only.
  ASSERT_TRUE(SendAll(b, Frame(kEcho, 200, "2:y")));
  ASSERT_TRUE(WaitFor([&] { return server_->held_replies() == 2; }, milliseconds(2000)));
  server_->ReleaseHeld(2);
  ExpectReply(b, 200, RpcStatus::kOk, "re:2:y");
  EXPECT_TRUE(Silent(a));
  server_->ReleaseHeld(5);
  ExpectReply(a, 1, RpcStatus::kOk, "re:5:a");
}

TEST_F(HoldTest, FailHeldAnswersNotLeaderUntilResetHeld) {
  Start(2);
  server_->ReleaseHeld(2);
  const int a = Open();
  const int b = Open();
  ASSERT_TRUE(SendAll(a, Frame(kEcho, 11, "5:a")));
  ASSERT_TRUE(SendAll(b, Frame(kSlow, 12, "6:b")));
  ASSERT_TRUE(WaitFor([&] { return server_->held_replies() == 2; }, milliseconds(2000)));
  server_->FailHeld("lost the lease");
  EXPECT_EQ(server_->held_replies(), 0u);
  ExpectReply(a, 11, RpcStatus::kNotLeader, "lost the lease");
  ExpectReply(b, 12, RpcStatus::kNotLeader, "lost the lease", kSlow);
  // From now on: what would be held fails at once (both paths); what is durable, or not
  // held at all, goes as it is.
  ASSERT_TRUE(SendAll(a, Frame(kEcho, 13, "7:c")));
  ExpectReply(a, 13, RpcStatus::kNotLeader, "lost the lease");
  ASSERT_TRUE(SendAll(b, Frame(kSlow, 14, "8:d")));
  ExpectReply(b, 14, RpcStatus::kNotLeader, "lost the lease", kSlow);
  ASSERT_TRUE(SendAll(a, Frame(kEcho, 15, "0:e")));
  ExpectReply(a, 15, RpcStatus::kOk, "re:0:e");
  ASSERT_TRUE(SendAll(a, Frame(kEcho, 16, "2:f")));
  ExpectReply(a, 16, RpcStatus::kOk, "re:2:f");
  EXPECT_EQ(server_->held_replies(), 0u);
  // The client's side: a failed call, never an OK.
  g_default_pos = 9;
  RpcClient client("127.0.0.1:" + std::to_string(server_->port()));
  rpc::PingRequest q;
  q.set_client_id("c");
  rpc::PingResponse r;
  Status s = client.Call(MasterMethod::kPing, q, &r, milliseconds(2000));
  EXPECT_TRUE(IsNotLeader(s)) << s.ToString();
  EXPECT_NE(s.ToString().find("lost the lease"), std::string::npos) << s.ToString();
  g_default_pos = 0;
  // A new log from 0: held again, released by its own positions.
  server_->ResetHeld(0);
  ASSERT_TRUE(SendAll(a, Frame(kEcho, 17, "1:g")));
  EXPECT_TRUE(Silent(a));
  EXPECT_EQ(server_->held_replies(), 1u);
  server_->ReleaseHeld(1);
  ExpectReply(a, 17, RpcStatus::kOk, "re:1:g");
}

TEST_F(HoldTest, ResetHeldFailsRepliesStillHeldForTheOldLog) {
  Start();
  const int a = Open();
  ASSERT_TRUE(SendAll(a, Frame(kEcho, 1, "5:a")));
  ASSERT_TRUE(WaitFor([&] { return server_->held_replies() == 1; }, milliseconds(2000)));
  server_->ResetHeld(0);
  auto r = ReadReply(a, milliseconds(2000));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->header.seq, 1u);
  EXPECT_EQ(r->header.status, static_cast<uint16_t>(RpcStatus::kNotLeader));
  EXPECT_EQ(server_->held_replies(), 0u);
}

TEST_F(HoldTest, TheWorkerPathHoldsAndReleases) {
  Start(1);
  const int a = Open();
  const int b = Open();
  // The slow method's reply held, and an echo pipelined behind it not handled meanwhile.
  ASSERT_TRUE(SendAll(a, Frame(kSlow, 1, "4:w") + Frame(kEcho, 2, "0:n")));
  ASSERT_TRUE(WaitFor([&] { return server_->held_replies() == 1; }, milliseconds(2000)));
  EXPECT_EQ(g_calls[kSlow].load(), 1);
  EXPECT_TRUE(Silent(a));
  EXPECT_EQ(g_calls[kEcho].load(), 0);
  ASSERT_TRUE(SendAll(b, Frame(kEcho, 3, "0:o")));  // the loop is free
  ExpectReply(b, 3, RpcStatus::kOk, "re:0:o");
  server_->ReleaseHeld(4);
  ExpectReply(a, 1, RpcStatus::kOk, "re:4:w", kSlow);
  ExpectReply(a, 2, RpcStatus::kOk, "re:0:n");
  // Durable already: the worker's reply goes at once.
  ASSERT_TRUE(SendAll(a, Frame(kSlow, 4, "3:x")));
  ExpectReply(a, 4, RpcStatus::kOk, "re:3:x", kSlow);
}

TEST_F(HoldTest, AConnectionClosedWhileHeldLosesItsReplyAndTheServerGoesOn) {
  Start(1);
  const linger reset{1, 0};  // close with RST: the server sees the connection fail at once
  // Inline and worker path, each closed while held.
  for (uint16_t method : {kEcho, kSlow}) {
    const int a = Connect(server_->port());
    ASSERT_GE(a, 0);
    ASSERT_TRUE(SendAll(a, Frame(method, 1, "5:a")));
    ASSERT_TRUE(WaitFor([&] { return server_->held_replies() == 1; }, milliseconds(2000)));
    ASSERT_EQ(::setsockopt(a, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset)), 0);
    const size_t open = server_->open_connections();
    ::close(a);
    ASSERT_TRUE(
        WaitFor([&] { return server_->open_connections() == open - 1; }, milliseconds(2000)))
        << "method " << method << ": " << server_->open_connections() << " open";
    // A new connection, likely on the same fd, held at a later position: the old reply
    // must not reach it.
    const int b = Open();
    ASSERT_TRUE(SendAll(b, Frame(kEcho, 2, "9:b")));
    ASSERT_TRUE(WaitFor([&] { return server_->held_replies() == 2; }, milliseconds(2000)));
    server_->ReleaseHeld(5);
    EXPECT_TRUE(Silent(b));
    server_->ReleaseHeld(9);
    ExpectReply(b, 2, RpcStatus::kOk, "re:9:b");
    ASSERT_TRUE(SendAll(b, Frame(kEcho, 3, "0:c")));
    ExpectReply(b, 3, RpcStatus::kOk, "re:0:c");
    EXPECT_EQ(server_->held_replies(), 0u);
    server_->ResetHeld(0);
  }
  // Closed gently (FIN) while held: the reply is sent to it at release, then it closes.
  const int c = Connect(server_->port());
  ASSERT_TRUE(SendAll(c, Frame(kEcho, 4, "1:d")));
  ASSERT_TRUE(WaitFor([&] { return server_->held_replies() == 1; }, milliseconds(2000)));
  ::close(c);
  server_->ReleaseHeld(1);
  const int d = Open();
  ASSERT_TRUE(SendAll(d, Frame(kEcho, 5, "0:e")));
  ExpectReply(d, 5, RpcStatus::kOk, "re:0:e");
}

TEST_F(HoldTest, StopDropsHeldReplies) {
  Start(2);
  const int a = Open();
  const int b = Open();
  ASSERT_TRUE(SendAll(a, Frame(kEcho, 1, "5:a")));
  ASSERT_TRUE(SendAll(b, Frame(kSlow, 2, "6:b")));
  ASSERT_TRUE(WaitFor([&] { return server_->held_replies() == 2; }, milliseconds(2000)));
  server_->Stop();
  EXPECT_EQ(server_->held_replies(), 0u);
  EXPECT_TRUE(ClosedWithin(a, milliseconds(2000)));
  EXPECT_TRUE(ClosedWithin(b, milliseconds(2000)));
  server_->ReleaseHeld(10);  // nothing left, no loop to deliver to
  server_->FailHeld("gone");
  server_->ResetHeld(0);
}

// A reply that comes back from the worker (or a release) while replies of earlier requests
// of its connection are still unsent goes after them: none of their bytes are lost.
TEST_F(HoldTest, AReplyTakenBackKeepsTheUnsentRepliesBeforeIt) {
  Start(1);
  const int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  fds_.push_back(fd);
  const int small = 16 << 10;
  ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
  constexpr int kRounds = 12;
  constexpr size_t kBytes = 700 << 10;
  std::string requests;
  for (int i = 0; i < kRounds; ++i) {
    const char ch = static_cast<char>('a' + i);
    requests += Frame(kBig, 2 * i, "0:" + std::to_string(kBytes) + ":" + ch);
    // Alternately the worker's reply and a held inline one (released by `releaser`).
    requests += i % 2 ? Frame(kSlow, 2 * i + 1, "0:s")
                      : Frame(kEcho, 2 * i + 1, std::to_string(i + 1) + ":h");
  }
  std::atomic<bool> done{false};
  std::thread releaser([&] {
    for (uint64_t v = 1; !done.load(); ++v) {
      server_->ReleaseHeld(v);
      std::this_thread::sleep_for(milliseconds(10));
    }
  });
  std::thread sender([&] { SendAll(fd, requests); });
  std::this_thread::sleep_for(milliseconds(200));  // the socket fills, the server's out too
  for (int i = 0; i < kRounds; ++i) {
    // Slowly: the server's sends keep hitting a full socket.
    auto r = ReadReply(fd, milliseconds(5000));
    const bool big_ok = r && r->header.seq == static_cast<uint32_t>(2 * i) &&
                        r->payload == std::string(kBytes, static_cast<char>('a' + i));
    auto s = big_ok ? ReadReply(fd, milliseconds(5000)) : std::nullopt;
    const bool small_ok =
        s && s->header.seq == static_cast<uint32_t>(2 * i + 1) &&
        s->payload == (i % 2 ? "re:0:s" : "re:" + std::to_string(i + 1) + ":h");
    if (!big_ok || !small_ok) {
      ADD_FAILURE() << "round " << i << ": the " << (big_ok ? "small" : "large")
                    << " reply is missing or wrong (bytes lost from the connection's stream)";
      ::shutdown(fd, SHUT_RDWR);  // the sender stops
      break;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  done = true;
  releaser.join();
  sender.join();
}

// Releases from several threads, with growing values, race replies being parked: every reply
// arrives (a bounded wait: the test fails rather than hangs), none is stranded.
TEST_F(HoldTest, ReleasesRacingParkedRepliesStrandNone) {
  Start(2);
  std::atomic<uint64_t> counter{0};
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::atomic<int> replies{0};
  std::vector<std::thread> releasers;
  for (int t = 0; t < 3; ++t) {
    releasers.emplace_back([&, t] {
      while (!done.load()) {
        server_->ReleaseHeld(counter.load());
        if (t == 0) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(50 * t));
        }
      }
    });
  }
  constexpr int kClients = 4;
  constexpr int kCalls = 300;
  std::vector<std::thread> clients;
  for (int t = 0; t < kClients; ++t) {
    clients.emplace_back([&, t] {
      const int fd = Connect(server_->port());
      if (fd < 0) {
        ++failures;
        return;
      }
      for (int i = 0; i < kCalls && failures.load() == 0; ++i) {
        // Two pipelined now and then; every fifth on the worker.
        const int n = i % 7 == 0 ? 2 : 1;
        std::string bytes;
        std::vector<std::string> want;
        for (int k = 0; k < n; ++k) {
          const uint64_t pos = ++counter;
          const std::string p = std::to_string(pos) + ":" + std::to_string(t);
          bytes += Frame((i + k) % 5 == 0 ? kSlow : kEcho, static_cast<uint32_t>(2 * i + k), p);
          want.push_back("re:" + p);
        }
        if (!SendAll(fd, bytes)) {
          ++failures;
          break;
        }
        for (int k = 0; k < n; ++k) {
          auto r = ReadReply(fd, milliseconds(5000));
          if (!r || r->header.seq != static_cast<uint32_t>(2 * i + k) ||
              r->payload != want[k] || r->header.status != 0) {
            ADD_FAILURE() << "client " << t << " call " << i << ": "
                          << (r ? "wrong reply " + r->payload : std::string("no reply"));
            ++failures;
            break;
          }
          ++replies;
        }
      }
      ::close(fd);
    });
  }
  for (auto& c : clients) c.join();
  done = true;
  for (auto& r : releasers) r.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(replies.load(), kClients * kCalls);
  EXPECT_EQ(server_->held_replies(), 0u);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
