// The disk tier's rules at the master (master_disk.cc): mounting disks, what is queued for
// them, the replicas they report, what readers and removals see, expiry and restarts.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "store/master/master_rpc.h"
#include "store/master/master_service_test_fixture.h"
#include "store/rpc/rpc_server.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_support;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr char kStore1[] = "0123456789abcdef0123456789abcdef";
constexpr char kStore2[] = "fedcba9876543210fedcba9876543210";

class MasterDiskTest : public MasterServiceTest {
 protected:
  void MakeOffload(bool on_evict = false, bool force_evict = false, uint64_t queue = 50000) {
    MasterConfig c;
    c.offload.enable = true;
    c.offload.on_evict = on_evict;
    c.offload.force_evict = force_evict;
    c.offload.queue_limit = queue;
    c.eviction_high_watermark_ratio = 1.0;
    c.eviction_ratio = 0.0;
    Make(c);
  }
  rpc::MountLocalDiskResponse MountDisk(const std::string& client, const std::string& store,
                                        bool offloading = true) {
    rpc::MountLocalDiskRequest req;
    req.set_client_id(client);
    req.set_store_id(store);
    req.set_endpoint("10.0.0.1:" + std::to_string(7000 + client.size()));
    req.set_enable_offloading(offloading);
    return master_->MountLocalDisk(req);
  }
  rpc::OffloadFetchResponse Fetch(const std::string& client, uint64_t removals_done = 0) {
    rpc::OffloadFetchRequest req;
    req.set_client_id(client);
    req.set_removals_done(removals_done);
    return master_->OffloadFetch(req);
  }
  rpc::OffloadDoneResponse Done(const std::string& client,
                                const std::vector<std::tuple<std::string, uint64_t, uint64_t>>& items,
                                bool registration = false) {
    rpc::OffloadDoneRequest req;
    req.set_client_id(client);
    req.set_registration(registration);
    for (const auto& [k, v, s] : items) {
      auto* i = req.add_items();
      i->set_key(k);
      i->set_version(v);
      i->set_size(s);
    }
    return master_->OffloadDone(req);
  }
  // Reports every item of fetch `f` written, read from the memory the fetch named.
  rpc::OffloadDoneResponse Report(const std::string& client, const rpc::OffloadFetchResponse& f) {
    rpc::OffloadDoneRequest req;
    req.set_client_id(client);
    for (const auto& i : f.items()) {
      auto* d = req.add_items();
      d->set_key(i.key());
      d->set_version(i.version());
      d->set_size(i.size());
      *d->mutable_buffer() = i.buffer();
    }
    return master_->OffloadDone(req);
  }
  // Offloads everything queued for `client` and reports it written.
  std::vector<std::string> OffloadAll(const std::string& client) {
    auto f = Fetch(client);
    std::vector<std::string> keys;
    for (const auto& i : f.items()) keys.push_back(i.key());
    if (!keys.empty()) {
      const auto done = Report(client, f);
      for (int c : done.codes()) EXPECT_EQ(c, kOk);
    }
    return keys;
  }
  // c1 lends a 2 KiB segment and has a disk; "a" and "b" (1 KiB each) fill it and are
  // handed to c1 to write.
  rpc::OffloadFetchResponse TwoObjectsFetched() {
    MakeOffload();
    EXPECT_EQ(Mount("c1", "seg1", 0x10000000, 2 * 1024), kOk);
    EXPECT_EQ(MountDisk("c1", kStore1).code(), kOk);
    EXPECT_EQ(Put("w", "a", 1024), kOk);
    EXPECT_EQ(Put("w", "b", 1024), kOk);
    auto f = Fetch("c1");
    EXPECT_EQ(f.items_size(), 2);
    return f;
  }
  static bool OnDisk(const rpc::GetReplicaListResult& r) {
    return r.replicas_size() == 1 && r.replicas(0).has_disk() && !r.replicas(0).has_buffer();
  }
};

TEST_F(MasterDiskTest, WithoutEnableOffloadAClientCannotMountItsDisk) {
  auto r = MountDisk("c1", kStore1);
  EXPECT_EQ(r.code(), ToInt(ErrorCode::UNABLE_OFFLOAD));
  EXPECT_NE(r.message().find("--enable_offload"), std::string::npos);
  MakeOffload();
  EXPECT_EQ(MountDisk("c1", kStore1).code(), kOk);
  EXPECT_EQ(MountDisk("c1", "not-hex!").code(), ToInt(ErrorCode::INVALID_PARAMS));
}

