// MasterService under issue 14's attacks: the space of an object removed while leased is not
// reused before the lease lapses (deferred free), a remounted segment takes nothing new for
// one lease TTL, and every request is bounded (keys, names, batches, replicas, regex
// patterns) with RE2 matching in chunks of the key space.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "store/master/master_service_test_fixture.h"
#include "store/common/limits.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_support;  // NOLINT

class MasterSafetyTest : public MasterServiceTest {
 protected:
  static constexpr uint64_t kObj = 64 * KiB;
  // One segment that holds exactly one object.
  void MakeOneSlot(uint64_t lease_ms = 10000) {
    MasterConfig c;
    c.default_kv_lease_ttl_ms = lease_ms;
    c.eviction_high_watermark_ratio = 1.0;
    c.eviction_ratio = 0.0;
    Make(c);
    ASSERT_EQ(Mount("c1", "seg", 0x10000000, kObj), kOk);
  }
  // Tick, with the clients' heartbeats kept up.
  void TickAlive() {
    for (const char* c : {"c1", "c2"}) Ping(c);
    master_->Tick();
  }
  void ExpireLeases() { Advance(milliseconds(master_->config().default_kv_lease_ttl_ms)); }
  uint64_t AddrOf(const rpc::PutStartResult& r) {
    return r.replicas_size() > 0 ? r.replicas(0).buffer().addr() : 0;
  }
  int32_t MountAgain(const std::string& client, const std::string& name, uint64_t base,
                     uint64_t size) {
    rpc::MountSegmentRequest req;
    req.set_client_id(client);
    req.set_segment_name(name);
    req.set_base(base);
    req.set_size(size);
    req.set_remount(true);
    return master_->MountSegment(req).code();
  }
};

