// Unit tests for OffsetAllocator (src/store/offset_allocator.h): alignment, best fit,
// exhaustion, refusals, coalescing, and a randomized run against a shadow model.
#include "store/offset_allocator.h"
#include "store/master_records.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <vector>

namespace mooncake {
namespace store {
namespace {

TEST(OffsetAllocatorTest, CapacityIsRoundedDownToAlignment) {
  OffsetAllocator a(1000, 64);
  EXPECT_EQ(a.capacity(), 960u);
  EXPECT_EQ(a.largest_free(), 960u);
  EXPECT_EQ(a.allocated(), 0u);
  OffsetAllocator tiny(63, 64);
  EXPECT_EQ(tiny.capacity(), 0u);
  EXPECT_EQ(tiny.largest_free(), 0u);
  EXPECT_FALSE(tiny.Allocate(1).has_value());
}

TEST(OffsetAllocatorTest, SizesAreRoundedUpToAlignmentAndOffsetsStayAligned) {
  OffsetAllocator a(4096, 64);
  auto x = a.Allocate(1);
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(a.allocated(), 64u);
  auto y = a.Allocate(65);
  ASSERT_TRUE(y.has_value());
  EXPECT_EQ(*y, 64u);
  EXPECT_EQ(a.allocated(), 64u + 128u);
  auto z = a.Allocate(64);
  ASSERT_TRUE(z.has_value());
  EXPECT_EQ(*z, 192u);
  EXPECT_EQ(a.allocated(), 256u);
  EXPECT_EQ(a.live_allocations(), 3u);
  for (uint64_t off : {*x, *y, *z}) EXPECT_EQ(off % 64, 0u);

  OffsetAllocator b(1 << 20, 4096);
  for (int i = 1; i < 20; ++i) {
    auto o = b.Allocate(static_cast<uint64_t>(i) * 1000);
    ASSERT_TRUE(o.has_value());
    EXPECT_EQ(*o % 4096, 0u) << i;
  }
}

TEST(OffsetAllocatorTest, SizeZeroIsRefused) {
  OffsetAllocator a(4096);
  EXPECT_FALSE(a.Allocate(0).has_value());
  EXPECT_EQ(a.allocated(), 0u);
  EXPECT_EQ(a.live_allocations(), 0u);
}

TEST(OffsetAllocatorTest, TooLargeIsRefused) {
  OffsetAllocator a(4096);
  EXPECT_FALSE(a.Allocate(4097).has_value());
  EXPECT_FALSE(a.Allocate(UINT64_MAX).has_value());
  EXPECT_FALSE(a.Allocate(UINT64_MAX - 10).has_value());
  EXPECT_EQ(a.allocated(), 0u);
  auto all = a.Allocate(4096);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(*all, 0u);
}

TEST(OffsetAllocatorTest, ExhaustionReturnsNullopt) {
  OffsetAllocator a(1024, 64);
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(a.Allocate(64).has_value()) << i;
  EXPECT_EQ(a.allocated(), 1024u);
  EXPECT_EQ(a.largest_free(), 0u);
  EXPECT_FALSE(a.Allocate(1).has_value());
  EXPECT_EQ(a.allocated(), 1024u);
  EXPECT_EQ(a.live_allocations(), 16u);
}

TEST(OffsetAllocatorTest, BestFitPicksTheSmallestRangeThatFits) {
  // Layout after frees: [0,256) free, [256,320) used, [320,448) free, [448,512) used,
  // [512,1024) free. A 100-byte request (128 rounded) fits exactly in [320,448).
  OffsetAllocator a(1024, 64);
  auto r0 = a.Allocate(256);
  auto r1 = a.Allocate(64);
  auto r2 = a.Allocate(128);
  auto r3 = a.Allocate(64);
  ASSERT_TRUE(r0 && r1 && r2 && r3);
  EXPECT_EQ(*r0, 0u);
  EXPECT_EQ(*r1, 256u);
  EXPECT_EQ(*r2, 320u);
  EXPECT_EQ(*r3, 448u);
  ASSERT_TRUE(a.Free(*r0));
  ASSERT_TRUE(a.Free(*r2));
  EXPECT_EQ(a.largest_free(), 512u);
  auto fit = a.Allocate(100);
  ASSERT_TRUE(fit.has_value());
  EXPECT_EQ(*fit, 320u);
  // 200 bytes (256 rounded): [0,256) is the smallest that fits, not the 512-byte tail.
  auto fit2 = a.Allocate(200);
  ASSERT_TRUE(fit2.has_value());
  EXPECT_EQ(*fit2, 0u);
  // 300 bytes: only the tail fits.
  auto fit3 = a.Allocate(300);
  ASSERT_TRUE(fit3.has_value());
  EXPECT_EQ(*fit3, 512u);
}

TEST(OffsetAllocatorTest, FreeOfUnknownOffsetOrTwiceIsRefused) {
  OffsetAllocator a(4096, 64);
  auto x = a.Allocate(128);
  auto y = a.Allocate(128);
  ASSERT_TRUE(x && y);
  EXPECT_FALSE(a.Free(4000));  // never allocated
  EXPECT_FALSE(a.Free(*x + 64));  // inside a live range, not its start
  EXPECT_EQ(a.allocated(), 256u);
  EXPECT_TRUE(a.Free(*x));
  EXPECT_EQ(a.allocated(), 128u);
  EXPECT_FALSE(a.Free(*x));  // double free
  EXPECT_EQ(a.allocated(), 128u);
  EXPECT_EQ(a.live_allocations(), 1u);
  // The state is intact: y is still live and the rest still allocatable.
  EXPECT_TRUE(a.Free(*y));
  EXPECT_EQ(a.largest_free(), 4096u);
  EXPECT_EQ(a.allocated(), 0u);
}

TEST(OffsetAllocatorTest, FreeingMiddleThenNeighboursCoalescesToFullCapacity) {
  OffsetAllocator a(64 * 5, 64);
  std::vector<uint64_t> r;
  for (int i = 0; i < 5; ++i) {
    auto o = a.Allocate(64);
    ASSERT_TRUE(o.has_value());
    r.push_back(*o);
  }
  EXPECT_EQ(a.largest_free(), 0u);
  ASSERT_TRUE(a.Free(r[2]));
  EXPECT_EQ(a.largest_free(), 64u);
  ASSERT_TRUE(a.Free(r[1]));  // merges with the free range after it
  EXPECT_EQ(a.largest_free(), 128u);
  ASSERT_TRUE(a.Free(r[3]));  // merges with the free range before it
  EXPECT_EQ(a.largest_free(), 192u);
  ASSERT_TRUE(a.Free(r[0]));
  EXPECT_EQ(a.largest_free(), 256u);
  ASSERT_TRUE(a.Free(r[4]));
  EXPECT_EQ(a.largest_free(), 320u);
  EXPECT_EQ(a.allocated(), 0u);
  EXPECT_EQ(a.live_allocations(), 0u);
  // One range again: the whole capacity can be taken in one allocation.
  auto all = a.Allocate(320);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(*all, 0u);
}

TEST(OffsetAllocatorTest, FreeMergesWithBothNeighboursAtOnce) {
  OffsetAllocator a(64 * 3, 64);
  auto r0 = a.Allocate(64), r1 = a.Allocate(64), r2 = a.Allocate(64);
  ASSERT_TRUE(r0 && r1 && r2);
  ASSERT_TRUE(a.Free(*r0));
  ASSERT_TRUE(a.Free(*r2));
  EXPECT_EQ(a.largest_free(), 64u);
  ASSERT_TRUE(a.Free(*r1));  // both sides free: one range
  EXPECT_EQ(a.largest_free(), 192u);
  EXPECT_TRUE(a.Allocate(192).has_value());
}

TEST(OffsetAllocatorTest, RandomizedAgainstShadowModel) {
  constexpr uint64_t kCapacity = 1 << 20;
  constexpr uint64_t kAlign = 64;
  OffsetAllocator a(kCapacity, kAlign);
  std::mt19937_64 rng(12345);
  std::map<uint64_t, uint64_t> live;  // offset -> rounded size
  uint64_t expected_allocated = 0;
  auto check_no_overlap = [&](uint64_t off, uint64_t size) {
    auto next = live.lower_bound(off);
    if (next != live.end()) {
      ASSERT_LE(off + size, next->first) << "overlaps the next range";
    }
    if (next != live.begin()) {
      auto prev = std::prev(next);
      ASSERT_LE(prev->first + prev->second, off) << "overlaps the previous range";
    }
  };
  int failed_allocs = 0;
  for (int step = 0; step < 20000; ++step) {
    const bool do_alloc = live.empty() || (rng() % 100) < 55;
    if (do_alloc) {
      // Mostly small, sometimes large.
      const uint64_t size = (rng() % 10 == 0) ? 1 + rng() % (64 << 10) : 1 + rng() % 4096;
      auto off = a.Allocate(size);
      const uint64_t rounded = (size + kAlign - 1) / kAlign * kAlign;
      if (!off) {
        ++failed_allocs;
        // Best fit: a refusal means no free range is large enough.
        ASSERT_LT(a.largest_free(), rounded);
        continue;
      }
      ASSERT_EQ(*off % kAlign, 0u);
      ASSERT_LE(*off + rounded, kCapacity);
      check_no_overlap(*off, rounded);
      if (HasFatalFailure()) return;
      live.emplace(*off, rounded);
      expected_allocated += rounded;
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      ASSERT_TRUE(a.Free(it->first));
      ASSERT_FALSE(a.Free(it->first + 1));
      expected_allocated -= it->second;
      live.erase(it);
    }
    ASSERT_EQ(a.allocated(), expected_allocated) << "step " << step;
    ASSERT_EQ(a.live_allocations(), live.size());
    ASSERT_LE(a.largest_free(), kCapacity - expected_allocated);
  }
  // Largest free range, computed from the model, matches.
  uint64_t largest = 0, cursor = 0;
  for (const auto& [off, size] : live) {
    largest = std::max(largest, off - cursor);
    cursor = off + size;
  }
  largest = std::max(largest, kCapacity - cursor);
  EXPECT_EQ(a.largest_free(), largest);
  for (const auto& [off, size] : live) ASSERT_TRUE(a.Free(off));
  EXPECT_EQ(a.allocated(), 0u);
  EXPECT_EQ(a.largest_free(), kCapacity);
  EXPECT_TRUE(a.Allocate(kCapacity).has_value());
  (void)failed_allocs;
}

}  // namespace
}  // namespace store
}  // namespace mooncake