TEST_F(MasterDiskTest, EveryPutIsQueuedForTheDiskOfItsReplicasClientAndReadFromItOnceEvicted) {
  MakeOffload();
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 << 20), kOk);
  ASSERT_EQ(Mount("c2", "seg2", 0x20000000, 1 << 20), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  // Placed on seg1 (c1, with a disk) and seg2 (c2, none).
  ASSERT_EQ(Put("w", "a", 4096, Config(1, {"seg1"})), kOk);
  ASSERT_EQ(Put("w", "b", 4096, Config(1, {"seg2"})), kOk);
  EXPECT_EQ(Ping("c1").offload_waiting(), 1u);
  EXPECT_EQ(Ping("c2").offload_waiting(), 0u);
  auto f = Fetch("c1");
  ASSERT_EQ(f.items_size(), 1);
  EXPECT_EQ(f.items(0).key(), "a");
  EXPECT_EQ(f.items(0).buffer().segment_name(), "seg1");
  EXPECT_GE(f.items(0).buffer().addr(), 0x10000000u);
  EXPECT_GT(f.lease_ttl_ms(), 0u);
  const uint64_t version = f.items(0).version();
  EXPECT_EQ(Get("a").version(), version);
  // Nothing readable from the disk before the report; the memory replica serves.
  auto g = Get("a");
  ASSERT_EQ(g.replicas_size(), 1);
  EXPECT_TRUE(g.replicas(0).has_buffer());
  ASSERT_EQ(Done("c1", {{"a", version, 4096}}).codes(0), kOk);
  // With memory replicas the reader is sent to memory; asked, the disk replica is listed too.
  g = Get("a");
  ASSERT_EQ(g.replicas_size(), 1);
  EXPECT_TRUE(g.replicas(0).has_buffer());
  auto req = Keys("reader", {"a"});
  req.set_with_disk(true);
  auto both = master_->GetReplicaList(req).results(0);
  ASSERT_EQ(both.replicas_size(), 2);
  EXPECT_TRUE(both.replicas(1).has_disk());
  EXPECT_EQ(both.replicas(1).disk().store_id(), kStore1);
  EXPECT_EQ(both.replicas(1).disk().owner(), "c1");
  // The memory replica goes (its segment unmounted): the disk serves, same size and version.
  ASSERT_EQ(Unmount("c1", "seg1", 0x10000000), kOk);
  master_->Tick();
  g = Get("a");
  ASSERT_EQ(g.code(), kOk);
  EXPECT_TRUE(OnDisk(g));
  EXPECT_EQ(g.size(), 4096u);
  EXPECT_EQ(g.version(), version);
  EXPECT_EQ(g.replicas(0).disk().endpoint(), "10.0.0.1:7002");
  EXPECT_EQ(Exist("a"), kOk);
  // The key exists: a put of it is refused; the metrics count the disk's read.
  EXPECT_EQ(PutStart("w", "a", 10).code(), ToInt(ErrorCode::OBJECT_ALREADY_EXISTS));
  EXPECT_EQ(Metrics()["file_cache_hit_nums_"], 1u);
  EXPECT_EQ(Metrics()["file_cache_hit_bytes_total"], 4096u);
  EXPECT_EQ(Metrics()["file_cache_nums_"], 1u);
}

TEST_F(MasterDiskTest, AReportOfAValueNoLongerThereIsRefused) {
  MakeOffload();
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 << 20), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  ASSERT_EQ(Put("c1", "gone", 100), kOk);
  ASSERT_EQ(Put("c1", "replaced", 100), kOk);
  auto f = Fetch("c1");
  ASSERT_EQ(f.items_size(), 2);
  const uint64_t v_gone = f.items(0).version(), v_rep = f.items(1).version();
  ASSERT_EQ(Remove("gone", true), kOk);
  // An upsert: a new value of the key.
  ASSERT_EQ(PutStart("c1", "replaced", 200, Config(), 0, /*upsert=*/true).code(), kOk);
  ASSERT_EQ(PutEnd("c1", "replaced"), kOk);
  auto d = Done("c1", {{"gone", v_gone, 100}, {"replaced", v_rep, 100}, {"never", 5, 100}});
  for (int c : d.codes()) EXPECT_EQ(c, ToInt(ErrorCode::OBJECT_NOT_FOUND));
  // Nothing is recorded; the new value is queued.
  auto f2 = Fetch("c1");
  ASSERT_EQ(f2.items_size(), 1);
  EXPECT_EQ(f2.items(0).key(), "replaced");
  EXPECT_NE(f2.items(0).version(), v_rep);
  EXPECT_EQ(f2.items(0).size(), 200u);
}