TEST_F(MasterSafetyTest, ForceRemoveOfALeasedObjectFreesItsSpaceOnlyAfterTheLease) {
  MakeOneSlot();
  ASSERT_EQ(Put("c1", "a", kObj), kOk);
  auto got = Get("a");
  ASSERT_EQ(got.code(), kOk);
  EXPECT_EQ(got.lease_ttl_ms(), 10000u);
  const uint64_t addr = got.replicas(0).buffer().addr();
  ASSERT_EQ(Remove("a", /*force=*/true), kOk);
  EXPECT_EQ(Get("a").code(), C(ErrorCode::OBJECT_NOT_FOUND));  // invisible at once
  // A reader may still be copying a's bytes: b must not be placed over them (before the fix
  // it was, at the same address).
  EXPECT_EQ(PutStart("c1", "b", kObj).code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  EXPECT_EQ(Metrics()["master_deferred_free_bytes"], kObj);
  Advance(milliseconds(9999));
  TickAlive();
  EXPECT_EQ(PutStart("c1", "b", kObj).code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  Advance(milliseconds(1));
  TickAlive();
  auto b = PutStart("c1", "b", kObj);
  ASSERT_EQ(b.code(), kOk);
  EXPECT_EQ(AddrOf(b), addr);
  auto m = Metrics();
  EXPECT_EQ(m["master_deferred_free_bytes"], 0u);
  EXPECT_EQ(m["master_deferred_frees_total"], 1u);
}

// A client that read the key itself, has no read of it in flight, and holds its latest
// lease (nobody else's lease live) may have the space freed at once: the Python pattern
// get(k) then remove(k, force=True) does not wait out its own lease.
TEST_F(MasterSafetyTest, TheOnlyReadersOwnCompletedReadFreesAtOnce) {
  MakeOneSlot();
  auto remove_after_read = [&](const std::string& client, uint64_t id) {
    rpc::KeysRequest req = Keys(client, {"a"}, /*force=*/true);
    req.add_read_lease_ids(id);
    auto r = master_->Remove(req);
    return r.codes_size() == 1 ? r.codes(0) : -99999;
  };
  auto get_as = [&](const std::string& client) {
    auto r = master_->GetReplicaList(Keys(client, {"a"}));
    EXPECT_EQ(r.results(0).code(), kOk);
    EXPECT_NE(r.results(0).lease_id(), 0u);
    return r.results(0).lease_id();
  };
  // Own, latest lease: freed at once.
  ASSERT_EQ(Put("c1", "a", kObj), kOk);
  uint64_t id = get_as("x");
  ASSERT_EQ(remove_after_read("x", id), kOk);
  EXPECT_EQ(PutStart("c1", "b", kObj).code(), kOk);
  ASSERT_EQ(PutRevoke("c1", "b"), kOk);
  // A wrong id, another client's id, or an older lease of ours: deferred.
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    ExpireLeases();
    TickAlive();
    ASSERT_EQ(Put("c1", "a", kObj), kOk);
    uint64_t first = get_as("x");
    if (variant == 0) {
      ASSERT_EQ(remove_after_read("x", first + 2), kOk);
    }
    if (variant == 1) {
      ASSERT_EQ(remove_after_read("y", first), kOk);
    }
    if (variant == 2) {
      get_as("x");  // a newer read of ours may be in flight
      ASSERT_EQ(remove_after_read("x", first), kOk);
    }
    EXPECT_EQ(PutStart("c1", "b", kObj).code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  }
  // Another client's lease still live: deferred even with our latest id.
  ExpireLeases();
  TickAlive();
  ASSERT_EQ(Put("c1", "a", kObj), kOk);
  get_as("y");
  id = get_as("x");
  ASSERT_EQ(remove_after_read("x", id), kOk);
  EXPECT_EQ(PutStart("c1", "b", kObj).code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  ExpireLeases();
  TickAlive();
  EXPECT_EQ(PutStart("c1", "b", kObj).code(), kOk);
}

TEST_F(MasterSafetyTest, BulkForcedRemovalByTheOnlyReaderFreesAtOnce) {
  MakeOneSlot();
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    ASSERT_EQ(Put("c1", "a", kObj), kOk);
    ASSERT_EQ(master_->GetReplicaList(Keys("x", {"a"})).results(0).code(), kOk);
    if (round == 3) {
      ASSERT_EQ(master_->GetReplicaList(Keys("y", {"a"})).results(0).code(), kOk);
    }
    const bool done = round != 2;  // round 2: x has reads in flight; round 3: y holds a lease
    if (round % 2 == 0) {
      rpc::RemoveByRegexRequest req;
      req.set_client_id("x");
      req.set_regex("^a$");
      req.set_force(true);
      req.set_own_reads_done(done);
      EXPECT_EQ(master_->RemoveByRegex(req).count(), 1);
    } else {
      rpc::KeysRequest req = Keys("x", {}, true);
      req.set_own_reads_done(done);
      EXPECT_EQ(master_->RemoveAll(req).count(), 1);
    }
    const bool at_once = round < 2;
    EXPECT_EQ(PutStart("c1", "b", kObj).code(),
              at_once ? kOk : C(ErrorCode::NO_AVAILABLE_HANDLE));
    if (at_once) {
      ASSERT_EQ(PutRevoke("c1", "b"), kOk);
    }
    ExpireLeases();
    TickAlive();
  }
}

TEST_F(MasterSafetyTest, PutStartReapsLapsedGravesWithoutWaitingForTheTick) {
  MakeOneSlot(100);
  ASSERT_EQ(Put("c1", "a", kObj), kOk);
  ASSERT_EQ(Get("a").code(), kOk);
  ASSERT_EQ(Remove("a", true), kOk);
  Advance(milliseconds(100));
  EXPECT_EQ(PutStart("c1", "b", kObj).code(), kOk);
}

TEST_F(MasterSafetyTest, UnleasedRemovalFreesAtOnce) {
  MakeOneSlot();
  ASSERT_EQ(Put("c1", "a", kObj), kOk);
  ASSERT_EQ(Remove("a", true), kOk);  // never read: nobody can hold its address
  EXPECT_EQ(PutStart("c1", "b", kObj).code(), kOk);
}

TEST_F(MasterSafetyTest, BulkForcedRemovalsDeferToo) {
  MakeOneSlot();
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(Put("c1", "a", kObj), kOk);
    ASSERT_EQ(Get("a").code(), kOk);
    if (round == 0) {
      EXPECT_EQ(RemoveByRegex("^a$", true).count(), 1);
    } else {
      EXPECT_EQ(master_->RemoveAll(Keys("x", {}, true)).count(), 1);
    }
    EXPECT_EQ(PutStart("c1", "b", kObj).code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
    Advance(milliseconds(10000));
    TickAlive();
    EXPECT_EQ(master_->GetStats().allocated(), 0u);
  }
}

TEST_F(MasterSafetyTest, EvictionNeverTakesALeasedObject) {
  MakeOneSlot();
  ASSERT_EQ(Put("c1", "a", kObj), kOk);
  ASSERT_EQ(Get("a").code(), kOk);
  EXPECT_EQ(PutStart("c1", "b", kObj).code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  EXPECT_EQ(Get("a").code(), kOk);
}

TEST_F(MasterSafetyTest, GravesOfAnUnmountedSegmentAreForgotten) {
  MakeOneSlot();
  ASSERT_EQ(Put("c1", "a", kObj), kOk);
  ASSERT_EQ(Get("a").code(), kOk);
  ASSERT_EQ(Remove("a", true), kOk);
  ASSERT_EQ(Unmount("c1", "seg", 0x10000000), kOk);
  ASSERT_EQ(Mount("c2", "other", 0x20000000, kObj), kOk);
  Advance(milliseconds(10000));
  TickAlive();  // must not free the grave into the new segment's allocator
  EXPECT_EQ(Put("c2", "b", kObj), kOk);
  EXPECT_EQ(master_->GetStats().allocated(), kObj);
}

TEST_F(MasterSafetyTest, ARemountedSegmentTakesNothingNewForOneLease) {
  MakeOneSlot();
  // After a master restart the client mounts its segment again, saying so.
  ASSERT_EQ(MountAgain("c2", "seg2", 0x20000000, kObj), kOk);
  ASSERT_EQ(Unmount("c1", "seg", 0x10000000), kOk);
  auto r = PutStart("c2", "k", kObj);
  EXPECT_EQ(r.code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  EXPECT_NE(r.message().find("mounted again"), std::string::npos) << r.message();
  Advance(milliseconds(9999));
  EXPECT_EQ(PutStart("c2", "k", kObj).code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  Advance(milliseconds(1));
  EXPECT_EQ(PutStart("c2", "k", kObj).code(), kOk);
}

TEST_F(MasterSafetyTest, ASegmentNameDroppedLatelyWaitsForItsLeases) {
  MasterConfig c;
  c.client_ttl_s = 2;
  Make(c);
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, MiB), kOk);
  ASSERT_EQ(Put("c1", "a", 1000), kOk);
  ASSERT_EQ(Get("a").code(), kOk);  // a reader holds a's address in seg
  Advance(seconds(2));
  master_->Tick();  // c1 was silent: seg is dropped
  ASSERT_FALSE(Ping("c1").client_known());
  // Mounted again under the same name (even without the remount flag: another process with
  // the same name): nothing new until the drop + one lease.
  Advance(seconds(1));
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, MiB), kOk);
  EXPECT_EQ(PutStart("c1", "b", 1000).code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  Advance(seconds(9));
  EXPECT_EQ(PutStart("c1", "b", 1000).code(), kOk);
}

TEST_F(MasterSafetyTest, AFirstMountTakesObjectsAtOnce) {
  ASSERT_EQ(Mount("c1", "fresh", 0x10000000, MiB), kOk);
  EXPECT_EQ(Put("c1", "k", 1000), kOk);
}

// ---- bounds ----

TEST_F(MasterSafetyTest, KeysOverTheLimitAreRefusedEverywhere) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, MiB), kOk);
  const std::string ok(kMaxKeyBytes, 'k'), big(kMaxKeyBytes + 1, 'k');
  EXPECT_EQ(Put("c1", ok, 100), kOk);
  auto r = PutStart("c1", big, 100);
  EXPECT_EQ(r.code(), C(ErrorCode::INVALID_KEY));
  EXPECT_NE(r.message().find("limit of 4096"), std::string::npos) << r.message();
  EXPECT_EQ(Get(big).code(), C(ErrorCode::INVALID_KEY));
  EXPECT_EQ(Exist(big), C(ErrorCode::INVALID_KEY));
  EXPECT_EQ(Remove(big), C(ErrorCode::INVALID_KEY));
  EXPECT_EQ(PutEnd("c1", big), C(ErrorCode::INVALID_KEY));
  EXPECT_EQ(PutRevoke("c1", big), C(ErrorCode::INVALID_KEY));
}

