// MasterService and the HA log (master_replica.cc): a standby that applies a serving master's
// entries holds the same state; once promoted it serves the same objects at the same
// addresses, keeps puts in flight, and does not reuse space the old leader's readers may
// still be reading.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "store/master/master_service_test_fixture.h"

namespace mooncake {
namespace store {
namespace {

using testing_support::C;
using testing_support::kOk;
using testing_support::KiB;
using testing_support::MiB;
using testing_support::MasterServiceTest;
using std::chrono::milliseconds;
using std::chrono::seconds;

using testing_support::Collect;

// The state as sorted serialized entries (ExportState's order is the tables').
std::vector<std::string> Canon(const MasterService& m) {
  std::vector<std::string> out;
  m.ExportState([&](oplog::Entry&& e) { out.push_back(e.SerializeAsString()); });
  std::sort(out.begin(), out.end());
  return out;
}

class MasterReplicaTest : public MasterServiceTest {
 protected:
  void SetUp() override { Reset(MasterConfig{}); }
  // A leader with this config logging to log_, and a standby with the same config.
  void Reset(MasterConfig config) {
    Make(config);
    master_->SetChangeSink(&log_);
    log_.entries.clear();
    applied_ = 0;
    config.standby = true;
    standby_ = std::make_unique<MasterService>(config, [this] { return now_; });
  }
  // Applies what the leader logged since the last call.
  void Sync() {
    for (; applied_ < log_.entries.size(); ++applied_) {
      ASSERT_TRUE(standby_->Apply(log_.entries[applied_]).ok())
          << standby_->Apply(log_.entries[applied_]).message();
    }
  }
  uint64_t AddrOf(MasterService* m, const std::string& key) {
    std::vector<MasterService::ReplicaView> r;
    if (m->QueryKey(key, &r) != ErrorCode::OK || r.empty()) return 0;
    return r[0].addr;
  }