TEST_F(MasterDiskTest, RemovalsReachTheDiskAndAreAcknowledged) {
  MakeOffload();
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 << 20), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  for (auto k : {"k1", "k2", "k3"}) ASSERT_EQ(Put("c1", k, 100), kOk);
  auto keys = OffloadAll("c1");
  ASSERT_EQ(keys.size(), 3u);
  const uint64_t v2 = Get("k2").version();
  // k1 removed while in memory too; k2 left on disk only, then removed; k3 by a regex.
  ASSERT_EQ(Remove("k1", true), kOk);
  ASSERT_EQ(Unmount("c1", "seg1", 0x10000000), kOk);
  master_->Tick();
  EXPECT_TRUE(OnDisk(Get("k2")));
  ASSERT_EQ(Remove("k2"), kOk);
  EXPECT_EQ(Get("k2").code(), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Exist("k2"), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(RemoveByRegex("^k3$").count(), 1);
  EXPECT_EQ(Get("k3").code(), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  auto f = Fetch("c1");
  ASSERT_EQ(f.removals_size(), 3);
  EXPECT_EQ(f.removals(0).key(), "k1");
  EXPECT_EQ(f.removals(1).key(), "k2");
  EXPECT_EQ(f.removals(1).version(), v2);
  EXPECT_EQ(f.removals_end(), 3u);
  // Sent again until acknowledged, then gone.
  EXPECT_EQ(Fetch("c1").removals_size(), 3);
  EXPECT_EQ(Fetch("c1", 2).removals_size(), 1);
  EXPECT_EQ(Fetch("c1", 3).removals_size(), 0);
  EXPECT_EQ(Ping("c1").offload_waiting(), 0u);
}

TEST_F(MasterDiskTest, AnExpiredClientsDiskIsNotServedAndItsRestartRegistersItsObjectsAgain) {
  MakeOffload();
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 << 20), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  for (auto k : {"k1", "k2", "k3"}) ASSERT_EQ(Put("c1", k, 100), kOk);
  OffloadAll("c1");
  const uint64_t v1 = Get("k1").version(), v2 = Get("k2").version(), v3 = Get("k3").version();
  // c1 dies: after its TTL neither its memory nor its disk replicas are served.
  Advance(seconds(master_->config().client_ttl_s + 1));
  master_->Tick();
  EXPECT_EQ(Get("k1").code(), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Exist("k1"), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  // A new client on the same directories registers what its scan found; k3's copy is
  // refused (k3 was put again meanwhile, by another writer on another segment).
  ASSERT_EQ(Mount("c9", "seg9", 0x30000000, 1 << 20), kOk);
  ASSERT_EQ(Put("c9", "k3", 50), kOk);
  ASSERT_EQ(MountDisk("c1b", kStore1).code(), kOk);
  auto d = Done("c1b", {{"k1", v1, 100}, {"k2", v2, 100}, {"k3", v3, 100}}, true);
  EXPECT_EQ(d.codes(0), kOk);
  EXPECT_EQ(d.codes(1), kOk);
  EXPECT_EQ(d.codes(2), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  auto g = Get("k1");
  ASSERT_TRUE(OnDisk(g));
  EXPECT_EQ(g.version(), v1);
  EXPECT_EQ(g.replicas(0).disk().owner(), "c1b");
  EXPECT_EQ(Get("k3").size(), 50u);
  // New versions stay above the registered ones.
  ASSERT_EQ(Put("c9", "new", 10), kOk);
  EXPECT_GT(Get("new").version(), std::max(v1, v2));
}

TEST_F(MasterDiskTest, ARestartWithinTheTtlTakesOverTheDiskAndARemovedKeyIsNotBroughtBack) {
  MakeOffload();
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 << 20), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  for (auto k : {"k1", "k2"}) ASSERT_EQ(Put("c1", k, 100), kOk);
  OffloadAll("c1");
  const uint64_t v1 = Get("k1").version(), v2 = Get("k2").version();
  ASSERT_EQ(Unmount("c1", "seg1", 0x10000000), kOk);
  master_->Tick();
  ASSERT_EQ(Remove("k2"), kOk);  // the removal waits for the disk's client
  // c1 restarts as c1b before its TTL (upstream's #3052): the disk passes to c1b at once.
  ASSERT_EQ(MountDisk("c1b", kStore1).code(), kOk);
  EXPECT_EQ(Get("k1").replicas(0).disk().owner(), "c1b");
  // Its scan still has k2 (the removal never reached it): refused, and the removal is sent.
  auto d = Done("c1b", {{"k1", v1, 100}, {"k2", v2, 100}}, true);
  EXPECT_EQ(d.codes(0), kOk);
  EXPECT_EQ(d.codes(1), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Get("k2").code(), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  auto f = Fetch("c1b");
  ASSERT_EQ(f.removals_size(), 1);
  EXPECT_EQ(f.removals(0).key(), "k2");
  // The old client id has no disk any more.
  EXPECT_TRUE(Fetch("c1").disk_unknown());
  // A master that never heard of the disk says so (after a restart or a failover).
  Make(MasterConfig{});
  EXPECT_TRUE(Fetch("c1b").disk_unknown());
}

TEST_F(MasterDiskTest, OffloadOnEvictKeepsVictimsUntilTheyAreOnDisk) {
  MakeOffload(/*on_evict=*/true);
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 4 * 1024), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(Put("c1", "k" + std::to_string(i), 1024), kOk);
  EXPECT_EQ(Ping("c1").offload_waiting(), 0u);  // not eager
  Advance(seconds(11));                          // leases lapse
  // Full: the put needs an eviction, whose victim is queued and kept.
  EXPECT_EQ(PutStart("c1", "k4", 1024).code(), ToInt(ErrorCode::NO_AVAILABLE_HANDLE));
  EXPECT_GT(Ping("c1").offload_waiting(), 0u);
  auto written = OffloadAll("c1");
  ASSERT_FALSE(written.empty());
  Advance(seconds(11));
  // Now the victim's memory may go: the put fits, and the victim reads from the disk.
  ASSERT_EQ(Put("c1", "k4", 1024), kOk);
  EXPECT_TRUE(OnDisk(Get(written[0])));
  EXPECT_GT(Metrics()["master_offload_held_total"], 0u);
}

TEST_F(MasterDiskTest, EagerOffloadKeepsWhatWaitsForItsDiskAndEvictsWhatHasNone) {
  MakeOffload();
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 2 * 1024), kOk);  // c1 has a disk
  ASSERT_EQ(Mount("c2", "seg2", 0x20000000, 2 * 1024), kOk);  // c2 has none
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  ASSERT_EQ(Put("w", "a1", 1024, Config(1, {"seg1"})), kOk);
  ASSERT_EQ(Put("w", "a2", 1024, Config(1, {"seg1"})), kOk);
  ASSERT_EQ(Put("w", "b1", 1024, Config(1, {"seg2"})), kOk);
  ASSERT_EQ(Put("w", "b2", 1024, Config(1, {"seg2"})), kOk);
  Advance(seconds(11));
  // Full. a1 and a2 wait for c1's disk: kept; b1 (no disk) is evicted for the new put.
  ASSERT_EQ(Put("w", "n", 1024), kOk);
  EXPECT_EQ(Exist("a1"), kOk);
  EXPECT_EQ(Exist("a2"), kOk);
  EXPECT_EQ(Exist("b1"), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  // Once written, their memory may go, and they read from the disk.
  OffloadAll("c1");
  Advance(seconds(11));
  ASSERT_EQ(Put("w", "m", 1024, Config(1, {"seg1"})), kOk);
  EXPECT_EQ(Exist("a1"), kOk);
  EXPECT_EQ(Exist("a2"), kOk);
}

