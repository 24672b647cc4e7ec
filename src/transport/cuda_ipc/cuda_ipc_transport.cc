#include "transport/cuda_ipc/cuda_ipc_transport.h"

#include <glog/logging.h>
#include <unistd.h>

#include "common/host_id.h"

namespace mooncake::cuda_ipc {

CudaIpcTransport::~CudaIpcTransport() { Stop(); }

Status CudaIpcTransport::Start(const TransportContext& ctx, SegmentDesc* local_desc) {
  dev_ = &platform::Devices();
  MC_RETURN_IF_ERROR(dev_->Available().WithContext("cuda_ipc"));
  host_id_ = LocalHostId(ctx.options);
  local_desc->mc_host_id = host_id_;
  local_desc->mc_pid = static_cast<uint64_t>(::getpid());
  started_ = true;
  thread_ = std::thread([this] { Run(); });
  LOG(INFO) << "CudaIpcTransport: " << dev_->name() << " backend, " << dev_->DeviceCount()
            << " device(s)";
  return Status::OK();
}

void CudaIpcTransport::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_ || !started_) {
      stopping_ = true;
      return;
    }
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

bool CudaIpcTransport::CanReach(const SegmentDesc& peer) {
  // CUDA cannot open a process's own handles: two engines of one process use TCP.
  return started_ && !peer.mc_host_id.empty() && peer.mc_host_id == host_id_ &&
         peer.mc_pid != static_cast<uint64_t>(::getpid());
}

bool CudaIpcTransport::CanMove(const SegmentDesc&, const BufferDesc& remote, int local_device) {
  // The peer's handle must be of our runtime's kind (cuda:N / npu:N), and ACL copies memory
  // imported from another process device to device only.
  const std::string prefix = std::string(dev_->location_prefix()) + ":";
  return remote.device >= 0 && !remote.ipc_handle.empty() &&
         remote.location.compare(0, prefix.size(), prefix) == 0 &&
         (local_device >= 0 || dev_->IpcCopiesWithHost());
}

Status CudaIpcTransport::Submit(const std::shared_ptr<const SegmentDesc>& peer,
                                const Slice* slices, size_t count) {
  {
    MutexLock lock(&mu_);
    if (stopping_ || !started_) return Status::FailedPrecondition("cuda_ipc transport is stopped");
    for (size_t i = 0; i < count; ++i) queue_.push_back({slices[i], peer, {}});
  }
  cv_.SignalAll();
  return Status::OK();
}

void CudaIpcTransport::DropPeer(const SegmentDesc& peer) {
  {
    MutexLock lock(&mu_);
    if (stopping_ || !started_) return;
    queue_.push_back({Slice{}, nullptr, peer.name});
  }
  cv_.SignalAll();
}

Result<platform::StreamHandle> CudaIpcTransport::StreamFor(int device) {
  auto it = streams_.find(device);
  if (it != streams_.end()) return it->second;
  MC_RETURN_IF_ERROR(dev_->SetDevice(device));
  MC_ASSIGN_OR_RETURN(platform::StreamHandle s, dev_->CreateStream());
  streams_[device] = s;
  return s;
}

Result<void*> CudaIpcTransport::MappingFor(const SegmentDesc& peer, const BufferDesc& buf) {
  std::string key = peer.name + "/" + buf.ipc_handle;
  auto it = mappings_.find(key);
  if (it != mappings_.end()) return it->second.base;
  MC_ASSIGN_OR_RETURN(platform::IpcHandle h, platform::IpcHandleFromHex(buf.ipc_handle));
  MC_ASSIGN_OR_RETURN(void* base, dev_->IpcOpen(h, buf.device));
  mappings_[key] = {base, buf.device};
  return base;
}

