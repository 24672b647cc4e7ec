// Unit tests for MemoryRegistry (src/engine/memory_registry.h).
#include "engine/memory_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace mooncake {
namespace {

using Clock = std::chrono::steady_clock;
using Code = Status::Code;

int64_t MsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// True when no two listed ranges overlap (List() is in registration order, not by address).
bool Disjoint(std::vector<RegionInfo> list) {
  std::sort(list.begin(), list.end(),
            [](const RegionInfo& a, const RegionInfo& b) { return a.addr < b.addr; });
  for (size_t i = 1; i < list.size(); ++i) {
    if (list[i - 1].addr + list[i - 1].length > list[i].addr) return false;
  }
  return true;
}

constexpr uint64_t kBase = 0x10000;
constexpr uint64_t kLen = 0x10000;  // base region: [0x10000, 0x20000)

TEST(MemoryRegistryTest, AddListContains) {
  MemoryRegistry r;
  EXPECT_EQ(r.size(), 0u);
  ASSERT_TRUE(r.Add(0x50000, 0x100, "cuda:1", false).ok());
  ASSERT_TRUE(r.Add(kBase, kLen, "cpu:0", true).ok());
  EXPECT_EQ(r.size(), 2u);
  auto list = r.List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].addr, 0x50000u);  // registration order, as upstream lists buffers
  EXPECT_EQ(list[0].length, 0x100u);
  EXPECT_EQ(list[0].location, "cuda:1");
  EXPECT_FALSE(list[0].remote_accessible);
  EXPECT_EQ(list[1].addr, kBase);
  EXPECT_EQ(list[1].length, kLen);
  EXPECT_EQ(list[1].location, "cpu:0");
  EXPECT_TRUE(list[1].remote_accessible);

  EXPECT_TRUE(r.Contains(kBase, kLen));
  EXPECT_TRUE(r.Contains(kBase + kLen - 1, 1));
  EXPECT_FALSE(r.Contains(kBase + kLen, 1));
  EXPECT_FALSE(r.Contains(kBase - 1, 2));
  EXPECT_FALSE(r.Contains(kBase, 0));
  EXPECT_FALSE(r.Contains(UINT64_MAX, 2));
}

TEST(MemoryRegistryTest, OverlapVariants) {
  MemoryRegistry r;
  ASSERT_TRUE(r.Add(kBase, kLen, "cpu:0", true).ok());
  struct Case {
    const char* what;
    uint64_t addr, len;
  };
  const Case overlapping[] = {
      {"same range", kBase, kLen},
      {"same start, shorter", kBase, 1},
      {"same start, longer", kBase, kLen * 2},
      {"inside", kBase + 0x1000, 0x1000},
      {"spanning", kBase - 0x1000, kLen + 0x2000},
      {"over the start", kBase - 0x1000, 0x1001},
      {"over the end", kBase + kLen - 1, 0x1000},
      {"last byte", kBase + kLen - 1, 1},
  };
  for (const auto& c : overlapping) {
    SCOPED_TRACE(c.what);
    Status s = r.Add(c.addr, c.len, "x", true);
    EXPECT_EQ(s.code(), Code::kAlreadyExists) << s.ToString();
  }
  EXPECT_EQ(r.size(), 1u);
  // Touching edges is allowed on both sides.
  EXPECT_TRUE(r.Add(kBase - 0x1000, 0x1000, "below", true).ok());
  EXPECT_TRUE(r.Add(kBase + kLen, 0x1000, "above", true).ok());
  EXPECT_EQ(r.size(), 3u);
  // A gap filled exactly.
  ASSERT_TRUE(r.Add(0x40000, 0x1000, "far", true).ok());
  EXPECT_TRUE(r.Add(kBase + kLen + 0x1000, 0x40000 - (kBase + kLen + 0x1000), "gap", true).ok());
  EXPECT_EQ(r.Add(0x3ffff, 2, "x", true).code(), Code::kAlreadyExists);
  EXPECT_TRUE(Disjoint(r.List()));
}