TEST_F(MasterDiskTest, AReportEndsTheWritersLeaseSoTheMemoryMayGoAtOnce) {
  MakeOffload();
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 2 * 1024), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  ASSERT_EQ(Put("w", "a", 1024), kOk);
  ASSERT_EQ(Put("w", "b", 1024), kOk);
  OffloadAll("c1");  // fetched (leased for 10 s) and reported at once
  ASSERT_EQ(Put("w", "c", 1024), kOk);  // evicts a's memory without waiting for the lease
  EXPECT_TRUE(OnDisk(Get("a")));
}

TEST_F(MasterDiskTest, AnObjectBeingWrittenIsKeptPastItsLeaseUntilReported) {
  // A slow write (a large bucket, a loaded disk) outlasts the fetch's lease: eviction must
  // not take the object meanwhile, else the report is refused and an acknowledged put is
  // gone from memory and disk alike (found by disk_tier_bench under load).
  auto f = TwoObjectsFetched();
  ASSERT_EQ(f.items_size(), 2);
  Advance(seconds(11));  // the lease lapsed; the write goes on
  EXPECT_EQ(PutStart("w", "c", 1024).code(), ToInt(ErrorCode::NO_AVAILABLE_HANDLE));
  EXPECT_EQ(Exist("a"), kOk);
  EXPECT_EQ(Exist("b"), kOk);
  auto done = Report("c1", f);
  ASSERT_EQ(done.codes_size(), 2);
  for (int c : done.codes()) EXPECT_EQ(c, kOk);
  // Written: now the memory may go, and both read from the disk.
  ASSERT_EQ(Put("w", "c", 1024), kOk);
  ASSERT_EQ(Put("w", "d", 1024), kOk);
  EXPECT_TRUE(OnDisk(Get("a")));
  EXPECT_TRUE(OnDisk(Get("b")));
}

