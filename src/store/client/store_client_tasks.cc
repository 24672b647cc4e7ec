// StoreClient: replica tasks (upstream's create_copy_task / create_move_task / query_task),
// and running the tasks the master gives this client (the executor of a task is the client
// owning its source replica's segment: master_tasks.cc).
//
// Running: the heartbeat's ping says how many tasks wait for this client; then the worker
// thread fetches them (16 at a time, as upstream's client) and runs each, unless half the
// time the master gives a task's writer (FetchTasksResponse.write_within_ms: its space goes
// after that) has passed since the fetch, when it is reported failed unwritten: the source must lie
// in this client's own lent memory (the global segment or a run-time segment, checked while
// no unmount can take it away), and is written to every target by the engine (a target in
// this client's own segment by memcpy); then FinishTask says whether every target was
// written. The master makes the new replicas readable only then.
#include <glog/logging.h>

#include "store/client/store_client_impl.h"

namespace mooncake {
namespace store {

namespace {

constexpr uint32_t kFetchBatch = 16;  // upstream's kTaskBatchSize

}  // namespace

void StoreClient::Impl::RunTasks() {
  while (!closed.load()) {
    rpc::FetchTasksRequest req;
    req.set_client_id(client_id);
    req.set_max_tasks(kFetchBatch);
    rpc::FetchTasksResponse resp;
    if (Checked("FetchTasks", master->FetchTasks(req, &resp)) != 0) return;
    if (resp.code() != 0) {
      LOG(WARNING) << "replica tasks: FetchTasks: " << ErrorCodeName(resp.code()) << ": "
                   << resp.message();
      return;
    }
    if (resp.tasks_size() == 0) return;
    const auto fetched = std::chrono::steady_clock::now();
    const auto begin_by = fetched + std::chrono::milliseconds(resp.write_within_ms() / 2);
    for (const rpc::TaskAssignment& task : resp.tasks()) {
      const std::string why =
          std::chrono::steady_clock::now() < begin_by
              ? RunTask(task)
              : "TRANSFER_FAIL: not begun within half the " +
                    std::to_string(resp.write_within_ms()) + " ms its space is held for";
      rpc::FinishTaskRequest fin;
      fin.set_client_id(client_id);
      fin.set_id_hi(task.id_hi());
      fin.set_id_lo(task.id_lo());
      fin.set_ok(why.empty());
      fin.set_message(why);
      rpc::FinishTaskResponse done;
      if (Checked("FinishTask", master->FinishTask(fin, &done)) != 0) continue;
      ++tasks_run;
      if (done.code() != 0 || !done.message().empty()) {
        LOG(WARNING) << "replica task " << task.id_hi() << "-" << task.id_lo() << ": "
                     << (done.code() != 0 ? std::string(ErrorCodeName(done.code())) + ": " : "")
                     << done.message();
      }
    }
  }
}

bool StoreClient::Impl::InLentMemory(uint64_t addr, uint64_t size) {
  auto inside = [&](const void* base, uint64_t len) {
    const uint64_t b = reinterpret_cast<uint64_t>(base);
    return base != nullptr && addr >= b && size <= len && addr - b <= len - size;
  };
  if (inside(segment, opt.global_segment_size)) return true;
  MutexLock lock(&runtime_mu);
  for (const auto& [id, seg] : runtime_segments) {
    if (inside(seg.base, seg.size)) return true;
  }
  return false;
}

std::string StoreClient::Impl::RunTask(const rpc::TaskAssignment& task) {
  const uint64_t size = task.size();
  const uint64_t src = task.source().addr();
  if (size == 0 || task.source().size() != size || task.targets_size() == 0 ||
      static_cast<size_t>(task.targets_size()) > kMaxReplicaNum) {
    return "INVALID_PARAMS: a malformed task (size " + std::to_string(size) + ", " +
           std::to_string(task.targets_size()) + " targets)";
  }
  if (task.source().segment_name() != seg_name) {
    return "REPLICA_NOT_IN_LOCAL_MEMORY: the source is in segment " +
           task.source().segment_name().substr(0, kMaxNameBytes) + ", not this client's";
  }
  for (const auto& t : task.targets()) {
    if (t.size() != size || t.segment_name().empty() || t.segment_name().size() > kMaxNameBytes) {
      return "INVALID_PARAMS: a malformed target";
    }
  }
  // The source must lie in memory this client lends (not any memory it registered): checked
  // with the layout held, so that no run-time segment leaves before the copy has ended.
  auto own = [&]() { return InLentMemory(src, size); };
  std::vector<Job> jobs;
  const std::vector<Span> parts{{reinterpret_cast<void*>(src), size}};
  for (int i = 0; i < task.targets_size(); ++i) {
    AddJobs(TransferRequest::WRITE, parts, &task.targets(i).segment_name(), task.targets(i).addr(),
            static_cast<size_t>(i), &jobs);
  }
  std::vector<char> failed(static_cast<size_t>(task.targets_size()), 0);
  bool source_ok = true;
  copier->Run(jobs, &failed, [&] { return source_ok = own(); });
  if (!source_ok) {
    return "REPLICA_NOT_IN_LOCAL_MEMORY: the source range is not in memory this client lends";
  }
  for (int i = 0; i < task.targets_size(); ++i) {
    if (failed[static_cast<size_t>(i)]) {
      return "TRANSFER_FAIL: writing segment " + task.targets(i).segment_name() + " failed";
    }
  }
  return "";
}

namespace {

int CreateTask(StoreClient::Impl* impl, rpc::ReplicaTaskRequest* req, StoreClient::TaskId* id) {
  req->set_client_id(impl->client_id);
  req->set_tenant_id(impl->opt.tenant_id);
  rpc::ReplicaTaskResponse resp;
  const int rc = StoreClient::Impl::Checked("CreateReplicaTask",
                                            impl->master->CreateReplicaTask(*req, &resp));
  if (rc != 0) return rc;
  if (resp.code() != 0) {
    LOG(WARNING) << (req->type() == 0 ? "create_copy_task" : "create_move_task") << ": "
                 << ErrorCodeName(resp.code()) << ": " << resp.message();
    return resp.code();
  }
  if (id != nullptr) *id = {resp.id_hi(), resp.id_lo()};
  return 0;
}

}  // namespace

int StoreClient::CreateCopyTask(const std::string& key, const std::vector<std::string>& targets,
                                TaskId* id) {
  rpc::ReplicaTaskRequest req;
  req.set_key(key);
  req.set_type(0);
  for (const std::string& t : targets) req.add_targets(t);
  return CreateTask(impl_.get(), &req, id);
}

int StoreClient::CreateMoveTask(const std::string& key, const std::string& source,
                                const std::string& target, TaskId* id) {
  rpc::ReplicaTaskRequest req;
  req.set_key(key);
  req.set_type(1);
  req.set_source(source);
  req.add_targets(target);
  return CreateTask(impl_.get(), &req, id);
}

int StoreClient::QueryTask(const TaskId& id, TaskInfo* info) {
  rpc::QueryTaskRequest req;
  req.set_client_id(impl_->client_id);
  req.set_tenant_id(impl_->opt.tenant_id);
  req.set_id_hi(id.hi);
  req.set_id_lo(id.lo);
  rpc::QueryTaskResponse resp;
  const int rc = Impl::Checked("QueryTask", impl_->master->QueryTask(req, &resp));
  if (rc != 0) return rc;
  if (resp.code() != 0) return resp.code();
  if (info != nullptr) {
    info->id = {resp.id_hi(), resp.id_lo()};
    info->type = resp.type();
    info->status = resp.status();
    info->created_at_ms = resp.created_at_ms();
    info->last_updated_at_ms = resp.last_updated_at_ms();
    info->assigned_client = resp.assigned_client();
    info->message = resp.task_message();
  }
  return 0;
}

uint64_t StoreClient::tasks_run() const { return impl_->tasks_run.load(); }

std::vector<StoreClient::KeyReplicas> StoreClient::BatchQueryReplicas(
    const std::vector<std::string>& keys) {
  std::vector<KeyReplicas> out(keys.size());
  for (size_t at = 0; at < keys.size(); at += kMaxBatchItems) {
    const size_t end = std::min(keys.size(), at + kMaxBatchItems);
    rpc::KeysRequest req;
    req.set_client_id(impl_->client_id);
    req.set_tenant_id(impl_->opt.tenant_id);
    req.set_with_disk(true);
    for (size_t i = at; i < end; ++i) req.add_keys(keys[i]);
    rpc::GetReplicaListResponse resp;
    int rc = Impl::Checked("GetReplicaList", impl_->master->GetReplicaList(req, &resp));
    if (rc == 0 && resp.code() != 0) rc = resp.code();
    if (rc == 0 && resp.results_size() != static_cast<int>(end - at)) {
      rc = ToInt(ErrorCode::RPC_FAIL);
    }
    for (size_t i = at; i < end; ++i) {
      KeyReplicas& k = out[i];
      if (rc != 0) {
        k.code = rc;
        continue;
      }
      const auto& r = resp.results(static_cast<int>(i - at));
      k.code = r.code();
      k.size = r.size();
      for (const auto& rep : r.replicas()) {
        if (rep.has_disk()) {
          k.replicas.push_back({rep.disk().endpoint(), 0, r.size(), true});
        } else {
          k.replicas.push_back(
              {rep.buffer().segment_name(), rep.buffer().addr(), rep.buffer().size(), false});
        }
      }
    }
  }
  return out;
}

}  // namespace store
}  // namespace mooncake
