#include "common/conn_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace mooncake {
namespace {

using namespace std::chrono_literals;

struct Listener {
  UniqueFd fd;
  uint16_t port = 0;
};

Listener Listen() {
  Listener l;
  auto fd = ListenTcpInRange(20000, 40000, 64, &l.port, "127.0.0.1");
  EXPECT_TRUE(fd.ok()) << fd.status().ToString();
  l.fd = std::move(fd).value();
  return l;
}

template <class Pred>
bool WaitFor(Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// The client reads until EOF; true if it came within 5 s.
bool SeesEof(int fd) {
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  for (;;) {
    ssize_t n = ::recv(fd, &c, 1, 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

TEST(ConnServer, ServesEachConnectionOnItsOwnThreadAndClosesItAfterwards) {
  std::atomic<int> served{0};
  ConnServer server("test", 16, [&](int fd) {
    char c = 0;
    if (::recv(fd, &c, 1, 0) == 1) (void)!::send(fd, &c, 1, MSG_NOSIGNAL);  // echo one byte
    served.fetch_add(1);
  });
  Listener l = Listen();
  ASSERT_TRUE(server.Start(std::move(l.fd)).ok());
  for (int i = 0; i < 3; ++i) {
    auto c = ConnectTcp("127.0.0.1", l.port, 2000);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    char x = static_cast<char>('a' + i), y = 0;
    ASSERT_EQ(::send(c->get(), &x, 1, MSG_NOSIGNAL), 1);
    ASSERT_EQ(::recv(c->get(), &y, 1, 0), 1);
    EXPECT_EQ(x, y);
    EXPECT_TRUE(SeesEof(c->get())) << "the server shuts a served connection down";
  }
  EXPECT_TRUE(WaitFor([&] { return server.active() == 0; }));
  EXPECT_EQ(server.accepted(), 3u);
  EXPECT_EQ(served.load(), 3);
  server.Stop();
  server.Stop();  // idempotent
}

TEST(ConnServer, StopEndsConnectionsThatAreStillBeingServed) {
  ConnServer server("test", 16, [](int fd) {
    char c;
    while (::recv(fd, &c, 1, 0) > 0) {
    }  // until the server shuts the socket down
  });
  Listener l = Listen();
  ASSERT_TRUE(server.Start(std::move(l.fd)).ok());
  std::vector<UniqueFd> clients;
  for (int i = 0; i < 4; ++i) {
    auto c = ConnectTcp("127.0.0.1", l.port, 2000);
    ASSERT_TRUE(c.ok());
    clients.push_back(std::move(c).value());
  }
  ASSERT_TRUE(WaitFor([&] { return server.active() == 4; }));
  server.Stop();  // must not hang: every serve thread returns and is joined
  EXPECT_EQ(server.active(), 0u);
  for (auto& c : clients) EXPECT_TRUE(SeesEof(c.get()));
}

TEST(ConnServer, RefusesConnectionsBeyondItsLimit) {
  std::atomic<bool> release{false};
  ConnServer server("test", 2, [&](int) {
    while (!release.load()) std::this_thread::sleep_for(1ms);
  });
  Listener l = Listen();
  ASSERT_TRUE(server.Start(std::move(l.fd)).ok());
  std::vector<UniqueFd> held;
  for (int i = 0; i < 2; ++i) {
    auto c = ConnectTcp("127.0.0.1", l.port, 2000);
    ASSERT_TRUE(c.ok());
    held.push_back(std::move(c).value());
  }
  ASSERT_TRUE(WaitFor([&] { return server.active() == 2; }));
  auto extra = ConnectTcp("127.0.0.1", l.port, 2000);
  ASSERT_TRUE(extra.ok());  // the kernel accepts; the server closes it at once
  EXPECT_TRUE(SeesEof(extra->get()));
  EXPECT_EQ(server.accepted(), 2u);
  release = true;
  EXPECT_TRUE(WaitFor([&] { return server.active() == 0; }));
}

TEST(ConnServer, SurvivesThreadCreationFailure) {
  std::atomic<int> served{0};
  ConnServer server("test", 16, [&](int) { served.fetch_add(1); });
  Listener l = Listen();
  ASSERT_TRUE(server.Start(std::move(l.fd)).ok());
  server.FailThreadCreationForTest(2);
  for (int i = 0; i < 2; ++i) {
    auto c = ConnectTcp("127.0.0.1", l.port, 2000);
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(SeesEof(c->get())) << "a connection without a thread is closed";
  }
  auto c = ConnectTcp("127.0.0.1", l.port, 2000);  // and serving goes on
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(SeesEof(c->get()));
  EXPECT_TRUE(WaitFor([&] { return served.load() == 1; }));
  EXPECT_EQ(server.counters().thread_failures, 2u);
}

// A server whose serve function marks a connection established once it reads one byte.
struct MarkingServer {
  std::atomic<int> served{0};
  ConnServer server;
  Listener l;
  explicit MarkingServer(ConnLimits limits)
      : server("test", limits, [this](int fd) {
          char c;
          if (::recv(fd, &c, 1, 0) != 1) return;
          ConnServer::MarkEstablished();
          served.fetch_add(1);
          while (::recv(fd, &c, 1, 0) > 0) {
          }
        }) {
    l = Listen();
    EXPECT_TRUE(server.Start(std::move(l.fd)).ok());
  }
  UniqueFd Connect(bool establish) {
    auto c = ConnectTcp("127.0.0.1", l.port, 2000);
    EXPECT_TRUE(c.ok());
    if (establish) {
      EXPECT_EQ(::send(c->get(), "x", 1, MSG_NOSIGNAL), 1);
    }
    return c.ok() ? std::move(c).value() : UniqueFd();
  }
};

TEST(ConnServer, ClosesConnectionsThatSendNoFirstFrameInTime) {
  MarkingServer s(ConnLimits{16, 0, 300});
  UniqueFd idle = s.Connect(false);
  UniqueFd busy = s.Connect(true);
  ASSERT_TRUE(WaitFor([&] { return s.served.load() == 1; }));
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(SeesEof(idle.get()));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(s.server.counters().deadline_closed, 1u);
  std::this_thread::sleep_for(500ms);  // the established one is never closed for idling
  EXPECT_EQ(s.server.active(), 1u);
}

TEST(ConnServer, AtTheCapUnestablishedConnectionsMakeRoomAndEstablishedOnesStay) {
  MarkingServer s(ConnLimits{4, 0, 60000});
  std::vector<UniqueFd> est, idle;
  for (int i = 0; i < 2; ++i) est.push_back(s.Connect(true));
  ASSERT_TRUE(WaitFor([&] { return s.served.load() == 2; }));
  for (int i = 0; i < 2; ++i) idle.push_back(s.Connect(false));
  ASSERT_TRUE(WaitFor([&] { return s.server.active() == 4; }));
  UniqueFd fresh = s.Connect(true);  // full: the oldest idle one is evicted for it
  ASSERT_TRUE(WaitFor([&] { return s.served.load() == 3; }));
  EXPECT_TRUE(SeesEof(idle[0].get()));
  EXPECT_EQ(s.server.counters().evicted, 1u);
  UniqueFd more = s.Connect(true);
  ASSERT_TRUE(WaitFor([&] { return s.served.load() == 4; }));
  EXPECT_TRUE(SeesEof(idle[1].get()));
  // All four are established now: the next is refused, none of them is closed.
  UniqueFd refused = s.Connect(true);
  EXPECT_TRUE(SeesEof(refused.get()));
  EXPECT_EQ(s.server.counters().refused_full, 1u);
  EXPECT_EQ(s.served.load(), 4);
}

TEST(ConnServer, OneAddressCannotTakeEverySlot) {
  MarkingServer s(ConnLimits{16, 3, 0});
  std::vector<UniqueFd> held;
  for (int i = 0; i < 3; ++i) held.push_back(s.Connect(true));
  ASSERT_TRUE(WaitFor([&] { return s.served.load() == 3; }));
  UniqueFd fourth = s.Connect(true);
  EXPECT_TRUE(SeesEof(fourth.get()));
  EXPECT_EQ(s.server.counters().refused_address, 1u);
  EXPECT_EQ(s.server.active(), 3u);
}

TEST(ConnServer, WaitForBytesNeedsTheWholeFrame) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  UniqueFd a(fds[0]), b(fds[1]);
  ASSERT_EQ(::send(a.get(), "abc", 3, 0), 3);
  EXPECT_FALSE(ConnServer::WaitForBytes(b.get(), 4, 100));
  ASSERT_EQ(::send(a.get(), "d", 1, 0), 1);
  EXPECT_TRUE(ConnServer::WaitForBytes(b.get(), 4, 100));
  char buf[4];
  EXPECT_EQ(::recv(b.get(), buf, 4, 0), 4) << "the bytes are still there";
  // A partial frame and then EOF: false at once, not at the deadline.
  ASSERT_EQ(::send(a.get(), "ab", 2, 0), 2);
  ::shutdown(a.get(), SHUT_WR);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(ConnServer::WaitForBytes(b.get(), 4, 3000));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
}

}  // namespace
}  // namespace mooncake