TEST(MemoryRegistryTest, InvalidRanges) {
  MemoryRegistry r;
  EXPECT_EQ(r.Add(0, 0x1000, "x", true).code(), Code::kInvalidArgument);       // null
  EXPECT_EQ(r.Add(kBase, 0, "x", true).code(), Code::kInvalidArgument);        // zero length
  EXPECT_EQ(r.Add(UINT64_MAX, 2, "x", true).code(), Code::kInvalidArgument);   // wraps
  EXPECT_EQ(r.Add(UINT64_MAX - 0xf, 0x11, "x", true).code(), Code::kInvalidArgument);
  EXPECT_EQ(r.Add(kBase, UINT64_MAX, "x", true).code(), Code::kInvalidArgument);
  EXPECT_EQ(r.size(), 0u);
}

TEST(MemoryRegistryTest, AddBatchAllOrNothing) {
  MemoryRegistry r;
  ASSERT_TRUE(r.Add(kBase, kLen, "cpu:0", true).ok());

  // One entry overlaps what is registered: nothing is added.
  Status s = r.AddBatch({{0x100000, 0x1000, "a", true}, {kBase + 0x10, 0x10, "b", true},
                         {0x200000, 0x1000, "c", true}});
  EXPECT_EQ(s.code(), Code::kAlreadyExists);
  EXPECT_EQ(r.size(), 1u);
  EXPECT_FALSE(r.Contains(0x100000, 1));

  // Entries overlap each other (given out of order): nothing is added.
  s = r.AddBatch({{0x300000, 0x1000, "a", true}, {0x100000, 0x1000, "b", true},
                  {0x100800, 0x1000, "c", true}});
  EXPECT_EQ(s.code(), Code::kAlreadyExists);
  EXPECT_EQ(r.size(), 1u);
  // The same range twice.
  s = r.AddBatch({{0x100000, 0x1000, "a", true}, {0x100000, 0x1000, "a", true}});
  EXPECT_EQ(s.code(), Code::kAlreadyExists);
  EXPECT_EQ(r.size(), 1u);

  // One invalid entry: nothing is added.
  s = r.AddBatch({{0x100000, 0x1000, "a", true}, {0x200000, 0, "b", true}});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(r.size(), 1u);

  // Valid, unsorted and touching each other: all added.
  s = r.AddBatch({{0x300000, 0x1000, "c", false}, {0x100000, 0x1000, "a", true},
                  {0x101000, 0x1000, "b", true}});
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto list = r.List();
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[0].addr, kBase);  // registered first
  EXPECT_TRUE(r.Contains(0x100000, 0x1000));
  EXPECT_TRUE(r.Contains(0x101000, 0x1000));
  EXPECT_FALSE(r.Contains(0x100800, 0x1000));  // two touching ranges, not one
  EXPECT_TRUE(r.Contains(0x300000, 0x1000));
  MemoryRegion* c = r.Pin(0x300000, 1, false);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->location, "c");
  EXPECT_FALSE(c->remote_accessible);
  MemoryRegistry::Unpin(c);
  EXPECT_TRUE(Disjoint(list));

  EXPECT_TRUE(r.AddBatch({}).ok());
  EXPECT_EQ(r.size(), 4u);
}

