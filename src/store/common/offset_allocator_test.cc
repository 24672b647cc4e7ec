// Unit tests for OffsetAllocator and AddressedAllocator (src/store/common/offset_allocator.h):
// alignment, fit, exhaustion, refusals, coalescing, and randomized runs against a shadow model.
#include "store/common/offset_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <vector>

namespace mooncake {
namespace store {
namespace {

// The offset of an allocation that must succeed.
uint64_t At(const std::optional<OffsetAllocation>& a) {
  EXPECT_TRUE(a.has_value());
  return a ? a->offset : UINT64_MAX;
}

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
  EXPECT_EQ(At(a.Allocate(1)), 0u);
  EXPECT_EQ(a.allocated(), 64u);
  EXPECT_EQ(At(a.Allocate(65)), 64u);
  EXPECT_EQ(a.allocated(), 64u + 128u);
  EXPECT_EQ(At(a.Allocate(64)), 192u);
  EXPECT_EQ(a.allocated(), 256u);
  EXPECT_EQ(a.live_allocations(), 3u);

  OffsetAllocator b(1 << 20, 4096);
  for (int i = 1; i < 20; ++i) {
    EXPECT_EQ(At(b.Allocate(static_cast<uint64_t>(i) * 1000)) % 4096, 0u) << i;
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
  EXPECT_EQ(At(a.Allocate(4096)), 0u);
}

TEST(OffsetAllocatorTest, ExhaustionReturnsNullopt) {
  OffsetAllocator a(1024, 64);
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(a.Allocate(64).has_value()) << i;
  EXPECT_EQ(a.allocated(), 1024u);
  EXPECT_EQ(a.largest_free(), 0u);
  EXPECT_EQ(a.free_ranges(), 0u);
  EXPECT_FALSE(a.Allocate(1).has_value());
  EXPECT_EQ(a.allocated(), 1024u);
  EXPECT_EQ(a.live_allocations(), 16u);
}

TEST(OffsetAllocatorTest, PicksARangeOfTheSmallestSizeClassThatFits) {
  // Layout after frees: [0,256) free, [256,320) used, [320,448) free, [448,512) used,
  // [512,1024) free. A 100-byte request (128 rounded) fits exactly in [320,448).
  OffsetAllocator a(1024, 64);
  auto r0 = a.Allocate(256);
  auto r1 = a.Allocate(64);
  auto r2 = a.Allocate(128);
  auto r3 = a.Allocate(64);
  ASSERT_TRUE(r0 && r1 && r2 && r3);
  EXPECT_EQ(r0->offset, 0u);
  EXPECT_EQ(r1->offset, 256u);
  EXPECT_EQ(r2->offset, 320u);
  EXPECT_EQ(r3->offset, 448u);
  ASSERT_TRUE(a.Free(*r0));
  ASSERT_TRUE(a.Free(*r2));
  EXPECT_EQ(a.largest_free(), 512u);
  EXPECT_EQ(a.free_ranges(), 3u);
  EXPECT_EQ(At(a.Allocate(100)), 320u);
  // 200 bytes (256 rounded): [0,256) is the smallest that fits, not the 512-byte tail.
  EXPECT_EQ(At(a.Allocate(200)), 0u);
  // 300 bytes: only the tail fits.
  EXPECT_EQ(At(a.Allocate(300)), 512u);
}

TEST(OffsetAllocatorTest, ARangeInTheRequestsOwnSizeClassIsFoundWhenNothingLargerIsFree) {
  // 980 and 1000 bytes share a size class (960..1023): no class above holds a range, so the
  // one free range is found by looking through the class.
  OffsetAllocator a(1000, 4);
  EXPECT_EQ(At(a.Allocate(980)), 0u);
  EXPECT_FALSE(a.Allocate(24).has_value());
  EXPECT_EQ(At(a.Allocate(20)), 980u);
  OffsetAllocator whole(1000, 4);
  EXPECT_EQ(At(whole.Allocate(1000)), 0u);
  // A range of that class too small for the request is not taken.
  OffsetAllocator b(2000, 4);
  auto x = b.Allocate(968), y = b.Allocate(1032);
  ASSERT_TRUE(x && y);
  ASSERT_TRUE(b.Free(*x));  // [0,968) free: in the class of 980, but smaller
  EXPECT_FALSE(b.Allocate(980).has_value());
  EXPECT_EQ(b.largest_free(), 968u);
  EXPECT_EQ(At(b.Allocate(968)), 0u);
}

TEST(OffsetAllocatorTest, FreeOfAWrongHandleOrTwiceIsRefused) {
  OffsetAllocator a(4096, 64);
  auto x = a.Allocate(128);
  auto y = a.Allocate(128);
  ASSERT_TRUE(x && y);
  EXPECT_FALSE(a.Free({4000, 7}));                   // never handed out
  EXPECT_FALSE(a.Free({x->offset + 64, x->handle}));  // not where that allocation starts
  EXPECT_FALSE(a.Free({y->offset, x->handle}));       // another allocation's offset
  EXPECT_FALSE(a.Free({x->offset, UINT32_MAX}));
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
  EXPECT_EQ(a.free_ranges(), 1u);
}

TEST(OffsetAllocatorTest, FreeingMiddleThenNeighboursCoalescesToFullCapacity) {
  OffsetAllocator a(64 * 5, 64);
  std::vector<OffsetAllocation> r;
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
  EXPECT_EQ(a.free_ranges(), 1u);
  // One range again: the whole capacity can be taken in one allocation.
  EXPECT_EQ(At(a.Allocate(320)), 0u);
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
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_TRUE(a.Allocate(192).has_value());
}

TEST(OffsetAllocatorTest, HugeRegionsAndManyRangesKeepWorking) {
  // A 4 TiB segment, as the master's bench mounts, and 100 thousand live ranges (several
  // chunks of nodes), freed in an order that merges from both sides.
  OffsetAllocator a(4ull << 40, 64);
  std::vector<OffsetAllocation> live;
  for (uint64_t i = 0; i < 100000; ++i) {
    auto o = a.Allocate(4096 + (i % 61) * 1024);
    ASSERT_TRUE(o.has_value()) << i;
    live.push_back(*o);
  }
  EXPECT_EQ(a.live_allocations(), 100000u);
  for (size_t i = 0; i < live.size(); i += 2) ASSERT_TRUE(a.Free(live[i]));
  for (size_t i = 1; i < live.size(); i += 2) ASSERT_TRUE(a.Free(live[i]));
  EXPECT_EQ(a.allocated(), 0u);
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.largest_free(), 4ull << 40);
  EXPECT_EQ(At(a.Allocate(4ull << 40)), 0u);
}

// Random allocations and frees against a model of the live ranges: no overlap, the counts
// agree, and a refusal means that no free range was large enough.
template <class Alloc, class Handle>
void RunAgainstShadowModel(Alloc& a, uint64_t capacity, uint64_t align,
                           std::optional<Handle> (Alloc::*allocate)(uint64_t),
                           uint64_t (*offset_of)(const Handle&)) {
  std::mt19937_64 rng(12345);
  std::map<uint64_t, std::pair<uint64_t, Handle>> live;  // offset -> rounded size, handle
  uint64_t expected_allocated = 0;
  auto largest_gap = [&] {
    uint64_t largest = 0, cursor = 0;
    for (const auto& [off, v] : live) {
      largest = std::max(largest, off - cursor);
      cursor = off + v.first;
    }
    return std::max(largest, capacity - cursor);
  };
  for (int step = 0; step < 20000; ++step) {
    const bool do_alloc = live.empty() || (rng() % 100) < 55;
    if (do_alloc) {
      // Mostly small, sometimes large.
      const uint64_t size = (rng() % 10 == 0) ? 1 + rng() % (64 << 10) : 1 + rng() % 4096;
      auto got = (a.*allocate)(size);
      const uint64_t rounded = (size + align - 1) / align * align;
      if (!got) {
        ASSERT_LT(largest_gap(), rounded) << "refused with room left, step " << step;
        continue;
      }
      const uint64_t off = offset_of(*got);
      ASSERT_EQ(off % align, 0u);
      ASSERT_LE(off + rounded, capacity);
      auto next = live.lower_bound(off);
      if (next != live.end()) {
        ASSERT_LE(off + rounded, next->first) << "overlaps the next";
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.first, off) << "overlaps the previous";
      }
      live.emplace(off, std::make_pair(rounded, *got));
      expected_allocated += rounded;
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      ASSERT_TRUE(a.Free(it->second.second));
      ASSERT_FALSE(a.Free(it->second.second)) << "a double free was taken";
      expected_allocated -= it->second.first;
      live.erase(it);
    }
    ASSERT_EQ(a.allocated(), expected_allocated) << "step " << step;
    ASSERT_EQ(a.live_allocations(), live.size());
    ASSERT_EQ(a.largest_free(), largest_gap()) << "step " << step;
  }
  for (const auto& [off, v] : live) ASSERT_TRUE(a.Free(v.second));
  EXPECT_EQ(a.allocated(), 0u);
  EXPECT_EQ(a.largest_free(), capacity);
}

TEST(OffsetAllocatorTest, RandomizedAgainstShadowModel) {
  constexpr uint64_t kCapacity = 1 << 20;
  OffsetAllocator a(kCapacity, 64);
  RunAgainstShadowModel<OffsetAllocator, OffsetAllocation>(
      a, kCapacity, 64, &OffsetAllocator::Allocate,
      +[](const OffsetAllocation& h) { return h.offset; });
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_TRUE(a.Allocate(kCapacity).has_value());
}

TEST(AddressedAllocatorTest, FreesByOffsetAndRefusesOthers) {
  AddressedAllocator a(4096, 64);
  auto x = a.Allocate(100), y = a.Allocate(64);
  ASSERT_TRUE(x && y);
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y, 128u);
  EXPECT_FALSE(a.Free(64));    // inside x
  EXPECT_FALSE(a.Free(4000));  // never allocated
  EXPECT_TRUE(a.Free(*x));
  EXPECT_FALSE(a.Free(*x));
  EXPECT_EQ(a.allocated(), 64u);
  EXPECT_EQ(a.live_allocations(), 1u);
  EXPECT_TRUE(a.Free(*y));
  EXPECT_EQ(a.largest_free(), 4096u);
}