void CudaIpcTransport::CloseMappings(const std::string& peer_name) {
  const std::string prefix = peer_name + "/";
  for (auto it = mappings_.lower_bound(prefix);
       it != mappings_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    Status s = dev_->IpcClose(it->second.base);
    if (!s.ok()) LOG(WARNING) << "cuda_ipc: close mapping of " << peer_name << ": " << s.ToString();
    it = mappings_.erase(it);
  }
}

void CudaIpcTransport::Issue(Item& item, std::deque<InFlight>* in_flight) {
  const Slice& s = item.slice;
  const BufferDesc& buf = *s.remote_buffer;
  auto fail = [&](const Status& st) {
    std::string msg = "cuda_ipc to " + item.peer->name + ": " + st.ToString();
    s.Done(FAILED, 0, msg.c_str());
  };
  auto base = MappingFor(*item.peer, buf);
  if (!base.ok()) return fail(base.status());
  auto stream = StreamFor(buf.device);
  if (!stream.ok()) return fail(stream.status());
  auto* remote = static_cast<uint8_t*>(*base) + buf.ipc_offset + (s.remote - buf.addr);
  auto* local = reinterpret_cast<uint8_t*>(s.local);
  platform::EventHandle ev = nullptr;
  if (!free_events_.empty()) {
    ev = free_events_.back();
    free_events_.pop_back();
  } else {
    auto created = dev_->CreateEvent();
    if (!created.ok()) return fail(created.status());
    ev = *created;
  }
  Status st = s.opcode == TransferRequest::WRITE ? dev_->CopyAsync(remote, local, s.length, *stream)
                                                 : dev_->CopyAsync(local, remote, s.length, *stream);
  if (st.ok()) st = dev_->RecordEvent(ev, *stream);
  if (!st.ok()) {
    free_events_.push_back(ev);
    return fail(st);
  }
  in_flight->push_back({s, ev});
}

void CudaIpcTransport::Run() {
  std::deque<InFlight> in_flight;
  std::deque<Item> items;
  bool stop = false;
  while (!stop || !in_flight.empty()) {
    {
      MutexLock lock(&mu_);
      if (in_flight.empty()) {
        while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
      }
      items.swap(queue_);
      stop = stopping_;
    }
    for (Item& item : items) {
      if (stop && item.close_peer.empty()) {
        item.slice.Done(FAILED, 0, "engine is shutting down");
        continue;
      }
      if (!item.close_peer.empty()) {
        // Copies issued before the close finish first: nothing touches a closed mapping.
        while (!in_flight.empty()) {
          InFlight f = in_flight.front();
          in_flight.pop_front();
          Status st = dev_->EventSynchronize(f.event);
          free_events_.push_back(f.event);
          f.slice.Done(st.ok() ? COMPLETED : FAILED, st.ok() ? f.slice.length : 0,
                       st.ok() ? nullptr : ("cuda_ipc copy: " + st.ToString()).c_str());
        }
        CloseMappings(item.close_peer);
        continue;
      }
      Issue(item, &in_flight);
    }
    items.clear();
    if (in_flight.empty()) continue;
    // One stream per device, so the oldest copy of the front's stream finishes first.
    InFlight f = in_flight.front();
    in_flight.pop_front();
    Status st = dev_->EventSynchronize(f.event);
    free_events_.push_back(f.event);
    if (st.ok()) {
      f.slice.Done(COMPLETED, f.slice.length);
    } else {
      std::string msg = "cuda_ipc copy: " + st.ToString();
      f.slice.Done(FAILED, 0, msg.c_str());
    }
  }
  for (auto& [key, m] : mappings_) {
    Status s = dev_->IpcClose(m.base);
    if (!s.ok()) LOG(WARNING) << "cuda_ipc: close mapping " << key << ": " << s.ToString();
  }
  mappings_.clear();
  for (platform::EventHandle e : free_events_) dev_->DestroyEvent(e);
  free_events_.clear();
  for (auto& [device, s] : streams_) dev_->DestroyStream(s);
  streams_.clear();
}

}  // namespace mooncake::cuda_ipc
