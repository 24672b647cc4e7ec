// Issue 14, point 4: a same-host request header sent one byte per message, each message
// carrying 253 passed descriptors, made the target hold them all until the header was
// complete: six connections pinned all 20,000 of its descriptors and legitimate peers
// failed. Now descriptors are taken only with a map message's header, at most 250 before a
// header is complete and at most a quarter of RLIMIT_NOFILE held by all connections at once;
// a connection over a bound is closed at once. Run with a lowered RLIMIT_NOFILE.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <thread>

#include "shm_hostile.h"

namespace shm_hostile {
namespace {

class ShmFdLimit : public ::testing::Test {
 protected:
  static constexpr rlim_t kLimit = 1024;
  void SetUp() override {
    ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved_), 0);
    rlimit low = saved_;
    low.rlim_cur = std::min(saved_.rlim_cur, kLimit);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
    memfd_ = SealedMemfd(1 << 20);
    ASSERT_GE(memfd_, 0);
  }
  void TearDown() override {
    if (memfd_ >= 0) ::close(memfd_);
    ::setrlimit(RLIMIT_NOFILE, &saved_);
  }
  // Sends `h` one byte per message with `per_message` copies of memfd_ attached to each;
  // returns the number of bytes the target took before it closed the connection.
  size_t Drip(int fd, const RequestHeader& h, size_t per_message) {
    std::vector<int> fds(per_message, memfd_);
    const auto* p = reinterpret_cast<const uint8_t*>(&h);
    size_t sent = 0;
    for (; sent < sizeof(h); ++sent) {
      if (SendWithFds(fd, p + sent, 1, fds) != 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return sent;
  }
  rlimit saved_{};
  int memfd_ = -1;
};

TEST_F(ShmFdLimit, OneBytePerMessageWith253DescriptorsEachIsCutOff) {
  Target t;
  ASSERT_TRUE(t.Start());
  const int before = OpenFdCount();
  RequestHeader h;  // a request header: descriptors have no business here at all
  h.count = 1;
  RequestHeader m;  // a map header, 250 descriptors per byte: the second byte is too many
  m.magic = kMapMagic;
  m.count = 1;
  std::vector<UniqueFd> conns;
  for (int i = 0; i < 12; ++i) {
    auto c = ConnectAndHello(t.path, 3000, "");
    ASSERT_TRUE(c.ok()) << "attacker " << i << ": " << c.status().ToString();
    Drip(c->get(), i < 6 ? h : m, i < 6 ? 253 : 250);
    conns.push_back(std::move(*c));
  }
  // While the attackers still hold their connections: few descriptors in use, and a
  // legitimate peer is served.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  int during = OpenFdCount();
  std::printf("[shm fd limit] open descriptors: %d before, %d with 12 attacking connections "
              "(RLIMIT_NOFILE %d)\n", before, during, static_cast<int>(kLimit));
  EXPECT_LE(during, before + 3 * 12 + 8);
  EXPECT_EQ(LegitimateTransfer(t), "");
  for (size_t i = 0; i < conns.size(); ++i) {
    EXPECT_TRUE(PeerClosed(conns[i].get(), 3000)) << "attacker " << i << " not closed";
  }
  EXPECT_GE(t.server->limits().dropped_for_fds.load(), 12u);
}

// Connections that each stop after one byte with 250 descriptors (the most a header may
// bring) share one budget: a quarter of RLIMIT_NOFILE. Descriptors over it are closed at
// once (that announcement is refused; the connection stays); the target keeps descriptors
// for legitimate peers.
TEST_F(ShmFdLimit, HoldersOfIncompleteHeadersShareOneBudget) {
  Target t;
  ASSERT_TRUE(t.Start());
  const int before = OpenFdCount();
  RequestHeader m;
  m.magic = kMapMagic;
  m.count = 250;
  std::vector<UniqueFd> conns;
  int closed = 0;
  for (int i = 0; i < 8; ++i) {
    auto c = ConnectAndHello(t.path, 3000, "");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    std::vector<int> fds(250, memfd_);
    ASSERT_EQ(SendWithFds(c->get(), &m, 1, fds), 1);
    if (PeerClosed(c->get(), 300)) ++closed;
    conns.push_back(std::move(*c));
  }
  int during = OpenFdCount();
  std::printf("[shm fd limit] 8 connections holding 250 descriptors each: %d open (%d before), "
              "%d connections closed, budget %zu\n", during, before, closed,
              t.server->limits().max_held_fds);
  EXPECT_LE(static_cast<size_t>(during), before + t.server->limits().max_held_fds + 3 * 8 + 8);
  EXPECT_EQ(LegitimateTransfer(t), "");
}

}  // namespace
}  // namespace shm_hostile