// The master's compact record parts (master_records.h), which sit beside the allocator in
// every object record.
namespace {

using mooncake::store::ClientName;
using mooncake::store::ClientNames;
using mooncake::store::Placement;
using mooncake::store::Replicas;

TEST(MasterRecordsTest, ClientNamesAreSharedAndDroppedWithTheirLastReference) {
  ClientNames names;
  ClientName a = names.Get("0123456789abcdef0123456789abcdef");
  ClientName b = names.Get("0123456789abcdef0123456789abcdef");
  EXPECT_EQ(names.size(), 1u);
  EXPECT_TRUE(a == "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(&a.str(), &b.str());  // one copy of the id
  ClientName c = names.Get("other");
  EXPECT_EQ(names.size(), 2u);
  EXPECT_TRUE(c != a.str());
  ClientName moved = std::move(c);
  EXPECT_TRUE(c == "");  // a moved-from name is empty
  moved = a;             // the last reference to "other" goes
  EXPECT_EQ(names.size(), 1u);
  a = ClientName();
  b = ClientName();
  EXPECT_EQ(names.size(), 1u);  // `moved` still names it
  moved = ClientName();
  EXPECT_EQ(names.size(), 0u);
}

TEST(MasterRecordsTest, ReplicasKeepOneInlineAndGrowOnTheHeap) {
  Replicas r;
  EXPECT_TRUE(r.empty());
  for (uint64_t i = 0; i < 5; ++i) r.push_back(Placement{i, i * 100});
  ASSERT_EQ(r.size(), 5u);
  Replicas copy = r;
  r.erase(r.begin() + 1, r.begin() + 3);  // drops 1 and 2
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r.begin()[0].segment_id, 0u);
  EXPECT_EQ(r.begin()[1].segment_id, 3u);
  EXPECT_EQ(r.begin()[2].offset, 400u);
  ASSERT_EQ(copy.size(), 5u);
  EXPECT_EQ(copy.begin()[2].offset, 200u);
  Replicas moved = std::move(copy);
  EXPECT_EQ(moved.size(), 5u);
  EXPECT_TRUE(copy.empty());
  Replicas one;
  one.push_back(Placement{7, 8});
  Replicas one_moved = std::move(one);
  ASSERT_EQ(one_moved.size(), 1u);
  EXPECT_EQ(one_moved.begin()->offset, 8u);
  one_moved.erase(one_moved.begin());
  EXPECT_TRUE(one_moved.empty());
  moved = one_moved;
  EXPECT_TRUE(moved.empty());
}

}  // namespace