TEST_F(MasterDiskTest, AWriteNeverReportedStopsKeepingItsObjectsAtTheNextFetchOrAfterAMinute) {
  ASSERT_EQ(TwoObjectsFetched().items_size(), 2);
  Advance(seconds(11));
  EXPECT_EQ(PutStart("w", "c", 1024).code(), ToInt(ErrorCode::NO_AVAILABLE_HANDLE));
  // The client fetches again without reporting (its write failed: they stay memory-only).
  ASSERT_EQ(Fetch("c1").items_size(), 0);
  ASSERT_EQ(Put("w", "c", 1024), kOk);
  // A write stuck past the bound keeps nothing either.
  ASSERT_EQ(Put("w", "d", 1024), kOk);
  ASSERT_EQ(Fetch("c1").items_size(), 2);  // c and d
  Advance(seconds(30));
  EXPECT_EQ(PutStart("w", "e", 1024).code(), ToInt(ErrorCode::NO_AVAILABLE_HANDLE));
  Advance(seconds(31));
  EXPECT_EQ(Put("w", "e", 1024), kOk);
}

TEST_F(MasterDiskTest, ObjectsReadOftenFromADiskArePromotedBackToMemory) {
  MasterConfig c;
  c.offload.enable = true;
  c.offload.promotion_on_hit = true;
  c.offload.promotion_threshold = 2;
  Make(c);
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 << 20), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  ASSERT_EQ(Put("c1", "k", 100), kOk);
  OffloadAll("c1");
  const uint64_t v = Get("k").version();
  ASSERT_EQ(Unmount("c1", "seg1", 0x10000000), kOk);
  master_->Tick();
  ASSERT_EQ(Mount("c1", "seg1b", 0x20000000, 1 << 20), kOk);
  EXPECT_TRUE(OnDisk(Get("k")));
  EXPECT_EQ(Fetch("c1").promotions_size(), 0);  // one read: below the threshold
  EXPECT_TRUE(OnDisk(Get("k")));
  EXPECT_GT(Ping("c1").offload_waiting(), 0u);
  auto f = Fetch("c1");
  ASSERT_EQ(f.promotions_size(), 1);
  EXPECT_EQ(f.promotions(0).key(), "k");
  EXPECT_EQ(f.promotions(0).version(), v);
  // A plain put of the key is refused; the promotion's put of that version is not.
  EXPECT_EQ(PutStart("c1", "k", 100).code(), ToInt(ErrorCode::OBJECT_ALREADY_EXISTS));
  rpc::PutStartRequest req;
  req.set_client_id("c1");
  req.set_promote_version(v + 1);
  auto* item = req.add_items();
  item->set_key("k");
  item->set_size(100);
  EXPECT_EQ(master_->PutStart(req).results(0).code(), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  req.set_promote_version(v);
  ASSERT_EQ(master_->PutStart(req).results(0).code(), kOk);
  ASSERT_EQ(PutEnd("c1", "k"), kOk);
  auto g = Get("k");
  ASSERT_EQ(g.replicas_size(), 1);
  EXPECT_TRUE(g.replicas(0).has_buffer());  // memory again, same value
  EXPECT_EQ(g.version(), v);
  auto with = Keys("reader", {"k"});
  with.set_with_disk(true);
  EXPECT_EQ(master_->GetReplicaList(with).results(0).replicas_size(), 2);  // the disk's stays
  EXPECT_EQ(Ping("c1").offload_waiting(), 0u);  // not queued to be written again
  EXPECT_EQ(Metrics()["master_promotion_done_total"], 1u);
}

