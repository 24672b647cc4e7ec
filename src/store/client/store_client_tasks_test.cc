// Replica tasks through StoreClient (CreateCopyTask / CreateMoveTask / QueryTask) against an
// in-process master: the client owning the source runs the task in the background, the new
// replica reads back byte-exact (also once the source holder has left), a move leaves only
// the target, and a task the executor cannot run (a target it cannot reach, a source the
// master says lies outside its lent memory) fails without a replica of other bytes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <set>
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
using testing::Bytes;
using testing::InProcessMaster;
constexpr uint64_t MiB = 1 << 20;

class StoreClientTasksTest : public ::testing::Test {
 protected:
  std::unique_ptr<StoreClient> Client(uint64_t segment) {
    return testing::MakeClient(master_, segment, 16 * MiB, milliseconds(100));
  }
  std::set<std::string> Holders(const std::string& key) {
    std::vector<MasterService::ReplicaView> views;
    std::set<std::string> out;
    if (master_->service().QueryKey(key, &views) != ErrorCode::OK) return out;
    for (const auto& v : views) out.insert(v.segment_name);
    return out;
  }
  // Polls until the task has ended (or 10 s).
  StoreClient::TaskInfo Wait(StoreClient* c, const StoreClient::TaskId& id) {
    StoreClient::TaskInfo info;
    for (int i = 0; i < 1000; ++i) {
      EXPECT_EQ(c->QueryTask(id, &info), 0);
      if (info.status >= 2) break;
      std::this_thread::sleep_for(milliseconds(10));
    }
    return info;
  }
  // `by` puts `v` under `key` with its replica preferably in `holder`'s segment.
  static int PutOn(StoreClient* by, StoreClient* holder, const std::string& key,
                   std::vector<char>& v) {
    ReplicateConfig on;
    on.preferred_segments = {holder->segment_name()};
    return by->Put(key, {{v.data(), v.size()}}, on);
  }
  std::vector<char> Read(StoreClient* c, const std::string& key, size_t n, int64_t* rc) {
    std::vector<char> out(n);
    *rc = c->Get(key, {{out.data(), out.size()}});
    return out;
  }

  std::shared_ptr<InProcessMaster> master_ = std::make_shared<InProcessMaster>();
};

TEST_F(StoreClientTasksTest, ACopyOnAnotherHolderReadsBackAfterTheSourceLeft) {
  auto a = Client(32 * MiB);
  auto b = Client(32 * MiB);
  auto user = Client(0);
  ASSERT_TRUE(a && b && user);
  auto v = Bytes(5 * MiB + 123, 7);  // staged and sent in several pieces
  ASSERT_EQ(PutOn(user.get(), a.get(), "k", v), 0);
  ASSERT_EQ(Holders("k"), std::set<std::string>{a->segment_name()});
  StoreClient::TaskId id;
  ASSERT_EQ(user->CreateCopyTask("k", {b->segment_name()}, &id), 0);
  EXPECT_TRUE(id.hi != 0 || id.lo != 0);
  auto info = Wait(user.get(), id);
  EXPECT_EQ(info.status, 3u) << info.message;
  EXPECT_EQ(info.message, "Task completed successfully");
  EXPECT_EQ(info.type, 0u);
  EXPECT_EQ(a->tasks_run(), 1u);  // the source's holder ran it
  EXPECT_EQ(b->tasks_run(), 0u);
  EXPECT_EQ(Holders("k"), (std::set<std::string>{a->segment_name(), b->segment_name()}));
  ASSERT_EQ(a->Close(), 0);  // the source leaves: its replica goes with it
  EXPECT_EQ(Holders("k"), std::set<std::string>{b->segment_name()});
  int64_t rc = 0;
  EXPECT_EQ(Read(user.get(), "k", v.size(), &rc), v);
  EXPECT_EQ(rc, static_cast<int64_t>(v.size()));
}

