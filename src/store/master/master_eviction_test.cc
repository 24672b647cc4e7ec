// Unit tests of the Store master's eviction (src/store/master/master_service.h): approximately LRU,
// skipping leased, pinned and in-flight objects, on a fake clock.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "store/master/master_service_test_fixture.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_support;

TEST_F(MasterEvictionTest, FullPoolEvictsLeastRecentlyAccessedFirst) {
  MakeExact();
  auto keys = Fill("k", 10);
  EXPECT_EQ(master_->GetStats().allocated(), kSeg);
  // Touch k0 and k1: the LRU order becomes k2, k3, ..., k9, k0, k1.
  ASSERT_EQ(Get("k0").code(), kOk);
  Advance(seconds(1));
  ASSERT_EQ(Get("k1").code(), kOk);
  ExpireLeases();
  ASSERT_EQ(Put("c1", "new1", kObj), kOk);
  EXPECT_EQ(Gone(keys), (std::set<std::string>{"k2"}));
  Advance(seconds(1));
  ASSERT_EQ(Put("c1", "new2", 250 * KiB), kOk);  // needs three more objects' room
  EXPECT_EQ(Gone(keys), (std::set<std::string>{"k2", "k3", "k4", "k5"}));
  auto stats = master_->GetStats();
  EXPECT_EQ(stats.evicted_objects(), 4u);
  auto m = Metrics();
  EXPECT_EQ(m["master_evicted_key_count"], 4u);
  EXPECT_EQ(m["master_evicted_size_bytes"], 4 * kObj);
  EXPECT_EQ(m["master_evicted_key_count_mem"], 4u);
  EXPECT_GE(m["master_successful_evictions_total"], 1u);
  EXPECT_GE(m["master_attempted_evictions_total"], m["master_successful_evictions_total"]);
  EXPECT_EQ(Exist("new1"), kOk);
  EXPECT_EQ(Exist("new2"), kOk);
}

TEST_F(MasterEvictionTest, DefaultWatermarkEvictsDownBelowIt) {
  // Above 92 % allocated, evict to 87 %.
  MasterConfig c;
  c.eviction_high_watermark_ratio = 0.92;
  c.eviction_ratio = 0.05;
  Make(c);
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, kSeg), kOk);
  auto keys = Fill("k", 10);  // 100 %; the 10th put started at 90 %: no eviction yet
  EXPECT_TRUE(Gone(keys).empty());
  ASSERT_EQ(Put("c1", "new", kObj), kOk);
  // 100 % -> at most 87 % before placing: the two oldest objects went.
  EXPECT_EQ(Gone(keys), (std::set<std::string>{"k0", "k1"}));
  EXPECT_EQ(master_->GetStats().allocated(), 9 * kObj);
}

TEST_F(MasterEvictionTest, TickEvictsAboveTheWatermark) {
  MasterConfig c;
  c.eviction_high_watermark_ratio = 0.92;
  c.eviction_ratio = 0.05;
  Make(c);
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, kSeg), kOk);
  auto keys = Fill("k", 10);
  ASSERT_TRUE(Ping("c1").client_known());  // 10 s passed: c1 must not expire meanwhile
  master_->Tick();
  EXPECT_EQ(Gone(keys), (std::set<std::string>{"k0", "k1"}));
  master_->Tick();  // 80 %: nothing more
  EXPECT_EQ(Gone(keys).size(), 2u);
}

TEST_F(MasterEvictionTest, LeasedObjectsAreNotEvicted) {
  MakeExact(/*lease_ms=*/1000 * 1000);
  ASSERT_EQ(Put("c1", "leased", kObj), kOk);
  ASSERT_EQ(Get("leased").code(), kOk);  // oldest access, but leased for 1000 s
  Advance(seconds(1));
  auto keys = Fill("k", 9);
  ASSERT_EQ(Put("c1", "new", kObj), kOk);
  EXPECT_EQ(Exist("leased"), kOk);
  EXPECT_EQ(Gone(keys), (std::set<std::string>{"k0"}));
}

TEST_F(MasterEvictionTest, HardPinnedAndInFlightObjectsAreNotEvicted) {
  MakeExact();
  ASSERT_EQ(Put("c1", "hard", kObj, Config(1, {}, false, true)), kOk);
  Advance(seconds(1));
  ASSERT_EQ(PutStart("c1", "inflight", kObj).code(), kOk);
  Advance(seconds(1));
  auto keys = Fill("k", 8);
  ASSERT_EQ(Put("c1", "new", kObj), kOk);
  EXPECT_EQ(Exist("hard"), kOk);
  EXPECT_EQ(Get("inflight").code(), C(ErrorCode::REPLICA_IS_NOT_READY));
  EXPECT_EQ(Gone(keys), (std::set<std::string>{"k0"}));
  EXPECT_EQ(PutEnd("c1", "inflight"), kOk);
}

