// StoreClient against an in-process master (store/testing/in_process_master.h): the put,
// get, lease, fallback, revoke, remount and read-mark rules of the client, with the
// master's answers bent where a test needs it. No master process; the engines are real
// (two clients of one process move bytes through them as two processes would).
#include <gtest/gtest.h>

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mooncake/store/error_code.h"
#include "mooncake/store/store_client.h"
#include "store/testing/client_fixture.h"
#include "store/testing/in_process_master.h"

namespace mooncake {
namespace store {
namespace {

using std::chrono::milliseconds;
using testing::InProcessMaster;
constexpr uint64_t MiB = 1 << 20;
const int kNotFound = ToInt(ErrorCode::OBJECT_NOT_FOUND);

using testing::Bytes;

class StoreClientTest : public ::testing::Test {
 protected:
  // A client of the in-process master: `segment` bytes lent, `local` bytes of staging.
  std::unique_ptr<StoreClient> Client(uint64_t segment, uint64_t local = 16 * MiB,
                                      milliseconds heartbeat = milliseconds(1000)) {
    return testing::MakeClient(master_, segment, local, heartbeat);
  }
  // `holder` lends its segment; `user` lends nothing, so its objects go to the holder's.
  void TwoClients(uint64_t user_local = 16 * MiB) {
    holder_ = Client(64 * MiB);
    user_ = Client(0, user_local);
    ASSERT_TRUE(holder_ && user_);
  }
  int Put(StoreClient* c, const std::string& key, std::vector<char>& v) {
    return c->Put(key, {{v.data(), v.size()}}, ReplicateConfig());
  }
  std::vector<char> Get(StoreClient* c, const std::string& key, int64_t* rc) {
    std::vector<char> out(c->GetSize(key) > 0 ? c->GetSize(key) : 0);
    *rc = c->Get(key, {{out.data(), out.size()}});
    return out;
  }