TEST_F(MasterDiskTest, AValueReplacedOrRemovedWhileItsDiskWasAwayIsNotBroughtBack) {
  MakeOffload();
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 << 20), kOk);
  ASSERT_EQ(Mount("c2", "seg2", 0x20000000, 1 << 20), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  ASSERT_EQ(Put("w", "k", 100, Config(1, {"seg1"})), kOk);
  ASSERT_EQ(Put("w", "j", 100, Config(1, {"seg1"})), kOk);
  OffloadAll("c1");
  const uint64_t vk = Get("k").version(), vj = Get("j").version();
  // c1 is cut off past its TTL: not served; the key may be put again elsewhere, and removed.
  for (int i = 0; i < 12; ++i) {
    Advance(seconds(1));
    Ping("c2");
    Ping("w");
  }
  master_->Tick();
  EXPECT_EQ(Exist("k"), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  ASSERT_EQ(Put("w", "k", 50, Config(1, {"seg2"})), kOk);  // a newer value, no disk
  ASSERT_EQ(Remove("k", true), kOk);
  EXPECT_EQ(Remove("j"), ToInt(ErrorCode::OBJECT_NOT_FOUND));  // not visible, told all the same
  // c1 comes back: neither old copy is registered; both removals reach its disk.
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  auto d = Done("c1", {{"k", vk, 100}, {"j", vj, 100}}, true);
  EXPECT_EQ(d.codes(0), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(d.codes(1), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Exist("k"), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Exist("j"), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Fetch("c1").removals_size(), 2);
}

TEST_F(MasterDiskTest, AnUpsertWhileQueuedQueuesTheNewValue) {
  MakeOffload();
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 << 20), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  ASSERT_EQ(Put("c1", "k", 100), kOk);
  ASSERT_EQ(PutStart("c1", "k", 200, Config(), 0, /*upsert=*/true).code(), kOk);
  ASSERT_EQ(PutEnd("c1", "k"), kOk);
  auto f = Fetch("c1");
  ASSERT_EQ(f.items_size(), 1);
  EXPECT_EQ(f.items(0).size(), 200u);
  EXPECT_EQ(f.items(0).version(), Get("k").version());
}

TEST_F(MasterDiskTest, AReportKeepsAReadersLeaseGrantedAfterTheFetch) {
  auto f = TwoObjectsFetched();
  ASSERT_EQ(f.items_size(), 2);
  Advance(seconds(1));
  // c1 itself reads a (its get's lease ends later than the fetch's).
  ASSERT_EQ(master_->GetReplicaList(Keys("c1", {"a"})).results(0).code(), kOk);
  std::vector<std::tuple<std::string, uint64_t, uint64_t>> items;
  for (const auto& i : f.items()) items.emplace_back(i.key(), i.version(), i.size());
  const auto done = Done("c1", items);
  for (int c : done.codes()) ASSERT_EQ(c, kOk);
  // A put needing room evicts b (its fetch lease ended with the report), not a (read).
  ASSERT_EQ(Put("w", "c", 1024), kOk);
  auto g = Get("a");
  ASSERT_EQ(g.replicas_size(), 1);
  EXPECT_TRUE(g.replicas(0).has_buffer());
  EXPECT_TRUE(OnDisk(Get("b")));
}

TEST_F(MasterDiskTest, AReportOfBytesReadFromAReplicaTheObjectNoLongerHoldsIsRefused) {
  MakeOffload();
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 << 20), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  ASSERT_EQ(Put("c1", "k", 100), kOk);
  auto f = Fetch("c1");
  ASSERT_EQ(f.items_size(), 1);
  rpc::OffloadDoneRequest req;
  req.set_client_id("c1");
  auto* d = req.add_items();
  d->set_key("k");
  d->set_version(f.items(0).version());
  d->set_size(100);
  *d->mutable_buffer() = f.items(0).buffer();
  d->mutable_buffer()->set_addr(f.items(0).buffer().addr() + 4096);  // not its replica
  EXPECT_EQ(master_->OffloadDone(req).codes(0), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  *d->mutable_buffer() = f.items(0).buffer();
  EXPECT_EQ(master_->OffloadDone(req).codes(0), kOk);
}

TEST_F(MasterDiskTest, OffloadForceEvictEvictsWhatCannotWait) {
  MakeOffload(/*on_evict=*/true, /*force_evict=*/true);
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 4 * 1024), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(Put("c1", "k" + std::to_string(i), 1024), kOk);
  Advance(seconds(11));
  ASSERT_EQ(Put("c1", "k4", 1024), kOk);
  EXPECT_GT(Ping("c1").offload_waiting(), 0u);  // the victim was queued all the same
}