TEST_F(MasterSafetyTest, BatchesOverTheLimitAreRefusedBeforeAnyWork) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, 64 * MiB), kOk);
  rpc::PutStartRequest put;
  put.set_client_id("c1");
  for (int i = 0; i < 200000; ++i) {
    auto* item = put.add_items();
    item->set_key("k" + std::to_string(i));
    item->set_size(1);
  }
  auto resp = master_->PutStart(put);
  EXPECT_EQ(resp.code(), C(ErrorCode::INVALID_PARAMS));
  EXPECT_NE(resp.message().find("at most 4096"), std::string::npos) << resp.message();
  EXPECT_EQ(resp.results_size(), 0);
  EXPECT_EQ(master_->GetStats().keys(), 0u);  // before the fix all 200,000 were created
  std::vector<std::string> many(kMaxBatchItems + 1, "k");
  EXPECT_EQ(master_->GetReplicaList(Keys("r", many)).code(), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(master_->ExistKey(Keys("r", many)).code(), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(master_->Remove(Keys("r", many)).code(), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(master_->PutEnd(Keys("r", many)).code(), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(master_->PutRevoke(Keys("r", many)).code(), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(master_->GetReplicaList(Keys("r", many)).results_size(), 0);
  // The largest accepted batch fits the RPC wire's payload limit, its reply too.
  put.mutable_items()->DeleteSubrange(static_cast<int>(kMaxBatchItems),
                                      put.items_size() - static_cast<int>(kMaxBatchItems));
  auto ok = master_->PutStart(put);
  EXPECT_EQ(ok.code(), kOk);
  EXPECT_EQ(ok.results_size(), static_cast<int>(kMaxBatchItems));
  EXPECT_LT(ok.ByteSizeLong(), static_cast<size_t>(kMaxMessageBytes));
  EXPECT_EQ(Metrics()["master_refused_requests_total"], 7u);
}

TEST_F(MasterSafetyTest, NamesAndReplicaCountsOverTheLimitAreRefused) {
  EXPECT_EQ(Mount("c1", std::string(kMaxNameBytes + 1, 's'), 0x10000000, MiB),
            C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(Mount(std::string(kMaxNameBytes + 1, 'c'), "seg", 0x10000000, MiB),
            C(ErrorCode::INVALID_PARAMS));
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, MiB), kOk);
  rpc::PutStartRequest put;
  put.set_client_id("c1");
  put.add_items()->set_key("k");
  put.mutable_items(0)->set_size(10);
  put.mutable_config()->set_replica_num(kMaxReplicaNum + 1);
  EXPECT_EQ(master_->PutStart(put).code(), C(ErrorCode::INVALID_PARAMS));
  put.mutable_config()->set_replica_num(1);
  for (size_t i = 0; i <= kMaxPreferredSegments; ++i) put.mutable_config()->add_preferred_segments("s");
  EXPECT_EQ(master_->PutStart(put).code(), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(master_->GetStats().keys(), 0u);
}

TEST_F(MasterSafetyTest, RegexIsLinearTimeAndBounded) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, 16 * MiB), kOk);
  // The keys that crashed (stack overflow) or froze (backtracking) std::regex, at the
  // longest key allowed, and 2,000 ordinary ones.
  ASSERT_EQ(Put("c1", std::string(kMaxKeyBytes, 'a'), 10), kOk);
  ASSERT_EQ(Put("c1", std::string(33, 'a') + "b", 10), kOk);
  for (int i = 0; i < 2000; ++i) ASSERT_EQ(Put("c1", "x/" + std::to_string(i), 10), kOk);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(RemoveByRegex("^(a|a)*$").count(), 1);  // the 4096 a's
  EXPECT_EQ(RemoveByRegex("^(a|a)*b$").count(), 1);
  EXPECT_EQ(RemoveByRegex("^a.*").count(), 0);
  EXPECT_EQ(RemoveByRegex("^x/1").count(), 1111);  // 1, 10-19, 100-199, 1000-1999
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(2));
  // RE2 refuses what it cannot run in linear time (a backreference) and bad syntax.
  for (const char* bad : {"(a)\\1", "(?=a)", "(", "a{2,1}"}) {
    auto r = RemoveByRegex(bad);
    EXPECT_EQ(r.code(), C(ErrorCode::INVALID_PARAMS)) << bad;
    EXPECT_NE(r.message().find("RE2"), std::string::npos) << r.message();
  }
  auto too_long = RemoveByRegex(std::string(kMaxRegexBytes + 1, 'a'));
  EXPECT_EQ(too_long.code(), C(ErrorCode::INVALID_PARAMS));
  EXPECT_NE(too_long.message().find("limit"), std::string::npos);
  EXPECT_EQ(master_->GetStats().keys(), 2000u - 1111u);
}