TEST_F(StoreClientTasksTest, AMoveLeavesOnlyTheTarget) {
  auto a = Client(32 * MiB);
  auto b = Client(32 * MiB);
  ASSERT_TRUE(a && b);
  auto v = Bytes(300000, 9);
  ASSERT_EQ(PutOn(b.get(), a.get(), "k", v), 0);
  StoreClient::TaskId id;
  EXPECT_EQ(b->CreateMoveTask("k", a->segment_name(), a->segment_name(), &id),
            ToInt(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(b->CreateMoveTask("nope", a->segment_name(), b->segment_name(), &id),
            ToInt(ErrorCode::OBJECT_NOT_FOUND));
  ASSERT_EQ(b->CreateMoveTask("k", a->segment_name(), b->segment_name(), &id), 0);
  auto info = Wait(b.get(), id);
  EXPECT_EQ(info.status, 3u) << info.message;
  EXPECT_EQ(info.type, 1u);
  EXPECT_EQ(Holders("k"), std::set<std::string>{b->segment_name()});
  int64_t rc = 0;
  EXPECT_EQ(Read(a.get(), "k", v.size(), &rc), v);
  StoreClient::TaskInfo none;
  EXPECT_EQ(b->QueryTask({1, 2}, &none), ToInt(ErrorCode::TASK_NOT_FOUND));
}

TEST_F(StoreClientTasksTest, ATargetTheExecutorCannotReachFailsTheTask) {
  auto a = Client(32 * MiB);
  ASSERT_TRUE(a);
  auto v = Bytes(100000, 3);
  ASSERT_EQ(a->Put("k", {{v.data(), v.size()}}, ReplicateConfig()), 0);
  // A segment the master knows whose engine is not there.
  rpc::MountSegmentRequest ghost;
  ghost.set_client_id("ghost");
  ghost.set_segment_name("127.0.0.1:1");
  ghost.set_base(0x7f0000000000);
  ghost.set_size(64 * MiB);
  ASSERT_EQ(master_->service().MountSegment(ghost).code(), 0);
  StoreClient::TaskId id;
  ASSERT_EQ(a->CreateCopyTask("k", {"127.0.0.1:1"}, &id), 0);
  auto info = Wait(a.get(), id);
  EXPECT_EQ(info.status, 2u);
  EXPECT_EQ(info.message.rfind("TRANSFER_FAIL", 0), 0u) << info.message;
  EXPECT_EQ(Holders("k"), std::set<std::string>{a->segment_name()});
}

TEST_F(StoreClientTasksTest, ASourceOutsideTheLentMemoryIsNeverRead) {
  auto a = Client(32 * MiB);
  auto b = Client(32 * MiB);
  ASSERT_TRUE(a && b);
  auto v = Bytes(4096, 5);
  ASSERT_EQ(PutOn(a.get(), a.get(), "k", v), 0);
  // A master (buggy or hostile) that points the executor at memory it does not lend: its
  // local buffer (registered, but not the pool's), and an address past its segment.
  const char* local = static_cast<const char*>(a->local_buffer().ptr);
  std::vector<uint64_t> lies = {reinterpret_cast<uint64_t>(local), ~uint64_t{0} - 100};
  std::vector<std::string> reported;
  Mutex mu;
  size_t next = 0;
  master_->on_FetchTasks = [&](const rpc::FetchTasksRequest& req, rpc::FetchTasksResponse* resp) {
    const Status s = master_->ServeFetchTasks(req, resp);
    for (auto& t : *resp->mutable_tasks()) {
      MutexLock lock(&mu);
      t.mutable_source()->set_addr(lies[next++ % lies.size()]);
    }
    return s;
  };
  master_->on_FinishTask = [&](const rpc::FinishTaskRequest& req, rpc::FinishTaskResponse* resp) {
    {
      MutexLock lock(&mu);
      reported.push_back(req.message());
    }
    return master_->ServeFinishTask(req, resp);
  };
  for (int i = 0; i < 2; ++i) {
    StoreClient::TaskId id;
    ASSERT_EQ(a->CreateCopyTask("k", {b->segment_name()}, &id), 0);
    auto info = Wait(a.get(), id);
    EXPECT_EQ(info.status, 2u);
    EXPECT_EQ(info.message.rfind("REPLICA_NOT_IN_LOCAL_MEMORY: ", 0), 0u) << info.message;
  }
  MutexLock lock(&mu);
  ASSERT_EQ(reported.size(), 2u);
  for (const auto& r : reported) EXPECT_EQ(r.rfind("REPLICA_NOT_IN_LOCAL_MEMORY", 0), 0u) << r;
  EXPECT_EQ(Holders("k"), std::set<std::string>{a->segment_name()});
}

TEST_F(StoreClientTasksTest, ATaskNotBegunWhileItsSpaceIsSurelyHeldIsReportedUnwritten) {
  auto a = Client(32 * MiB);
  auto b = Client(32 * MiB);
  ASSERT_TRUE(a && b);
  auto v = Bytes(4096, 11);
  ASSERT_EQ(PutOn(a.get(), a.get(), "k", v), 0);
  // A master that holds the space for no time at all: nothing may be written.
  master_->on_FetchTasks = [&](const rpc::FetchTasksRequest& req, rpc::FetchTasksResponse* resp) {
    const Status s = master_->ServeFetchTasks(req, resp);
    resp->set_write_within_ms(0);
    return s;
  };
  StoreClient::TaskId id;
  ASSERT_EQ(a->CreateCopyTask("k", {b->segment_name()}, &id), 0);
  auto info = Wait(a.get(), id);
  EXPECT_EQ(info.status, 2u);
  EXPECT_NE(info.message.find("not begun within"), std::string::npos) << info.message;
  EXPECT_EQ(Holders("k"), std::set<std::string>{a->segment_name()});
}

}  // namespace
}  // namespace store
}  // namespace mooncake
