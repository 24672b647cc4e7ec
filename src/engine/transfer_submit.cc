// The data path: checking requests, cutting them into slices, handing slices to transports,
// folding results into task and batch status.
#include <glog/logging.h>

#include <cstring>
#include <sstream>

#include "engine/engine_impl.h"
#include "platform/device.h"

namespace mooncake {
namespace {

std::string Hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

std::string RangeText(uint64_t addr, uint64_t len) {
  return Hex(addr) + " + " + std::to_string(len);
}

// A checked request, ready to be cut into slices.
struct Prepared {
  MemoryRegion* local = nullptr;           // pinned
  MemoryRegion* local_target = nullptr;    // pinned; LOCAL_SEGMENT_ID requests only
  size_t route = SIZE_MAX;                  // index into the routes of this submit
  const BufferDesc* remote_buffer = nullptr;  // in routes[route].desc
};

struct PeerRoute {
  SegmentID id = INVALID_SEGMENT_ID;
  SegmentCache::DescPtr desc;
  Transport* transport = nullptr;       // the transport this route's slices go to
  Transport* host_transport = nullptr;  // first route of a peer: its pick for host memory
  bool refreshed = false;
  // Superseded by a refreshed descriptor: takes no more requests, but keeps its own
  // descriptor, into which its requests' remote_buffer pointers point.
  bool stale = false;
};

void UnpinAll(std::vector<Prepared>& prepared) {
  for (auto& p : prepared) {
    if (p.local) MemoryRegistry::Unpin(p.local);
    if (p.local_target) MemoryRegistry::Unpin(p.local_target);
  }
  prepared.clear();
}

}  // namespace

Status TransferEngine::Impl::Submit(BatchID id, const std::vector<TransferRequest>& requests) {
  if (!initialized.load()) return Status::FailedPrecondition("call Init first");
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Batch> batch, batches.Get(id));
  if (requests.empty()) return Status::OK();
  if (requests.size() > batch->capacity() - batch->size()) {
    return Status::ResourceExhausted(
        "batch " + std::to_string(id) + " holds " + std::to_string(batch->capacity()) +
        " requests; " + std::to_string(batch->size()) + " are in it and " +
        std::to_string(requests.size()) + " more were submitted");
  }

