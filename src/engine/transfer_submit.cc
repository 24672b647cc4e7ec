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

}  // namespace

namespace submit {

// A checked request, ready to be cut into slices.
struct Prepared {
  MemoryRegion* local = nullptr;           // pinned (by this request, or by its run's first)
  // `local` is the previous request's region, pinned once for the run of consecutive
  // requests in it (by the run's first request); the run's tasks share that pin (`share`).
  bool in_run = false;
  PinShare* share = nullptr;
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

}  // namespace submit

namespace {

using submit::PeerRoute;
using submit::Prepared;

void Unpin(const Prepared& p) {
  if (p.local && !p.in_run) MemoryRegistry::Unpin(p.local);
  if (p.local_target) MemoryRegistry::Unpin(p.local_target);
}

void UnpinAll(std::vector<Prepared>& prepared) {
  for (auto& p : prepared) Unpin(p);
  prepared.clear();
}

// What is wrong with the request's shape (before any lookup), or nullptr.
inline const char* ShapeError(const TransferRequest& r) {
  auto src = reinterpret_cast<uint64_t>(r.source);
  if (r.length == 0) return "length is 0";
  if (r.opcode != TransferRequest::READ && r.opcode != TransferRequest::WRITE) {
    return "opcode must be READ or WRITE";
  }
  if (src + r.length < src || r.target_offset + r.length < r.target_offset) {
    return "address + length wraps around";
  }
  return nullptr;
}

// The live (not stale) route of segment `id` that holds its descriptor, or SIZE_MAX.
inline size_t FirstRouteOf(const std::vector<PeerRoute>& routes, SegmentID id) {
  for (size_t k = 0; k < routes.size(); ++k) {
    if (routes[k].id == id && !routes[k].stale) return k;
  }
  return SIZE_MAX;
}

// The route from `first_route` on (same segment, same descriptor) whose transport is
// `transport`, taking one not yet bound; a new route if none fits.
inline size_t RouteFor(std::vector<PeerRoute>& routes, size_t first_route, SegmentID id,
                       Transport* transport) {
  for (size_t k = first_route; k < routes.size(); ++k) {
    if (routes[k].id == id && !routes[k].stale &&
        (routes[k].transport == nullptr || routes[k].transport == transport)) {
      routes[k].transport = transport;
      return k;
    }
  }
  routes.push_back({id, routes[first_route].desc, transport, nullptr, true, false});
  return routes.size() - 1;
}

// Appends request r's slices (of at most slice_size bytes) for `task` and starts the task.
inline void CutIntoSlices(const TransferRequest& r, const Prepared& p, TransferTask* task,
                          uint64_t slice_size, std::vector<Slice>* slices) {
  uint64_t n = (r.length + slice_size - 1) / slice_size;
  task->Start(static_cast<uint32_t>(n), r.length, p.local, p.share);
  for (uint64_t off = 0; off < r.length; off += slice_size) {
    Slice s;
    s.task = task;
    s.opcode = r.opcode;
    s.local = reinterpret_cast<uint64_t>(r.source) + off;
    s.remote = r.target_offset + off;
    s.length = std::min<uint64_t>(slice_size, r.length - off);
    s.local_device = p.local->device;
    s.remote_buffer = p.remote_buffer;
    slices->push_back(s);
  }
}

// A request to our own segment: a memcpy (or a device copy), done here; ends its task.
void CopyLocally(const TransferRequest& r, const Prepared& p, TransferTask* task) {
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
  task->Start(1, r.length, p.local, p.share);
  if (copied.ok()) {
    task->OnSliceDone(COMPLETED, r.length);
  } else {
    task->OnSliceDone(FAILED, 0, copied.ToString().c_str());
  }
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
    Prepared p;
    Status s = PrepareRequest(i, requests[i], routes,
                              prepared.empty() ? nullptr : prepared.back().local, &p);
    if (!s.ok()) {
      Unpin(p);
      UnpinAll(prepared);
      return s;
    }
    prepared.push_back(p);
  }

  // 2. Reserve the tasks.
  size_t first = 0;
  TransferTask* tasks = batch->Reserve(requests.size(), &first);
  if (tasks == nullptr) {
    UnpinAll(prepared);
    return Status::ResourceExhausted("batch " + std::to_string(id) +
                                     " is full (another thread submitted meanwhile)");
  }

  // Runs of requests in one local region share its pin.
  for (size_t i = 0; i < prepared.size();) {
    size_t j = i + 1;
    while (j < prepared.size() && prepared[j].in_run) ++j;
    if (j - i > 1) {
      PinShare* share = batch->SharePin(prepared[i].local, static_cast<uint32_t>(j - i));
      for (size_t k = i; k < j; ++k) prepared[k].share = share;
    }
    i = j;
  }

  // 3. Cut into slices and hand them out per route.
  thread_local std::vector<Slice> slices;
  for (size_t k = 0; k < routes.size(); ++k) {
    SubmitRoute(k, routes[k], requests, prepared, tasks, &slices);
  }

