// TransferEngine's public methods: argument checks and forwarding to Impl
// (engine_impl.cc: set-up, registration, segments, notifies; transfer_submit.cc: data path).
#include "mooncake/transfer_engine.h"

#include <glog/logging.h>

#include <nlohmann/json.hpp>

#include "common/net.h"
#include "engine/engine_impl.h"
#include "metadata/json_util.h"

namespace mooncake {

// ---------------------------------------------------------------------------------------
// Public API: thin forwarding with argument checks.

TransferEngine::TransferEngine() : TransferEngine(EngineOptions::FromEnvironment()) {}
TransferEngine::TransferEngine(const EngineOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}
TransferEngine::~TransferEngine() = default;

Status TransferEngine::Init(const std::string& metadata, const std::string& local_server_name,
                            const std::string& transport) {
  if (impl_->initialized.load()) {
    return Status::FailedPrecondition("engine is already initialized");
  }
  Status s = impl_->Init(metadata, local_server_name, transport);
  if (!s.ok()) {
    impl_->Shutdown();
    auto fresh = std::make_unique<Impl>(impl_->options);
    // Memory registered before Init stays registered (Init's contract).
    {
      MutexLock old_lock(&impl_->shared_mu);
      MutexLock fresh_lock(&fresh->shared_mu);  // a new Impl: no one else holds it
      fresh->shared.swap(impl_->shared);
    }
    Status kept = fresh->registry.AddBatch(impl_->registry.List());
    if (!kept.ok()) LOG(ERROR) << "registrations lost after a failed Init: " << kept.ToString();
    impl_ = std::move(fresh);
  }
  return s;
}

bool TransferEngine::initialized() const { return impl_->initialized.load(); }
std::string TransferEngine::GetLocalSegmentName() const { return impl_->local_name; }
uint16_t TransferEngine::GetRpcPort() const { return impl_->rpc_port; }
std::string TransferEngine::GetLocalIpAndPort() const {
  return HostPort{impl_->local_host, impl_->rpc_port, true}.ToString();
}

std::vector<std::string> TransferEngine::GetTransports() const {
  std::vector<std::string> out;
  for (const auto& t : impl_->transports) out.push_back(t->name());
  return out;
}

Status TransferEngine::RegisterLocalMemory(void* addr, size_t length, const std::string& location,
                                           bool remote_accessible) {
  return impl_->Register(
      {RegionInfo{reinterpret_cast<uint64_t>(addr), length, location, remote_accessible}});
}

Status TransferEngine::UnregisterLocalMemory(void* addr) { return impl_->Unregister(addr); }

Status TransferEngine::RegisterLocalMemoryBatch(const std::vector<BufferEntry>& buffers,
                                                const std::string& location) {
  std::vector<RegionInfo> regions;
  regions.reserve(buffers.size());
  for (const auto& b : buffers) {
    regions.push_back({reinterpret_cast<uint64_t>(b.addr), b.length, location, true});
  }
  return impl_->Register(regions);
}

Status TransferEngine::UnregisterLocalMemoryBatch(const std::vector<void*>& addrs) {
  Status first;
  for (void* a : addrs) {
    Status s = impl_->Unregister(a);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Result<void*> TransferEngine::AllocateSharedMemory(size_t length, const std::string& location,
                                                   size_t huge_page_size) {
  return impl_->AllocateShared(length, location, huge_page_size);
}

Status TransferEngine::FreeSharedMemory(void* addr) { return impl_->FreeShared(addr); }

Result<SegmentID> TransferEngine::OpenSegment(const std::string& name) {
  return impl_->OpenSegment(name);
}

Status TransferEngine::CloseSegment(SegmentID id) {
  if (id == LOCAL_SEGMENT_ID) return Status::OK();
  return impl_->segments.Invalidate(id);
}

Status TransferEngine::RefreshSegment(SegmentID id) {
  if (id == LOCAL_SEGMENT_ID) return Status::OK();
  return impl_->segments.Refresh(id).status();
}

Result<SegmentInfo> TransferEngine::GetSegmentInfo(SegmentID id) {
  SegmentInfo info;
  if (id == LOCAL_SEGMENT_ID) {
    info.name = impl_->local_name;
    info.protocol = "tcp";
    for (const RegionInfo& r : impl_->registry.List()) info.buffers.push_back({r.addr, r.length});
    return info;
  }
  MC_ASSIGN_OR_RETURN(SegmentCache::DescPtr desc, impl_->segments.Get(id));
  info.name = desc->name;
  info.protocol = desc->protocol;
  for (const auto& b : desc->buffers) info.buffers.push_back({b.addr, b.length});
  // The transport for host memory at both ends (device buffers may take another), asked for
  // the peer's first host buffer (per-buffer fields such as a UCX key count).
  BufferDesc host_buffer;
  for (const auto& b : desc->buffers) {
    if (b.device < 0) {
      host_buffer = b;
      break;
    }
  }
  if (Transport* t = impl_->PickTransport(*desc, host_buffer, -1)) info.transport = t->name();
  return info;
}

Result<BatchID> TransferEngine::AllocateBatchID(size_t batch_size) {
  return impl_->batches.Allocate(batch_size);
}

Status TransferEngine::SubmitTransfer(BatchID batch, const std::vector<TransferRequest>& reqs) {
  return impl_->Submit(batch, reqs);
}

Status TransferEngine::SubmitTransferWithNotify(BatchID batch,
                                                const std::vector<TransferRequest>& reqs,
                                                const NotifyDesc& notify) {
  if (reqs.empty()) return Status::InvalidArgument("no requests to attach the notify to");
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Batch> b, impl_->batches.Get(batch));
  MC_RETURN_IF_ERROR(impl_->Submit(batch, reqs));
  MutexLock lock(&b->notify_mu);
  b->pending_notify.emplace(reqs[0].target_id, notify);
  return Status::OK();
}

Result<TransferStatus> TransferEngine::GetTransferStatus(BatchID batch, size_t task_id) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Batch> b, impl_->batches.Get(batch));
  if (task_id >= b->size()) {
    return Status::InvalidArgument("task " + std::to_string(task_id) + " of batch " +
                                   std::to_string(batch) + " does not exist (it has " +
                                   std::to_string(b->size()) + ")");
  }
  return b->task(task_id).status();
}