TEST(MemoryRegistryTest, RemoveNeedsTheStart) {
  MemoryRegistry r;
  ASSERT_TRUE(r.Add(kBase, kLen, "cpu:0", true).ok());
  EXPECT_EQ(r.Remove(kBase + 1, 0).code(), Code::kNotFound);
  EXPECT_EQ(r.Remove(kBase + kLen, 0).code(), Code::kNotFound);
  EXPECT_EQ(r.Remove(kBase - 1, 0).code(), Code::kNotFound);
  EXPECT_EQ(r.Remove(0, 0).code(), Code::kNotFound);
  EXPECT_EQ(r.size(), 1u);
  EXPECT_TRUE(r.Remove(kBase, 0).ok());
  EXPECT_EQ(r.size(), 0u);
  EXPECT_FALSE(r.Contains(kBase, 1));
  EXPECT_EQ(r.Remove(kBase, 0).code(), Code::kNotFound);
  EXPECT_TRUE(r.Add(kBase, kLen, "again", true).ok());  // the range is free again
}

TEST(MemoryRegistryTest, PinContainment) {
  MemoryRegistry r;
  ASSERT_TRUE(r.Add(kBase, kLen, "cpu:0", true).ok());
  ASSERT_TRUE(r.Add(kBase + kLen, kLen, "cpu:0", true).ok());  // adjacent
  ASSERT_TRUE(r.Add(0x100000, 0x1000, "private", false).ok());

  MemoryRegion* exact = r.Pin(kBase, kLen, false);
  ASSERT_NE(exact, nullptr);
  EXPECT_EQ(exact->begin, kBase);
  EXPECT_EQ(exact->length, kLen);
  EXPECT_EQ(exact->users.load(), 1);
  MemoryRegion* inner = r.Pin(kBase + 0x100, 0x100, true);
  EXPECT_EQ(inner, exact);
  EXPECT_EQ(exact->users.load(), 2);
  MemoryRegion* second = r.Pin(kBase + kLen, 1, true);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->begin, kBase + kLen);

  EXPECT_EQ(r.Pin(kBase + kLen - 8, 16, false), nullptr);  // straddles two adjacent regions
  EXPECT_FALSE(r.Contains(kBase + kLen - 8, 16));
  EXPECT_EQ(r.Pin(kBase, kLen + 1, false), nullptr);
  EXPECT_EQ(r.Pin(kBase - 1, 1, false), nullptr);
  EXPECT_EQ(r.Pin(kBase + 2 * kLen, 1, false), nullptr);  // one past the second
  EXPECT_EQ(r.Pin(kBase, 0, false), nullptr);
  EXPECT_EQ(r.Pin(kBase + 0x10, UINT64_MAX, false), nullptr);  // wraps
  EXPECT_EQ(r.Pin(0x1000, 1, false), nullptr);  // below everything

  // remote_only skips ranges registered without remote access.
  EXPECT_EQ(r.Pin(0x100000, 0x10, true), nullptr);
  MemoryRegion* priv = r.Pin(0x100000, 0x10, false);
  ASSERT_NE(priv, nullptr);
  EXPECT_EQ(priv->location, "private");
  EXPECT_EQ(priv->users.load(), 1);

  MemoryRegistry::Unpin(exact);
  MemoryRegistry::Unpin(inner);
  MemoryRegistry::Unpin(second);
  MemoryRegistry::Unpin(priv);
  EXPECT_EQ(exact->users.load(), 0);
  EXPECT_EQ(second->users.load(), 0);
  EXPECT_EQ(priv->users.load(), 0);
  EXPECT_TRUE(r.Remove(kBase, 0).ok());  // no users left: immediate
}

TEST(MemoryRegistryTest, RemoveWaitsForPinnedUser) {
  MemoryRegistry r;
  ASSERT_TRUE(r.Add(kBase, kLen, "cpu:0", true).ok());
  MemoryRegion* pinned = r.Pin(kBase, 64, true);
  ASSERT_NE(pinned, nullptr);
  std::atomic<bool> unpinned{false};
  std::atomic<bool> found_while_removing{true};
  std::thread user([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    // Remove() has taken the range out of the table: a new Pin cannot find it.
    MemoryRegion* again = r.Pin(kBase, 64, true);
    found_while_removing = again != nullptr;
    if (again) MemoryRegistry::Unpin(again);
    unpinned = true;
    MemoryRegistry::Unpin(pinned);
  });
  auto t0 = Clock::now();
  Status s = r.Remove(kBase, 5000);
  int64_t ms = MsSince(t0);
  user.join();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(unpinned.load());  // Remove returned only after the unpin
  EXPECT_GE(ms, 40);
  EXPECT_LT(ms, 2000);
  EXPECT_FALSE(found_while_removing.load());
  EXPECT_EQ(r.size(), 0u);
  EXPECT_FALSE(r.Contains(kBase, 1));
}