  std::shared_ptr<InProcessMaster> master_ = std::make_shared<InProcessMaster>();
  std::unique_ptr<StoreClient> holder_, user_;
};

TEST_F(StoreClientTest, PutAndGetThroughItsOwnSegmentAndThroughAnotherClients) {
  auto self = Client(16 * MiB);
  ASSERT_TRUE(self);
  auto v = Bytes(100000, 1);
  ASSERT_EQ(Put(self.get(), "mine", v), 0);
  int64_t rc = 0;
  EXPECT_EQ(Get(self.get(), "mine", &rc), v);
  EXPECT_EQ(rc, static_cast<int64_t>(v.size()));

  TwoClients();
  // Unregistered memory, staged through the user's local buffer, into the holder's segment.
  auto w = Bytes(3 * MiB + 17, 2);
  ASSERT_EQ(Put(user_.get(), "theirs", w), 0);
  EXPECT_EQ(Get(user_.get(), "theirs", &rc), w);
  EXPECT_EQ(Get(holder_.get(), "theirs", &rc), w);  // a memcpy from its own segment
  // Registered memory moves as it is.
  auto r = Bytes(MiB, 3);
  ASSERT_EQ(user_->RegisterBuffer(r.data(), r.size(), false), 0);
  ASSERT_EQ(Put(user_.get(), "registered", r), 0);
  std::vector<char> back(r.size());
  ASSERT_EQ(user_->RegisterBuffer(back.data(), back.size(), false), 0);
  EXPECT_EQ(user_->Get("registered", {{back.data(), back.size()}}), static_cast<int64_t>(MiB));
  EXPECT_EQ(back, r);
  EXPECT_EQ(user_->UnregisterBuffer(r.data()), 0);
  EXPECT_EQ(user_->UnregisterBuffer(back.data()), 0);
  EXPECT_EQ(user_->UnregisterBuffer(back.data()), ToInt(ErrorCode::INVALID_PARAMS));
}

// The local hot cache serves repeated reads of another client's object, and never a value
// that another client replaced, removed or wrote again since.
TEST_F(StoreClientTest, TheHotCacheServesRepeatsAndNeverAReplacedValue) {
  TwoClients();
  setenv("MC_STORE_LOCAL_HOT_CACHE_SIZE", "600000", 1);
  setenv("MC_STORE_LOCAL_HOT_BLOCK_SIZE", "400000", 1);
  auto reader = Client(0);
  unsetenv("MC_STORE_LOCAL_HOT_CACHE_SIZE");
  unsetenv("MC_STORE_LOCAL_HOT_BLOCK_SIZE");
  ASSERT_TRUE(reader);
  ASSERT_TRUE(reader->GetHotCacheStats().enabled);
  EXPECT_FALSE(user_->GetHotCacheStats().enabled);
  auto v1 = Bytes(300000, 11);
  ASSERT_EQ(Put(user_.get(), "k", v1), 0);
  int64_t rc = 0;
  EXPECT_EQ(Get(reader.get(), "k", &rc), v1);
  EXPECT_EQ(reader->GetHotCacheStats().fills, 1u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Get(reader.get(), "k", &rc), v1);
  EXPECT_EQ(reader->GetHotCacheStats().hits, 3u);
  // Another client replaces the value: the next read is the new one.
  auto v2 = Bytes(300000, 12);
  ASSERT_EQ(user_->Upsert("k", {{v2.data(), v2.size()}}, ReplicateConfig()), 0);
  EXPECT_EQ(Get(reader.get(), "k", &rc), v2);
  EXPECT_EQ(Get(reader.get(), "k", &rc), v2);
  // ... removes it, and writes it again (perhaps in the same space).
  ASSERT_EQ(user_->Remove("k", true), 0);
  std::vector<char> none(300000);
  EXPECT_EQ(reader->Get("k", {{none.data(), none.size()}}), kNotFound);
  auto v3 = Bytes(300000, 13);
  ASSERT_EQ(Put(user_.get(), "k", v3), 0);
  EXPECT_EQ(Get(reader.get(), "k", &rc), v3);
  // Ten objects of 100 kB through a cache of 600 kB: evictions, and every value right.
  std::vector<std::vector<char>> values;
  for (int i = 0; i < 10; ++i) {
    values.push_back(Bytes(100000 + i, 100 + i));
    ASSERT_EQ(Put(user_.get(), "m" + std::to_string(i), values.back()), 0);
  }
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 10; ++i) EXPECT_EQ(Get(reader.get(), "m" + std::to_string(i), &rc), values[i]);
  }
  const auto st = reader->GetHotCacheStats();
  EXPECT_LE(st.bytes, 600000u);
  EXPECT_GT(st.evictions, 0u);
  // An object over one block is read each time, not kept.
  auto big = Bytes(2 * MiB, 14);
  ASSERT_EQ(Put(user_.get(), "big", big), 0);
  const uint64_t fills = reader->GetHotCacheStats().fills;
  EXPECT_EQ(Get(reader.get(), "big", &rc), big);
  EXPECT_EQ(reader->GetHotCacheStats().fills, fills);
}

TEST_F(StoreClientTest, AnObjectLargerThanTheLocalBufferIsStagedInRounds) {
  // Buffers that are not a multiple of the staging allocator's 64-byte alignment too (their
  // chunks once did not fit: every staged copy waited out the transfer timeout).
  TwoClients(/*user_local=*/4097);
  auto u = Bytes(3 * 4097 + 5, 17);
  ASSERT_EQ(Put(user_.get(), "odd", u), 0);
  int64_t rc = 0;
  EXPECT_EQ(Get(user_.get(), "odd", &rc), u);
  user_ = Client(0, 64 * 1024);
  auto v = Bytes(5 * MiB + 3, 4);
  ASSERT_EQ(Put(user_.get(), "big", v), 0);
  EXPECT_EQ(Get(user_.get(), "big", &rc), v);
  EXPECT_EQ(rc, static_cast<int64_t>(v.size()));
}

TEST_F(StoreClientTest, WithoutALocalBufferUnregisteredMemoryIsRefusedAndTheRestPut) {
  TwoClients(/*user_local=*/0);
  auto a = Bytes(4096, 5), b = Bytes(4096, 6);
  ASSERT_EQ(user_->RegisterBuffer(b.data(), b.size(), false), 0);
  auto codes = user_->BatchPut({"a", "b"}, {{{a.data(), a.size()}}, {{b.data(), b.size()}}},
                               ReplicateConfig());
  EXPECT_EQ(codes[0], ToInt(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(user_->GetSize("a"), kNotFound);
  EXPECT_EQ(user_->GetSize("b"), 4096);
}

TEST_F(StoreClientTest, AReadThatOutlastsItsLeaseIsTriedOnceMoreThenLeaseExpired) {
  TwoClients();
  auto v = Bytes(4096, 7);
  ASSERT_EQ(Put(user_.get(), "k", v), 0);
  // The master grants 20 ms and answers 40 ms late: every read ends after its lease.
  master_->on_GetReplicaList = [&](const rpc::KeysRequest& q, rpc::GetReplicaListResponse* r) {
    Status s = master_->ServeGetReplicaList(q, r);
    for (auto& res : *r->mutable_results()) res.set_lease_ttl_ms(20);
    std::this_thread::sleep_for(milliseconds(40));
    return s;
  };
  const int before = master_->calls(MasterMethod::kGetReplicaList);
  std::vector<char> out(v.size());
  EXPECT_EQ(user_->Get("k", {{out.data(), out.size()}}), ToInt(ErrorCode::LEASE_EXPIRED));
  EXPECT_EQ(master_->calls(MasterMethod::kGetReplicaList) - before, 2);
  master_->on_GetReplicaList = nullptr;
  EXPECT_EQ(user_->Get("k", {{out.data(), out.size()}}), 4096);
  EXPECT_EQ(out, v);
}

TEST_F(StoreClientTest, AReplicaThatCannotBeReadFallsBackToTheNext) {
  TwoClients();
  auto v = Bytes(8192, 8);
  ASSERT_EQ(Put(user_.get(), "k", v), 0);
  // A first replica on a segment nobody serves (nothing listens on port 1).
  master_->on_GetReplicaList = [&](const rpc::KeysRequest& q, rpc::GetReplicaListResponse* r) {
    Status s = master_->ServeGetReplicaList(q, r);
    auto* reps = r->mutable_results(0)->mutable_replicas();
    rpc::Replica bad = reps->Get(0);
    bad.mutable_buffer()->set_segment_name("127.0.0.1:1");
    reps->Add(std::move(bad));
    reps->SwapElements(0, reps->size() - 1);
    return s;
  };
  std::vector<char> out(v.size());
  EXPECT_EQ(user_->Get("k", {{out.data(), out.size()}}), 8192);
  EXPECT_EQ(out, v);
}

TEST_F(StoreClientTest, APutWhoseCopyFailsIsRevokedNotEnded) {
  TwoClients();
  master_->on_PutStart = [&](const rpc::PutStartRequest& q, rpc::PutStartResponse* r) {
    Status s = master_->ServePutStart(q, r);
    for (auto& res : *r->mutable_results()) {
      for (auto& rep : *res.mutable_replicas()) rep.mutable_buffer()->set_segment_name("127.0.0.1:1");
    }
    return s;
  };
  auto v = Bytes(4096, 9);
  EXPECT_EQ(Put(user_.get(), "k", v), ToInt(ErrorCode::TRANSFER_FAIL));
  EXPECT_EQ(master_->calls(MasterMethod::kPutRevoke), 1);
  EXPECT_EQ(master_->calls(MasterMethod::kPutEnd), 0);
  master_->on_PutStart = nullptr;
  EXPECT_EQ(user_->GetSize("k"), kNotFound);
  EXPECT_EQ(Put(user_.get(), "k", v), 0);  // the revoked put left nothing behind
}

TEST_F(StoreClientTest, AReplyWithTheWrongNumberOfResultsIsRpcFailAndEndsNothing) {
  TwoClients();
  master_->on_PutStart = [&](const rpc::PutStartRequest& q, rpc::PutStartResponse* r) {
    Status s = master_->ServePutStart(q, r);
    r->mutable_results()->RemoveLast();
    return s;
  };
  auto a = Bytes(4096, 10), b = Bytes(4096, 11);
  auto codes = user_->BatchPut({"a", "b"}, {{{a.data(), a.size()}}, {{b.data(), b.size()}}},
                               ReplicateConfig());
  EXPECT_EQ(codes, std::vector<int>(2, ToInt(ErrorCode::RPC_FAIL)));
  EXPECT_EQ(master_->calls(MasterMethod::kPutEnd), 0);
  master_->on_GetReplicaList = [](const rpc::KeysRequest&, rpc::GetReplicaListResponse*) {
    return Status::Unavailable("the master went away");
  };
  std::vector<char> out(4096);
  EXPECT_EQ(user_->Get("a", {{out.data(), out.size()}}), ToInt(ErrorCode::RPC_FAIL));
}

TEST_F(StoreClientTest, AnUpsertWaitsForAnotherWritersPutInFlight) {
  TwoClients();
  auto v = Bytes(4096, 12);
  ASSERT_EQ(Put(user_.get(), "k", v), 0);
  int busy = 2;
  master_->on_PutStart = [&](const rpc::PutStartRequest& q, rpc::PutStartResponse* r) {
    if (busy-- > 0) {
      r->add_results()->set_code(ToInt(ErrorCode::OBJECT_REPLICA_BUSY));
      return Status::OK();
    }
    return master_->ServePutStart(q, r);
  };
  auto w = Bytes(4096, 13);
  EXPECT_EQ(user_->Upsert("k", {{w.data(), w.size()}}, ReplicateConfig()), 0);
  EXPECT_EQ(master_->calls(MasterMethod::kPutStart), 1 + 3);
  int64_t rc = 0;
  EXPECT_EQ(Get(user_.get(), "k", &rc), w);
}

TEST_F(StoreClientTest, AForcedRemovePassesTheLeaseOfTheLastCompletedRead) {
  TwoClients();
  auto v = Bytes(4096, 14);
  ASSERT_EQ(Put(user_.get(), "k", v), 0);
  uint64_t granted = 0;
  master_->on_GetReplicaList = [&](const rpc::KeysRequest& q, rpc::GetReplicaListResponse* r) {
    Status s = master_->ServeGetReplicaList(q, r);
    granted = r->results(0).lease_id();
    return s;
  };
  std::vector<uint64_t> passed;
  master_->on_Remove = [&](const rpc::KeysRequest& q, rpc::CodesResponse* r) {
    passed.assign(q.read_lease_ids().begin(), q.read_lease_ids().end());
    return master_->ServeRemove(q, r);
  };
  std::vector<char> out(v.size());
  ASSERT_EQ(user_->Get("k", {{out.data(), out.size()}}), 4096);
  ASSERT_NE(granted, 0u);
  EXPECT_EQ(user_->Remove("k", /*force=*/true), 0);
  EXPECT_EQ(passed, std::vector<uint64_t>{granted});
  ASSERT_EQ(Put(user_.get(), "k", v), 0);
  EXPECT_EQ(user_->Remove("k", /*force=*/true), 0);  // no read since: the id was taken
  EXPECT_EQ(passed, std::vector<uint64_t>{0});
}

// A forced RemoveAll while a get session's lookup is in flight must not tell the master that
// this client's reads are done: the session's lease would not hold its bytes.
TEST_F(StoreClientTest, AForcedRemoveAllDuringASessionStartSaysAReadIsInFlight) {
  TwoClients();
  auto v = Bytes(4096, 15);
  ASSERT_EQ(Put(user_.get(), "k", v), 0);
  std::vector<bool> reads_done;
  master_->on_RemoveAll = [&](const rpc::KeysRequest& q, rpc::CountResponse* r) {
    reads_done.push_back(q.own_reads_done());
    return master_->ServeRemoveAll(q, r);
  };
  master_->on_GetReplicaList = [&](const rpc::KeysRequest& q, rpc::GetReplicaListResponse* r) {
    Status s = master_->ServeGetReplicaList(q, r);  // the lease is granted here
    (void)user_->RemoveAll(/*force=*/true);         // and this client removes everything
    return s;
  };
  EXPECT_EQ(user_->GetSessionStart({"k"}), std::vector<int>{0});
  master_->on_GetReplicaList = nullptr;
  ASSERT_EQ(reads_done, std::vector<bool>{false});
  std::vector<char> out(v.size());
  EXPECT_EQ(user_->GetSessionRanges({"k"}, {{0, 0, {out.data(), out.size()}}}),
            std::vector<int64_t>{4096});
  EXPECT_EQ(out, v);  // the lease kept the space: the bytes are still the object's
  EXPECT_EQ(user_->GetSessionEnd({"k"}), 0);
  EXPECT_EQ(user_->RemoveAll(/*force=*/true), 0);
  EXPECT_EQ(reads_done, (std::vector<bool>{false, true}));
}

TEST_F(StoreClientTest, AMasterThatForgetsTheClientGetsItsSegmentRemounted) {
  auto now = std::make_shared<std::atomic<int64_t>>(0);
  MasterConfig config;
  config.client_ttl_s = 1;
  master_ = std::make_shared<InProcessMaster>(config, [now] {
    return MasterService::Clock::now() + std::chrono::seconds(now->load());
  });
  // Written by the heartbeat thread, read here once `served` says the remount is done.
  std::mutex mu;
  std::vector<bool> remounts;
  std::atomic<int> served{0};  // mounts the master has finished (calls() counts them on entry)
  master_->on_MountSegment = [&](const rpc::MountSegmentRequest& q, rpc::MountSegmentResponse* r) {
    {
      std::lock_guard<std::mutex> lock(mu);
      remounts.push_back(q.remount());
    }
    Status s = master_->ServeMountSegment(q, r);
    served.fetch_add(1);
    return s;
  };
  std::atomic<bool> deaf{false};  // pings lost (the heartbeat is late)
  master_->on_Ping = [&](const rpc::PingRequest& q, rpc::PingResponse* r) {
    if (deaf) return Status::Unavailable("lost");
    return master_->ServePing(q, r);
  };
  auto c = Client(4 * MiB, 16 * MiB, milliseconds(20));
  ASSERT_TRUE(c);
  auto v = Bytes(4096, 16);
  ASSERT_EQ(Put(c.get(), "k", v), 0);
  deaf = true;
  now->store(5);  // past client_ttl: the next housekeeping expires the client
  master_->service().Tick();
  deaf = false;
  EXPECT_EQ(c->GetSize("k"), kNotFound);
  for (int i = 0; i < 200 && served.load() < 2; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(served.load(), 2);
  EXPECT_EQ(master_->calls(MasterMethod::kMountSegment), 2);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(remounts, (std::vector<bool>{false, true}));
  }
  // The remounted segment takes new objects once a lease TTL has passed (the master's rule
  // for a segment dropped with reads possibly in flight: src/store/README.md).
  EXPECT_EQ(Put(c.get(), "k", v), ToInt(ErrorCode::NO_AVAILABLE_HANDLE));
  now->store(5 + 11);
  EXPECT_EQ(Put(c.get(), "k", v), 0);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