  // 4. Requests to our own segment are a memcpy, done here.
  for (size_t i = 0; i < requests.size(); ++i) {
    if (prepared[i].local_target != nullptr) CopyLocally(requests[i], prepared[i], &tasks[i]);
  }
  prepared.clear();
  routes.clear();
  return Status::OK();
}

Status TransferEngine::Impl::PrepareRequest(size_t i, const TransferRequest& r,
                                            std::vector<PeerRoute>& routes, MemoryRegion* run,
                                            Prepared* p) {
  // Named only in an error (built then: a batch of small requests is hot).
  auto which = [i] { return "request " + std::to_string(i) + ": "; };
  if (const char* bad = ShapeError(r)) return Status::InvalidArgument(which() + bad);
  auto src = reinterpret_cast<uint64_t>(r.source);
  if (run != nullptr && src >= run->begin && src < run->end() &&
      r.length <= run->end() - src) {
    p->local = run;  // pinned by the run's first request, held until the run's tasks end
    p->in_run = true;
  } else {
    p->local = registry.Pin(src, r.length, /*remote_only=*/false);
  }
  if (p->local == nullptr) {
    return Status::InvalidArgument(which() + "local range " + RangeText(src, r.length) +
                                   " is not inside registered memory; register it first");
  }
  if (r.target_id == LOCAL_SEGMENT_ID) {
    p->local_target = registry.Pin(r.target_offset, r.length, /*remote_only=*/false);
    if (p->local_target == nullptr) {
      return Status::InvalidArgument(which() + "target range " +
                                     RangeText(r.target_offset, r.length) +
                                     " is not inside this engine's registered memory");
    }
    return Status::OK();
  }
  // Routes are (peer, transport) pairs; the first route of a peer holds its descriptor.
  size_t first_route = FirstRouteOf(routes, r.target_id);
  if (first_route == SIZE_MAX) {
    auto desc = segments.Get(r.target_id);
    if (!desc.ok()) return desc.status().WithContext("request " + std::to_string(i));
    routes.push_back({r.target_id, std::move(desc).value(), nullptr, nullptr, false, false});
    first_route = routes.size() - 1;
  }
  const BufferDesc* buf = FindRemoteBuffer(r, routes, &first_route);
  const PeerRoute& route = routes[first_route];
  if (buf == nullptr) {
    return Status::InvalidArgument(which() + "remote range " +
                                   RangeText(r.target_offset, r.length) +
                                   " is not inside any buffer registered by segment '" +
                                   route.desc->name + "'");
  }
  Transport* transport = ChooseTransport(&routes[first_route], *buf, p->local->device);
  if (transport == nullptr) {
    return Status::Unavailable(which() + "no installed transport reaches segment '" +
                               route.desc->name + "' (protocol " + route.desc->protocol +
                               ") for " + (p->local->device < 0 ? "host" : "device") +
                               " memory here and " + (buf->device < 0 ? "host" : "device") +
                               " memory there");
  }
  p->remote_buffer = buf;
  p->route = RouteFor(routes, first_route, r.target_id, transport);
  return Status::OK();
}

const BufferDesc* TransferEngine::Impl::FindRemoteBuffer(const TransferRequest& r,
                                                         std::vector<PeerRoute>& routes,
                                                         size_t* first_route) {
  PeerRoute* route = &routes[*first_route];
  const BufferDesc* buf = route->desc->FindBuffer(r.target_offset, r.length);
  if (buf != nullptr || route->refreshed) return buf;
  // The peer may have registered more memory since we fetched its descriptor.
  route->refreshed = true;
  auto fresh = segments.Refresh(r.target_id);
  if (!fresh.ok()) return nullptr;
  for (auto& other : routes) {
    if (other.id == r.target_id) other.stale = true;
  }
  routes.push_back({r.target_id, std::move(fresh).value(), nullptr, nullptr, true, false});
  *first_route = routes.size() - 1;
  return routes.back().desc->FindBuffer(r.target_offset, r.length);
}

Transport* TransferEngine::Impl::ChooseTransport(PeerRoute* route, const BufferDesc& remote,
                                                 int local_device) {
  if (local_device >= 0 || remote.device >= 0) {
    return PickTransport(*route->desc, remote, local_device);
  }
  // Host memory at both ends: picked once per peer.
  if (route->host_transport == nullptr) {
    route->host_transport = PickTransport(*route->desc, remote, -1);
  }
  return route->host_transport;
}

void TransferEngine::Impl::SubmitRoute(size_t k, const PeerRoute& route,
                                       const std::vector<TransferRequest>& requests,
                                       const std::vector<Prepared>& prepared,
                                       TransferTask* tasks, std::vector<Slice>* slices) {
  if (route.transport == nullptr) return;  // superseded before it took a request
  const uint64_t slice_size = std::max<uint64_t>(route.transport->slice_size(), 4096);
  slices->clear();
  for (size_t i = 0; i < requests.size(); ++i) {
    if (prepared[i].route == k) CutIntoSlices(requests[i], prepared[i], &tasks[i], slice_size, slices);
  }
  Status s = route.transport->Submit(route.desc, slices->data(), slices->size());
  if (!s.ok()) {
    LOG(WARNING) << "submit to " << route.desc->name << ": " << s.ToString();
    std::string msg = s.ToString();
    for (const Slice& sl : *slices) sl.task->OnSliceDone(FAILED, 0, msg.c_str());
  }
}

Result<TransferStatus> TransferEngine::Impl::BatchStatus(BatchID id) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Batch> batch, batches.Get(id));
  TransferStatus st = batch->Aggregate();
  if (st.s == COMPLETED) {
    std::optional<std::pair<SegmentID, NotifyDesc>> notify;
    {
      MutexLock lock(&batch->notify_mu);
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
  MutexLock lock(&orphan_mu);
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
    MutexLock lock(&orphan_mu);
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
