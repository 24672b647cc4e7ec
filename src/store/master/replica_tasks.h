// ReplicaTasks: the master's book of replica tasks (create_copy_task / create_move_task /
// query_task, upstream's names): which task waits for which client, which runs, how each
// ended. It knows nothing of objects or space: MasterService (master_tasks.cc) checks a task
// against its tables when it is created, started and finished, and holds the space a running
// task writes.
//
// A task is PENDING until its executor (the client owning the source replica's segment)
// fetches it, PROCESSING while the executor copies, then SUCCESS or FAILED. Bounds (as
// upstream's defaults): at most max_pending waiting (Add refuses more with
// TASK_PENDING_LIMIT_EXCEEDED) and max_processing running, at most max_finished kept for
// query_task (the oldest pruned first); a task pending past pending_timeout or processing
// past processing_timeout fails (Expire).
//
// Not thread safe: the master calls it under its lock. The book is the leader's alone (not in
// the HA log): after a failover query_task of an older task answers TASK_NOT_FOUND, and the
// space a running task held is freed once its writer could no longer be writing (the log
// carries that space: oplog.proto COPY_*).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mooncake/store/error_code.h"

namespace mooncake {
namespace store {

enum class TaskType : uint32_t { kCopy = 0, kMove = 1 };                 // upstream's values
enum class TaskStatus : uint32_t { kPending = 0, kProcessing = 1, kFailed = 2, kSuccess = 3 };

struct TaskId {
  uint64_t hi = 0;
  uint64_t lo = 0;
  bool operator<(const TaskId& o) const { return hi != o.hi ? hi < o.hi : lo < o.lo; }
  bool operator==(const TaskId& o) const { return hi == o.hi && lo == o.lo; }
};

struct ReplicaTask {
  using Clock = std::chrono::steady_clock;
  TaskId id;
  TaskType type = TaskType::kCopy;
  TaskStatus status = TaskStatus::kPending;
  std::string key;                   // as the master stores it (strict mode: scoped)
  std::string tenant;                // strict mode: who created it ("" otherwise)
  std::string source;                // the segment read from (a move's: the one dropped)
  std::vector<std::string> targets;  // segment names
  std::string executor;              // the client id that runs it
  int64_t created_ms = 0;            // ms since the epoch
  int64_t updated_ms = 0;
  Clock::time_point since;           // when it entered its status (timeouts)
  uint32_t attempts = 0;             // starts that found no space (retried while pending)
  std::string message;
  // Set when it starts: the object's version and the source placement it copies from,
  // which must still be the object's at the end for the copy to count.
  uint64_t version = 0;
  uint32_t source_segment = 0;
  uint64_t source_offset = 0;
};

struct ReplicaTaskLimits {
  size_t max_pending = 10000;
  size_t max_processing = 10000;
  size_t max_finished = 10000;
  std::chrono::seconds pending_timeout{300};
  std::chrono::seconds processing_timeout{300};
};

class ReplicaTasks {
 public:
  using Clock = ReplicaTask::Clock;
  using Limits = ReplicaTaskLimits;
  explicit ReplicaTasks(Limits limits = Limits()) : limits_(limits) {}

  // Records `task` as pending for its executor (its id, key, source, targets, executor set
  // by the caller); TASK_PENDING_LIMIT_EXCEEDED when max_pending wait already, INVALID_PARAMS
  // for an id in use.
  ErrorCode Add(ReplicaTask task, Clock::time_point now);
  // Null when unknown (or pruned).
  const ReplicaTask* Find(const TaskId& id) const;
  ReplicaTask* FindMutable(const TaskId& id);
  // The executor's pending tasks, oldest first, at most `max`.
  std::vector<TaskId> PendingOf(const std::string& executor, size_t max) const;
  size_t PendingCount(const std::string& executor) const;
  // The processing task of `key` (null: none).
  const ReplicaTask* RunningOf(const std::string& key) const;
  bool CanStart() const { return processing_ < limits_.max_processing; }
  // Pending -> processing.
  void Start(const TaskId& id, Clock::time_point now);
  // Pending or processing -> SUCCESS (ok) or FAILED, with `message`.
  void Finish(const TaskId& id, bool ok, std::string message, Clock::time_point now);
  // Fails every task past its status's timeout; the processing ones so failed are returned
  // (the master frees the space they held).
  std::vector<ReplicaTask> Expire(Clock::time_point now);
  // Fails the executor's pending tasks (it left): `why`.
  void FailPendingOf(const std::string& executor, const std::string& why, Clock::time_point now);

  size_t pending() const { return pending_; }
  size_t processing() const { return processing_; }
  size_t finished() const { return finished_.size(); }
  const Limits& limits() const { return limits_; }

 private:
  void Unqueue(const ReplicaTask& t);
  void Prune();

  const Limits limits_;
  std::map<TaskId, ReplicaTask> tasks_;
  // Pending tasks per executor in creation order (entries of tasks no longer pending are
  // skipped and dropped as met).
  std::unordered_map<std::string, std::deque<TaskId>> queues_;
  std::unordered_map<std::string, size_t> queued_;  // per executor: pending count
  std::unordered_map<std::string, TaskId> running_keys_;
  std::deque<TaskId> finished_;  // in finishing order
  size_t pending_ = 0;
  size_t processing_ = 0;
};

int64_t WallMs();

}  // namespace store
}  // namespace mooncake
