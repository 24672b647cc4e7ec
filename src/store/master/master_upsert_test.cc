// MasterService: upsert (PutStartRequest.upsert) and ReplicaClear.
#include <gtest/gtest.h>

#include "store/master/master_service_test_fixture.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_support;

class MasterUpsertTest : public MasterServiceTest {
 protected:
  rpc::PutStartResult UpsertStart(const std::string& client, const std::string& key,
                                  uint64_t size, rpc::ReplicateConfig config = Config()) {
    return PutStart(client, key, size, config, /*nonce=*/0, /*upsert=*/true);
  }
  int32_t Upsert(const std::string& client, const std::string& key, uint64_t size,
                 rpc::ReplicateConfig config = Config()) {
    auto r = UpsertStart(client, key, size, config);
    if (r.code() != kOk) return r.code();
    return PutEnd(client, key);
  }
  static uint64_t Addr(const rpc::GetReplicaListResult& r) {
    return r.replicas_size() > 0 ? r.replicas(0).buffer().addr() : 0;
  }
  rpc::ReplicaClearResponse Clear(const std::string& client, const std::vector<std::string>& keys,
                                  const std::string& segment = "") {
    rpc::ReplicaClearRequest req;
    req.set_client_id(client);
    for (const auto& k : keys) req.add_keys(k);
    req.set_segment_name(segment);
    return master_->ReplicaClear(req);
  }
};

TEST_F(MasterUpsertTest, NewKeyIsAPut) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, 1 * MiB), kOk);
  auto r = UpsertStart("c1", "k", 1000);
  ASSERT_EQ(r.code(), kOk);
  EXPECT_EQ(Get("k").code(), C(ErrorCode::REPLICA_IS_NOT_READY));
  EXPECT_EQ(PutEnd("c1", "k"), kOk);
  EXPECT_EQ(Get("k").size(), 1000u);
}

TEST_F(MasterUpsertTest, OldValueStaysVisibleUntilPutEndThenTheNewOneInNewSpace) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, 1 * MiB), kOk);
  ASSERT_EQ(Put("c1", "k", 1000), kOk);
  const uint64_t old_addr = Addr(Get("k"));
  auto r = UpsertStart("c2", "k", 2000);
  ASSERT_EQ(r.code(), kOk);
  ASSERT_EQ(r.replicas_size(), 1);
  const uint64_t new_addr = r.replicas(0).buffer().addr();
  // the new value is written elsewhere, never over the old one
  EXPECT_TRUE(new_addr >= old_addr + 1000 || new_addr + 2000 <= old_addr);
  auto during = Get("k");
  EXPECT_EQ(during.size(), 1000u);
  EXPECT_EQ(Addr(during), old_addr);
  EXPECT_EQ(Exist("k"), kOk);
  EXPECT_EQ(PutEnd("c2", "k"), kOk);
  auto after = Get("k");
  EXPECT_EQ(after.size(), 2000u);
  EXPECT_EQ(Addr(after), new_addr);
  EXPECT_EQ(master_->GetStats().keys(), 1u);
}

TEST_F(MasterUpsertTest, LeasedOldSpaceIsNotReusedUntilTheLeaseLapses) {
  MasterConfig c;
  c.default_kv_lease_ttl_ms = 1000;
  c.eviction_high_watermark_ratio = 1.0;
  c.eviction_ratio = 0.0;
  Make(c);
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, 4 * KiB), kOk);  // room for two 2 KiB values
  ASSERT_EQ(Put("c1", "k", 2 * KiB), kOk);
  const uint64_t old_addr = Addr(Get("k"));  // a reader holds a lease on the old value
  ASSERT_EQ(Upsert("c1", "k", 2 * KiB), kOk);
  EXPECT_NE(Addr(Get("k")), old_addr);  // (leases the new value too)
  // the old value's space is still leased: a third value has nowhere to go
  EXPECT_EQ(UpsertStart("c1", "k", 2 * KiB).code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  Advance(milliseconds(1100));
  ASSERT_EQ(Upsert("c1", "k", 2 * KiB), kOk);
  EXPECT_EQ(Addr(Get("k")), old_addr);
}