TEST_F(MasterDiskTest, DiskEvictionForgetsTheReplicasFirst) {
  MakeOffload();
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 << 20), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  ASSERT_EQ(MountDisk("c2", kStore2).code(), kOk);
  ASSERT_EQ(Put("c1", "k", 100), kOk);
  OffloadAll("c1");
  ASSERT_EQ(Unmount("c1", "seg1", 0x10000000), kOk);
  master_->Tick();
  // Another disk's eviction of the key changes nothing; its own does.
  rpc::EvictDiskRequest req;
  req.set_client_id("c2");
  req.add_keys("k");
  EXPECT_EQ(master_->EvictDisk(req).code(), kOk);
  EXPECT_TRUE(OnDisk(Get("k")));
  req.set_client_id("c1");
  EXPECT_EQ(master_->EvictDisk(req).code(), kOk);
  EXPECT_EQ(Get("k").code(), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  // No removal is sent for it: the disk deleted it itself.
  EXPECT_EQ(Fetch("c1").removals_size(), 0);
}

TEST_F(MasterDiskTest, TheQueueIsBounded) {
  MakeOffload(false, false, /*queue=*/2);
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 << 20), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(Put("c1", "k" + std::to_string(i), 100), kOk);
  EXPECT_EQ(Ping("c1").offload_waiting(), 2u);
  EXPECT_EQ(Metrics()["master_offload_queue_full_total"], 3u);
}

}  // namespace
}  // namespace store
}  // namespace mooncake