  // 1. Check everything before anything moves.
  thread_local std::vector<Prepared> prepared;
  thread_local std::vector<PeerRoute> routes;
  prepared.clear();
  routes.clear();
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& r = requests[i];
    // Named only in an error (built then: a batch of small requests is hot).
    auto which = [i] { return "request " + std::to_string(i) + ": "; };
    auto src = reinterpret_cast<uint64_t>(r.source);
    if (r.length == 0) {
      UnpinAll(prepared);
      return Status::InvalidArgument(which() + "length is 0");
    }
    if (r.opcode != TransferRequest::READ && r.opcode != TransferRequest::WRITE) {
      UnpinAll(prepared);
      return Status::InvalidArgument(which() + "opcode must be READ or WRITE");
    }
    if (src + r.length < src || r.target_offset + r.length < r.target_offset) {
      UnpinAll(prepared);
      return Status::InvalidArgument(which() + "address + length wraps around");
    }
    Prepared p;
    p.local = registry.Pin(src, r.length, /*remote_only=*/false);
    if (p.local == nullptr) {
      UnpinAll(prepared);
      return Status::InvalidArgument(which() + "local range " + RangeText(src, r.length) +
                                     " is not inside registered memory; register it first");
    }
    if (r.target_id == LOCAL_SEGMENT_ID) {
      p.local_target = registry.Pin(r.target_offset, r.length, /*remote_only=*/false);
      if (p.local_target == nullptr) {
        MemoryRegistry::Unpin(p.local);
        UnpinAll(prepared);
        return Status::InvalidArgument(which() + "target range " +
                                       RangeText(r.target_offset, r.length) +
                                       " is not inside this engine's registered memory");
      }
      prepared.push_back(p);
      continue;
    }
    // Routes are (peer, transport) pairs; the first route of a peer holds its descriptor.
    size_t first_route = SIZE_MAX;
    for (size_t k = 0; k < routes.size() && first_route == SIZE_MAX; ++k) {
      if (routes[k].id == r.target_id && !routes[k].stale) first_route = k;
    }
    if (first_route == SIZE_MAX) {
      auto desc = segments.Get(r.target_id);
      if (!desc.ok()) {
        MemoryRegistry::Unpin(p.local);
        UnpinAll(prepared);
        return desc.status().WithContext("request " + std::to_string(i));
      }
      routes.push_back({r.target_id, std::move(desc).value(), nullptr, nullptr, false, false});
      first_route = routes.size() - 1;
    }
    PeerRoute* route = &routes[first_route];
    const BufferDesc* buf = route->desc->FindBuffer(r.target_offset, r.length);
    if (buf == nullptr && !route->refreshed) {
      // The peer may have registered more memory since we fetched its descriptor.
      route->refreshed = true;
      auto fresh = segments.Refresh(r.target_id);
      if (fresh.ok()) {
        for (auto& other : routes) {
          if (other.id == r.target_id) other.stale = true;
        }
        routes.push_back({r.target_id, std::move(fresh).value(), nullptr, nullptr, true, false});
        first_route = routes.size() - 1;
        route = &routes[first_route];
        buf = route->desc->FindBuffer(r.target_offset, r.length);
      }
    }
    if (buf == nullptr) {
      MemoryRegistry::Unpin(p.local);
      UnpinAll(prepared);
      return Status::InvalidArgument(which() + "remote range " +
                                     RangeText(r.target_offset, r.length) +
                                     " is not inside any buffer registered by segment '" +
                                     route->desc->name + "'");
    }
    Transport* transport;
    if (p.local->device < 0 && buf->device < 0) {  // host memory at both ends: once per peer
      if (route->host_transport == nullptr) {
        route->host_transport = PickTransport(*route->desc, *buf, -1);
      }
      transport = route->host_transport;
    } else {
      transport = PickTransport(*route->desc, *buf, p.local->device);
    }
    if (transport == nullptr) {
      MemoryRegistry::Unpin(p.local);
      UnpinAll(prepared);
      return Status::Unavailable(which() + "no installed transport reaches segment '" +
                                 route->desc->name + "' (protocol " + route->desc->protocol +
                                 ") for " + (p.local->device < 0 ? "host" : "device") +
                                 " memory here and " + (buf->device < 0 ? "host" : "device") +
                                 " memory there");
    }
    p.remote_buffer = buf;
    p.route = SIZE_MAX;
    for (size_t k = first_route; k < routes.size(); ++k) {
      if (routes[k].id == r.target_id && !routes[k].stale &&
          (routes[k].transport == nullptr || routes[k].transport == transport)) {
        routes[k].transport = transport;
        p.route = k;
        break;
      }
    }
    if (p.route == SIZE_MAX) {
      routes.push_back({r.target_id, routes[first_route].desc, transport, nullptr, true, false});
      p.route = routes.size() - 1;
    }
    prepared.push_back(p);
  }

  // 2. Reserve the tasks, then cut into slices and hand them out per peer.
  size_t first = 0;
  TransferTask* tasks = batch->Reserve(requests.size(), &first);
  if (tasks == nullptr) {
    UnpinAll(prepared);
    return Status::ResourceExhausted("batch " + std::to_string(id) +
                                     " is full (another thread submitted meanwhile)");
  }
  thread_local std::vector<Slice> slices;
  for (size_t k = 0; k < routes.size(); ++k) {
    const PeerRoute& route = routes[k];
    if (route.transport == nullptr) continue;  // superseded before it took a request
    const uint64_t slice_size = std::max<uint64_t>(route.transport->slice_size(), 4096);
    slices.clear();
    for (size_t i = 0; i < requests.size(); ++i) {
      const Prepared& p = prepared[i];
      if (p.route != k) continue;
      const TransferRequest& r = requests[i];
      uint64_t n = (r.length + slice_size - 1) / slice_size;
      tasks[i].Start(static_cast<uint32_t>(n), r.length, p.local);
      for (uint64_t off = 0; off < r.length; off += slice_size) {
        Slice s;
        s.task = &tasks[i];
        s.opcode = r.opcode;
        s.local = reinterpret_cast<uint64_t>(r.source) + off;
        s.remote = r.target_offset + off;
        s.length = std::min<uint64_t>(slice_size, r.length - off);
        s.local_device = p.local->device;
        s.remote_buffer = p.remote_buffer;
        slices.push_back(s);
      }
    }
    Status s = route.transport->Submit(route.desc, slices.data(), slices.size());
    if (!s.ok()) {
      LOG(WARNING) << "submit to " << route.desc->name << ": " << s.ToString();
      std::string msg = s.ToString();
      for (const Slice& sl : slices) sl.task->OnSliceDone(FAILED, 0, msg.c_str());
    }
  }
  // Requests to our own segment are a memcpy, done here.
  for (size_t i = 0; i < requests.size(); ++i) {
    const Prepared& p = prepared[i];
    if (p.local_target == nullptr) continue;
    const TransferRequest& r = requests[i];
    auto* remote = reinterpret_cast<void*>(r.target_offset);
    void* dst = r.opcode == TransferRequest::WRITE ? remote : r.source;
    const void* src = r.opcode == TransferRequest::WRITE ? r.source : remote;
    Status copied;
    if (p.local->device < 0 && p.local_target->device < 0) {
      std::memmove(dst, src, r.length);
    } else {
      copied = platform::Devices().Copy(dst, src, r.length);
    }
    MemoryRegistry::Unpin(p.local_target);
    tasks[i].Start(1, r.length, p.local);
    if (copied.ok()) {
      tasks[i].OnSliceDone(COMPLETED, r.length);
    } else {
      tasks[i].OnSliceDone(FAILED, 0, copied.ToString().c_str());
    }
  }
  prepared.clear();
  routes.clear();
  return Status::OK();
}