TEST_F(MasterUpsertTest, LeasedOldSpaceRefusesANewValueWhileLeased) {
  MasterConfig c;
  c.default_kv_lease_ttl_ms = 1000;
  c.eviction_high_watermark_ratio = 1.0;
  c.eviction_ratio = 0.0;
  Make(c);
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, 4 * KiB), kOk);
  ASSERT_EQ(Put("c1", "a", 2 * KiB), kOk);
  const uint64_t a_addr = Addr(Get("a"));  // leased
  ASSERT_EQ(Upsert("c1", "a", 2 * KiB), kOk);
  // the old value's space waits in the graveyard: a put of another key does not get it
  auto r = PutStart("c1", "b", 2 * KiB);
  if (r.code() == kOk) {
    EXPECT_NE(r.replicas(0).buffer().addr(), a_addr);
  }
  EXPECT_GT(Metrics()["master_deferred_free_bytes"], 0u);
}

TEST_F(MasterUpsertTest, OneWriterAtATime) {
  MasterConfig c;
  c.put_start_discard_timeout_s = 30;
  Make(c);
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, 1 * MiB), kOk);
  ASSERT_EQ(Put("c1", "k", 100), kOk);
  ASSERT_EQ(UpsertStart("c1", "k", 200).code(), kOk);
  EXPECT_EQ(UpsertStart("c2", "k", 300).code(), C(ErrorCode::OBJECT_REPLICA_BUSY));
  EXPECT_EQ(PutStart("c2", "k", 300).code(), C(ErrorCode::OBJECT_ALREADY_EXISTS));
  EXPECT_EQ(PutEnd("c2", "k"), C(ErrorCode::INVALID_WRITE));  // not c2's upsert
  // a plain put in flight: an upsert waits for it too
  ASSERT_EQ(PutStart("c1", "p", 100).code(), kOk);
  EXPECT_EQ(UpsertStart("c2", "p", 100).code(), C(ErrorCode::OBJECT_REPLICA_BUSY));
  // a stale upsert (no PutEnd within the discard timeout) no longer blocks
  Advance(seconds(31));
  ASSERT_EQ(UpsertStart("c2", "k", 300).code(), kOk);
  EXPECT_EQ(PutEnd("c1", "k"), C(ErrorCode::INVALID_WRITE));  // c1's was discarded
  EXPECT_EQ(PutEnd("c2", "k"), kOk);
  EXPECT_EQ(Get("k").size(), 300u);
}

TEST_F(MasterUpsertTest, RevokeKeepsTheOldValueAndFreesTheNewSpace) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, 1 * MiB), kOk);
  ASSERT_EQ(Put("c1", "k", 100), kOk);
  const uint64_t allocated = master_->GetStats().allocated();
  ASSERT_EQ(UpsertStart("c1", "k", 5000).code(), kOk);
  EXPECT_GT(master_->GetStats().allocated(), allocated);
  EXPECT_EQ(PutRevoke("c1", "k"), kOk);
  EXPECT_EQ(master_->GetStats().allocated(), allocated);
  EXPECT_EQ(Get("k").size(), 100u);
}

