// MasterService: replica tasks (create_copy_task / create_move_task / query_task, upstream's
// calls; the book in replica_tasks.h).
//
// A task copies a complete object's bytes from one of its replicas (the source) to space on
// other segments (the targets), by the engine of the client that owns the source's segment
// (the executor: it polls FetchTasks when its heartbeat says tasks wait). The rules:
// - The new space is allocated when the executor starts the task, held in copies_ (in the HA
//   log as COPY_OBJECT), and never handed to readers: the new replicas become part of the
//   object only at a successful FinishTask, and only if the object still has the version and
//   the source replica the executor copied from (else the copy is freed and the task fails:
//   an object removed, replaced by an upsert, or whose source segment went away meanwhile
//   never gets a replica of other bytes).
// - A move drops its source replica at that same moment (its space freed after the readers'
//   leases, as a removal's); readers see the source until then.
// - One task of a key runs at a time (another waits, pending); an object with a task is not
//   evicted while the task runs, and a remove without force answers
//   OBJECT_HAS_REPLICATION_TASK (forced, it goes, and the task fails).
// - A running task's space is freed when the executor reports, when its segment is
//   unmounted, or once its writer may no longer write (put_start_discard_timeout_s, as a
//   put's); the task then fails.
#include <glog/logging.h>

#include <algorithm>

#include "store/common/limits.h"
#include "store/master/master_service.h"
#include "store/master/master_service_internal.h"

