// Idle sockets at the same-host server (issue 14 point 7, same-host part): connections that
// never say hello hold no slot past the first-frame deadline, and when one user fills its
// share of the slots with them, a legitimate peer still gets in at once (the oldest
// connection that never said hello makes room).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <chrono>
#include <cstddef>
#include <thread>

#include "shm_hostile.h"

namespace shm_hostile {
namespace {

int ConnectRaw(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, path.data(), path.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size());
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(ShmIdle, IdleConnectionsNeitherLockOutNorOutstayTheDeadline) {
  EngineOptions o = Target::Default();
  o.first_frame_timeout_ms = 1500;
  Target t(o);
  ASSERT_TRUE(t.Start());
  // More idle connections than one uid may hold (a quarter of 4096).
  const size_t kIdle = ShmServer::kMaxConnections / 4 + 64;
  std::vector<int> idle;
  for (size_t i = 0; i < kIdle; ++i) {
    int fd = ConnectRaw(t.path);
    ASSERT_GE(fd, 0) << "connect " << i << ": " << std::strerror(errno);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // all accepted
  auto start = std::chrono::steady_clock::now();
  auto c = ConnectAndHello(t.path, 3000, "");
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count();
  std::printf("[shm idle] hello with %zu idle connections open: %s after %.0f ms\n", kIdle,
              c.ok() ? "ok" : c.status().ToString().c_str(), ms);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_LT(ms, 1000);
  std::vector<uint32_t> st;
  ASSERT_TRUE(SendRequest(c->get(), {{t.buf.addr(), t.buf.addr(), 4096, 1, 0}}, 1));
  // (a WRITE from our own copy of the address: the target reads it from this process)
  ASSERT_TRUE(ReadReply(c->get(), 1, 1, &st));
  EXPECT_EQ(st[0], kOk);
  // Past the deadline every idle connection has been closed by the server.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  size_t closed = 0;
  for (int fd : idle) {
    char b;
    if (::recv(fd, &b, 1, MSG_DONTWAIT) == 0) ++closed;
    ::close(fd);
  }
  ConnCounters n = t.server->connections().counters();
  std::printf("[shm idle] closed by the server: %zu of %zu (deadline %lu, evicted %lu)\n", closed,
              kIdle, static_cast<unsigned long>(n.deadline_closed),
              static_cast<unsigned long>(n.evicted));
  EXPECT_EQ(closed, kIdle);
  EXPECT_GE(n.evicted, 1u);
  // The legitimate connection, established, is still served.
  ASSERT_TRUE(SendRequest(c->get(), {{t.buf.addr(), t.buf.addr(), 4096, 1, 0}}, 2));
  ASSERT_TRUE(ReadReply(c->get(), 1, 2, &st));
  EXPECT_EQ(st[0], kOk);
}

}  // namespace
}  // namespace shm_hostile
