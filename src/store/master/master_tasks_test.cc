// MasterService: replica tasks (master_tasks.cc): create / query / fetch / finish, the checks
// and codes, the new replicas readable only at the end, moves, failures that leave nothing
// half-done, and the HA log of a task's space.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "store/master/master_service_test_fixture.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_support;

constexpr uint64_t kSeg1 = 0x10000000, kSeg2 = 0x20000000, kSeg3 = 0x30000000;

class MasterTasksTest : public MasterServiceTest {
 protected:
  void MountThree() {
    ASSERT_EQ(Mount("c1", "seg1", kSeg1, 1 * MiB), kOk);
    ASSERT_EQ(Mount("c2", "seg2", kSeg2, 1 * MiB), kOk);
    ASSERT_EQ(Mount("c3", "seg3", kSeg3, 1 * MiB), kOk);
  }
  // A complete object of `size` bytes on seg1 only.
  void PutOnSeg1(const std::string& key, uint64_t size = 1000) {
    ASSERT_EQ(Put("c1", key, size, Config(1, {"seg1"})), kOk);
    ASSERT_EQ(SegmentsOf(Get(key)), std::set<std::string>{"seg1"});
  }
  rpc::ReplicaTaskResponse Copy(const std::string& key, const std::vector<std::string>& targets) {
    rpc::ReplicaTaskRequest req;
    req.set_client_id("admin");
    req.set_key(key);
    req.set_type(0);
    for (const auto& t : targets) req.add_targets(t);
    return master_->CreateReplicaTask(req);
  }
  rpc::ReplicaTaskResponse Move(const std::string& key, const std::string& source,
                                const std::string& target) {
    rpc::ReplicaTaskRequest req;
    req.set_client_id("admin");
    req.set_key(key);
    req.set_type(1);
    req.set_source(source);
    req.add_targets(target);
    return master_->CreateReplicaTask(req);
  }
  rpc::QueryTaskResponse Query(const rpc::ReplicaTaskResponse& created) {
    rpc::QueryTaskRequest req;
    req.set_id_hi(created.id_hi());
    req.set_id_lo(created.id_lo());
    return master_->QueryTask(req);
  }
  rpc::FetchTasksResponse Fetch(const std::string& client) {
    rpc::FetchTasksRequest req;
    req.set_client_id(client);
    return master_->FetchTasks(req);
  }
  rpc::FinishTaskResponse Finish(const std::string& client, const rpc::TaskAssignment& a,
                                 bool ok, const std::string& message = "") {
    rpc::FinishTaskRequest req;
    req.set_client_id(client);
    req.set_id_hi(a.id_hi());
    req.set_id_lo(a.id_lo());
    req.set_ok(ok);
    req.set_message(message);
    return master_->FinishTask(req);
  }
  uint64_t Allocated() { return master_->GetSummary().allocated; }
  // Time passes with the clients' heartbeats going on, the master ticking.
  void Wait(int secs) {
    for (int i = 0; i < secs; ++i) {
      Advance(seconds(1));
      for (const char* c : {"c1", "c2", "c3"}) Ping(c);
      master_->Tick();
    }
  }
  static uint32_t Status(const rpc::QueryTaskResponse& q) { return q.status(); }
};

constexpr uint32_t kPending = 0, kProcessing = 1, kFailed = 2, kSuccess = 3;