namespace mooncake {
namespace store {

namespace {

constexpr uint32_t kMaxStartAttempts = 10;  // upstream's retries of NO_AVAILABLE_HANDLE
constexpr size_t kDefaultFetch = 16;        // upstream's batch
constexpr size_t kMaxClientMessage = 512;   // of a FinishTask's message, kept

std::string Named(ErrorCode c, const std::string& why) {
  return std::string(ErrorCodeName(c)) + ": " + why;
}

// The executor's reason as it gave it when it names a code ("CODE: why"), else as a
// TRANSFER_FAIL.
std::string ClientFailure(const std::string& message) {
  size_t n = 0;
  while (n < message.size() && ((message[n] >= 'A' && message[n] <= 'Z') || message[n] == '_')) ++n;
  if (n > 0 && message.compare(n, 2, ": ") == 0) return message;
  return Named(ErrorCode::TRANSFER_FAIL, message.empty() ? "the executor did not say why" : message);
}

}  // namespace

std::vector<std::pair<uint64_t, MasterService::Segment*>> MasterService::SegmentsNamedLocked(
    const std::string& name) {
  std::vector<std::pair<uint64_t, Segment*>> out;
  for (auto& [id, seg] : segments_) {
    if (seg->name == name) out.emplace_back(id, seg.get());
  }
  return out;
}

rpc::ReplicaTaskResponse MasterService::CreateReplicaTask(const rpc::ReplicaTaskRequest& req) {
  rpc::ReplicaTaskResponse resp = CreateReplicaTaskUncounted(req);
  MutexLock lock(&mu_);
  (req.type() == static_cast<uint32_t>(TaskType::kMove) ? counters_.tasks.create_move
                                                        : counters_.tasks.create_copy)
      .Count(resp.code() != Code(ErrorCode::OK));
  return resp;
}

rpc::ReplicaTaskResponse MasterService::CreateReplicaTaskUncounted(
    const rpc::ReplicaTaskRequest& req) {
  rpc::ReplicaTaskResponse resp;
  auto fail = [&resp](ErrorCode c, const std::string& why) {
    resp.set_code(Code(c));
    resp.set_message(why);
    return resp;
  };
  const bool move = req.type() == static_cast<uint32_t>(TaskType::kMove);
  if (!move && req.type() != static_cast<uint32_t>(TaskType::kCopy)) {
    return fail(ErrorCode::INVALID_PARAMS, "unknown task type " + std::to_string(req.type()) +
                                               " (0: copy, 1: move)");
  }
  std::string problem = NameProblem("client id", req.client_id());
  if (problem.empty()) problem = StoredKeyProblem(req.key());
  if (!problem.empty()) return fail(ErrorCode::INVALID_PARAMS, problem);
  if (req.targets_size() == 0) return fail(ErrorCode::INVALID_PARAMS, "no target segment given");
  if (static_cast<size_t>(req.targets_size()) > kMaxReplicaNum) {
    return fail(ErrorCode::INVALID_PARAMS, "more than " + std::to_string(kMaxReplicaNum) +
                                               " target segments");
  }
  std::vector<std::string> targets;  // in order, each once
  for (const std::string& t : req.targets()) {
    problem = NameProblem("target segment name", t);
    if (!problem.empty()) return fail(ErrorCode::INVALID_PARAMS, problem);
    if (std::find(targets.begin(), targets.end(), t) == targets.end()) targets.push_back(t);
  }
  if (move) {
    problem = NameProblem("source segment name", req.source());
    if (!problem.empty()) return fail(ErrorCode::INVALID_PARAMS, problem);
    if (req.targets_size() != 1) return fail(ErrorCode::INVALID_PARAMS, "a move has one target");
  }
  MutexLock lock(&mu_);
  const auto now = now_();
  auto it = objects_.find(req.key());
  if (it == objects_.end() || !it->second.complete) {
    return fail(ErrorCode::OBJECT_NOT_FOUND, "no object under this key");
  }
  const Object& obj = it->second;
  if (move && req.source() == req.targets(0)) {
    return fail(ErrorCode::INVALID_PARAMS, "source and target are the same segment");
  }
  for (const std::string& t : targets) {
    bool mounted = false, placeable = false;
    for (const auto& [sid, seg] : SegmentsNamedLocked(t)) {
      mounted |= !seg->draining;
      placeable |= !seg->draining && seg->alloc_after <= now;
    }
    if (!mounted) return fail(ErrorCode::INVALID_PARAMS, "segment " + t + " is not mounted");
    if (!placeable) {
      return fail(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                  "segment " + t + " takes no new objects yet (mounted again lately)");
    }
  }
  // The source: a move's named segment, a copy's replica chosen at random.
  std::vector<const Segment*> sources;
  for (const auto& p : obj.replicas) {
    auto seg = segments_.find(p.segment_id);
    if (seg == segments_.end() || seg->second->draining) continue;
    if (move && seg->second->name != req.source()) continue;
    sources.push_back(seg->second.get());
  }
  if (sources.empty()) {
    return fail(move ? ErrorCode::INVALID_PARAMS : ErrorCode::OBJECT_NOT_FOUND,
                move ? "segment " + req.source() + " holds no replica of this object"
                     : "no replica of this object is readable now");
  }
  const Segment* source = sources[lease_ids_() % sources.size()];
  ReplicaTask task;
  do {
    task.id = {lease_ids_(), lease_ids_()};
  } while ((task.id.hi == 0 && task.id.lo == 0) || tasks_.Find(task.id) != nullptr);
  task.type = move ? TaskType::kMove : TaskType::kCopy;
  task.key = req.key();
  task.tenant = req.tenant_id();
  task.source = source->name;
  task.targets = std::move(targets);
  task.executor = source->client_id;
  const TaskId id = task.id;
  const ErrorCode code = tasks_.Add(std::move(task), now);
  if (code != ErrorCode::OK) {
    return fail(code, std::to_string(tasks_.pending()) + " replica tasks wait already (at most " +
                          std::to_string(tasks_.limits().max_pending) + ")");
  }
  resp.set_code(Code(ErrorCode::OK));
  resp.set_id_hi(id.hi);
  resp.set_id_lo(id.lo);
  return resp;
}

rpc::QueryTaskResponse MasterService::QueryTask(const rpc::QueryTaskRequest& req) {
  rpc::QueryTaskResponse resp;
  MutexLock lock(&mu_);
  const ReplicaTask* t = tasks_.Find({req.id_hi(), req.id_lo()});
  const bool found = t != nullptr && (!config_.enable_multi_tenants || t->tenant == req.tenant_id());
  counters_.tasks.query.Count(!found);
  if (!found) {
    resp.set_code(Code(ErrorCode::TASK_NOT_FOUND));
    resp.set_message("no replica task with this id on this master (finished tasks are kept "
                     "up to " + std::to_string(tasks_.limits().max_finished) +
                     "; tasks do not survive a change of leader)");
    return resp;
  }
  resp.set_code(Code(ErrorCode::OK));
  resp.set_id_hi(t->id.hi);
  resp.set_id_lo(t->id.lo);
  resp.set_type(static_cast<uint32_t>(t->type));
  resp.set_status(static_cast<uint32_t>(t->status));
  resp.set_created_at_ms(t->created_ms);
  resp.set_last_updated_at_ms(t->updated_ms);
  resp.set_assigned_client(t->executor);
  resp.set_task_message(t->message);
  return resp;
}

bool MasterService::StartTaskLocked(ReplicaTask* t, rpc::TaskAssignment* out,
                                    Clock::time_point now) {
  const TaskId id = t->id;
  const TaskType type = t->type;
  const std::string key = t->key;  // t may be pruned once it has ended
  RequestCounters& counted =
      type == TaskType::kMove ? counters_.tasks.move_start : counters_.tasks.copy_start;
  auto end = [&](ErrorCode c, const std::string& why) MC_REQUIRES(mu_) {
    counted.Count(true);
    tasks_.Finish(id, false, Named(c, why), now);
    return false;
  };
  // Another task of the key runs, or the space of one (of a previous leader's) is still held:
  // this one waits.
  if (tasks_.RunningOf(key) != nullptr || CopyingLocked(key)) return false;
  auto live = [&](uint32_t segment_id) MC_REQUIRES(mu_) {
    auto seg = segments_.find(segment_id);
    return seg != segments_.end() && !seg->second->draining ? seg->second.get() : nullptr;
  };
  // The source: a replica on a live segment of the executor (a move: the named one).
  auto find_source = [&](const Object& obj) MC_REQUIRES(mu_) -> const Placement* {
    for (const auto& p : obj.replicas) {
      const Segment* seg = live(p.segment_id);
      if (seg == nullptr || seg->client_id != t->executor) continue;
      if (type == TaskType::kMove && seg->name != t->source) continue;
      return &p;
    }
    return nullptr;
  };
  auto it = objects_.find(key);
  if (it == objects_.end() || !it->second.complete) {
    return end(ErrorCode::OBJECT_NOT_FOUND, "the object was removed before the task started");
  }
  const uint64_t version = it->second.version;
  const uint64_t size = it->second.size;
  const Placement* source = find_source(it->second);
  if (source == nullptr) {
    return end(ErrorCode::REPLICA_NOT_FOUND,
               "segment " + t->source + " no longer holds a replica of the object");
  }
  // The targets that need space: those without a replica on a live segment of that name (a
  // replica on a segment being unmounted does not count: it is about to go).
  std::vector<std::string> needed;
  for (const std::string& name : t->targets) {
    bool holds = false;
    for (const auto& p : it->second.replicas) {
      const Segment* seg = live(p.segment_id);
      holds |= seg != nullptr && seg->name == name;
    }
    if (!holds) needed.push_back(name);
  }
  if (!needed.empty() && config_.enable_multi_tenants) {
    // Making room within the tenant's quota may evict: the object is looked up again after.
    rpc::PutStartResult refusal;
    admit_capacity_ = CapacityLocked();
    quota_evict_failed_ = false;
    if (!AdmitLocked(key, size * needed.size(), &refusal, now)) {
      return end(static_cast<ErrorCode>(refusal.code()), refusal.message());
    }
    it = objects_.find(key);
    if (it == objects_.end() || !it->second.complete || it->second.version != version) {
      return end(ErrorCode::OBJECT_NOT_FOUND, "the object was evicted before the task started");
    }
    source = find_source(it->second);
    if (source == nullptr) {
      return end(ErrorCode::REPLICA_NOT_FOUND, "the source replica went before the task started");
    }
  }
  Object& obj = it->second;
  if (needed.empty()) {
    // Every target holds a replica already: a copy has nothing to do, a move only drops its
    // source (the object keeps the target's replica, on a live segment).
    t->version = version;
    tasks_.Start(id, now);
    counted.Count(false);
    if (type == TaskType::kMove) {
      DropReplicaLocked(key, &obj, source, now);
      LogObjectLocked(oplog::Entry::OBJECT, key, obj);
    }
    tasks_.Finish(id, true, "Task completed successfully", now);
    return false;
  }
  std::vector<std::pair<Segment*, Placement>> placed;
  for (const std::string& name : needed) {
    bool got = false;
    for (const auto& [sid, seg] : SegmentsNamedLocked(name)) {
      if (seg->draining || seg->alloc_after > now) continue;
      auto space = seg->alloc.Allocate(size);
      if (!space) continue;
      placed.push_back({seg, {static_cast<uint32_t>(sid), space->handle, space->offset}});
      got = true;
      break;
    }
    if (got) continue;
    for (const auto& [seg, p] : placed) seg->alloc.Free({p.offset, p.handle});
    if (++t->attempts < kMaxStartAttempts) return false;  // waits for space, tried again
    return end(ErrorCode::NO_AVAILABLE_HANDLE,
               "no space for " + std::to_string(size) + " bytes on segment " + name +
                   " (max retries reached: " + std::to_string(kMaxStartAttempts) + ")");
  }
  t->version = version;
  t->source_segment = source->segment_id;
  t->source_offset = source->offset;
  const Segment* source_seg = live(source->segment_id);
  tasks_.Start(id, now);
  counted.Count(false);
  Object copy;
  copy.size = size;
  copy.owner = client_names_.Get(t->executor);
  copy.version = version;
  copy.stamp = now;
  copy.last_access = now;
  out->set_id_hi(id.hi);
  out->set_id_lo(id.lo);
  out->set_type(static_cast<uint32_t>(type));
  out->set_size(size);
  out->mutable_source()->set_segment_name(source_seg->name);
  out->mutable_source()->set_addr(source_seg->base + source->offset);
  out->mutable_source()->set_size(size);
  for (const auto& [seg, p] : placed) {
    copy.replicas.push_back(p);
    rpc::BufferDescriptor* d = out->add_targets();
    d->set_segment_name(seg->name);
    d->set_addr(seg->base + p.offset);
    d->set_size(size);
  }
  ChargeLocked(key, size * placed.size());
  auto c = copies_.emplace(key, std::move(copy)).first;
  LogObjectLocked(oplog::Entry::COPY_OBJECT, c->first, c->second);
  return true;
}

rpc::FetchTasksResponse MasterService::FetchTasks(const rpc::FetchTasksRequest& req) {
  rpc::FetchTasksResponse resp;
  const std::string problem = NameProblem("client id", req.client_id());
  MutexLock lock(&mu_);
  counters_.tasks.fetch.Count(!problem.empty());
  if (!problem.empty()) {
    resp.set_code(Code(ErrorCode::INVALID_PARAMS));
    resp.set_message(problem);
    return resp;
  }
  const size_t max = req.max_tasks() == 0 ? kDefaultFetch
                                          : std::min<size_t>(req.max_tasks(), kMaxBatchItems);
  const auto now = now_();
  for (const TaskId& id : tasks_.PendingOf(req.client_id(), max)) {
    if (!tasks_.CanStart()) break;
    ReplicaTask* t = tasks_.FindMutable(id);
    rpc::TaskAssignment a;
    if (StartTaskLocked(t, &a, now)) *resp.add_tasks() = std::move(a);
  }
  resp.set_code(Code(ErrorCode::OK));
  resp.set_write_within_ms(config_.put_start_discard_timeout_s * 1000);
  return resp;
}

rpc::FinishTaskResponse MasterService::FinishTask(const rpc::FinishTaskRequest& req) {
  rpc::FinishTaskResponse resp;
  MutexLock lock(&mu_);
  const auto now = now_();
  const TaskId id{req.id_hi(), req.id_lo()};
  const ReplicaTask* t = tasks_.Find(id);
  // update_task: every report; the end (ok) or revoke of the task's kind once it is known,
  // an end failing when its replicas could not join the object. (Finish may prune the
  // record: what the count needs is taken first.)
  const bool known = t != nullptr;
  const bool move = known && t->type == TaskType::kMove;
  auto answer = [&](ErrorCode c, const std::string& message, bool commit_failed = false)
      MC_REQUIRES(mu_) {
    resp.set_code(Code(c));
    resp.set_message(message);
    counters_.tasks.update.Count(c != ErrorCode::OK);
    if (known) {
      RequestCounters& kind =
          req.ok() ? (move ? counters_.tasks.move_end : counters_.tasks.copy_end)
                   : (move ? counters_.tasks.move_revoke : counters_.tasks.copy_revoke);
      kind.Count(c != ErrorCode::OK || commit_failed);
    }
    return resp;
  };
  if (t == nullptr) {
    return answer(ErrorCode::TASK_NOT_FOUND,
                  "no such replica task on this master (a new leader since?)");
  }
  if (t->executor != req.client_id()) {
    return answer(ErrorCode::ILLEGAL_CLIENT, "the task was given to another client");
  }
  if (t->status != TaskStatus::kProcessing) {
    return answer(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                  "the task has ended already: " + t->message);
  }
  std::string why;
  if (!req.ok()) {
    auto c = copies_.find(t->key);
    if (c != copies_.end()) EraseCopyLocked(c, now);
    why = ClientFailure(req.message().substr(0, kMaxClientMessage));
  } else {
    why = CommitCopyLocked(*t, now);
  }
  tasks_.Finish(id, why.empty(), why.empty() ? "Task completed successfully" : why, now);
  return answer(ErrorCode::OK, why, req.ok() && !why.empty());
}

void MasterService::DropReplicaLocked(const std::string& key, Object* obj, const Placement* p,
                                      Clock::time_point now) {
  Object old;  // the replica alone, freed as a removal frees (after its readers' leases)
  old.size = obj->size;
  old.replicas.push_back(*p);
  old.lease_until = obj->lease_until;
  old.stamp = obj->stamp;
  obj->replicas.erase(obj->replicas.begin() + (p - obj->replicas.begin()));
  FreeObjectLocked(old, now);
  UnchargeLocked(key, obj->size);
}

std::string MasterService::CommitCopyLocked(const ReplicaTask& t, Clock::time_point now) {
  auto c = copies_.find(t.key);
  if (c == copies_.end()) {
    return Named(ErrorCode::REPLICA_IS_GONE,
                 "the target segments were unmounted (or the space discarded) while the task ran");
  }
  auto gone = [&](const std::string& why) MC_REQUIRES(mu_) {
    EraseCopyLocked(c, now);
    return Named(ErrorCode::REPLICA_IS_GONE, why);
  };
  auto it = objects_.find(t.key);
  if (it == objects_.end() || !it->second.complete || it->second.version != t.version) {
    return gone("the object was removed or replaced while the task ran");
  }
  Object& obj = it->second;
  auto src = std::find_if(obj.replicas.begin(), obj.replicas.end(), [&](const Placement& p) {
    return p.segment_id == t.source_segment && p.offset == t.source_offset;
  });
  if (src == obj.replicas.end() || draining_.count(src->segment_id)) {
    return gone("the source replica was dropped while the task ran (its segment unmounted)");
  }
  if (t.type == TaskType::kMove) DropReplicaLocked(t.key, &obj, &*src, now);
  for (const Placement& p : c->second.replicas) obj.replicas.push_back(p);
  copies_.erase(c);  // its space (and charge) is the object's now
  LogObjectLocked(oplog::Entry::COPY_COMMIT, t.key, obj);
  return "";
}

MasterService::Copies::iterator MasterService::EraseCopyLocked(Copies::iterator it,
                                                               Clock::time_point now) {
  UnchargeLocked(it->first, InFlightBytes(it->second));
  LogKeyLocked(oplog::Entry::COPY_ERASE, it->first);
  FreeObjectLocked(it->second, now);  // never read: freed at once
  return copies_.erase(it);
}

void MasterService::ExpireTasksLocked(Clock::time_point now) {
  const auto discard = std::chrono::seconds(config_.put_start_discard_timeout_s);
  for (auto it = copies_.begin(); it != copies_.end();) {
    if (it->second.stamp + discard > now) {
      ++it;
      continue;
    }
    const std::string why = "its executor " + it->second.owner.str() + " did not report within " +
                            std::to_string(config_.put_start_discard_timeout_s) + " s";
    LOG(WARNING) << "discarding the replica task space of " << it->first << ": " << why;
    if (const ReplicaTask* t = tasks_.RunningOf(it->first)) {
      tasks_.Finish(t->id, false, Named(ErrorCode::TRANSFER_FAIL, why), now);
    }
    it = EraseCopyLocked(it, now);
  }
  // A task past --processing_task_timeout_sec fails; its space (if any) stays held until the
  // discard time above, when its writer may no longer be writing.
  (void)tasks_.Expire(now);
}

}  // namespace store
}  // namespace mooncake