TEST(AddressedAllocatorTest, RandomizedAgainstShadowModel) {
  constexpr uint64_t kCapacity = 1 << 20;
  AddressedAllocator a(kCapacity, 128);
  RunAgainstShadowModel<AddressedAllocator, uint64_t>(
      a, kCapacity, 128, &AddressedAllocator::Allocate, +[](const uint64_t& o) { return o; });
}


// ClaimAscending rebuilds an allocator from placements made elsewhere: the claimed ranges are
// exactly where they were, the gaps stay free, and freeing merges as for Allocate's ranges.
TEST(OffsetAllocatorClaimTest, ClaimsInOrderLeaveTheGapsFree) {
  OffsetAllocator a(1 << 20, 64);
  auto c1 = a.ClaimAscending(0, 100);      // 128 bytes
  auto c2 = a.ClaimAscending(4096, 64);    // a gap of 3968 before it
  auto c3 = a.ClaimAscending(4160, 1000);  // right after c2
  ASSERT_TRUE(c1 && c2 && c3);
  EXPECT_EQ(c1->offset, 0u);
  EXPECT_EQ(c2->offset, 4096u);
  EXPECT_EQ(c3->offset, 4160u);
  EXPECT_EQ(a.allocated(), 128u + 64u + 1024u);
  EXPECT_EQ(a.live_allocations(), 3u);
  // Out of order, overlapping, misaligned, empty, past the end: refused, nothing changes.
  EXPECT_FALSE(a.ClaimAscending(64, 64));
  EXPECT_FALSE(a.ClaimAscending(5000, 64));
  EXPECT_FALSE(a.ClaimAscending(8192 + 1, 64));
  EXPECT_FALSE(a.ClaimAscending(8192, 0));
  EXPECT_FALSE(a.ClaimAscending(1 << 20, 64));
  EXPECT_EQ(a.allocated(), 128u + 64u + 1024u);
  // The gaps are free and the claims are not: 64-byte allocations fill exactly the rest, none
  // inside a claimed range.
  EXPECT_EQ(a.free_ranges(), 2u);
  std::vector<OffsetAllocation> rest;
  while (auto g = a.Allocate(64)) {
    EXPECT_FALSE(g->offset < 128 || (g->offset >= 4096 && g->offset < 4096 + 64 + 1024))
        << g->offset;
    rest.push_back(*g);
  }
  EXPECT_EQ(a.allocated(), uint64_t{1} << 20);
  for (const auto& g : rest) EXPECT_TRUE(a.Free(g));
  // Freeing a claim merges with its free neighbours like any allocation.
  EXPECT_TRUE(a.Free(*c3));
  EXPECT_TRUE(a.Free(*c2));
  EXPECT_TRUE(a.Free(*c1));
  EXPECT_EQ(a.allocated(), 0u);
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.largest_free(), uint64_t{1} << 20);
}

TEST(OffsetAllocatorClaimTest, ClaimAfterAllocateIsRefused) {
  OffsetAllocator a(1 << 20, 64);
  ASSERT_TRUE(a.Allocate(64));
  EXPECT_FALSE(a.ClaimAscending(4096, 64));  // the tail is not the whole free range any more
}

TEST(OffsetAllocatorClaimTest, ClaimToTheEndLeavesNoTail) {
  OffsetAllocator a(4096, 64);
  auto c = a.ClaimAscending(1024, 3072);
  ASSERT_TRUE(c);
  EXPECT_FALSE(a.ClaimAscending(4096, 64));
  EXPECT_EQ(a.largest_free(), 1024u);
  EXPECT_TRUE(a.Free(*c));
  EXPECT_EQ(a.largest_free(), 4096u);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