TEST_F(MasterTasksTest, CreateChecksAsUpstream) {
  MountThree();
  PutOnSeg1("k");
  EXPECT_EQ(Copy("k", {}).code(), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(Copy("missing", {"seg2"}).code(), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Copy("k", {"nowhere"}).code(), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(Move("missing", "seg1", "seg2").code(), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Move("k", "seg1", "seg1").code(), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(Move("k", "seg2", "seg3").code(), C(ErrorCode::INVALID_PARAMS));  // no replica there
  EXPECT_EQ(Move("k", "seg1", "nowhere").code(), C(ErrorCode::INVALID_PARAMS));
  rpc::ReplicaTaskRequest odd;
  odd.set_client_id("admin");
  odd.set_key("k");
  odd.set_type(7);
  odd.add_targets("seg2");
  EXPECT_EQ(master_->CreateReplicaTask(odd).code(), C(ErrorCode::INVALID_PARAMS));
  // A segment mounted again lately takes no new objects yet: -1010.
  ASSERT_EQ(Unmount("c3", "seg3", kSeg3), kOk);
  ASSERT_EQ(Mount("c3", "seg3", kSeg3, 1 * MiB), kOk);
  EXPECT_EQ(Copy("k", {"seg3"}).code(), C(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS));
  rpc::QueryTaskRequest unknown;
  unknown.set_id_hi(1);
  unknown.set_id_lo(2);
  EXPECT_EQ(master_->QueryTask(unknown).code(), C(ErrorCode::TASK_NOT_FOUND));
}

TEST_F(MasterTasksTest, ACopyIsReadableOnlyOnceItsExecutorReportsIt) {
  MountThree();
  PutOnSeg1("k");
  const uint64_t source_addr = Get("k").replicas(0).buffer().addr();
  auto created = Copy("k", {"seg2", "seg3"});
  ASSERT_EQ(created.code(), kOk) << created.message();
  auto q = Query(created);
  EXPECT_EQ(Status(q), kPending);
  EXPECT_EQ(q.assigned_client(), "c1");  // the source's owner runs it
  EXPECT_EQ(q.type(), 0u);
  EXPECT_GT(q.created_at_ms(), 0);
  EXPECT_EQ(Ping("c1").tasks_waiting(), 1u);
  EXPECT_EQ(Ping("c2").tasks_waiting(), 0u);
  EXPECT_EQ(Fetch("c2").tasks_size(), 0);
  const uint64_t before = Allocated();
  auto fetched = Fetch("c1");
  ASSERT_EQ(fetched.tasks_size(), 1);
  const rpc::TaskAssignment a = fetched.tasks(0);
  EXPECT_EQ(a.size(), 1000u);
  EXPECT_EQ(a.source().segment_name(), "seg1");
  EXPECT_EQ(a.source().addr(), source_addr);
  ASSERT_EQ(a.targets_size(), 2);
  EXPECT_EQ(a.targets(0).segment_name(), "seg2");
  EXPECT_EQ(a.targets(1).segment_name(), "seg3");
  EXPECT_GE(a.targets(0).addr(), kSeg2);
  EXPECT_GT(Allocated(), before);  // the targets' space is taken ...
  EXPECT_EQ(SegmentsOf(Get("k")), std::set<std::string>{"seg1"});  // ... and not readable
  EXPECT_EQ(Status(Query(created)), kProcessing);
  EXPECT_EQ(Ping("c1").tasks_waiting(), 0u);
  EXPECT_EQ(Fetch("c1").tasks_size(), 0);  // handed out once
  // Only the executor reports.
  EXPECT_EQ(Finish("c2", a, true).code(), C(ErrorCode::ILLEGAL_CLIENT));
  auto done = Finish("c1", a, true);
  ASSERT_EQ(done.code(), kOk);
  EXPECT_EQ(done.message(), "");
  EXPECT_EQ(SegmentsOf(Get("k")), (std::set<std::string>{"seg1", "seg2", "seg3"}));
  q = Query(created);
  EXPECT_EQ(Status(q), kSuccess);
  EXPECT_EQ(q.task_message(), "Task completed successfully");
  EXPECT_GE(q.last_updated_at_ms(), q.created_at_ms());
  EXPECT_EQ(Finish("c1", a, true).code(), C(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS));
  // Counted under upstream's names: one create, one start, one end; reports 3 (2 refused).
  const std::string m = master_->MetricsText();
  for (const char* line : {"master_create_copy_task_requests_total 1\n",
                           "master_create_copy_task_failures_total 0\n",
                           "master_copy_start_requests_total 1\n",
                           "master_copy_end_requests_total 3\n",
                           "master_copy_end_failures_total 2\n",
                           "master_update_task_requests_total 3\n",
                           "master_update_task_failures_total 2\n",
                           "master_fetch_tasks_requests_total 3\n",
                           "master_move_start_requests_total 0\n"}) {
    EXPECT_NE(m.find(line), std::string::npos) << line;
  }
  // The object with three replicas goes as a whole.
  EXPECT_EQ(Remove("k", /*force=*/true), kOk);
  Advance(seconds(11));
  master_->Tick();
  EXPECT_EQ(Allocated(), 0u);
}

TEST_F(MasterTasksTest, AMoveDropsItsSourceAtTheEndAfterItsReadersLeases) {
  MountThree();
  PutOnSeg1("k");
  auto created = Move("k", "seg1", "seg2");
  ASSERT_EQ(created.code(), kOk) << created.message();
  auto fetched = Fetch("c1");
  ASSERT_EQ(fetched.tasks_size(), 1);
  EXPECT_EQ(fetched.tasks(0).type(), 1u);
  EXPECT_EQ(SegmentsOf(Get("k")), std::set<std::string>{"seg1"});  // a lease on the source
  ASSERT_EQ(Finish("c1", fetched.tasks(0), true).code(), kOk);
  EXPECT_EQ(SegmentsOf(Get("k")), std::set<std::string>{"seg2"});
  EXPECT_EQ(Status(Query(created)), kSuccess);
  // The source's space waits out the lease granted on it, then is free.
  const uint64_t leased = Allocated();
  master_->Tick();
  EXPECT_EQ(Allocated(), leased);
  Advance(seconds(11));
  master_->Tick();
  EXPECT_LT(Allocated(), leased);
  size_t total = 0;
  auto view = master_->ListSegments(10, &total);
  for (const auto& s : view) {
    if (s.name == "seg1") {
      EXPECT_EQ(s.allocated, 0u);
    }
  }
}

TEST_F(MasterTasksTest, AFailedCopyLeavesTheObjectAsItWasAndFreesTheSpace) {
  MountThree();
  PutOnSeg1("k");
  const uint64_t before = Allocated();
  auto created = Copy("k", {"seg2"});
  auto fetched = Fetch("c1");
  ASSERT_EQ(fetched.tasks_size(), 1);
  ASSERT_EQ(Finish("c1", fetched.tasks(0), false, "peer unreachable").code(), kOk);
  EXPECT_EQ(SegmentsOf(Get("k")), std::set<std::string>{"seg1"});
  EXPECT_EQ(Allocated(), before);
  auto q = Query(created);
  EXPECT_EQ(Status(q), kFailed);
  EXPECT_EQ(q.task_message(), "TRANSFER_FAIL: peer unreachable");
}

TEST_F(MasterTasksTest, AnObjectReplacedOrRemovedDuringTheCopyGetsNoReplicaOfOtherBytes) {
  MountThree();
  PutOnSeg1("k");
  auto created = Copy("k", {"seg2"});
  auto fetched = Fetch("c1");
  ASSERT_EQ(fetched.tasks_size(), 1);
  // Removing needs force while the task runs.
  Advance(seconds(11));  // the lease of PutOnSeg1's read lapses
  EXPECT_EQ(Remove("k"), C(ErrorCode::OBJECT_HAS_REPLICATION_TASK));
  EXPECT_EQ(RemoveByRegex("^k$").count(), 0);
  ASSERT_EQ(Remove("k", /*force=*/true), kOk);
  ASSERT_EQ(Put("c3", "k", 2000, Config(1, {"seg3"})), kOk);  // a new value under the key
  ASSERT_EQ(Finish("c1", fetched.tasks(0), true).code(), kOk);
  EXPECT_EQ(SegmentsOf(Get("k")), std::set<std::string>{"seg3"});
  EXPECT_EQ(Get("k").size(), 2000u);
  auto q = Query(created);
  EXPECT_EQ(Status(q), kFailed);
  EXPECT_EQ(q.task_message().rfind("REPLICA_IS_GONE", 0), 0u) << q.task_message();
  Wait(11);
  EXPECT_EQ(Allocated(), 2048u);  // the new value's alone (the copy's space freed)
}

TEST_F(MasterTasksTest, APendingTaskOfARemovedObjectFailsWhenFetched) {
  MountThree();
  PutOnSeg1("k");
  auto created = Copy("k", {"seg2"});
  Advance(seconds(11));
  // Only a running task holds a remove off: a pending one (whose executor may never come)
  // does not.
  ASSERT_EQ(Remove("k"), kOk);
  EXPECT_EQ(Fetch("c1").tasks_size(), 0);
  auto q = Query(created);
  EXPECT_EQ(Status(q), kFailed);
  EXPECT_EQ(q.task_message().rfind("OBJECT_NOT_FOUND", 0), 0u) << q.task_message();
}

TEST_F(MasterTasksTest, SourceOrTargetUnmountedWhileRunning) {
  MountThree();
  PutOnSeg1("a");
  ASSERT_EQ(Put("c2", "b", 1000, Config(1, {"seg2"})), kOk);
  auto ca = Copy("a", {"seg3"});  // source seg1 goes away
  auto cb = Copy("b", {"seg3"});  // target seg3 goes away
  auto fa = Fetch("c1");
  auto fb = Fetch("c2");
  ASSERT_EQ(fa.tasks_size(), 1);
  ASSERT_EQ(fb.tasks_size(), 1);
  ASSERT_EQ(Unmount("c1", "seg1", kSeg1), kOk);
  EXPECT_EQ(Get("a").code(), C(ErrorCode::OBJECT_NOT_FOUND));  // its only replica went
  ASSERT_EQ(Finish("c1", fa.tasks(0), true).code(), kOk);
  EXPECT_EQ(Status(Query(ca)), kFailed);
  EXPECT_EQ(Get("a").code(), C(ErrorCode::OBJECT_NOT_FOUND));
  ASSERT_EQ(Unmount("c3", "seg3", kSeg3), kOk);
  EXPECT_EQ(Status(Query(cb)), kFailed);  // at once: nothing is left to write to
  EXPECT_EQ(Finish("c2", fb.tasks(0), true).code(), C(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS));
  EXPECT_EQ(SegmentsOf(Get("b")), std::set<std::string>{"seg2"});
}

TEST_F(MasterTasksTest, AnExecutorThatNeverReportsLosesTheSpaceAtTheDiscardTime) {
  MountThree();
  PutOnSeg1("k");
  const uint64_t before = Allocated();
  auto created = Copy("k", {"seg2"});
  auto fetched = Fetch("c1");
  ASSERT_EQ(fetched.tasks_size(), 1);
  for (int i = 0; i < 31; ++i) {  // the executors keep their heartbeats
    Advance(seconds(1));
    Ping("c1");
    Ping("c2");
    Ping("c3");
    master_->Tick();
  }
  EXPECT_EQ(Status(Query(created)), kFailed);
  EXPECT_EQ(Allocated(), before);
  EXPECT_EQ(Finish("c1", fetched.tasks(0), true).code(),
            C(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS));
  EXPECT_EQ(SegmentsOf(Get("k")), std::set<std::string>{"seg1"});
}

TEST_F(MasterTasksTest, TargetsHoldingAReplicaNeedNothing) {
  MountThree();
  PutOnSeg1("k");
  auto copy = Copy("k", {"seg1"});
  ASSERT_EQ(copy.code(), kOk);
  EXPECT_EQ(Fetch("c1").tasks_size(), 0);  // nothing to copy: done at once
  EXPECT_EQ(Status(Query(copy)), kSuccess);
  // A move to a segment that holds one already just drops the source.
  ASSERT_EQ(Put("c1", "m", 1000, Config(2, {"seg1", "seg2"})), kOk);
  auto move = Move("m", "seg1", "seg2");
  ASSERT_EQ(move.code(), kOk);
  EXPECT_EQ(Fetch("c1").tasks_size(), 0);
  EXPECT_EQ(Status(Query(move)), kSuccess);
  EXPECT_EQ(SegmentsOf(Get("m")), std::set<std::string>{"seg2"});
}

TEST_F(MasterTasksTest, NoSpaceOnTheTargetIsRetriedThenFails) {
  ASSERT_EQ(Mount("c1", "seg1", kSeg1, 1 * MiB), kOk);
  ASSERT_EQ(Mount("c2", "small", kSeg2, 64 * KiB), kOk);
  PutOnSeg1("k", 256 * KiB);
  auto created = Copy("k", {"small"});
  ASSERT_EQ(created.code(), kOk);
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(Fetch("c1").tasks_size(), 0);
    EXPECT_EQ(Status(Query(created)), kPending);
  }
  EXPECT_EQ(Fetch("c1").tasks_size(), 0);
  auto q = Query(created);
  EXPECT_EQ(Status(q), kFailed);
  EXPECT_NE(q.task_message().find("max retries reached: 10"), std::string::npos);
  EXPECT_EQ(q.task_message().rfind("NO_AVAILABLE_HANDLE", 0), 0u);
}

TEST_F(MasterTasksTest, ATaskWhoseTargetsWentFailsAtOnceAndTheNextTaskOfTheKeyRuns) {
  MountThree();
  PutOnSeg1("k");
  auto first = Copy("k", {"seg2", "seg2"});  // a target named twice is one target
  auto second = Copy("k", {"seg3"});
  auto f1 = Fetch("c1");
  ASSERT_EQ(f1.tasks_size(), 1);
  EXPECT_EQ(f1.tasks(0).targets_size(), 1);
  ASSERT_EQ(Unmount("c2", "seg2", kSeg2), kOk);  // the first task's only target
  auto q = Query(first);
  EXPECT_EQ(Status(q), kFailed);
  EXPECT_EQ(q.task_message().rfind("REPLICA_IS_GONE", 0), 0u) << q.task_message();
  auto f2 = Fetch("c1");  // the second may run now
  ASSERT_EQ(f2.tasks_size(), 1);
  // The first's late report touches nothing of the second's.
  EXPECT_EQ(Finish("c1", f1.tasks(0), true).code(), C(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS));
  EXPECT_EQ(Finish("c1", f1.tasks(0), false).code(), C(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS));
  ASSERT_EQ(Finish("c1", f2.tasks(0), true).code(), kOk);
  EXPECT_EQ(Status(Query(second)), kSuccess);
  EXPECT_EQ(SegmentsOf(Get("k")), (std::set<std::string>{"seg1", "seg3"}));
}

TEST_F(MasterTasksTest, TasksOfOneKeyRunOneAtATime) {
  MountThree();
  PutOnSeg1("k");
  auto first = Copy("k", {"seg2"});
  auto second = Copy("k", {"seg3"});
  auto f1 = Fetch("c1");
  ASSERT_EQ(f1.tasks_size(), 1);
  EXPECT_EQ(f1.tasks(0).id_hi(), first.id_hi());
  EXPECT_EQ(Status(Query(second)), kPending);
  EXPECT_EQ(Fetch("c1").tasks_size(), 0);  // waits for the first
  ASSERT_EQ(Finish("c1", f1.tasks(0), true).code(), kOk);
  auto f2 = Fetch("c1");
  ASSERT_EQ(f2.tasks_size(), 1);
  ASSERT_EQ(Finish("c1", f2.tasks(0), true).code(), kOk);
  EXPECT_EQ(SegmentsOf(Get("k")), (std::set<std::string>{"seg1", "seg2", "seg3"}));
}

TEST_F(MasterTasksTest, AnObjectBeingCopiedIsNotEvicted) {
  ASSERT_EQ(Mount("c1", "seg1", kSeg1, 1 * MiB), kOk);
  ASSERT_EQ(Mount("c2", "seg2", kSeg2, 256 * KiB), kOk);
  PutOnSeg1("k", 200 * KiB);
  Wait(11);  // its put's lease gone
  ASSERT_EQ(Copy("k", {"seg2"}).code(), kOk);
  auto f = Fetch("c1");
  ASSERT_EQ(f.tasks_size(), 1);
  // Fill seg1 past the watermark: eviction takes the others, never k.
  for (int i = 0; i < 9; ++i) {
    Put("c1", "fill" + std::to_string(i), 100 * KiB, Config(1, {"seg1"}));
    Wait(2);
  }
  EXPECT_EQ(Exist("k"), kOk);
  EXPECT_LT(Exist("fill0"), 0);  // evicted, as others
  ASSERT_EQ(Finish("c1", f.tasks(0), true).code(), kOk);
  EXPECT_EQ(SegmentsOf(Get("k")), (std::set<std::string>{"seg1", "seg2"}));
}

TEST_F(MasterTasksTest, ATaskSpaceIsInTheLogAndANewLeaderDoesNotReuseIt) {
  Collect log;
  master_->SetChangeSink(&log);
  MountThree();
  PutOnSeg1("k");
  ASSERT_EQ(Copy("k", {"seg2"}).code(), kOk);
  auto f = Fetch("c1");
  ASSERT_EQ(f.tasks_size(), 1);
  const uint64_t target = f.tasks(0).targets(0).addr();
  MasterConfig sc;
  sc.standby = true;
  MasterService standby(sc, [this] { return now_; });
  for (const auto& e : log.entries) ASSERT_TRUE(standby.Apply(e).ok()) << e.DebugString();
  ASSERT_TRUE(standby.Promote().ok());
  // The new leader places nothing over the copy its predecessor's executor may be writing.
  rpc::PutStartRequest req;
  req.set_client_id("c2");
  auto* item = req.add_items();
  item->set_key("other");
  item->set_size(1000);
  req.mutable_config()->set_replica_num(1);
  req.mutable_config()->add_preferred_segments("seg2");
  auto r = standby.PutStart(req);
  ASSERT_EQ(r.results(0).code(), kOk) << r.results(0).message();
  const uint64_t placed = r.results(0).replicas(0).buffer().addr();
  EXPECT_TRUE(placed >= target + 1000 || placed + 1000 <= target) << placed << " " << target;
  // And a commit replays: the standby of a leader that finished the copy sees three ... two replicas.
  ASSERT_EQ(Finish("c1", f.tasks(0), true).code(), kOk);
  MasterService standby2(sc, [this] { return now_; });
  for (const auto& e : log.entries) ASSERT_TRUE(standby2.Apply(e).ok()) << e.DebugString();
  std::vector<MasterService::ReplicaView> views;
  ASSERT_EQ(standby2.QueryKey("k", &views), ErrorCode::OK);
  EXPECT_EQ(views.size(), 2u);
  // Tasks that need no space (the targets hold replicas already) replay too: a copy, and a
  // move that only drops its source.
  ASSERT_EQ(Copy("k", {"seg1"}).code(), kOk);
  ASSERT_EQ(Fetch("c1").tasks_size(), 0);
  auto move = Move("k", "seg1", "seg2");
  ASSERT_EQ(move.code(), kOk);
  ASSERT_EQ(Fetch("c1").tasks_size(), 0);
  ASSERT_EQ(Status(Query(move)), kSuccess);
  MasterService standby4(sc, [this] { return now_; });
  for (const auto& e : log.entries) ASSERT_TRUE(standby4.Apply(e).ok()) << e.DebugString();
  views.clear();
  ASSERT_EQ(standby4.QueryKey("k", &views), ErrorCode::OK);
  ASSERT_EQ(views.size(), 1u);
  EXPECT_EQ(views[0].segment_name, "seg2");
  // A checkpoint of the leader with a task running carries its space too.
  auto third = Copy("k", {"seg3"});
  ASSERT_EQ(third.code(), kOk);
  ASSERT_EQ(Fetch(Query(third).assigned_client()).tasks_size(), 1);
  MasterService standby3(sc, [this] { return now_; });
  size_t copies = 0;
  master_->ExportState([&](oplog::Entry&& e) {
    copies += e.kind() == oplog::Entry::COPY_OBJECT;
    ASSERT_TRUE(standby3.Apply(e).ok());
  });
  EXPECT_EQ(copies, 1u);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
