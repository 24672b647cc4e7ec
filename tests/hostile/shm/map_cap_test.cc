// Issue 14, point 3: map announcements of huge sealed sparse memfds (64 TiB each, from 40
// connections) filled the target's address space; creating the next connection's thread
// then threw and the process aborted. The target now caps what it maps per connection and
// in total (MC_SHM_MAX_MAP_PER_CONN_GB / MC_SHM_MAX_MAP_TOTAL_GB), refuses announcements
// over the cap with a clear status and goes on serving.
#include <gtest/gtest.h>

#include "shm_hostile.h"

namespace shm_hostile {
namespace {

// The defaults; MC_SHM_HOSTILE_NO_CAPS=1 lifts the caps to show what they prevent.
EngineOptions CapTestOptions() {
  EngineOptions o = Target::Default();
  if (const char* v = std::getenv("MC_SHM_HOSTILE_NO_CAPS"); v && *v == '1') {
    o.shm_max_map_per_conn = o.shm_max_map_total = UINT64_MAX;
  }
  return o;
}

TEST(ShmMapCap, FortyHugeSparseMemfdsAreRefusedAndALegitimatePeerStillTransfers) {
  Target t(CapTestOptions());
  ASSERT_TRUE(t.Start());
  constexpr uint64_t k64TiB = uint64_t{64} << 40;
  int huge = SealedMemfd(k64TiB);
  ASSERT_GE(huge, 0) << "memfd of 64 TiB: " << std::strerror(errno);
  std::vector<UniqueFd> conns;
  for (int i = 0; i < 40; ++i) {
    auto c = ConnectAndHello(t.path, 3000, "");
    ASSERT_TRUE(c.ok()) << "attacker connection " << i << ": " << c.status().ToString();
    MapReply mr;
    ASSERT_TRUE(Map(c->get(), {{0x100000000000ULL, k64TiB}}, {huge}, 1, &mr)) << i;
    EXPECT_EQ(mr.count, 0u) << "connection " << i << " got 64 TiB mapped";
    EXPECT_EQ(mr.status, kMapOverCap) << i;
    conns.push_back(std::move(*c));
  }
  ::close(huge);
  EXPECT_EQ(t.server->limits().maps_refused.load(), 40u);
  EXPECT_EQ(t.server->limits().mapped.load(), 0u);
  // The target still accepts, maps and copies for a legitimate peer.
  EXPECT_EQ(LegitimateTransfer(t), "");
}

// The total cap is shared by the connections and given back when a connection ends.
TEST(ShmMapCap, TotalCapIsSharedAndReleasedWhenAConnectionCloses) {
  EngineOptions o = Target::Default();
  o.shm_max_map_per_conn = 4 << 20;
  o.shm_max_map_total = 8 << 20;
  Target t(o);
  ASSERT_TRUE(t.Start());
  int four = SealedMemfd(4 << 20), five = SealedMemfd(5 << 20);
  ASSERT_GE(four, 0);
  ASSERT_GE(five, 0);
  auto a = ConnectAndHello(t.path, 3000, "");
  auto b = ConnectAndHello(t.path, 3000, "");
  auto c = ConnectAndHello(t.path, 3000, "");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  MapReply mr;
  ASSERT_TRUE(Map(a->get(), {{0x10000000, 5 << 20}}, {five}, 1, &mr));
  EXPECT_EQ(mr.status, kMapOverCap) << "5 MiB over a 4 MiB per-connection cap";
  ASSERT_TRUE(Map(a->get(), {{0x10000000, 4 << 20}}, {four}, 2, &mr));
  EXPECT_EQ(mr.count, 1u);
  ASSERT_TRUE(Map(b->get(), {{0x10000000, 4 << 20}}, {four}, 1, &mr));
  EXPECT_EQ(mr.count, 1u);
  ASSERT_TRUE(Map(c->get(), {{0x10000000, 4 << 20}}, {four}, 1, &mr));
  EXPECT_EQ(mr.count, 0u) << "a third 4 MiB passes the 8 MiB total";
  EXPECT_EQ(mr.status, kMapOverCap);
  EXPECT_EQ(t.server->limits().mapped.load(), uint64_t{8} << 20);
  // An empty announcement unmaps a's set; then c fits.
  ASSERT_TRUE(Map(a->get(), {}, {}, 3, &mr));
  EXPECT_EQ(mr.count, 0u);
  ASSERT_TRUE(Map(c->get(), {{0x10000000, 4 << 20}}, {four}, 2, &mr));
  EXPECT_EQ(mr.count, 1u);
  // Closing b gives its 4 MiB back.
  *b = UniqueFd();
  for (int i = 0; i < 200 && t.server->limits().mapped.load() != (4u << 20); ++i) {
    ::usleep(10000);
  }
  EXPECT_EQ(t.server->limits().mapped.load(), uint64_t{4} << 20);
  ::close(four);
  ::close(five);
}

// Descriptors of the wrong kind and shrinkable memfds are refused (never mapped).
TEST(ShmMapCap, WrongDescriptorsAreRefused) {
  Target t;
  ASSERT_TRUE(t.Start());
  auto c = ConnectAndHello(t.path, 3000, "");
  ASSERT_TRUE(c.ok());
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  int unsealed = ::memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_EQ(::ftruncate(unsealed, 1 << 20), 0);
  int sealed = SealedMemfd(1 << 20);
  MapReply mr;
  ASSERT_TRUE(Map(c->get(), {{0x10000000, 4096}}, {pipefd[0]}, 1, &mr));
  EXPECT_EQ(mr.status, kMapBadRange);
  ASSERT_TRUE(Map(c->get(), {{0x10000000, 4096}}, {unsealed}, 2, &mr));
  EXPECT_EQ(mr.status, kMapBadRange);
  ASSERT_TRUE(Map(c->get(), {{0x10000000, 2 << 20}}, {sealed}, 3, &mr));
  EXPECT_EQ(mr.status, kMapBadRange) << "range longer than its memfd";
  ASSERT_TRUE(Map(c->get(), {{0x10000000, 4096}, {0x20000000, 4096}}, {sealed}, 4, &mr));
  EXPECT_EQ(mr.status, kMapBadDescriptors);
  EXPECT_EQ(mr.count, 0u);
  ASSERT_TRUE(Map(c->get(), {{0x10000000, 1 << 20}}, {sealed}, 5, &mr));
  EXPECT_EQ(mr.count, 1u);
  for (int f : {pipefd[0], pipefd[1], unsealed, sealed}) ::close(f);
}

}  // namespace
}  // namespace shm_hostile
