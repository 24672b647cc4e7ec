// Unit tests for MasterService (src/store/master/master_service.h): the Store master's rules, driven
// directly (no RPC layer) with a fake clock. Eviction: master_eviction_test.cc.
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

TEST_F(MasterServiceTest, MountRejectsInvalidParameters) {
  EXPECT_EQ(Mount("", "seg", 0x1000, MiB), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(Mount("c", "", 0x1000, MiB), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(Mount("c", "seg", 0x1000, 0), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(Mount("c", "seg", 0, MiB), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(Mount("c", "seg", UINT64_MAX - 100, MiB), C(ErrorCode::INVALID_PARAMS));  // wraps
  auto stats = master_->GetStats();
  EXPECT_EQ(stats.segments(), 0u);
  EXPECT_EQ(stats.clients(), 0u);
  EXPECT_EQ(stats.capacity(), 0u);
}

TEST_F(MasterServiceTest, MountOverlapAndIdempotentRemount) {
  ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  // The very same mount again (a retry after a lost reply): OK, nothing added.
  EXPECT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  EXPECT_EQ(master_->GetStats().segments(), 1u);
  EXPECT_EQ(master_->GetStats().capacity(), MiB);
  // Overlapping ranges of the same segment name: refused, whoever asks.
  EXPECT_EQ(Mount("c2", "seg", 0x100000, MiB), C(ErrorCode::SEGMENT_ALREADY_EXISTS));
  EXPECT_EQ(Mount("c1", "seg", 0x100000, 2 * MiB), C(ErrorCode::SEGMENT_ALREADY_EXISTS));
  EXPECT_EQ(Mount("c1", "seg", 0x100000 + MiB / 2, MiB), C(ErrorCode::SEGMENT_ALREADY_EXISTS));
  EXPECT_EQ(Mount("c1", "seg", 0x100000 - MiB / 2, MiB), C(ErrorCode::SEGMENT_ALREADY_EXISTS));
  EXPECT_EQ(master_->GetStats().segments(), 1u);
  // Adjacent, not overlapping: a second range of the same segment.
  EXPECT_EQ(Mount("c1", "seg", 0x100000 + MiB, MiB), kOk);
  // The same addresses in another process (another segment name) are no conflict.
  EXPECT_EQ(Mount("c2", "other", 0x100000, MiB), kOk);
  auto stats = master_->GetStats();
  EXPECT_EQ(stats.segments(), 3u);
  EXPECT_EQ(stats.clients(), 2u);
  EXPECT_EQ(stats.capacity(), 3 * MiB);
}

TEST_F(MasterServiceTest, UnmountRules) {
  ASSERT_EQ(Mount("c1", "seg1", 0x100000, MiB), kOk);
  ASSERT_EQ(Put("c1", "k", 1000), kOk);
  EXPECT_EQ(Unmount("c2", "seg1", 0x100000), C(ErrorCode::ILLEGAL_CLIENT));
  EXPECT_EQ(Exist("k"), kOk);
  EXPECT_EQ(Unmount("c1", "seg1", 0x200000), C(ErrorCode::SEGMENT_NOT_FOUND));
  EXPECT_EQ(Unmount("c1", "nope", 0x100000), C(ErrorCode::SEGMENT_NOT_FOUND));
  EXPECT_EQ(Unmount("c1", "seg1", 0x100000), kOk);
  EXPECT_EQ(Exist("k"), C(ErrorCode::OBJECT_NOT_FOUND));  // its only replica went with it
  EXPECT_EQ(Get("k").code(), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(master_->GetStats().segments(), 0u);
  EXPECT_EQ(master_->GetStats().keys(), 0u);
  EXPECT_EQ(Unmount("c1", "seg1", 0x100000), C(ErrorCode::SEGMENT_NOT_FOUND));
  // Mountable again afterwards.
  EXPECT_EQ(Mount("c1", "seg1", 0x100000, MiB), kOk);
}

TEST_F(MasterServiceTest, PingKnownAndUnknownClients) {
  auto unknown = Ping("nobody");
  EXPECT_EQ(unknown.code(), kOk);
  EXPECT_FALSE(unknown.client_known());
  const uint64_t v0 = unknown.view_version();
  ASSERT_EQ(Mount("c1", "seg1", 0x100000, MiB), kOk);
  auto known = Ping("c1");
  EXPECT_EQ(known.code(), kOk);
  EXPECT_TRUE(known.client_known());
  EXPECT_GT(known.view_version(), v0);  // a mount changes the view
  EXPECT_FALSE(Ping("nobody").client_known());
}

// ---- Put / Get ----

TEST_F(MasterServiceTest, PutStartPutEndGetRoundTrip) {
  const uint64_t base = 0x7f0000000000;
  ASSERT_EQ(Mount("c1", "host:1", base, 4 * MiB), kOk);
  auto start = PutStart("c1", "key", 12345);
  ASSERT_EQ(start.code(), kOk) << start.message();
  ASSERT_EQ(start.replicas_size(), 1);
  const auto& rep = start.replicas(0);
  EXPECT_EQ(rep.status(), rpc::Replica::PROCESSING);
  EXPECT_EQ(rep.buffer().segment_name(), "host:1");
  EXPECT_EQ(rep.buffer().size(), 12345u);
  EXPECT_GE(rep.buffer().addr(), base);
  EXPECT_LE(rep.buffer().addr() + rep.buffer().size(), base + 4 * MiB);
  EXPECT_EQ(rep.buffer().addr() % 64, 0u);

  ASSERT_EQ(PutEnd("c1", "key"), kOk);
  auto got = Get("key");
  ASSERT_EQ(got.code(), kOk);
  EXPECT_EQ(got.size(), 12345u);
  EXPECT_EQ(got.lease_ttl_ms(), master_->config().default_kv_lease_ttl_ms);
  ASSERT_EQ(got.replicas_size(), 1);
  EXPECT_EQ(got.replicas(0).status(), rpc::Replica::COMPLETE);
  EXPECT_EQ(got.replicas(0).buffer().segment_name(), "host:1");
  EXPECT_EQ(got.replicas(0).buffer().addr(), rep.buffer().addr());
  EXPECT_EQ(got.replicas(0).buffer().size(), 12345u);
  EXPECT_EQ(Exist("key"), kOk);
  auto exist = master_->ExistKey(Keys("x", {"key", "missing"}));
  ASSERT_EQ(exist.results_size(), 2);
  EXPECT_EQ(exist.results(0).size(), 12345u);
  EXPECT_EQ(exist.results(1).code(), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Get("missing").code(), C(ErrorCode::OBJECT_NOT_FOUND));
  // PutEnd of a complete object is not a write.
  EXPECT_EQ(PutEnd("c1", "key"), C(ErrorCode::INVALID_WRITE));
  EXPECT_EQ(PutEnd("c1", "missing"), C(ErrorCode::OBJECT_NOT_FOUND));
}

TEST_F(MasterServiceTest, BatchPutStartReportsPerItem) {
  ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  rpc::PutStartRequest req;
  req.set_client_id("c1");
  auto add = [&](const std::string& k, uint64_t s) {
    auto* i = req.add_items();
    i->set_key(k);
    i->set_size(s);
  };
  add("a", 100);
  add("", 100);
  add("b", 0);
  add("c", 2 * MiB);  // bigger than the pool
  add("a", 100);      // same key again in the batch
  auto resp = master_->PutStart(req);
  ASSERT_EQ(resp.results_size(), 5);
  EXPECT_EQ(resp.results(0).code(), kOk);
  EXPECT_EQ(resp.results(1).code(), C(ErrorCode::INVALID_KEY));
  EXPECT_EQ(resp.results(2).code(), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(resp.results(3).code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  EXPECT_EQ(resp.results(4).code(), C(ErrorCode::OBJECT_ALREADY_EXISTS));
  // A call of five items is upstream's batch call (its single-call counters stay 0).
  auto m = Metrics();
  EXPECT_EQ(m["master_put_start_requests_total"], 0u);
  EXPECT_EQ(m["master_batch_put_start_requests_total"], 1u);
  EXPECT_EQ(m["master_batch_put_start_items_total"], 5u);
  EXPECT_EQ(m["master_batch_put_start_partial_successes_total"], 1u);
  EXPECT_EQ(m["master_batch_put_start_failed_items_total"], 4u);
  EXPECT_EQ(m["master_batch_put_start_failures_total"], 0u);
  // "c" was refused by the client's in-flight bound (half the pool), before any placement.
  EXPECT_EQ(m["master_put_start_alloc_failures_total"], 0u);
}

TEST_F(MasterServiceTest, NoSegmentMeansNoAvailableHandle) {
  auto r = PutStart("c1", "k", 10);
  EXPECT_EQ(r.code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  EXPECT_FALSE(r.message().empty());
}

TEST_F(MasterServiceTest, InvisibleWhileProcessing) {
  ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  ASSERT_EQ(PutStart("c1", "k", 100).code(), kOk);
  EXPECT_EQ(Get("k").code(), C(ErrorCode::REPLICA_IS_NOT_READY));
  EXPECT_EQ(Exist("k"), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Remove("k"), C(ErrorCode::REPLICA_IS_NOT_READY));
  EXPECT_EQ(Remove("k", true), C(ErrorCode::REPLICA_IS_NOT_READY));
  EXPECT_EQ(master_->RemoveAll(Keys("x", {}, true)).count(), 0);
  EXPECT_EQ(RemoveByRegex(".*", true).count(), 0);
  EXPECT_EQ(PutStart("c2", "k", 100).code(), C(ErrorCode::OBJECT_ALREADY_EXISTS));
  ASSERT_EQ(PutEnd("c1", "k"), kOk);
  EXPECT_EQ(Get("k").code(), kOk);
  EXPECT_EQ(Exist("k"), kOk);
}

TEST_F(MasterServiceTest, PutEndAndRevokeFromAnotherClientAreIllegal) {
  ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  ASSERT_EQ(PutStart("c1", "k", 100).code(), kOk);
  EXPECT_EQ(PutEnd("c2", "k"), C(ErrorCode::ILLEGAL_CLIENT));
  EXPECT_EQ(PutRevoke("c2", "k"), C(ErrorCode::ILLEGAL_CLIENT));
  EXPECT_EQ(Get("k").code(), C(ErrorCode::REPLICA_IS_NOT_READY));  // still in flight
  EXPECT_EQ(PutEnd("c1", "k"), kOk);
  EXPECT_EQ(PutRevoke("c1", "k"), C(ErrorCode::INVALID_WRITE));  // complete: not revocable
  EXPECT_EQ(PutRevoke("c1", "missing"), C(ErrorCode::OBJECT_NOT_FOUND));
}

TEST_F(MasterServiceTest, PutRevokeFreesSpace) {
  ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  auto r = PutStart("c1", "k", MiB);  // the whole segment
  ASSERT_EQ(r.code(), kOk);
  EXPECT_EQ(master_->GetStats().allocated(), MiB);
  EXPECT_EQ(PutStart("c1", "k2", 1).code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  ASSERT_EQ(PutRevoke("c1", "k"), kOk);
  EXPECT_EQ(master_->GetStats().allocated(), 0u);
  EXPECT_EQ(master_->GetStats().keys(), 0u);
  EXPECT_EQ(Get("k").code(), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(PutRevoke("c1", "k"), C(ErrorCode::OBJECT_NOT_FOUND));
  // The key and the space are free again.
  auto again = PutStart("c1", "k", MiB);
  ASSERT_EQ(again.code(), kOk);
  EXPECT_EQ(again.replicas(0).buffer().addr(), r.replicas(0).buffer().addr());
}

TEST_F(MasterServiceTest, ObjectAlreadyExists) {
  ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  ASSERT_EQ(Put("c1", "k", 100), kOk);
  EXPECT_EQ(PutStart("c1", "k", 100).code(), C(ErrorCode::OBJECT_ALREADY_EXISTS));
  EXPECT_EQ(PutStart("c2", "k", 999).code(), C(ErrorCode::OBJECT_ALREADY_EXISTS));
  EXPECT_EQ(Get("k").size(), 100u);  // not overwritten
}

// ---- Placement ----

TEST_F(MasterServiceTest, ReplicasGoToDistinctSegments) {
  ASSERT_EQ(Mount("c1", "s1", 0x100000, MiB), kOk);
  ASSERT_EQ(Mount("c2", "s2", 0x100000, MiB), kOk);
  ASSERT_EQ(Mount("c3", "s3", 0x100000, MiB), kOk);
  for (int i = 0; i < 6; ++i) {
    const std::string key = "k" + std::to_string(i);
    auto r = PutStart("c1", key, 1000, Config(2));
    ASSERT_EQ(r.code(), kOk);
    ASSERT_EQ(r.replicas_size(), 2);
    EXPECT_NE(r.replicas(0).buffer().segment_name(), r.replicas(1).buffer().segment_name());
    ASSERT_EQ(PutEnd("c1", key), kOk);
    auto got = Get(key);
    EXPECT_EQ(got.replicas_size(), 2);
    EXPECT_EQ(SegmentsOf(got).size(), 2u);
  }
  // More replicas than segments: one per segment.
  auto r = PutStart("c1", "many", 1000, Config(5));
  ASSERT_EQ(r.code(), kOk);
  EXPECT_EQ(r.replicas_size(), 3);
  // Replica bytes count once per replica.
  EXPECT_EQ(master_->GetStats().allocated(), 6 * 2 * 1024u + 3 * 1024u);
}

TEST_F(MasterServiceTest, OneSegmentGivesOneReplica) {
  ASSERT_EQ(Mount("c1", "s1", 0x100000, MiB), kOk);
  auto r = PutStart("c1", "k", 1000, Config(2));
  ASSERT_EQ(r.code(), kOk);
  EXPECT_EQ(r.replicas_size(), 1);
  // Two ranges of one segment name are still one place.
  ASSERT_EQ(Mount("c1", "s1", 0x100000 + MiB, MiB), kOk);
  auto r2 = PutStart("c1", "k2", 1000, Config(2));
  ASSERT_EQ(r2.code(), kOk);
  EXPECT_EQ(r2.replicas_size(), 1);
}

TEST_F(MasterServiceTest, ReplicaNumZeroMeansOne) {
  ASSERT_EQ(Mount("c1", "s1", 0x100000, MiB), kOk);
  ASSERT_EQ(Mount("c2", "s2", 0x100000, MiB), kOk);
  auto r = PutStart("c1", "k", 1000, Config(0));
  ASSERT_EQ(r.code(), kOk);
  EXPECT_EQ(r.replicas_size(), 1);
}

TEST_F(MasterServiceTest, PreferredSegmentsAreHonoured) {
  ASSERT_EQ(Mount("c1", "s1", 0x100000, MiB), kOk);
  ASSERT_EQ(Mount("c2", "s2", 0x200000, MiB), kOk);
  ASSERT_EQ(Mount("c3", "s3", 0x300000, MiB), kOk);
  for (int i = 0; i < 6; ++i) {  // the rotating cursor does not matter
    auto r = PutStart("c1", "p3-" + std::to_string(i), 1000, Config(1, {"s3"}));
    ASSERT_EQ(r.code(), kOk);
    ASSERT_EQ(r.replicas_size(), 1);
    EXPECT_EQ(r.replicas(0).buffer().segment_name(), "s3");
    EXPECT_GE(r.replicas(0).buffer().addr(), 0x300000u);
  }
  for (int i = 0; i < 4; ++i) {
    auto r = PutStart("c1", "p21-" + std::to_string(i), 1000, Config(2, {"s2", "s1"}));
    ASSERT_EQ(r.code(), kOk);
    ASSERT_EQ(r.replicas_size(), 2);
    EXPECT_EQ(r.replicas(0).buffer().segment_name(), "s2");
    EXPECT_EQ(r.replicas(1).buffer().segment_name(), "s1");
  }
  // A full preferred segment falls back to another.
  auto full = PutStart("c1", "fill-s3", MiB - 6 * 1024, Config(1, {"s3"}));
  ASSERT_EQ(full.code(), kOk);
  EXPECT_EQ(full.replicas(0).buffer().segment_name(), "s3");
  auto fallback = PutStart("c1", "fb", 1000, Config(1, {"s3"}));
  ASSERT_EQ(fallback.code(), kOk);
  EXPECT_NE(fallback.replicas(0).buffer().segment_name(), "s3");
  // An unknown preferred name is ignored.
  auto unknown = PutStart("c1", "u", 1000, Config(1, {"nope"}));
  EXPECT_EQ(unknown.code(), kOk);
}

TEST_F(MasterServiceTest, PlacementSpreadsOverSegments) {
  ASSERT_EQ(Mount("c1", "s1", 0x100000, MiB), kOk);
  ASSERT_EQ(Mount("c2", "s2", 0x100000, MiB), kOk);
  ASSERT_EQ(Mount("c3", "s3", 0x100000, MiB), kOk);
  std::map<std::string, int> per_segment;
  for (int i = 0; i < 9; ++i) {
    auto r = PutStart("c1", "k" + std::to_string(i), 1000);
    ASSERT_EQ(r.code(), kOk);
    ++per_segment[r.replicas(0).buffer().segment_name()];
  }
  EXPECT_EQ(per_segment.size(), 3u);
}

// ---- Leases and removal ----

TEST_F(MasterServiceTest, LeaseBlocksRemoveUntilItExpires) {
  ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  ASSERT_EQ(Put("c1", "k", 100), kOk);
  EXPECT_EQ(Remove("missing"), C(ErrorCode::OBJECT_NOT_FOUND));
  ASSERT_EQ(Get("k").code(), kOk);
  EXPECT_EQ(Remove("k"), C(ErrorCode::OBJECT_HAS_LEASE));
  const auto ttl = milliseconds(master_->config().default_kv_lease_ttl_ms);
  Advance(ttl - milliseconds(1));
  EXPECT_EQ(Remove("k"), C(ErrorCode::OBJECT_HAS_LEASE));
  Advance(milliseconds(2));
  EXPECT_EQ(Remove("k"), kOk);
  EXPECT_EQ(Exist("k"), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(master_->GetStats().allocated(), 0u);
}

TEST_F(MasterServiceTest, EachGetExtendsTheLease) {
  ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  ASSERT_EQ(Put("c1", "k", 100), kOk);
  const auto ttl = milliseconds(master_->config().default_kv_lease_ttl_ms);
  ASSERT_EQ(Get("k").code(), kOk);
  Advance(ttl / 2);
  ASSERT_EQ(Get("k").code(), kOk);
  Advance(ttl / 2 + milliseconds(1));  // past the first lease, inside the second
  EXPECT_EQ(Remove("k"), C(ErrorCode::OBJECT_HAS_LEASE));
  Advance(ttl / 2);
  EXPECT_EQ(Remove("k"), kOk);
}

TEST_F(MasterServiceTest, ForceRemoveIgnoresTheLease) {
  ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  ASSERT_EQ(Put("c1", "k", 100), kOk);
  ASSERT_EQ(Get("k").code(), kOk);
  EXPECT_EQ(Remove("k", true), kOk);
  EXPECT_EQ(Get("k").code(), C(ErrorCode::OBJECT_NOT_FOUND));
}

TEST_F(MasterServiceTest, RemoveByRegexCountsAndSkipsLeased) {
  ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  for (const char* k : {"a/1", "a/2", "a/3", "b/1", "xa/1"}) ASSERT_EQ(Put("c1", k, 100), kOk);
  ASSERT_EQ(PutStart("c1", "a/inflight", 100).code(), kOk);
  ASSERT_EQ(Get("a/1").code(), kOk);  // leased
  auto r = RemoveByRegex("^a/");
  EXPECT_EQ(r.code(), kOk);
  EXPECT_EQ(r.count(), 2);
  EXPECT_EQ(Present({"a/1", "a/2", "a/3", "b/1", "xa/1"}),
            (std::set<std::string>{"a/1", "b/1", "xa/1"}));
  EXPECT_EQ(RemoveByRegex("^a/").count(), 0);  // only the leased one is left
  auto forced = RemoveByRegex("^a/", true);
  EXPECT_EQ(forced.code(), kOk);
  EXPECT_EQ(forced.count(), 1);
  EXPECT_EQ(Present({"a/1", "b/1", "xa/1"}), (std::set<std::string>{"b/1", "xa/1"}));
  EXPECT_EQ(RemoveByRegex("^nomatch$").count(), 0);
  // The in-flight object is untouched and can still be ended.
  EXPECT_EQ(PutEnd("c1", "a/inflight"), kOk);
}

TEST_F(MasterServiceTest, RemoveByRegexRejectsAnInvalidExpression) {
  ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  ASSERT_EQ(Put("c1", "k", 100), kOk);
  for (const char* bad : {"(", "[a-", "*x", "a{2,1}"}) {
    auto r = RemoveByRegex(bad);
    EXPECT_EQ(r.code(), C(ErrorCode::INVALID_PARAMS)) << bad;
    EXPECT_FALSE(r.message().empty());
  }
  EXPECT_EQ(Exist("k"), kOk);
}

TEST_F(MasterServiceTest, RemoveAllCountsAndRespectsLeases) {
  ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(Put("c1", "k" + std::to_string(i), 100), kOk);
  ASSERT_EQ(PutStart("c1", "inflight", 100).code(), kOk);
  ASSERT_EQ(Get("k0").code(), kOk);
  ASSERT_EQ(Get("k1").code(), kOk);
  auto r = master_->RemoveAll(Keys("x", {}));
  EXPECT_EQ(r.code(), kOk);
  EXPECT_EQ(r.count(), 3);
  auto forced = master_->RemoveAll(Keys("x", {}, true));
  EXPECT_EQ(forced.count(), 2);
  EXPECT_EQ(master_->GetStats().keys(), 1u);  // the in-flight one
  EXPECT_EQ(master_->RemoveAll(Keys("x", {}, true)).count(), 0);
  ASSERT_EQ(PutRevoke("c1", "inflight"), kOk);
  // The two forced out while leased keep their space until their leases lapse.
  EXPECT_EQ(master_->GetStats().allocated(), 2 * 128u);
  Advance(milliseconds(master_->config().default_kv_lease_ttl_ms));
  master_->Tick();
  EXPECT_EQ(master_->GetStats().allocated(), 0u);
}

TEST_F(MasterServiceTest, SilentClientLosesItsSegments) {
  MasterConfig c;
  c.client_ttl_s = 10;
  Make(c);
  ASSERT_EQ(Mount("alive", "sa", 0x100000, MiB), kOk);
  ASSERT_EQ(Mount("silent", "ss", 0x100000, MiB), kOk);
  ASSERT_EQ(Put("alive", "only-silent", 1000, Config(1, {"ss"})), kOk);
  ASSERT_EQ(Put("alive", "both", 1000, Config(2, {"ss", "sa"})), kOk);
  ASSERT_EQ(Put("alive", "only-alive", 1000, Config(1, {"sa"})), kOk);
  ASSERT_EQ(PutStart("alive", "inflight-silent", 1000, Config(1, {"ss"})).code(), kOk);
  ASSERT_EQ(SegmentsOf(Get("only-silent")), (std::set<std::string>{"ss"}));
  ASSERT_EQ(SegmentsOf(Get("both")), (std::set<std::string>{"ss", "sa"}));
  for (int i = 0; i < 9; ++i) {
    Advance(seconds(1));
    ASSERT_TRUE(Ping("alive").client_known());
    master_->Tick();
  }
  // 9 s of silence: still there.
  EXPECT_EQ(master_->GetStats().segments(), 2u);
  EXPECT_EQ(Exist("only-silent"), kOk);
  Advance(seconds(1));
  ASSERT_TRUE(Ping("alive").client_known());
  master_->Tick();  // 10 s: gone
  auto stats = master_->GetStats();
  EXPECT_EQ(stats.segments(), 1u);
  EXPECT_EQ(stats.clients(), 1u);
  EXPECT_EQ(Exist("only-silent"), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Get("only-silent").code(), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Get("inflight-silent").code(), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(PutEnd("alive", "inflight-silent"), C(ErrorCode::OBJECT_NOT_FOUND));
  auto both = Get("both");
  ASSERT_EQ(both.code(), kOk);
  ASSERT_EQ(both.replicas_size(), 1);
  EXPECT_EQ(both.replicas(0).buffer().segment_name(), "sa");
  EXPECT_EQ(Exist("only-alive"), kOk);
  EXPECT_EQ(stats.keys(), 2u);
  EXPECT_EQ(stats.allocated(), 2 * 1024u);
  // The silent client is forgotten: its next ping says so, and it may mount again.
  auto ping = Ping("silent");
  EXPECT_FALSE(ping.client_known());
  EXPECT_EQ(Mount("silent", "ss", 0x100000, MiB), kOk);
  EXPECT_TRUE(Ping("silent").client_known());
  EXPECT_EQ(Metrics()["master_expired_clients_total"], 1u);
}

TEST_F(MasterServiceTest, StalePutStartIsDiscardedByTick) {
  ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  const auto timeout = seconds(master_->config().put_start_discard_timeout_s);
  ASSERT_EQ(PutStart("c1", "stale", 1000).code(), kOk);
  for (auto t = seconds(1); t < timeout; t += seconds(1)) {
    Advance(seconds(1));
    ASSERT_TRUE(Ping("c1").client_known());
    master_->Tick();
  }
  // timeout - 1 s: still there
  EXPECT_EQ(master_->GetStats().keys(), 1u);
  EXPECT_EQ(PutStart("c2", "stale", 1000).code(), C(ErrorCode::OBJECT_ALREADY_EXISTS));
  Advance(seconds(1));
  ASSERT_TRUE(Ping("c1").client_known());
  master_->Tick();  // timeout: discarded
  EXPECT_EQ(master_->GetStats().keys(), 0u);
  EXPECT_EQ(master_->GetStats().allocated(), 0u);
  EXPECT_EQ(PutEnd("c1", "stale"), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Metrics()["master_put_start_discard_cnt"], 1u);
  EXPECT_EQ(Metrics()["master_put_start_release_cnt"], 1u);
  EXPECT_EQ(Put("c2", "stale", 1000), kOk);
}

TEST_F(MasterServiceTest, StalePutStartIsReplacedByANewPutStart) {
  ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  ASSERT_EQ(PutStart("c1", "k", 1000).code(), kOk);
  Advance(seconds(master_->config().put_start_discard_timeout_s));
  // No Tick: the next PutStart of the key takes over.
  ASSERT_EQ(PutStart("c2", "k", 2000).code(), kOk);
  EXPECT_EQ(PutEnd("c1", "k"), C(ErrorCode::ILLEGAL_CLIENT));
  EXPECT_EQ(PutEnd("c2", "k"), kOk);
  EXPECT_EQ(Get("k").size(), 2000u);
  EXPECT_EQ(master_->GetStats().allocated(), 2048u);
}

// ---- Metrics ----

TEST_F(MasterServiceTest, MetricsTextHasTheGaugesWithTheirValues) {
  auto empty = Metrics();
  for (const char* name :
       {"master_total_capacity_bytes", "master_allocated_bytes", "master_key_count",
        "master_mounted_segments", "master_active_clients", "master_put_start_requests_total",
        "master_get_replica_list_requests_total", "master_evicted_key_count",
        "master_value_size_bytes_count"}) {
    ASSERT_TRUE(empty.count(name)) << name;
    EXPECT_EQ(empty[name], 0u) << name;
  }
  ASSERT_EQ(Mount("c1", "s1", 0x100000, MiB), kOk);
  ASSERT_EQ(Mount("c2", "s2", 0x100000, 2 * MiB), kOk);
  ASSERT_EQ(Put("c1", "a", 1000), kOk);
  ASSERT_EQ(Put("c1", "b", 64, Config(2)), kOk);
  ASSERT_EQ(PutStart("c1", "c", 100).code(), kOk);  // in flight counts as a key
  ASSERT_EQ(Get("a").code(), kOk);
  ASSERT_EQ(Get("nope").code(), C(ErrorCode::OBJECT_NOT_FOUND));
  ASSERT_EQ(Exist("a"), kOk);
  ASSERT_EQ(Remove("nope"), C(ErrorCode::OBJECT_NOT_FOUND));
  auto m = Metrics();
  EXPECT_EQ(m["master_total_capacity_bytes"], 3 * MiB);
  EXPECT_EQ(m["master_allocated_bytes"], 1024u + 2 * 64u + 128u);
  EXPECT_EQ(m["master_key_count"], 3u);
  EXPECT_EQ(m["master_mounted_segments"], 2u);
  EXPECT_EQ(m["master_active_clients"], 2u);
  EXPECT_EQ(m["master_put_start_requests_total"], 3u);
  EXPECT_EQ(m["master_put_start_failures_total"], 0u);
  EXPECT_EQ(m["master_put_end_requests_total"], 2u);
  // Upstream counts a miss as a failed get; hits and bytes as its cache-hit counters.
  EXPECT_EQ(m["master_get_replica_list_requests_total"], 2u);
  EXPECT_EQ(m["master_get_replica_list_failures_total"], 1u);
  EXPECT_EQ(m["total_get_nums_"], 2u);
  EXPECT_EQ(m["valid_get_nums_"], 1u);
  EXPECT_EQ(m["mem_cache_hit_nums_"], 1u);
  EXPECT_EQ(m["mem_cache_hit_bytes_total"], 1000u);
  EXPECT_EQ(m["mem_cache_nums_"], 2u);
  EXPECT_EQ(m["master_exist_key_requests_total"], 1u);
  EXPECT_EQ(m["master_exist_key_failures_total"], 0u);
  EXPECT_EQ(m["master_remove_requests_total"], 1u);
  EXPECT_EQ(m["master_remove_failures_total"], 1u);
  EXPECT_EQ(m["master_mount_segment_requests_total"], 2u);
  EXPECT_EQ(m["master_unmount_segment_requests_total"], 0u);
  // The sizes of the three objects placed: 1000 and 100 under 4 KiB, 64 too.
  EXPECT_EQ(m["master_value_size_bytes_count"], 3u);
  EXPECT_EQ(m["master_value_size_bytes_sum"], 1164u);
  EXPECT_EQ(m["master_value_size_bytes_bucket{le=\"4096\"}"], 3u);
  EXPECT_EQ(m["master_value_size_bytes_bucket{le=\"+Inf\"}"], 3u);
  ASSERT_EQ(Unmount("c2", "s2", 0x100000), kOk);
  m = Metrics();
  EXPECT_EQ(m["master_unmount_segment_requests_total"], 1u);
  EXPECT_EQ(m["master_mounted_segments"], 1u);
  EXPECT_EQ(m["master_total_capacity_bytes"], MiB);
  // "b" kept its replica on s1 (or went, if that was its only one); "a" and "c" are on s1
  // or were on s2. Whatever happened, the gauges agree with GetStats.
  auto stats = master_->GetStats();
  EXPECT_EQ(m["master_key_count"], stats.keys());
  EXPECT_EQ(m["master_allocated_bytes"], stats.allocated());
  // The text itself: one "name value" line per metric.
  const std::string text = master_->MetricsText();
  EXPECT_NE(text.find("\nmaster_key_count " + std::to_string(stats.keys()) + "\n"),
            std::string::npos);
  EXPECT_NE(text.find("# TYPE master_key_count gauge\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE master_put_start_requests_total counter\n"), std::string::npos);
}

// ---- Concurrency (meaningful under the sanitizers) ----

TEST_F(MasterServiceTest, ConcurrentCallsKeepTheBooksStraight) {
  Make(MasterConfig{});
  ASSERT_EQ(Mount("c1", "s1", 0x100000, 4 * MiB), kOk);
  ASSERT_EQ(Mount("c2", "s2", 0x100000, 4 * MiB), kOk);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const std::string key = "t" + std::to_string(t) + "-" + std::to_string(i);
        if (Put("c1", key, 1000 + i, Config(1 + i % 2)) != kOk) ++failures;
        if (Get(key).code() != kOk) ++failures;
        if (i % 3 == 0 && Remove(key, true) != kOk) ++failures;
        if (i % 50 == 0) master_->Tick();
        (void)master_->MetricsText();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  // 4 threads x 200 keys, a third removed.
  EXPECT_EQ(master_->GetStats().keys(), 4u * (200 - 67));
  EXPECT_EQ(master_->RemoveAll(Keys("x", {}, true)).count(), 4 * (200 - 67));
  // Every key was read, so its space waits for its lease to lapse.
  EXPECT_GT(master_->GetStats().allocated(), 0u);
  Advance(milliseconds(master_->config().default_kv_lease_ttl_ms));
  master_->Tick();
  EXPECT_EQ(master_->GetStats().allocated(), 0u);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
