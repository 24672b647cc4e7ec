// Unit tests for tasks, batches and the batch-id table (src/engine/batch.h).
#include "engine/batch.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace mooncake {
namespace {

using Code = Status::Code;
using std::chrono::milliseconds;

// TransferStatusName is used by batch.cc (mooncake_core) but defined in transfer_engine.cc
// (mooncake_te); this test also makes the linker pull it in before it scans mooncake_core.
TEST(TransferStatusNameTest, Names) {
  EXPECT_STREQ(TransferStatusName(WAITING), "WAITING");
  EXPECT_STREQ(TransferStatusName(COMPLETED), "COMPLETED");
  EXPECT_STREQ(TransferStatusName(TIMEOUT), "TIMEOUT");
  EXPECT_STREQ(TransferStatusName(FAILED), "FAILED");
}

// --- BatchTable --------------------------------------------------------------------------------

TEST(BatchTableTest, IdsAreNonZeroAndDistinct) {
  BatchTable table;
  std::set<BatchID> ids;
  for (int i = 0; i < 100; ++i) {
    auto id = table.Allocate(4);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    EXPECT_NE(*id, 0u);
    EXPECT_NE(*id, INVALID_BATCH_ID);
    EXPECT_NE(*id & 0xffffffffu, 0u);  // the slot part is never 0 either
    EXPECT_TRUE(ids.insert(*id).second) << "duplicate id " << *id;
    auto b = table.Get(*id);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ((*b)->capacity(), 4u);
  }
  EXPECT_EQ(table.live(), 100u);
}

TEST(BatchTableTest, StaleIdAfterFreeIsNotFound) {
  BatchTable table;
  auto id = table.Allocate(1);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(table.Free(*id).ok());
  EXPECT_EQ(table.live(), 0u);
  EXPECT_EQ(table.Get(*id).status().code(), Code::kNotFound);
  EXPECT_EQ(table.Free(*id).code(), Code::kNotFound);  // double free

  // The slot is reused with a new generation: the old id stays dead.
  auto id2 = table.Allocate(2);
  ASSERT_TRUE(id2.ok());
  EXPECT_NE(*id2, *id);
  EXPECT_EQ(*id2 & 0xffffffffu, *id & 0xffffffffu);  // same slot
  EXPECT_EQ(table.Get(*id).status().code(), Code::kNotFound);
  EXPECT_EQ(table.Free(*id).code(), Code::kNotFound);
  auto b = table.Get(*id2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->capacity(), 2u);
}

TEST(BatchTableTest, GarbageIdsAreErrorsNotCrashes) {
  BatchTable table;
  // Before anything is allocated.
  for (BatchID id : {BatchID{0}, BatchID{1}, BatchID{1} << 32 | 1, INVALID_BATCH_ID}) {
    EXPECT_FALSE(table.Get(id).ok()) << id;
    EXPECT_FALSE(table.Free(id).ok()) << id;
  }
  auto good = table.Allocate(1);
  ASSERT_TRUE(good.ok());
  const uint64_t low = *good & 0xffffffffu;  // slot + 1
  const uint64_t gen = *good >> 32;
  EXPECT_EQ(table.Get(0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(table.Get(UINT64_MAX).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(table.Get(gen << 32 | (low + 1)).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(table.Get((gen + 1) << 32 | low).status().code(), Code::kNotFound);  // generation
  EXPECT_EQ(table.Get(low).status().code(), Code::kNotFound);  // generation 0
  EXPECT_EQ(table.Free((gen + 7) << 32 | low).code(), Code::kNotFound);
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 10000; ++i) {
    BatchID id = rng();
    if (id == *good) continue;
    EXPECT_FALSE(table.Get(id).ok());
    EXPECT_FALSE(table.Free(id).ok());
  }
  EXPECT_TRUE(table.Get(*good).ok());  // untouched by all that
  EXPECT_EQ(table.live(), 1u);
}

TEST(BatchTableTest, CapacityBounds) {
  BatchTable table;
  EXPECT_EQ(table.Allocate(0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(table.Allocate(BatchTable::kMaxBatchSize + 1).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(table.live(), 0u);
  auto max = table.Allocate(BatchTable::kMaxBatchSize);
  ASSERT_TRUE(max.ok());
  EXPECT_TRUE(table.Free(*max).ok());
}

TEST(BatchTableTest, FreeRefusedWhileSlicesOutstanding) {
  BatchTable table;
  auto id = table.Allocate(2);
  ASSERT_TRUE(id.ok());
  auto batch = table.Get(*id);
  ASSERT_TRUE(batch.ok());
  size_t first = 99;
  TransferTask* t = (*batch)->Reserve(1, &first);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(first, 0u);
  EXPECT_EQ(table.Free(*id).code(), Code::kFailedPrecondition);  // reserved, not started
  t->Start(2, 200, nullptr);
  EXPECT_EQ(table.Free(*id).code(), Code::kFailedPrecondition);
  t->OnSliceDone(COMPLETED, 100);
  EXPECT_EQ(table.Free(*id).code(), Code::kFailedPrecondition);  // one slice left
  EXPECT_TRUE(table.Get(*id).ok());                              // the id stays valid
  t->OnSliceDone(COMPLETED, 100);
  EXPECT_TRUE(table.Free(*id).ok());
  EXPECT_EQ(table.Get(*id).status().code(), Code::kNotFound);
  // The caller's reference keeps the batch alive and readable after Free.
  EXPECT_EQ((*batch)->Aggregate().s, COMPLETED);
  EXPECT_EQ((*batch)->Aggregate().transferred_bytes, 200u);
}

// --- Batch::Reserve ----------------------------------------------------------------------------

TEST(BatchTest, ReserveRespectsCapacity) {
  Batch b(5);
  size_t first = 99;
  TransferTask* t0 = b.Reserve(3, &first);
  ASSERT_NE(t0, nullptr);
  EXPECT_EQ(first, 0u);
  EXPECT_EQ(t0, &b.task(0));
  EXPECT_EQ(b.size(), 3u);
  first = 99;
  EXPECT_EQ(b.Reserve(3, &first), nullptr);  // 3 + 3 > 5: no change
  EXPECT_EQ(first, 99u);
  EXPECT_EQ(b.size(), 3u);
  TransferTask* t3 = b.Reserve(2, &first);
  ASSERT_NE(t3, nullptr);
  EXPECT_EQ(first, 3u);
  EXPECT_EQ(t3, &b.task(3));
  EXPECT_EQ(b.size(), 5u);
  EXPECT_EQ(b.Reserve(1, &first), nullptr);
  EXPECT_EQ(b.Reserve(SIZE_MAX, &first), nullptr);
  EXPECT_EQ(b.size(), 5u);
}

TEST(BatchTest, ReservedButUnstartedTaskIsWaiting) {
  Batch b(2);
  size_t first;
  TransferTask* t = b.Reserve(1, &first);
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->started());
  EXPECT_FALSE(t->finished());
  EXPECT_EQ(t->status().s, WAITING);
  EXPECT_FALSE(b.AllFinished());
  EXPECT_EQ(b.Aggregate().s, WAITING);
}

// --- TransferTask state machine ----------------------------------------------------------------

TEST(TransferTaskTest, AllSlicesCompleted) {
  Batch b(1);
  size_t first;
  TransferTask* t = b.Reserve(1, &first);
  ASSERT_NE(t, nullptr);
  t->Start(3, 300, nullptr);
  EXPECT_TRUE(t->started());
  EXPECT_EQ(t->length(), 300u);
  t->OnSliceDone(COMPLETED, 100);
  t->OnSliceDone(COMPLETED, 120);
  EXPECT_FALSE(t->finished());
  EXPECT_EQ(t->status().s, WAITING);
  EXPECT_EQ(t->status().transferred_bytes, 220u);  // progress is visible while waiting
  EXPECT_FALSE(b.AllFinished());
  t->OnSliceDone(COMPLETED, 80);
  EXPECT_TRUE(t->finished());
  EXPECT_EQ(t->status().s, COMPLETED);
  EXPECT_EQ(t->status().transferred_bytes, 300u);
  EXPECT_EQ(t->error(), "");
  EXPECT_TRUE(b.AllFinished());
  EXPECT_TRUE(b.WaitAll(milliseconds(0)));
}

TEST(TransferTaskTest, FailedSliceKeepsItsMessage) {
  Batch b(1);
  size_t first;
  TransferTask* t = b.Reserve(1, &first);
  t->Start(3, 300, nullptr);
  t->OnSliceDone(COMPLETED, 100);
  t->OnSliceDone(FAILED, 100, "connect 10.0.0.1:1234: Connection refused");
  EXPECT_EQ(t->error(), "");  // not readable before the task finishes
  t->OnSliceDone(FAILED, 0, "second failure");
  EXPECT_EQ(t->status().s, FAILED);
  EXPECT_EQ(t->status().transferred_bytes, 100u);  // failed slices' bytes do not count
  EXPECT_EQ(t->error(), "connect 10.0.0.1:1234: Connection refused");
}

TEST(TransferTaskTest, FailureWithoutMessageNamesTheResult) {
  Batch b(1);
  size_t first;
  TransferTask* t = b.Reserve(1, &first);
  t->Start(1, 10, nullptr);
  t->OnSliceDone(TIMEOUT, 10);
  EXPECT_EQ(t->status().s, TIMEOUT);
  EXPECT_EQ(t->status().transferred_bytes, 0u);
  EXPECT_EQ(t->error(), "TIMEOUT");
}

TEST(TransferTaskTest, FailedOutranksTimeoutInEitherOrder) {
  Batch b(2);
  size_t first;
  TransferTask* a = b.Reserve(2, &first);
  TransferTask* c = a + 1;
  a->Start(2, 20, nullptr);
  a->OnSliceDone(TIMEOUT, 10, "slow");
  a->OnSliceDone(FAILED, 10, "broken");
  EXPECT_EQ(a->status().s, FAILED);
  EXPECT_EQ(a->error(), "slow");  // the first failure's message
  c->Start(3, 30, nullptr);
  c->OnSliceDone(FAILED, 10, "broken");
  c->OnSliceDone(TIMEOUT, 10, "slow");
  c->OnSliceDone(COMPLETED, 10);
  EXPECT_EQ(c->status().s, FAILED);
  EXPECT_EQ(c->status().transferred_bytes, 10u);
  EXPECT_EQ(c->error(), "broken");
}

TEST(TransferTaskTest, LastSliceUnpinsLocalRegion) {
  MemoryRegistry reg;
  ASSERT_TRUE(reg.Add(0x10000, 0x1000, "cpu:0", true).ok());
  MemoryRegion* local = reg.Pin(0x10000, 0x100, false);
  ASSERT_NE(local, nullptr);
  Batch b(1);
  size_t first;
  TransferTask* t = b.Reserve(1, &first);
  t->Start(2, 0x100, local);
  t->OnSliceDone(COMPLETED, 0x80);
  EXPECT_EQ(local->users.load(), 1);
  t->OnSliceDone(FAILED, 0x80, "x");
  EXPECT_EQ(local->users.load(), 0);
  EXPECT_TRUE(reg.Remove(0x10000, 0).ok());
}

TEST(TransferTaskTest, ASharedPinIsDroppedByTheLastTaskOfTheShare) {
  MemoryRegistry reg;
  ASSERT_TRUE(reg.Add(0x10000, 0x1000, "cpu:0", true).ok());
  MemoryRegion* local = reg.Pin(0x10000, 0x100, false);  // one pin for the three tasks
  ASSERT_NE(local, nullptr);
  Batch b(3);
  size_t first;
  TransferTask* t = b.Reserve(3, &first);
  PinShare* share = b.SharePin(local, 3);
  for (int i = 0; i < 3; ++i) t[i].Start(i == 1 ? 2 : 1, 0x10, local, share);
  EXPECT_EQ(t[1].local_region(), local);
  t[2].OnSliceDone(COMPLETED, 0x10);
  t[1].OnSliceDone(COMPLETED, 0x8);
  t[0].OnSliceDone(FAILED, 0, "x");
  EXPECT_EQ(local->users.load(), 1) << "task 1 still has a slice out";
  EXPECT_FALSE(reg.Remove(0x10000, 0).ok()) << "still in use";
  t[1].OnSliceDone(COMPLETED, 0x8);
  EXPECT_EQ(local->users.load(), 0) << "unpinned once, by the last task";
  EXPECT_TRUE(b.AllFinished());
  EXPECT_TRUE(reg.Remove(0x10000, 0).ok());
}

// --- WaitAll / Aggregate -----------------------------------------------------------------------

TEST(BatchTest, WaitAllReturnsWhenSlicesCompleteElsewhere) {
  Batch b(4);
  size_t first;
  TransferTask* t = b.Reserve(4, &first);
  ASSERT_NE(t, nullptr);
  for (int i = 0; i < 4; ++i) t[i].Start(8, 8 * 1024, nullptr);
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      std::this_thread::sleep_for(milliseconds(20));
      for (int i = 0; i < 4; ++i) {
        for (int s = 0; s < 2; ++s) t[i].OnSliceDone(COMPLETED, 1024);  // 2 of 8 each
      }
      (void)w;
    });
  }
  EXPECT_TRUE(b.WaitAll(milliseconds(5000)));
  for (auto& th : workers) th.join();
  TransferStatus agg = b.Aggregate();
  EXPECT_EQ(agg.s, COMPLETED);
  EXPECT_EQ(agg.transferred_bytes, 4u * 8 * 1024);
}

TEST(BatchTest, WaitAllTimesOut) {
  Batch b(2);
  size_t first;
  TransferTask* t = b.Reserve(2, &first);
  t[0].Start(1, 1, nullptr);
  t[1].Start(1, 1, nullptr);
  t[0].OnSliceDone(COMPLETED, 1);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(b.WaitAll(milliseconds(50)));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(45));
  t[1].OnSliceDone(COMPLETED, 1);
  EXPECT_TRUE(b.WaitAll(milliseconds(50)));
}

TEST(BatchTest, AggregateOverTasks) {
  Batch b(3);
  size_t first;
  TransferTask* t = b.Reserve(3, &first);
  for (int i = 0; i < 3; ++i) t[i].Start(1, 100, nullptr);
  EXPECT_EQ(b.Aggregate().s, WAITING);
  EXPECT_EQ(b.Aggregate().transferred_bytes, 0u);
  t[0].OnSliceDone(COMPLETED, 100);
  EXPECT_EQ(b.Aggregate().s, WAITING);
  EXPECT_EQ(b.Aggregate().transferred_bytes, 100u);
  t[1].OnSliceDone(TIMEOUT, 100);
  EXPECT_EQ(b.Aggregate().transferred_bytes, 100u);
  t[2].OnSliceDone(COMPLETED, 100);
  TransferStatus agg = b.Aggregate();
  EXPECT_EQ(agg.s, FAILED);
  EXPECT_EQ(agg.transferred_bytes, 200u);

  Batch ok(2);
  TransferTask* u = ok.Reserve(2, &first);
  u[0].Start(1, 5, nullptr);
  u[1].Start(2, 10, nullptr);
  u[0].OnSliceDone(COMPLETED, 5);
  u[1].OnSliceDone(COMPLETED, 5);
  u[1].OnSliceDone(COMPLETED, 5);
  EXPECT_EQ(ok.Aggregate().s, COMPLETED);
  EXPECT_EQ(ok.Aggregate().transferred_bytes, 15u);
  EXPECT_EQ(Batch(1).Aggregate().s, COMPLETED);  // nothing reserved
}

TEST(BatchTest, ManyThreadsReportingSlices) {
  constexpr int kSlices = 4000;
  Batch b(1);
  size_t first;
  TransferTask* t = b.Reserve(1, &first);
  t->Start(kSlices, kSlices, nullptr);
  std::vector<std::thread> threads;
  for (int w = 0; w < 8; ++w) {
    threads.emplace_back([&, w] {
      for (int i = w; i < kSlices; i += 8) {
        if (i == 1234) {
          t->OnSliceDone(FAILED, 1, "the one");
        } else {
          t->OnSliceDone(COMPLETED, 1);
        }
      }
    });
  }
  EXPECT_TRUE(b.WaitAll(milliseconds(5000)));
  for (auto& th : threads) th.join();
  EXPECT_EQ(t->status().s, FAILED);
  EXPECT_EQ(t->status().transferred_bytes, static_cast<size_t>(kSlices - 1));
  EXPECT_EQ(t->error(), "the one");
}

}  // namespace
}  // namespace mooncake