TEST_F(MasterEvictionTest, NothingEvictableMeansNoAvailableHandle) {
  MakeExact();
  auto keys = Fill("hard", 10, Config(1, {}, false, true));
  auto r = PutStart("c1", "new", kObj);
  EXPECT_EQ(r.code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  EXPECT_FALSE(r.message().empty());
  EXPECT_TRUE(Gone(keys).empty());
  EXPECT_EQ(Exist("new"), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Metrics()["master_put_start_alloc_failures_total"], 1u);
  EXPECT_EQ(Metrics()["master_put_start_failures_total"], 1u);
  // Unpinning by removal makes room again.
  ASSERT_EQ(Remove("hard3"), kOk);
  EXPECT_EQ(Put("c1", "new", kObj), kOk);
}

TEST_F(MasterEvictionTest, AllLeasedMeansNoAvailableHandle) {
  MakeExact();
  auto keys = Fill("k", 10);
  for (const auto& k : keys) ASSERT_EQ(Get(k).code(), kOk);
  EXPECT_EQ(PutStart("c1", "new", kObj).code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  EXPECT_TRUE(Gone(keys).empty());
  ExpireLeases();
  EXPECT_EQ(Put("c1", "new", kObj), kOk);
  EXPECT_EQ(Gone(keys).size(), 1u);
}

TEST_F(MasterEvictionTest, SoftPinnedGoOnlyAfterUnpinned) {
  MakeExact();
  auto soft = Fill("soft", 5, Config(1, {}, true, false));  // older
  auto plain = Fill("plain", 5);                          // newer
  const auto pinned = Config(1, {}, true, false);
  ASSERT_EQ(Put("c1", "new1", kObj, pinned), kOk);
  EXPECT_TRUE(Gone(soft).empty());
  EXPECT_EQ(Gone(plain), (std::set<std::string>{"plain0"}));
  Advance(seconds(1));
  // Four more objects' room: the four remaining plain ones go, no soft-pinned one.
  ASSERT_EQ(Put("c1", "new2", 4 * kObj, pinned), kOk);
  EXPECT_TRUE(Gone(soft).empty());
  EXPECT_EQ(Gone(plain).size(), 5u);
  Advance(seconds(1));
  // Only soft-pinned objects are left: the least recently accessed one goes.
  ASSERT_EQ(Put("c1", "new3", kObj, pinned), kOk);
  EXPECT_EQ(Gone(soft), (std::set<std::string>{"soft0"}));
}

TEST_F(MasterEvictionTest, SoftPinExpiresAfterItsTtl) {
  MasterConfig c;
  c.eviction_high_watermark_ratio = 1.0;
  c.eviction_ratio = 0.0;
  c.default_kv_soft_pin_ttl_ms = 60 * 1000;
  Make(c);
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, kSeg), kOk);
  ASSERT_EQ(Put("c1", "soft", kObj, Config(1, {}, true, false)), kOk);
  Advance(seconds(61));  // the soft pin lapsed: an ordinary (and the oldest) object now
  auto keys = Fill("k", 9);
  ASSERT_EQ(Put("c1", "new", kObj), kOk);
  EXPECT_EQ(Exist("soft"), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_TRUE(Gone(keys).empty());
}

TEST_F(MasterEvictionTest, APutsOwnSoftPinTtlOverridesTheDefault) {
  MasterConfig c;
  c.eviction_high_watermark_ratio = 1.0;
  c.eviction_ratio = 0.0;
  c.default_kv_soft_pin_ttl_ms = 60 * 60 * 1000;
  Make(c);
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, kSeg), kOk);
  auto short_pin = Config(1, {}, true, false);
  short_pin.set_soft_pin_ttl_ms(5000);
  ASSERT_EQ(Put("c1", "short", kObj, short_pin), kOk);       // pinned for 5 s
  ASSERT_EQ(Put("c1", "long", kObj, Config(1, {}, true, false)), kOk);  // the default: 1 h
  Advance(seconds(6));
  auto keys = Fill("k", 8);  // the pool is full
  ASSERT_EQ(Put("c1", "new", kObj), kOk);
  // "short" lapsed and is the oldest unpinned object; "long" is still pinned.
  EXPECT_EQ(Exist("short"), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Exist("long"), kOk);
  EXPECT_TRUE(Gone(keys).empty());
}

TEST_F(MasterEvictionTest, EvictionKeepsGoingUntilTheAllocationFits) {
  // The LRU victims are not adjacent: freeing their bytes is not enough for one range, so
  // eviction must continue until the object fits (MasterService's documented rule).
  MakeExact();
  auto keys = Fill("k", 10);
  // LRU order: k1, k3, k5, k7, k9, then k0, k2, ...
  for (const char* k : {"k0", "k2", "k4", "k6", "k8"}) {
    ASSERT_EQ(Get(k).code(), kOk);
    Advance(seconds(1));
  }
  ExpireLeases();
  ASSERT_EQ(Put("c1", "big", 2 * kObj), kOk);
  EXPECT_EQ(Exist("big"), kOk);
  // Whatever went, every victim was complete and unleased, and the pool is consistent.
  auto stats = master_->GetStats();
  EXPECT_EQ(stats.allocated(), (10 - Gone(keys).size()) * kObj + 2 * kObj);
}

