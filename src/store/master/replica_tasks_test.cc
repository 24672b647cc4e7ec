// ReplicaTasks: the book of replica tasks (states, queues, bounds, timeouts).
#include "store/master/replica_tasks.h"

#include <gtest/gtest.h>

namespace mooncake {
namespace store {
namespace {

using Clock = ReplicaTasks::Clock;
using std::chrono::seconds;

ReplicaTask Task(uint64_t n, const std::string& executor, const std::string& key) {
  ReplicaTask t;
  t.id = {n, n * 7};
  t.key = key;
  t.executor = executor;
  t.source = "seg-" + executor;
  t.targets = {"other"};
  return t;
}

TEST(ReplicaTasksTest, PendingThenProcessingThenEndedPerExecutorInOrder) {
  ReplicaTasks tasks;
  const auto now = Clock::now();
  ASSERT_EQ(tasks.Add(Task(1, "a", "k1"), now), ErrorCode::OK);
  ASSERT_EQ(tasks.Add(Task(2, "b", "k2"), now), ErrorCode::OK);
  ASSERT_EQ(tasks.Add(Task(3, "a", "k3"), now), ErrorCode::OK);
  EXPECT_EQ(tasks.Add(Task(3, "a", "k3"), now), ErrorCode::INVALID_PARAMS);  // id in use
  EXPECT_EQ(tasks.PendingCount("a"), 2u);
  EXPECT_EQ(tasks.PendingCount("c"), 0u);
  auto a = tasks.PendingOf("a", 16);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].hi, 1u);
  EXPECT_EQ(a[1].hi, 3u);
  EXPECT_EQ(tasks.PendingOf("a", 1).size(), 1u);
  EXPECT_EQ(tasks.RunningOf("k1"), nullptr);  // pending, not running
  EXPECT_GT(tasks.Find(a[0])->created_ms, 0);

  tasks.Start(a[0], now);
  EXPECT_EQ(tasks.Find(a[0])->status, TaskStatus::kProcessing);
  EXPECT_EQ(tasks.RunningOf("k1"), tasks.Find(a[0]));
  EXPECT_EQ(tasks.PendingCount("a"), 1u);
  EXPECT_EQ(tasks.PendingOf("a", 16).size(), 1u);
  EXPECT_EQ(tasks.processing(), 1u);
  tasks.Finish(a[0], true, "done", now);
  EXPECT_EQ(tasks.Find(a[0])->status, TaskStatus::kSuccess);
  EXPECT_EQ(tasks.Find(a[0])->message, "done");
  EXPECT_EQ(tasks.RunningOf("k1"), nullptr);
  tasks.Finish(a[0], false, "again", now);  // ended already: unchanged
  EXPECT_EQ(tasks.Find(a[0])->status, TaskStatus::kSuccess);

  tasks.Finish(a[1], false, "gave up", now);  // a pending one may fail too
  EXPECT_EQ(tasks.Find(a[1])->status, TaskStatus::kFailed);
  EXPECT_EQ(tasks.PendingCount("a"), 0u);
  EXPECT_TRUE(tasks.PendingOf("a", 16).empty());
  EXPECT_EQ(tasks.pending(), 1u);  // b's
  EXPECT_EQ(tasks.processing(), 0u);
  EXPECT_EQ(tasks.finished(), 2u);
}

TEST(ReplicaTasksTest, BoundsOnWaitingAndKeptTasks) {
  ReplicaTasks::Limits limits;
  limits.max_pending = 2;
  limits.max_processing = 1;
  limits.max_finished = 2;
  ReplicaTasks tasks(limits);
  const auto now = Clock::now();
  ASSERT_EQ(tasks.Add(Task(1, "a", "k1"), now), ErrorCode::OK);
  ASSERT_EQ(tasks.Add(Task(2, "a", "k2"), now), ErrorCode::OK);
  EXPECT_EQ(tasks.Add(Task(3, "a", "k3"), now), ErrorCode::TASK_PENDING_LIMIT_EXCEEDED);
  EXPECT_TRUE(tasks.CanStart());
  tasks.Start({1, 7}, now);
  EXPECT_FALSE(tasks.CanStart());
  ASSERT_EQ(tasks.Add(Task(3, "a", "k3"), now), ErrorCode::OK);  // room again
  for (uint64_t n : {1, 2, 3}) tasks.Finish({n, n * 7}, true, "", now);
  // the oldest finished is pruned
  EXPECT_EQ(tasks.Find({1, 7}), nullptr);
  EXPECT_NE(tasks.Find({2, 14}), nullptr);
  EXPECT_NE(tasks.Find({3, 21}), nullptr);
  EXPECT_EQ(tasks.finished(), 2u);
}

TEST(ReplicaTasksTest, TimeoutsFailTasksAndNameTheRunningOnes) {
  ReplicaTasks::Limits limits;
  limits.pending_timeout = seconds(10);
  limits.processing_timeout = seconds(20);
  ReplicaTasks tasks(limits);
  const auto t0 = Clock::now();
  ASSERT_EQ(tasks.Add(Task(1, "a", "k1"), t0), ErrorCode::OK);
  ASSERT_EQ(tasks.Add(Task(2, "a", "k2"), t0), ErrorCode::OK);
  tasks.Start({2, 14}, t0 + seconds(5));
  EXPECT_TRUE(tasks.Expire(t0 + seconds(9)).empty());
  EXPECT_EQ(tasks.Find({1, 7})->status, TaskStatus::kPending);
  EXPECT_TRUE(tasks.Expire(t0 + seconds(10)).empty());  // the pending one fails
  EXPECT_EQ(tasks.Find({1, 7})->status, TaskStatus::kFailed);
  EXPECT_NE(tasks.Find({1, 7})->message.find("not started within 10 s"), std::string::npos);
  EXPECT_EQ(tasks.Find({2, 14})->status, TaskStatus::kProcessing);
  auto late = tasks.Expire(t0 + seconds(25));
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].key, "k2");
  EXPECT_EQ(tasks.Find({2, 14})->status, TaskStatus::kFailed);
  EXPECT_NE(tasks.Find({2, 14})->message.find("not finished within 20 s"), std::string::npos);
  EXPECT_EQ(tasks.pending() + tasks.processing(), 0u);
}

TEST(ReplicaTasksTest, AnExecutorThatLeftFailsItsPendingTasks) {
  ReplicaTasks tasks;
  const auto now = Clock::now();
  ASSERT_EQ(tasks.Add(Task(1, "a", "k1"), now), ErrorCode::OK);
  ASSERT_EQ(tasks.Add(Task(2, "a", "k2"), now), ErrorCode::OK);
  ASSERT_EQ(tasks.Add(Task(3, "b", "k3"), now), ErrorCode::OK);
  tasks.Start({2, 14}, now);
  tasks.FailPendingOf("a", "gone", now);
  EXPECT_EQ(tasks.Find({1, 7})->status, TaskStatus::kFailed);
  EXPECT_EQ(tasks.Find({1, 7})->message, "gone");
  EXPECT_EQ(tasks.Find({2, 14})->status, TaskStatus::kProcessing);  // running: left to end
  EXPECT_EQ(tasks.Find({3, 21})->status, TaskStatus::kPending);
  EXPECT_EQ(tasks.PendingCount("a"), 0u);
  EXPECT_EQ(tasks.PendingCount("b"), 1u);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