namespace mooncake {
namespace store {
namespace {

// The long poll's side at the master: the disk's client is woken when its disk gets work
// where it had none (objects, removals), and ServeMasterRpc lets an OffloadFetch with
// nothing to send wait only when it asks to and a waker is set.
class MasterDiskWakeTest : public MasterDiskTest {
 protected:
  void Wake() {
    master_->SetDiskWorkWaker([this](const std::string& c) { woken_.push_back(c); });
  }
  // ServeMasterRpc's answer to an OffloadFetch of `client` asking to wait `wait_ms`.
  RpcStatus ServeFetch(const std::string& client, uint32_t wait_ms, rpc::OffloadFetchResponse* resp,
                       std::string* raw, bool end_wait = false) {
    rpc::OffloadFetchRequest req;
    req.set_client_id(client);
    req.set_wait_ms(wait_ms);
    req.set_end_wait(end_wait);
    const std::string wire = req.SerializeAsString();
    raw->clear();
    const RpcStatus st = ServeMasterRpc(master_.get(), static_cast<uint16_t>(MasterMethod::kOffloadFetch),
                                        wire.data(), wire.size(), raw);
    if (st == RpcStatus::kOk) {
      EXPECT_TRUE(resp->ParseFromString(*raw));
    }
    return st;
  }
  std::vector<std::string> woken_;
};

TEST_F(MasterDiskWakeTest, AClientIsWokenWhenItsDiskGetsWorkWhereItHadNone) {
  MakeOffload();
  Wake();
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 << 20), kOk);
  ASSERT_EQ(Mount("c2", "seg2", 0x20000000, 1 << 20), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  // Puts land in c1's or c2's segment; only c1 has a disk, woken once for its first object.
  for (int i = 0; i < 8; ++i) ASSERT_EQ(Put("w", "k" + std::to_string(i), 100), kOk);
  ASSERT_GE(Ping("c1").offload_waiting(), 1u);
  EXPECT_EQ(woken_, std::vector<std::string>{"c1"});
  auto keys = OffloadAll("c1");
  ASSERT_FALSE(keys.empty());
  woken_.clear();
  // Its queue empty again: the next object wakes it again.
  for (int i = 8; i < 16 && woken_.empty(); ++i) ASSERT_EQ(Put("w", "k" + std::to_string(i), 100), kOk);
  EXPECT_EQ(woken_, std::vector<std::string>{"c1"});
  (void)OffloadAll("c1");
  woken_.clear();
  // A removal of what its disk holds wakes it (none were pending).
  ASSERT_EQ(Remove(keys[0], true), kOk);
  EXPECT_EQ(woken_, std::vector<std::string>{"c1"});
}

TEST_F(MasterDiskWakeTest, AFetchWithNothingWaitsOnlyWhenItAsksAndAWakerIsSet) {
  MakeOffload();
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 << 20), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  rpc::OffloadFetchResponse resp;
  std::string raw;
  // No waker (a master whose server cannot wake it): answered now, even asked to wait.
  EXPECT_EQ(ServeFetch("c1", 100, &resp, &raw), RpcStatus::kOk);
  EXPECT_EQ(resp.items_size(), 0);
  Wake();
  // Not asked to wait: answered now.
  EXPECT_EQ(ServeFetch("c1", 0, &resp, &raw), RpcStatus::kOk);
  // Asked, nothing to send: waits on the client's id.
  EXPECT_EQ(ServeFetch("c1", 100, &resp, &raw), RpcServer::kWaitForWake);
  EXPECT_NE(raw.find("c1"), std::string::npos);
  // Work queued: answered with it.
  ASSERT_EQ(Put("w", "k", 100), kOk);
  EXPECT_EQ(ServeFetch("c1", 100, &resp, &raw), RpcStatus::kOk);
  EXPECT_EQ(resp.items_size(), 1);
  // A client without a disk is told so at once, never kept waiting.
  EXPECT_EQ(ServeFetch("nobody", 100, &resp, &raw), RpcStatus::kOk);
}

TEST_F(MasterDiskWakeTest, AClosingClientEndsItsWaitAndFetchesNothing) {
  MakeOffload();
  ASSERT_EQ(Mount("c1", "seg1", 0x10000000, 1 << 20), kOk);
  ASSERT_EQ(MountDisk("c1", kStore1).code(), kOk);
  Wake();
  rpc::OffloadFetchResponse resp;
  std::string raw;
  ASSERT_EQ(ServeFetch("c1", 100, &resp, &raw), RpcServer::kWaitForWake);
  // Close's end_wait: the waiting fetch is woken, and its rerun answers at once (once).
  EXPECT_EQ(ServeFetch("c1", 0, &resp, &raw, /*end_wait=*/true), RpcStatus::kOk);
  EXPECT_EQ(resp.items_size(), 0);
  EXPECT_EQ(woken_, std::vector<std::string>{"c1"});
  EXPECT_EQ(ServeFetch("c1", 100, &resp, &raw), RpcStatus::kOk);
  EXPECT_EQ(ServeFetch("c1", 100, &resp, &raw), RpcServer::kWaitForWake);
  // It fetches nothing: work queued stays for the writer.
  ASSERT_EQ(Put("w", "k", 100), kOk);
  EXPECT_EQ(ServeFetch("c1", 0, &resp, &raw, /*end_wait=*/true), RpcStatus::kOk);
  EXPECT_EQ(resp.items_size(), 0);
  EXPECT_EQ(Ping("c1").offload_waiting(), 1u);
  EXPECT_EQ(Fetch("c1").items_size(), 1);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