TEST_F(MasterSafetyTest, RemovalOfAWholeKeySpaceLetsOtherCallsThrough) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, 1024 * MiB), kOk);
  constexpr int kN = 60000;
  for (int i = 0; i < kN; ++i) ASSERT_EQ(Put("c1", "k" + std::to_string(i), 64), kOk);
  ASSERT_EQ(Put("c1", "probe", 64), kOk);
  std::atomic<bool> done{false};
  std::atomic<int64_t> count{0};
  std::thread remover([&] {
    count = RemoveByRegex("^k").count();  // a regex that matches every key, in chunks
    done = true;
  });
  // Meanwhile: reads, and puts of new keys (which must not make the scan miss old ones).
  int served_meanwhile = 0, put_meanwhile = 0;
  while (!done) {
    if (Exist("probe") == kOk && !done) ++served_meanwhile;
    if (Put("c1", "new" + std::to_string(put_meanwhile), 64) == kOk) ++put_meanwhile;
  }
  remover.join();
  EXPECT_EQ(count.load(), kN);  // every old key, none missed, none twice
  EXPECT_EQ(Exist("probe"), kOk);
  EXPECT_EQ(master_->GetStats().keys(), 1u + put_meanwhile);
  // One lock hold per kRemoveChunk keys: the prober got in between chunks.
  EXPECT_GT(served_meanwhile, 0);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