// A holder that must keep the range past its transfer's end (ucx_worker.cc, DrainLocked)
// pins it again while a Remove already waits: PinHeld finds it where Pin does not, and the
// Remove then fails instead of succeeding once the transfer's own pin goes.
TEST(MemoryRegistryTest, PinHeldKeepsARangeARemoveIsWaitingFor) {
  MemoryRegistry r;
  ASSERT_TRUE(r.Add(kBase, kLen, "cpu:0", true).ok());
  MemoryRegion* transfer = r.Pin(kBase + 64, 64, false);
  ASSERT_NE(transfer, nullptr);
  MemoryRegion* held = nullptr;
  MemoryRegion* plain = reinterpret_cast<MemoryRegion*>(1);
  std::thread holder([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // Remove is waiting now
    plain = r.Pin(kBase + 64, 64, false);
    held = r.PinHeld(kBase + 64, 64);
    MemoryRegistry::Unpin(transfer);  // the transfer ends; the holder keeps the range
  });
  Status s = r.Remove(kBase, 300);
  holder.join();
  EXPECT_EQ(plain, nullptr);
  ASSERT_EQ(held, transfer);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition) << s.ToString();
  EXPECT_TRUE(r.Contains(kBase, kLen));
  EXPECT_EQ(r.PinHeld(kBase + kLen - 1, 2), nullptr);  // not wholly inside
  EXPECT_EQ(r.PinHeld(kBase, 0), nullptr);
  MemoryRegistry::Unpin(held);
  EXPECT_TRUE(r.Remove(kBase, 0).ok());
  EXPECT_EQ(r.PinHeld(kBase, 1), nullptr);
}

TEST(MemoryRegistryTest, RemoveTimesOutWhilePinnedAndKeepsRegion) {
  MemoryRegistry r;
  ASSERT_TRUE(r.Add(kBase, kLen, "cpu:0", true).ok());
  MemoryRegion* pinned = r.Pin(kBase + 8, 8, false);
  ASSERT_NE(pinned, nullptr);
  auto t0 = Clock::now();
  Status s = r.Remove(kBase, 30);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition) << s.ToString();
  EXPECT_GE(MsSince(t0), 25);
  EXPECT_EQ(r.size(), 1u);
  EXPECT_TRUE(r.Contains(kBase, kLen));
  MemoryRegion* again = r.Pin(kBase, 1, true);  // still findable: the same region
  EXPECT_EQ(again, pinned);
  EXPECT_EQ(pinned->users.load(), 2);
  EXPECT_EQ(r.Add(kBase, 1, "x", true).code(), Code::kAlreadyExists);
  MemoryRegistry::Unpin(again);
  // Put back in its place: still listed before a range registered after it.
  ASSERT_TRUE(r.Add(0x1000, 0x1000, "later", true).ok());
  EXPECT_EQ(r.Remove(kBase, 0).code(), Code::kFailedPrecondition);  // one user left
  auto list = r.List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].addr, kBase);
  EXPECT_EQ(list[1].addr, 0x1000u);
  EXPECT_TRUE(r.Remove(0x1000, 0).ok());
  MemoryRegistry::Unpin(pinned);
  EXPECT_TRUE(r.Remove(kBase, 0).ok());
  EXPECT_EQ(r.size(), 0u);
}

