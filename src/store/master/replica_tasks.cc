#include "store/master/replica_tasks.h"

#include <algorithm>

namespace mooncake {
namespace store {

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ErrorCode ReplicaTasks::Add(ReplicaTask task, Clock::time_point now) {
  if (pending_ >= limits_.max_pending) return ErrorCode::TASK_PENDING_LIMIT_EXCEEDED;
  if (tasks_.count(task.id)) return ErrorCode::INVALID_PARAMS;
  task.status = TaskStatus::kPending;
  task.created_ms = task.updated_ms = WallMs();
  task.since = now;
  queues_[task.executor].push_back(task.id);
  ++queued_[task.executor];
  ++pending_;
  tasks_.emplace(task.id, std::move(task));
  return ErrorCode::OK;
}

const ReplicaTask* ReplicaTasks::Find(const TaskId& id) const {
  auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : &it->second;
}

ReplicaTask* ReplicaTasks::FindMutable(const TaskId& id) {
  auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : &it->second;
}

std::vector<TaskId> ReplicaTasks::PendingOf(const std::string& executor, size_t max) const {
  std::vector<TaskId> out;
  auto q = queues_.find(executor);
  if (q == queues_.end()) return out;
  for (const TaskId& id : q->second) {
    if (out.size() >= max) break;
    const ReplicaTask* t = Find(id);
    if (t != nullptr && t->status == TaskStatus::kPending) out.push_back(id);
  }
  return out;
}

const ReplicaTask* ReplicaTasks::RunningOf(const std::string& key) const {
  auto it = running_keys_.find(key);
  return it == running_keys_.end() ? nullptr : Find(it->second);
}

size_t ReplicaTasks::PendingCount(const std::string& executor) const {
  auto it = queued_.find(executor);
  return it == queued_.end() ? 0 : it->second;
}

void ReplicaTasks::Unqueue(const ReplicaTask& t) {
  // The id stays in queues_ until met at the front (PendingOf skips it meanwhile).
  auto n = queued_.find(t.executor);
  if (n != queued_.end() && --n->second == 0) {
    queued_.erase(n);
    queues_.erase(t.executor);  // nothing pending of it is left in the deque
  } else {
    auto q = queues_.find(t.executor);
    while (q != queues_.end() && !q->second.empty()) {
      const ReplicaTask* front = Find(q->second.front());
      if (front != nullptr && front->status == TaskStatus::kPending && !(front->id == t.id)) break;
      q->second.pop_front();
    }
  }
  --pending_;
}

void ReplicaTasks::Start(const TaskId& id, Clock::time_point now) {
  ReplicaTask* t = FindMutable(id);
  if (t == nullptr || t->status != TaskStatus::kPending) return;
  t->status = TaskStatus::kProcessing;  // before Unqueue: it is no longer pending
  Unqueue(*t);
  ++processing_;
  running_keys_[t->key] = id;
  t->since = now;
  t->updated_ms = WallMs();
}

void ReplicaTasks::Finish(const TaskId& id, bool ok, std::string message, Clock::time_point now) {
  ReplicaTask* t = FindMutable(id);
  if (t == nullptr) return;
  if (t->status == TaskStatus::kPending) {
    t->status = TaskStatus::kFailed;
    Unqueue(*t);
  } else if (t->status == TaskStatus::kProcessing) {
    --processing_;
    auto r = running_keys_.find(t->key);
    if (r != running_keys_.end() && r->second == id) running_keys_.erase(r);
  } else {
    return;  // ended already
  }
  t->status = ok ? TaskStatus::kSuccess : TaskStatus::kFailed;
  t->message = std::move(message);
  t->since = now;
  t->updated_ms = WallMs();
  finished_.push_back(id);
  Prune();
}

void ReplicaTasks::Prune() {
  while (finished_.size() > limits_.max_finished) {
    tasks_.erase(finished_.front());
    finished_.pop_front();
  }
}

std::vector<ReplicaTask> ReplicaTasks::Expire(Clock::time_point now) {
  if (pending_ + processing_ == 0) return {};  // the finished ones need no look every tick
  std::vector<TaskId> late;
  for (const auto& [id, t] : tasks_) {
    if ((t.status == TaskStatus::kPending && t.since + limits_.pending_timeout <= now) ||
        (t.status == TaskStatus::kProcessing && t.since + limits_.processing_timeout <= now)) {
      late.push_back(id);
    }
  }
  std::vector<ReplicaTask> failed_running;
  for (const TaskId& id : late) {
    const ReplicaTask* t = Find(id);
    const bool running = t->status == TaskStatus::kProcessing;
    const auto limit = running ? limits_.processing_timeout : limits_.pending_timeout;
    if (running) failed_running.push_back(*t);
    Finish(id, false,
           std::string(running ? "not finished" : "not started") + " within " +
               std::to_string(limit.count()) + " s (its executor " + t->executor +
               (running ? " did not report back)" : " did not fetch it)"),
           now);
  }
  return failed_running;
}

void ReplicaTasks::FailPendingOf(const std::string& executor, const std::string& why,
                                 Clock::time_point now) {
  for (const TaskId& id : PendingOf(executor, SIZE_MAX)) Finish(id, false, why, now);
}

}  // namespace store
}  // namespace mooncake