Result<TransferStatus> TransferEngine::Impl::BatchStatus(BatchID id) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Batch> batch, batches.Get(id));
  TransferStatus st = batch->Aggregate();
  if (st.s == COMPLETED) {
    std::optional<std::pair<SegmentID, NotifyDesc>> notify;
    {
      std::lock_guard lock(batch->notify_mu);
      notify.swap(batch->pending_notify);
    }
    if (notify) {
      Status s;
      if (notify->first == LOCAL_SEGMENT_ID) {
        s = SendNotifyTo(local_name, notify->second);
      } else {
        auto name = segments.NameOf(notify->first);
        s = name.ok() ? SendNotifyTo(*name, notify->second) : name.status();
      }
      if (!s.ok()) LOG(WARNING) << "notify after batch " << id << ": " << s.ToString();
    }
  }
  return st;
}

void TransferEngine::Impl::ReapOrphans() {
  std::lock_guard lock(orphan_mu);
  for (size_t i = 0; i < orphans.size();) {
    if (batches.Free(orphans[i]).ok()) {
      orphans[i] = orphans.back();
      orphans.pop_back();
    } else {
      ++i;
    }
  }
}

Status TransferEngine::Impl::TransferSync(const std::vector<TransferRequest>& requests,
                                          std::chrono::milliseconds timeout) {
  ReapOrphans();
  MC_ASSIGN_OR_RETURN(BatchID id, batches.Allocate(std::max<size_t>(requests.size(), 1)));
  Status s = Submit(id, requests);
  if (!s.ok()) {
    (void)batches.Free(id);
    return s;
  }
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Batch> batch, batches.Get(id));
  if (!batch->WaitAll(timeout)) {
    // The batch is freed by a later call once its slices end (bounded by the slice
    // timeout), so the caller is not held and nothing leaks.
    std::lock_guard lock(orphan_mu);
    orphans.push_back(id);
    return Status::DeadlineExceeded("transfer did not finish within " +
                                    std::to_string(timeout.count()) + " ms");
  }
  Status result;
  for (size_t i = 0; i < batch->size(); ++i) {
    TransferStatus st = batch->task(i).status();
    if (st.s != COMPLETED) {
      std::string err = batch->task(i).error();
      result = st.s == TIMEOUT ? Status::DeadlineExceeded("request " + std::to_string(i) + ": " + err)
                               : Status::Unavailable("request " + std::to_string(i) + ": " + err);
      break;
    }
  }
  (void)batches.Free(id);
  return result;
}

}  // namespace mooncake