// BUG (memory_registry.cc, Remove): Remove() drops the lock while it waits for users, with the
// range already out of the table, so an Add() of the same (or an overlapping) range succeeds
// meanwhile. When the wait then times out, Remove() puts its region back with InsertLocked()
// without any overlap check, and the table ends up with two overlapping registrations.
TEST(MemoryRegistryTest, AddDuringTimedOutRemoveMustNotLeaveOverlap) {
  MemoryRegistry r;
  ASSERT_TRUE(r.Add(kBase, kLen, "old", true).ok());
  MemoryRegion* pinned = r.Pin(kBase, 1, false);
  ASSERT_NE(pinned, nullptr);
  Status removed;
  std::thread remover([&] { removed = r.Remove(kBase, 200); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // Remove is waiting now
  Status added = r.Add(kBase, kLen / 2, "new", true);
  remover.join();
  EXPECT_EQ(removed.code(), Code::kFailedPrecondition) << removed.ToString();
  auto list = r.List();
  EXPECT_TRUE(Disjoint(list))
      << "overlapping registrations after Add() (" << added.ToString()
      << ") raced a Remove() that timed out; " << list.size() << " regions";
  EXPECT_EQ(list.size(), 1u);
  MemoryRegistry::Unpin(pinned);
}

TEST(MemoryRegistryTest, ConcurrentPinUnpinWithAddRemove) {
  // Fixed amounts of work (not a time budget), so the test ends however the threads are
  // scheduled: a shared_mutex may let the busy readers starve the writer for a while.
  MemoryRegistry r;
  constexpr int kPinners = 4;
  constexpr int kPinRounds = 20000;
  constexpr int kChurnRounds = 300;
  constexpr uint64_t kStable = 0x1000000;  // stable regions: kStable + i * 0x10000
  for (int i = 0; i < kPinners; ++i) {
    ASSERT_TRUE(r.Add(kStable + i * 0x10000, 0x10000, "cpu:0", true).ok());
  }
  std::atomic<int> pin_failures{0};
  std::atomic<bool> churn_done{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kPinners; ++i) {
    threads.emplace_back([&, i] {
      uint64_t base = kStable + i * 0x10000;
      uint64_t off = 0;
      for (int n = 0; n < kPinRounds || !churn_done.load(); ++n) {  // overlap the churn
        off = (off + 0x1230) % 0xff00;
        MemoryRegion* a = r.Pin(base + off, 0x100, true);
        MemoryRegion* b = r.Pin(base, 0x10000, false);
        if (!a || !b || a != b || a->users.load() < 2) ++pin_failures;
        if (a) MemoryRegistry::Unpin(a);
        if (b) MemoryRegistry::Unpin(b);
        if (n % 64 == 0) std::this_thread::yield();
      }
    });
  }
  std::atomic<int> churn_failures{0};
  std::thread churner([&] {
    // Unrelated regions below and above the stable ones come and go.
    for (int n = 0; n < kChurnRounds; ++n) {
      uint64_t lo = 0x100000 + (n % 16) * 0x1000;
      uint64_t hi = 0x2000000 + (n % 16) * 0x1000;
      if (!r.AddBatch({{lo, 0x1000, "lo", true}, {hi, 0x1000, "hi", false}}).ok()) {
        ++churn_failures;
      }
      if (!r.Remove(lo, 100).ok()) ++churn_failures;
      if (!r.Remove(hi, 100).ok()) ++churn_failures;
    }
    churn_done = true;
  });
  for (auto& t : threads) t.join();
  churner.join();
  EXPECT_EQ(pin_failures.load(), 0);
  EXPECT_EQ(churn_failures.load(), 0);
  EXPECT_EQ(r.size(), static_cast<size_t>(kPinners));
  for (int i = 0; i < kPinners; ++i) {
    EXPECT_TRUE(r.Remove(kStable + i * 0x10000, 0).ok());  // no users left behind
  }
}

}  // namespace
}  // namespace mooncake