TEST_F(MasterEvictionTest, ObjectLargerThanAnySegmentEvictsNothing) {
  MakeExact();
  auto keys = Fill("k", 5);
  EXPECT_EQ(PutStart("c1", "huge", kSeg + 64).code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  EXPECT_TRUE(Gone(keys).empty());
}

TEST_F(MasterEvictionTest, LapsedSoftPinsAndPlainObjectsGoInOrderOfLastAccess) {
  MakeExact();
  auto short_pin = Config(1, {}, true, false);
  short_pin.set_soft_pin_ttl_ms(5000);
  ASSERT_EQ(Put("c1", "plain_old", kObj), kOk);
  Advance(seconds(1));
  ASSERT_EQ(Put("c1", "soft", kObj, short_pin), kOk);
  Advance(seconds(1));
  ASSERT_EQ(Put("c1", "plain_new", kObj), kOk);
  Advance(seconds(1));
  ASSERT_EQ(Put("c1", "pinned", kObj, Config(1, {}, true, false)), kOk);  // the default TTL
  Advance(seconds(1));
  auto keys = Fill("k", 6);  // full; "soft" lapsed meanwhile
  for (const char* k : {"k0", "k1", "k2", "k3", "k4", "k5"}) {
    ASSERT_EQ(Get(k).code(), kOk);  // the fill is now the most recently used
    Advance(seconds(1));
  }
  ExpireLeases();
  const std::vector<std::string> first = {"plain_old", "soft", "plain_new", "pinned"};
  ASSERT_EQ(Put("c1", "n1", kObj), kOk);
  EXPECT_EQ(Gone(first), (std::set<std::string>{"plain_old"}));
  ASSERT_EQ(Put("c1", "n2", kObj), kOk);  // "soft" was accessed before "plain_new"
  EXPECT_EQ(Gone(first), (std::set<std::string>{"plain_old", "soft"}));
  ASSERT_EQ(Put("c1", "n3", kObj), kOk);
  EXPECT_EQ(Gone(first), (std::set<std::string>{"plain_old", "soft", "plain_new"}));
  ASSERT_EQ(Put("c1", "n4", kObj), kOk);  // then the fill, oldest access first
  EXPECT_EQ(Gone(keys), (std::set<std::string>{"k0"}));
  EXPECT_EQ(Exist("pinned"), kOk);
}

TEST_F(MasterEvictionTest, ABigEvictionGoesOnInPassesOfBoundedSizeAcrossCalls) {
  // Above 92 %, evict down to 42 %: for 20,000 small objects that is ~10,000 victims,
  // taken kEvictChunk per PutStart or Tick, oldest first.
  constexpr uint64_t kSmall = 64;
  constexpr int kSlots = 20000;
  MasterConfig c;
  c.eviction_high_watermark_ratio = 0.92;
  c.eviction_ratio = 0.5;
  Make(c);
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, kSlots * kSmall), kOk);
  std::vector<std::string> keys;
  for (int i = 0; i < 18401; ++i) {  // just above 92 %: the next PutStart evicts
    keys.push_back("k" + std::to_string(i));
    ASSERT_EQ(Put("c1", keys.back(), kSmall), kOk) << i;
    Advance(milliseconds(1));
    if (i % 1000 == 0) {
      ASSERT_TRUE(Ping("c1").client_known());  // c1 must not expire
    }
  }
  ASSERT_EQ(master_->GetStats().evicted_objects(), 0u);
  const size_t chunk = MasterService::kEvictChunk;
  ASSERT_EQ(Put("c1", "p1", kSmall), kOk);
  EXPECT_EQ(master_->GetStats().evicted_objects(), chunk);
  EXPECT_EQ(Exist(keys[chunk - 1]), C(ErrorCode::OBJECT_NOT_FOUND));  // the oldest went
  EXPECT_EQ(Exist(keys[chunk]), kOk);
  ASSERT_TRUE(Ping("c1").client_known());
  master_->Tick();  // below the high watermark now, but still on the way to the low one
  EXPECT_EQ(master_->GetStats().evicted_objects(), 2 * chunk);
  ASSERT_EQ(Put("c1", "p2", kSmall), kOk);  // the third pass reaches the low watermark
  const auto stats = master_->GetStats();
  EXPECT_LE(stats.allocated(), static_cast<uint64_t>(0.42 * kSlots * kSmall) + kSmall);
  EXPECT_GT(stats.allocated(), static_cast<uint64_t>(0.40 * kSlots * kSmall));
  const uint64_t evicted = stats.evicted_objects();
  EXPECT_EQ(Exist(keys[evicted - 1]), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Exist(keys[evicted]), kOk);
  // Done: the next put evicts nothing.
  ASSERT_EQ(Put("c1", "after", kSmall), kOk);
  master_->Tick();
  EXPECT_EQ(master_->GetStats().evicted_objects(), evicted);
}

// ---- Client TTL and stale puts (Tick) ----

}  // namespace
}  // namespace store
}  // namespace mooncake