  Collect log_;
  size_t applied_ = 0;
  std::unique_ptr<MasterService> standby_;
};

TEST_F(MasterReplicaTest, EveryChangeReachesTheStandbyAndPositionsGrow) {
  ASSERT_EQ(Mount("c1", "s1", 1 << 20, 4 * MiB), kOk);
  EXPECT_GT(MasterService::TakeLogPosition(), 0u);
  EXPECT_EQ(MasterService::TakeLogPosition(), 0u);  // taken
  ASSERT_EQ(PutStart("w", "k", 10 * KiB).code(), kOk);
  const uint64_t start = MasterService::TakeLogPosition();
  ASSERT_EQ(PutEnd("w", "k"), kOk);
  EXPECT_GT(MasterService::TakeLogPosition(), start);
  Get("k");  // a read changes nothing the log carries
  EXPECT_EQ(MasterService::TakeLogPosition(), 0u);
  Sync();
  EXPECT_EQ(Canon(*master_), Canon(*standby_));
  EXPECT_TRUE(standby_->standby());
  EXPECT_FALSE(master_->standby());
}

// A random history of every kind of change (puts, puts left in flight, revokes, removes,
// upserts, replica clears, evictions, unmounts, expiries, discards), compared after each step.
TEST_F(MasterReplicaTest, RandomHistoryReplaysToTheSameState) {
  MasterConfig config;
  config.client_ttl_s = 5;
  config.put_start_discard_timeout_s = 3;
  Reset(config);
  std::mt19937_64 rng(42);
  const std::vector<std::string> clients = {"c1", "c2", "c3"};
  std::map<std::string, bool> mounted;  // segment name -> mounted
  std::vector<std::string> keys;
  for (int i = 0; i < 200; ++i) keys.push_back("key-" + std::to_string(i));
  uint64_t base = 1 << 20;
  std::map<std::string, uint64_t> bases;
  auto mount = [&](const std::string& c) {
    const std::string name = "seg-" + c;
    bases[name] = base;
    base += 16 * MiB;
    if (Mount(c, name, bases[name], 4 * MiB) == kOk) mounted[name] = true;
  };
  for (const auto& c : clients) mount(c);
  for (int step = 0; step < 3000; ++step) {
    const std::string& key = keys[rng() % keys.size()];
    const std::string& client = clients[rng() % clients.size()];
    const uint64_t size = 1 + rng() % (64 * KiB);
    switch (rng() % 14) {
      case 0:
      case 1:
        Put(client, key, size, Config(1 + rng() % 2, {}, rng() % 5 == 0, rng() % 17 == 0));
        break;
      case 2:
        PutStart(client, key, size);
        break;
      case 3:
        PutEnd(client, key);
        break;
      case 4:
        PutRevoke(client, key);
        break;
      case 5:
        Remove(key, rng() % 2 == 0);
        break;
      case 6:
        Get(key);
        break;
      case 7: {
        if (PutStart(client, key, size, Config(), /*nonce=*/0, /*upsert=*/true).code() == kOk &&
            rng() % 3 != 0) {
          PutEnd(client, key);
        }
        break;
      }
      case 8: {
        rpc::ReplicaClearRequest req;
        req.set_client_id(client);
        req.add_keys(key);
        if (rng() % 2) req.set_segment_name("seg-" + clients[rng() % clients.size()]);
        master_->ReplicaClear(req);
        break;
      }
      case 9: {
        if (rng() % 8) break;  // seldom: each drops a third of the objects
        const std::string name = "seg-" + client;
        if (mounted[name]) {
          Unmount(client, name, bases[name]);
          mounted[name] = false;
        } else {
          mount(client);
        }
        break;
      }
      case 10:
        Advance(milliseconds(rng() % 3000));
        for (const auto& c : clients) {
          if (rng() % 4) Ping(c);  // now and then one misses its heartbeat
        }
        master_->Tick();
        break;
      default:
        Put(client, key + "-fill-" + std::to_string(step), 32 * KiB + size);  // evictions
        break;
    }
    MasterService::TakeLogPosition();
    Sync();
    ASSERT_EQ(Canon(*master_), Canon(*standby_)) << "after step " << step;
  }
  EXPECT_GT(log_.entries.size(), 3000u);

  // Promoted, the standby serves every object at the leader's addresses.
  ASSERT_TRUE(standby_->Promote().ok());
  EXPECT_FALSE(standby_->standby());
  size_t total = 0;
  const auto listed = master_->ListKeys(1 << 20, 1 << 30, &total);
  EXPECT_GT(listed.size(), 10u);
  for (const auto& key : listed) EXPECT_EQ(AddrOf(master_.get(), key), AddrOf(standby_.get(), key)) << key;
  EXPECT_EQ(Canon(*master_), Canon(*standby_));

  // New puts on the promoted master never overlap a replica it already holds.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [addr, addr + size)
  auto collect = [&] {
    ranges.clear();
    size_t n = 0;
    for (const auto& key : master_->ListKeys(1 << 20, 1 << 30, &n)) {
      std::vector<MasterService::ReplicaView> r;
      master_->QueryKey(key, &r);
      for (const auto& v : r) ranges.push_back({v.addr, v.addr + v.size});
    }
  };
  auto saved = std::move(master_);
  master_ = std::move(standby_);  // the fixture's helpers call the promoted one now
  for (int i = 0; i < 300; ++i) Put("c1", "new-" + std::to_string(i), 1 + rng() % (16 * KiB));
  collect();
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    ASSERT_LE(ranges[i - 1].second, ranges[i].first) << "replicas overlap at " << ranges[i].first;
  }
}

// A reader of the old leader may hold a lease on a removed object's space: the promoted
// master does not place new objects there within a lease TTL.
TEST_F(MasterReplicaTest, SpaceFreedLatelyIsNotReusedByTheNewLeader) {
  ASSERT_EQ(Mount("c1", "s1", 1 << 20, 64 * KiB), kOk);
  ASSERT_EQ(Put("w", "a", 32 * KiB), kOk);
  const uint64_t a = AddrOf(master_.get(), "a");
  ASSERT_NE(a, 0u);
  ASSERT_EQ(Remove("a", /*force=*/true), kOk);
  // The old leader, whose readers had no lease, reuses it at once.
  ASSERT_EQ(Put("w", "b", 32 * KiB), kOk);
  EXPECT_EQ(AddrOf(master_.get(), "b"), a);
  ASSERT_EQ(Remove("b", true), kOk);
  ASSERT_EQ(Put("w", "c", 16 * KiB), kOk);  // elsewhere, or in b's space
  Get("c");
  Sync();
  ASSERT_TRUE(standby_->Promote().ok());
  master_ = std::move(standby_);
  // The new leader does not know of "c"'s lease: c's space stays even if c is removed.
  const uint64_t c = AddrOf(master_.get(), "c");
  ASSERT_EQ(Remove("c", true), kOk);
  auto fresh = PutStart("w", "d", 16 * KiB);
  if (fresh.code() == kOk) {
    const uint64_t d = fresh.replicas(0).buffer().addr();
    EXPECT_FALSE(d < c + 16 * KiB && c < d + 16 * KiB) << "d placed in c's space";
  }
  // (a's and b's space was reused by the old leader for c: it knew no reader was left there,
  // so the new leader may place in the rest of it at once.)
  // After one lease TTL c's space is the new leader's to give: a 16 KiB put fits it exactly.
  Advance(milliseconds(MasterConfig{}.default_kv_lease_ttl_ms + 1));
  Ping("c1");
  master_->Tick();
  auto e = PutStart("w", "e", 16 * KiB);
  ASSERT_EQ(e.code(), kOk) << e.message();
  ASSERT_EQ(PutEnd("w", "e"), kOk);
  EXPECT_EQ(AddrOf(master_.get(), "e"), c);
}

// A removal the standby applied a moment before its promotion: the removed object's readers
// (leases of the old leader) may still read its space, so the new leader keeps it free.
TEST_F(MasterReplicaTest, ARemovalJustBeforeThePromotionKeepsItsSpaceOutOfUse) {
  ASSERT_EQ(Mount("c1", "s1", 1 << 20, 64 * KiB), kOk);
  ASSERT_EQ(Put("w", "x", 32 * KiB), kOk);
  const uint64_t x = AddrOf(master_.get(), "x");
  Get("x");
  ASSERT_EQ(Remove("x", /*force=*/true), kOk);
  Sync();
  Advance(milliseconds(2000));
  ASSERT_TRUE(standby_->Promote().ok());
  master_ = std::move(standby_);
  auto y = PutStart("w", "y", 32 * KiB);
  ASSERT_EQ(y.code(), kOk) << y.message();
  EXPECT_NE(y.replicas(0).buffer().addr(), x);
  EXPECT_EQ(PutStart("w2", "z", 32 * KiB).code(), C(ErrorCode::NO_AVAILABLE_HANDLE));
  Advance(milliseconds(MasterConfig{}.default_kv_lease_ttl_ms));
  Ping("c1");
  master_->Tick();
  auto z = PutStart("w2", "z", 32 * KiB);
  ASSERT_EQ(z.code(), kOk) << z.message();
  EXPECT_EQ(z.replicas(0).buffer().addr(), x);
}

// What the new leader itself wrote has no readers of the old one: removed, its space is
// reused at once, while an inherited object's space waits out the lease floor.
TEST_F(MasterReplicaTest, SpaceOfObjectsWrittenAfterThePromotionIsReusedAtOnce) {
  ASSERT_EQ(Mount("c1", "s1", 1 << 20, 64 * KiB), kOk);
  ASSERT_EQ(Put("w", "old", 32 * KiB), kOk);
  Sync();
  ASSERT_TRUE(standby_->Promote().ok());
  master_ = std::move(standby_);
  Advance(milliseconds(1));
  ASSERT_EQ(Put("w", "new", 32 * KiB), kOk);  // the pool is full now
  const uint64_t n = AddrOf(master_.get(), "new");
  Advance(milliseconds(MasterConfig{}.default_kv_lease_ttl_ms / 2));  // past new's write lease
  ASSERT_EQ(Remove("new", /*force=*/true), kOk);
  auto again = PutStart("w", "again", 32 * KiB);
  ASSERT_EQ(again.code(), kOk) << again.message();
  EXPECT_EQ(again.replicas(0).buffer().addr(), n);
  ASSERT_EQ(PutEnd("w", "again"), kOk);
  const uint64_t o = AddrOf(master_.get(), "old");
  ASSERT_EQ(Remove("old", true), kOk);
  EXPECT_EQ(PutStart("w", "later", 32 * KiB).code(), C(ErrorCode::NO_AVAILABLE_HANDLE))
      << "an inherited object's space was reused within the lease floor";
  Advance(milliseconds(MasterConfig{}.default_kv_lease_ttl_ms));
  Ping("c1");
  master_->Tick();
  auto later = PutStart("w", "later", 32 * KiB);
  ASSERT_EQ(later.code(), kOk) << later.message();
  EXPECT_EQ(later.replicas(0).buffer().addr(), o);
}

// A put in flight when the leader died ends on the new one, at the address it was given.
TEST_F(MasterReplicaTest, PutInFlightEndsOnTheNewLeader) {
  ASSERT_EQ(Mount("c1", "s1", 1 << 20, 4 * MiB), kOk);
  auto started = PutStart("w", "k", 100 * KiB);
  ASSERT_EQ(started.code(), kOk);
  const uint64_t addr = started.replicas(0).buffer().addr();
  Sync();
  ASSERT_TRUE(standby_->Promote().ok());
  master_ = std::move(standby_);
  EXPECT_EQ(Exist("k"), C(ErrorCode::OBJECT_NOT_FOUND));  // still in flight: invisible
  // Nothing else is placed in its space meanwhile.
  auto other = PutStart("w2", "other", 100 * KiB);
  ASSERT_EQ(other.code(), kOk);
  EXPECT_NE(other.replicas(0).buffer().addr(), addr);
  ASSERT_EQ(PutEnd("w", "k"), kOk);
  EXPECT_EQ(AddrOf(master_.get(), "k"), addr);
}

// The same PutStart sent again (the leader that took it stepped down, or died, before the
// client heard; the client resends it to the next) gets the same space, not
// OBJECT_ALREADY_EXISTS, which a client takes for "the key has a value" (the put would be
// acknowledged and never written: found by bench/ha_bench.py's failover rounds).
TEST_F(MasterReplicaTest, APutStartSentAgainToTheNewLeaderGetsItsSpaceAgain) {
  ASSERT_EQ(Mount("c1", "s1", 1 << 20, 4 * MiB), kOk);
  const uint64_t nonce = 0x5eed;
  auto started = PutStart("w", "k", 100 * KiB, Config(), nonce);
  ASSERT_EQ(started.code(), kOk);
  const uint64_t addr = started.replicas(0).buffer().addr();
  Sync();
  ASSERT_TRUE(standby_->Promote().ok());
  master_ = std::move(standby_);
  auto again = PutStart("w", "k", 100 * KiB, Config(), nonce);
  ASSERT_EQ(again.code(), kOk) << again.message();
  ASSERT_EQ(again.replicas_size(), 1);
  EXPECT_EQ(again.replicas(0).buffer().addr(), addr);
  // Another attempt (another nonce, no nonce, another client) is refused as before.
  EXPECT_EQ(PutStart("w", "k", 100 * KiB, Config(), nonce + 2).code(),
            C(ErrorCode::OBJECT_ALREADY_EXISTS));
  EXPECT_EQ(PutStart("w", "k", 100 * KiB).code(), C(ErrorCode::OBJECT_ALREADY_EXISTS));
  EXPECT_EQ(PutStart("x", "k", 100 * KiB, Config(), nonce).code(),
            C(ErrorCode::OBJECT_ALREADY_EXISTS));
  ASSERT_EQ(PutEnd("w", "k"), kOk);
  EXPECT_EQ(AddrOf(master_.get(), "k"), addr);
  // Once ended, the nonce grants nothing: the key has its value.
  EXPECT_EQ(PutStart("w", "k", 100 * KiB, Config(), nonce).code(),
            C(ErrorCode::OBJECT_ALREADY_EXISTS));
}

TEST_F(MasterReplicaTest, ADivergedLogIsRefusedAndOverlapsStopThePromotion) {
  oplog::Entry e;
  e.set_kind(oplog::Entry::ERASE);
  e.set_key("nothing");
  EXPECT_TRUE(standby_->Apply(e).IsFailedPrecondition());
  e.set_kind(oplog::Entry::OBJECT);
  e.mutable_object()->set_size(64);
  e.mutable_object()->add_replicas()->set_segment_id(7);
  EXPECT_TRUE(standby_->Apply(e).IsFailedPrecondition());  // unknown segment
  oplog::Entry m;
  m.set_kind(oplog::Entry::MOUNT);
  m.set_segment_id(7);
  m.set_segment_name("s");
  m.set_base(1 << 20);
  m.set_size(1 * MiB);
  m.set_client_id("c");
  ASSERT_TRUE(standby_->Apply(m).ok());
  EXPECT_TRUE(standby_->Apply(m).IsFailedPrecondition());  // the same id twice
  e.mutable_object()->set_complete(true);
  ASSERT_TRUE(standby_->Apply(e).ok());
  e.set_key("overlapping");
  e.mutable_object()->mutable_replicas(0)->set_offset(32);
  ASSERT_TRUE(standby_->Apply(e).ok());
  EXPECT_TRUE(standby_->Promote().IsFailedPrecondition());
  oplog::Entry unknown;
  unknown.set_kind(static_cast<oplog::Entry::Kind>(99));
  EXPECT_TRUE(standby_->Apply(unknown).IsFailedPrecondition());
  // Entries no leader writes (found by fuzz_oplog_apply: an OBJECT with neither key nor state
  // made a 0-byte object that a checkpoint of this standby could not be loaded from).
  for (auto kind : {oplog::Entry::OBJECT, oplog::Entry::UPSERT_OBJECT, oplog::Entry::UPSERT_COMMIT}) {
    oplog::Entry bare;
    bare.set_kind(kind);
    bare.set_key("bare");
    EXPECT_TRUE(standby_->Apply(bare).IsFailedPrecondition()) << oplog::Entry::Kind_Name(kind);
    bare.set_key("");
    *bare.mutable_object() = e.object();
    EXPECT_TRUE(standby_->Apply(bare).IsFailedPrecondition()) << oplog::Entry::Kind_Name(kind);
  }
  size_t total = 0;
  EXPECT_EQ(standby_->ListKeys(100, 1 << 20, &total).size(), 2u);
  // An UNMOUNT of a segment whose placements were not dropped first (no leader logs that:
  // its objects would point at a segment gone; found by fuzz_oplog_apply).
  oplog::Entry unmount;
  unmount.set_kind(oplog::Entry::UNMOUNT);
  unmount.set_segment_id(7);
  EXPECT_TRUE(standby_->Apply(unmount).IsFailedPrecondition());
  oplog::Entry erase;
  erase.set_kind(oplog::Entry::ERASE);
  for (const char* key : {"nothing", "overlapping"}) {
    erase.set_key(key);
    ASSERT_TRUE(standby_->Apply(erase).ok()) << key;
  }
  EXPECT_TRUE(standby_->Apply(unmount).ok());
  EXPECT_TRUE(master_->Apply(m).IsFailedPrecondition());  // a serving master applies nothing
}

}  // namespace
}  // namespace store
}  // namespace mooncake