Result<TransferStatus> TransferEngine::GetBatchTransferStatus(BatchID batch) {
  return impl_->BatchStatus(batch);
}

Result<TransferStatus> TransferEngine::WaitBatch(BatchID batch, std::chrono::milliseconds timeout) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Batch> b, impl_->batches.Get(batch));
  b->WaitAll(timeout);
  return impl_->BatchStatus(batch);
}

Result<std::string> TransferEngine::GetTransferError(BatchID batch, size_t task_id) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Batch> b, impl_->batches.Get(batch));
  if (task_id >= b->size()) return Status::InvalidArgument("no such task");
  return b->task(task_id).error();
}

Status TransferEngine::FreeBatchID(BatchID batch) { return impl_->batches.Free(batch); }

Status TransferEngine::TransferSync(const std::vector<TransferRequest>& requests,
                                    std::chrono::milliseconds timeout) {
  return impl_->TransferSync(requests, timeout);
}

Status TransferEngine::SendNotify(SegmentID target, const NotifyDesc& notify) {
  if (target == LOCAL_SEGMENT_ID) return impl_->SendNotifyTo(impl_->local_name, notify);
  MC_ASSIGN_OR_RETURN(std::string name, impl_->segments.NameOf(target));
  return impl_->SendNotifyTo(name, notify);
}

Status TransferEngine::SendNotifyByName(const std::string& name, const NotifyDesc& notify) {
  return impl_->SendNotifyTo(name, notify);
}

std::vector<NotifyDesc> TransferEngine::GetNotifies() {
  MutexLock lock(&impl_->notify_mu);
  std::vector<NotifyDesc> out;
  out.swap(impl_->notifies);
  impl_->notify_bytes = 0;
  return out;
}

Status TransferEngine::Probe(const std::string& segment_name) {
  return impl_->Probe(segment_name);
}

}  // namespace mooncake