TEST_F(MasterUpsertTest, TickDiscardsStaleUpsertsAndUnmountDropsThem) {
  MasterConfig c;
  c.put_start_discard_timeout_s = 5;
  c.client_ttl_s = 1000;
  Make(c);
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, 1 * MiB), kOk);
  ASSERT_EQ(Mount("c2", "seg2", 0x20000000, 1 * MiB), kOk);
  ASSERT_EQ(Put("c1", "k", 100, Config(1, {"seg"})), kOk);
  const uint64_t allocated = master_->GetStats().allocated();
  ASSERT_EQ(UpsertStart("c1", "k", 100, Config(1, {"seg"})).code(), kOk);
  Advance(seconds(6));
  master_->Tick();
  EXPECT_EQ(master_->GetStats().allocated(), allocated);
  EXPECT_EQ(PutEnd("c1", "k"), C(ErrorCode::INVALID_WRITE));
  EXPECT_EQ(Get("k").size(), 100u);
  // an upsert in flight on a segment that goes away is dropped with it
  ASSERT_EQ(UpsertStart("c1", "k", 100, Config(1, {"seg2"})).code(), kOk);
  ASSERT_EQ(Unmount("c2", "seg2", 0x20000000), kOk);
  EXPECT_EQ(PutEnd("c1", "k"), C(ErrorCode::INVALID_WRITE));
  EXPECT_EQ(Get("k").size(), 100u);
}

TEST_F(MasterUpsertTest, KeepSoftPinTakesTheReplacedValuesPin) {
  MasterConfig c;
  c.eviction_high_watermark_ratio = 1.0;
  c.eviction_ratio = 0.0;
  Make(c);
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, 2 * KiB), kOk);
  ASSERT_EQ(Put("c1", "pinned", 1 * KiB, Config(1, {}, /*soft_pin=*/true)), kOk);
  auto keep = Config();
  keep.set_keep_soft_pin(true);
  ASSERT_EQ(Upsert("c1", "pinned", 1 * KiB, keep), kOk);
  Advance(seconds(1));
  ASSERT_EQ(Put("c1", "plain", 1 * KiB), kOk);
  Advance(seconds(1));
  // full: the unpinned object goes first although it is newer
  ASSERT_EQ(Put("c1", "third", 1 * KiB), kOk);
  EXPECT_EQ(Exist("pinned"), kOk);
  EXPECT_EQ(Exist("plain"), C(ErrorCode::OBJECT_NOT_FOUND));
}

TEST_F(MasterUpsertTest, ReplicaClearOwnUnleasedCompleteObjectsOnly) {
  MasterConfig c;
  c.default_kv_lease_ttl_ms = 1000;
  Make(c);
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 * MiB), kOk);
  ASSERT_EQ(Mount("c2", "seg2", 0x20000000, 1 * MiB), kOk);
  ASSERT_EQ(Put("c1", "mine", 100, Config(2)), kOk);
  ASSERT_EQ(Put("c1", "leased", 100), kOk);
  ASSERT_EQ(Put("c2", "theirs", 100), kOk);
  ASSERT_EQ(PutStart("c1", "inflight", 100).code(), kOk);
  // as upstream, a fresh write counts as leased for one TTL
  EXPECT_EQ(Clear("c1", {"mine"}).cleared_keys_size(), 0);
  Advance(milliseconds(1100));
  ASSERT_EQ(Get("leased").code(), kOk);
  auto r = Clear("c1", {"mine", "leased", "theirs", "inflight", "absent"}, "seg2");
  ASSERT_EQ(r.code(), kOk);
  ASSERT_EQ(r.cleared_keys_size(), 1);
  EXPECT_EQ(r.cleared_keys(0), "mine");
  EXPECT_EQ(SegmentsOf(Get("mine")), std::set<std::string>{"seg1"});
  Advance(milliseconds(1100));
  r = Clear("c1", {"mine", "leased", "theirs"});
  ASSERT_EQ(r.cleared_keys_size(), 2);
  EXPECT_EQ(Exist("mine"), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Exist("leased"), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Exist("theirs"), kOk);
  // the last replica cleared by segment removes the object; its space is free again
  ASSERT_EQ(Put("c1", "one", 100, Config(1, {"seg1"})), kOk);
  Advance(milliseconds(1100));
  r = Clear("c1", {"one"}, "seg1");
  ASSERT_EQ(r.cleared_keys_size(), 1);
  EXPECT_EQ(Exist("one"), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Clear("c1", std::vector<std::string>(5000, "k")).code(), C(ErrorCode::INVALID_PARAMS));
}

}  // namespace
}  // namespace store
}  // namespace mooncake
