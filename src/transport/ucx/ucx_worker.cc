#include "transport/ucx/ucx_worker.h"

#include <glog/logging.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "common/net.h"
#include "transport/ucx/ucx_env.h"

namespace mooncake::ucx {
namespace {

using Clock = std::chrono::steady_clock;

// Empty progress rounds (each yields the CPU) after the last progress before the thread arms
// the worker and sleeps.
constexpr int kSpinRounds = 256;
constexpr auto kScanInterval = std::chrono::milliseconds(50);
// How long nothing may complete, after a watched same-host peer died, while a shared-memory
// peer waits for its requests, before the receive queue counts as blocked (header comment);
// the slice timeout when that is shorter. A healthy same-host peer answers in microseconds
// to milliseconds.
constexpr int kBlockedQueueMs = 2000;

}  // namespace

Status CheckWorkerAddress(const std::string& address) {
  // UCX 1.13 packs a header byte (the address format version in its low 4 bits: 0 = v1,
  // 1 = v2; UCX aborts on any other) and an 8-byte worker id before the device entries.
  if (address.size() < 9) {
    return Status::InvalidArgument("UCX worker address of " + std::to_string(address.size()) +
                                   " bytes is too short to be one");
  }
  const unsigned version = static_cast<uint8_t>(address[0]) & 0xf;
  if (version > 1) {
    return Status::InvalidArgument("UCX worker address has format version " +
                                   std::to_string(version) + "; UCX 1.12+ writes 0 (v1) or 1 (v2)");
  }
  return Status::OK();
}

Result<std::unique_ptr<UcxWorker>> UcxWorker::Create(const UcxApi* api, Config config) {
  std::unique_ptr<UcxWorker> w(new UcxWorker(api, std::move(config)));
  MC_RETURN_IF_ERROR(w->Init());
  return w;
}

Status UcxWorker::Init() {
  ucp_config_t* cfg = nullptr;
  ucs_status_t st = api_->config_read(nullptr, nullptr, &cfg);
  if (st != UCS_OK) return api_->Error("ucp_config_read", st);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  st = api_->init_version(UCP_API_MAJOR, UCP_API_MINOR, &params, cfg, &context_);
  api_->config_release(cfg);
  if (st != UCS_OK) return api_->Error("ucp_init (check UCX_TLS / UCX_NET_DEVICES)", st);
  ucp_context_attr_t cattr{};
  cattr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (api_->context_query(context_, &cattr) == UCS_OK) {
    cuda_memory_ = (cattr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  }
  {
    MutexLock lock(&mu_);
    MC_RETURN_IF_ERROR(CreateWorkerLocked());
  }
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return ErrnoStatus("eventfd", errno);
  const std::string resources =
      PrintToString([&](FILE* f) { api_->context_print_info(context_, f); });
  local_fast_lanes_ = FastLanes(resources);
  local_transports_ = TransportList(resources);
  peer_failure_lanes_ = HasPeerFailureLane(resources);
  memory_ = std::make_unique<MemoryTable>(api_, context_, cuda_memory_);
  thread_ = std::thread([this] { Run(); });
  return Status::OK();
}

Status UcxWorker::CreateWorkerLocked() {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // serialized by mu_
  ucs_status_t st = api_->worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) {
    worker_ = nullptr;
    return api_->Error("ucp_worker_create", st);
  }
  ucp_worker_attr_t wattr{};
  wattr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
  st = api_->worker_query(worker_, &wattr);
  if (st != UCS_OK) return api_->Error("ucp_worker_query", st);
  address_hex_ = ToHex(wattr.address, wattr.address_length);
  api_->worker_release_address(worker_, wattr.address);
  if (address_hex_.size() > 2 * kMaxUcxWorkerAddressBytes) {
    return Status::FailedPrecondition("UCX worker address of " +
                                      std::to_string(address_hex_.size() / 2) +
                                      " bytes exceeds what peers accept");
  }
  st = api_->worker_get_efd(worker_, &efd_);
  if (st != UCS_OK) return api_->Error("ucp_worker_get_efd", st);
  return Status::OK();
}

std::string UcxWorker::address_hex() const {
  MutexLock lock(&mu_);
  return address_hex_;
}

UcxWorker::~UcxWorker() { Stop(); }

void UcxWorker::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  if (worker_ != nullptr) {
    MutexLock lock(&mu_);
    std::vector<std::shared_ptr<PeerState>> all;
    for (auto& [key, st] : peers_) all.push_back(st);
    for (auto& st : all) ClosePeerLocked(st, "UCX transport stopped", false);
    ready_.clear();
    for (auto deadline = Clock::now() + std::chrono::seconds(2);
         !closing_.empty() && Clock::now() < deadline;) {
      api_->worker_progress(worker_);
      ReapClosingLocked();
    }
    // Whatever UCX did not complete in time still ends, once.
    ReapClosingLocked(/*force=*/true);
    closing_.clear();
    memory_.reset();
    api_->worker_destroy(worker_);
    worker_ = nullptr;
    // UCX cannot call back any more: what it never completed is freed now.
    for (Pending* p : abandoned_) delete p;
    abandoned_.clear();
  } else {
    memory_.reset();  // a rebuild failed (RebuildLocked): nothing else is left
  }
  if (context_ != nullptr) {
    api_->cleanup(context_);
    context_ = nullptr;
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
  wake_fd_ = -1;
}

// ---- data path ---------------------------------------------------------------------------

UcxWorker::Pending* UcxWorker::NewPendingLocked() {
  if (pool_.empty()) {
    auto* p = new Pending();
    p->worker = this;
    return p;
  }
  Pending* p = pool_.back().release();
  pool_.pop_back();
  return p;
}

void UcxWorker::FinishLocked(Pending* p, ucs_status_t status, bool abandon) {
  PeerState* st = p->peer.get();
  if (p->prev) p->prev->next = p->next; else st->head = p->next;
  if (p->next) p->next->prev = p->prev; else st->tail = p->prev;
  p->prev = p->next = nullptr;
  --outstanding_;
  if (p->probe) {
    p->probe = false;
    if (st->probe == p) st->probe = nullptr;
    if (status == UCS_OK) {
      st->confirmed = true;
      if (!st->deferred.empty()) ready_.push_back(p->peer);
    } else {
      EndDeferredLocked(st, FAILED,
                        "UCX transfer to segment '" + st->key + "' failed: the peer did not " +
                            "answer on a new endpoint (" +
                            (st->why.empty() ? api_->status_string(status) : st->why) + ")");
    }
  }
  if (status == UCS_OK) {
    st->last_progress = Clock::now();
    last_completion_ = st->last_progress;
    for (const Slice& s : p->slices) s.Done(COMPLETED, s.length);
  } else {
    const TransferStatusEnum result = p->timed_out ? TIMEOUT : FAILED;
    std::string msg = "UCX transfer to segment '" + st->key + "' " +
                      (p->timed_out ? "timed out after " + std::to_string(config_.slice_timeout_ms) +
                                          " ms (MC_SLICE_TIMEOUT)"
                                    : std::string("failed")) +
                      ": " + (st->why.empty() ? api_->status_string(status) : st->why);
    for (const Slice& s : p->slices) s.Done(result, 0, msg.c_str());
  }
  p->slices.clear();
  if (st->draining && st->head == nullptr) EndDrainLocked(p->peer);
  p->peer.reset();
  p->timed_out = false;
  p->has_puts = false;
  p->status = UCS_OK;
  if (abandon && p->ops > 0) {
    p->abandoned = true;  // UCX may still call OnOpDone with it, which deletes it
    abandoned_.insert(p);
    return;
  }
  p->ops = 0;
  pool_.emplace_back(p);
}

void UcxWorker::OnOpDone(void* request, ucs_status_t status, void* user_data) {
  auto* p = static_cast<Pending*>(user_data);
  UcxWorker* w = p->worker;
  w->mu_.AssertHeld();  // inside ucp_worker_progress
  w->api_->request_free(request);
  if (status != UCS_OK && p->status == UCS_OK) p->status = status;
  if (--p->ops > 0) return;
  if (p->abandoned) {
    w->abandoned_.erase(p);
    delete p;
    return;
  }
  w->FinishLocked(p, p->status);
}

Status UcxWorker::Submit(const std::shared_ptr<const SegmentDesc>& desc, const Slice* slices,
                         size_t count) {
  std::shared_ptr<PeerState> st;
  size_t next = 0;
  {
    MutexLock lock(&mu_);
    MC_ASSIGN_OR_RETURN(st, PeerLocked(*desc));
    if (!st->confirmed) StartProbeLocked(st, desc);
    if (!st->confirmed || st->draining || !st->deferred.empty()) {
      // Waits for the probe or the drain (behind the requests already waiting, in order).
      const auto now = Clock::now();
      for (size_t i = 0; i < count; ++i) st->deferred.push_back({desc, slices[i], now});
      next = count;
    } else {
      if (st->head == nullptr) st->last_progress = Clock::now();  // an idle peer's clock starts now
      next = PostLocked(st, desc, slices, count, 0);
    }
  }
  while (next < count) {
    // Let the progress thread in between groups: a long Submit must not hold back the
    // completions (and so the progress clock) of what it posted first.
    WakeProgress();
    MutexLock lock(&mu_);
    if (st->failed) {  // closed meanwhile (failure, timeout, Stop): the rest fails now
      const std::string msg = "UCX transfer to segment '" + st->key + "' failed: " + st->why;
      for (size_t k = next; k < count; ++k) slices[k].Done(FAILED, 0, msg.c_str());
      return Status::OK();
    }
    if (st->draining) {  // timed out meanwhile: the rest waits for the drain
      const auto now = Clock::now();
      for (size_t k = next; k < count; ++k) st->deferred.push_back({desc, slices[k], now});
      return Status::OK();
    }
    next = PostLocked(st, desc, slices, count, next);
  }
  WakeProgress();
  return Status::OK();
}

void UcxWorker::StartProbeLocked(const std::shared_ptr<PeerState>& st,
                                 const std::shared_ptr<const SegmentDesc>& desc) {
  if (st->probe != nullptr || st->confirmed) return;
  auto rkey = desc->buffers.empty() || desc->buffers[0].length == 0
                  ? Result<ucp_rkey_h>(Status::NotFound("no buffer"))
                  : RkeyLocked(st.get(), desc, 0);
  if (!rkey.ok()) {
    st->confirmed = true;  // nothing to probe with: the requests fail with their own message
    return;
  }
  Pending* p = NewPendingLocked();
  p->peer = st;
  p->probe = true;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxWorker::OnOpDone;
  param.user_data = p;
  ucs_status_ptr_t r =
      api_->get_nbx(st->ep, &p->probe_byte, 1, desc->buffers[0].addr, *rkey, &param);
  if (!UCS_PTR_IS_PTR(r)) {
    // Done at once, or refused: either way the requests go out and report for themselves.
    p->probe = false;
    p->peer.reset();
    pool_.emplace_back(p);
    st->confirmed = true;
    return;
  }
  ++p->ops;
  st->probe = p;
  FlushLocked(st, p);  // links it (no puts: no flush); it ends in OnOpDone
}

void UcxWorker::PostDeferredLocked(const std::shared_ptr<PeerState>& st) {
  std::vector<Deferred> waiting;
  waiting.swap(st->deferred);
  if (st->head == nullptr) st->last_progress = Clock::now();
  std::vector<Slice> run;
  for (size_t i = 0; i < waiting.size();) {
    // A run of requests against one descriptor (the peer's may have been refreshed).
    const std::shared_ptr<const SegmentDesc>& desc = waiting[i].desc;
    run.clear();
    for (; i < waiting.size() && waiting[i].desc == desc; ++i) run.push_back(waiting[i].slice);
    for (size_t next = 0; next < run.size();) {
      next = PostLocked(st, desc, run.data(), run.size(), next);
    }
  }
}

void UcxWorker::EndDeferredLocked(PeerState* st, TransferStatusEnum result,
                                  const std::string& msg, Clock::time_point before) {
  size_t kept = 0;
  for (size_t i = 0; i < st->deferred.size(); ++i) {
    Deferred& d = st->deferred[i];
    if (d.since < before) {
      d.slice.Done(result, 0, msg.c_str());
    } else {
      if (kept != i) st->deferred[kept] = std::move(d);
      ++kept;
    }
  }
  st->deferred.resize(kept);
}

size_t UcxWorker::PostLocked(const std::shared_ptr<PeerState>& st,
                             const std::shared_ptr<const SegmentDesc>& desc, const Slice* slices,
                             size_t count, size_t from) {
  const BufferDesc* first = desc->buffers.data();
  Pending* p = nullptr;
  uint64_t group_bytes = 0;
  for (size_t i = from; i < count; ++i) {
    const Slice& s = slices[i];
    const size_t index = static_cast<size_t>(s.remote_buffer - first);
    if (s.remote_buffer < first || index >= desc->buffers.size() ||
        s.remote < s.remote_buffer->addr || s.remote + s.length < s.remote ||
        s.remote + s.length > s.remote_buffer->end()) {
      s.Done(FAILED, 0, "UCX: remote range is not inside the peer's registered buffer");
      continue;
    }
    auto rkey = RkeyLocked(st.get(), desc, index);
    if (!rkey.ok()) {
      s.Done(FAILED, 0, rkey.status().ToString().c_str());
      continue;
    }
    if (p == nullptr) {
      p = NewPendingLocked();
      p->peer = st;
    }
    ucp_request_param_t param{};
    if (ucp_mem_h memh = memory_->Find(s.local, s.length)) {
      param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
      param.memh = memh;
    }
    if (s.opcode != TransferRequest::WRITE) {
      // A get is complete (the bytes are here) when its own request is: no flush needed.
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.send = &UcxWorker::OnOpDone;
      param.user_data = p;
    }
    ucs_status_ptr_t r =
        s.opcode == TransferRequest::WRITE
            ? api_->put_nbx(st->ep, reinterpret_cast<const void*>(s.local), s.length, s.remote,
                            *rkey, &param)
            : api_->get_nbx(st->ep, reinterpret_cast<void*>(s.local), s.length, s.remote,
                            *rkey, &param);
    if (UCS_PTR_IS_ERR(r)) {
      const std::string msg = "UCX " + std::string(s.opcode == TransferRequest::WRITE ? "put" : "get") +
                              " to segment '" + st->key + "': " +
                              api_->status_string(UCS_PTR_STATUS(r));
      s.Done(FAILED, 0, msg.c_str());
      continue;
    }
    if (s.opcode == TransferRequest::WRITE) {
      // A put completes locally first; the group's flush reports it once it is remote.
      if (r != nullptr) api_->request_free(r);
      p->has_puts = true;
    } else if (r != nullptr) {
      ++p->ops;
    }
    p->slices.push_back(s);
    group_bytes += s.length;
    if (group_bytes >= kFlushGroupBytes || p->slices.size() >= kFlushGroupSlices) {
      FlushLocked(st, p);
      return i + 1;  // a full group: the caller lets the progress thread in
    }
  }
  if (p != nullptr) {
    if (p->slices.empty()) {
      p->peer.reset();
      pool_.emplace_back(p);
    } else {
      FlushLocked(st, p);
    }
  }
  return count;
}

void UcxWorker::WakeProgress() {
  if (sleeping_.load(std::memory_order_acquire)) {
    uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
}

void UcxWorker::FlushLocked(const std::shared_ptr<PeerState>& st, Pending* p) {
  // Linked first: the flush may complete (and unlink) before ep_flush_nbx returns.
  p->prev = st->tail;
  if (st->tail) st->tail->next = p; else st->head = p;
  st->tail = p;
  ++outstanding_;
  if (p->has_puts) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &UcxWorker::OnOpDone;
    param.user_data = p;
    ucs_status_ptr_t r = api_->ep_flush_nbx(st->ep, &param);
    if (UCS_PTR_IS_PTR(r)) {
      ++p->ops;
    } else if (UCS_PTR_STATUS(r) != UCS_OK && p->status == UCS_OK) {
      p->status = UCS_PTR_STATUS(r);
    }
  }
  if (p->ops == 0) FinishLocked(p, p->status);
}

// ---- progress ----------------------------------------------------------------------------

void UcxWorker::ScanTimeoutsLocked(Clock::time_point now) {
  std::vector<std::shared_ptr<PeerState>> expired;
  std::vector<std::shared_ptr<PeerState>> dead;
  const auto timeout = std::chrono::milliseconds(config_.slice_timeout_ms);
  std::vector<std::shared_ptr<PeerState>> drain;
  for (auto& [key, st] : peers_) {
    if ((!st->confirmed || st->draining) && !st->deferred.empty()) {
      // Never posted, so nothing can land later; the endpoint stays (file comment).
      EndDeferredLocked(st.get(), TIMEOUT,
                        "UCX transfer to segment '" + st->key + "' timed out after " +
                            std::to_string(config_.slice_timeout_ms) +
                            " ms (MC_SLICE_TIMEOUT): " +
                            (st->draining
                                 ? "the peer has not ended the requests that timed out before "
                                   "(stopped or unreachable), and nothing newer is sent before "
                                   "it has; nothing was sent"
                                 : "the peer has not answered on its new endpoint (stopped or "
                                   "unreachable); nothing was sent"),
                        now - timeout + std::chrono::nanoseconds(1));
    }
    if (st->head == nullptr || st->draining) continue;
    if (!st->confirmed) {
      if (st->watch_pid != 0 && ::kill(st->watch_pid, 0) != 0 && errno == ESRCH) {
        dead.push_back(st);
      }
      continue;
    }
    if (now - st->last_progress >= std::chrono::milliseconds(config_.slice_timeout_ms)) {
      (st->no_failure_handling ? expired : drain).push_back(st);
    } else if (st->watch_pid != 0 && ::kill(st->watch_pid, 0) != 0 && errno == ESRCH) {
      dead.push_back(st);
    }
  }
  for (auto& st : dead) {
    LOG(WARNING) << "UCX: segment " << st->key << " (pid " << st->watch_pid
                 << ", same host) has exited";
    same_host_death_at_ = now;
    same_host_dead_pid_ = st->watch_pid;
    failed_names_.push_back(st->name);
    ClosePeerLocked(st, "the peer process (pid " + std::to_string(st->watch_pid) + ") has exited",
                    false);
  }
  for (auto& st : drain) {
    LOG(WARNING) << "UCX: no request to segment " << st->key << " completed for "
                 << config_.slice_timeout_ms << " ms (MC_SLICE_TIMEOUT): they end TIMEOUT; "
                 << "the endpoint stays open until the peer ends them";
    DrainLocked(st);
  }
  for (auto& st : expired) {
    LOG(WARNING) << "UCX: no request to segment " << st->key << " completed for "
                 << config_.slice_timeout_ms << " ms (MC_SLICE_TIMEOUT); closing the endpoint";
    // A same-host peer may have rebuilt its worker (a new address): fetch its descriptor anew.
    if (st->watch_pid != 0) failed_names_.push_back(st->name);
    ClosePeerLocked(st,
                    "nothing completed for " + std::to_string(config_.slice_timeout_ms) +
                        " ms (the peer is stopped or unreachable)",
                    true);
  }
  if (QueueBlockedLocked(now)) {
    RebuildLocked("nothing has completed on UCX's shared-memory lanes since same-host peer pid " +
                  std::to_string(same_host_dead_pid_) +
                  " died: a process killed while writing into this worker's receive queue "
                  "blocks it for good (UCX 1.13); the UCX worker was rebuilt, retry the request");
  }
}

void UcxWorker::DrainLocked(const std::shared_ptr<PeerState>& st) {
  st->draining = true;
  const std::string msg =
      "UCX transfer to segment '" + st->key + "' timed out after " +
      std::to_string(config_.slice_timeout_ms) +
      " ms (MC_SLICE_TIMEOUT): nothing completed (the peer is stopped or unreachable); it may "
      "still be applied if the peer resumes, before anything newer to it";
  for (Pending* p = st->head; p != nullptr; p = p->next) {
    for (const Slice& s : p->slices) {
      // Pinned before it is reported: the task's own pin goes with the report.
      MemoryRegion* r =
          config_.registry != nullptr ? config_.registry->PinHeld(s.local, s.length) : nullptr;
      if (r != nullptr) st->drain_pins.push_back(r);
      s.Done(TIMEOUT, 0, msg.c_str());
    }
    p->slices.clear();
  }
}

void UcxWorker::EndDrainLocked(const std::shared_ptr<PeerState>& st) {
  st->draining = false;
  for (MemoryRegion* r : st->drain_pins) MemoryRegistry::Unpin(r);
  st->drain_pins.clear();
  st->last_progress = Clock::now();
  if (!st->failed) {
    LOG(INFO) << "UCX: segment " << st->key << " ended the requests that had timed out";
    if (!st->deferred.empty()) ready_.push_back(st);
  }
}

bool UcxWorker::QueueBlockedLocked(Clock::time_point now) {
  if (same_host_dead_pid_ == 0 || last_completion_ >= same_host_death_at_) return false;
  const auto wait = std::chrono::milliseconds(std::min(config_.slice_timeout_ms, kBlockedQueueMs));
  if (now - same_host_death_at_ < wait) return false;
  for (auto& [key, st] : peers_) {
    if (!st->no_failure_handling) continue;  // not over shared memory
    if (st->confirmed && st->head != nullptr && now - st->last_progress >= wait) return true;
    if (!st->confirmed && !st->deferred.empty() && now - st->deferred.front().since >= wait) {
      return true;  // its probe's answer does not arrive either
    }
  }
  return false;
}

void UcxWorker::RebuildLocked(const std::string& why) {
  LOG(ERROR) << "UCX: " << why;
  std::vector<std::shared_ptr<PeerState>> all;
  for (auto& [key, st] : peers_) all.push_back(st);
  for (auto& st : all) ClosePeerLocked(st, why, false);
  ready_.clear();
  failed_.clear();
  // The old worker's queue moves nothing any more: what UCX still owes is reported now.
  ReapClosingLocked(/*force=*/true);
  closing_.clear();
  api_->worker_destroy(worker_);
  worker_ = nullptr;
  efd_ = -1;
  for (Pending* p : abandoned_) delete p;  // UCX cannot call them back any more
  abandoned_.clear();
  same_host_dead_pid_ = 0;
  Status s = CreateWorkerLocked();
  if (!s.ok()) {
    LOG(ERROR) << "UCX: could not create a new worker: " << s.ToString()
               << "; UCX requests of this engine fail from now on (restart the process)";
    if (worker_ != nullptr) api_->worker_destroy(worker_);
    worker_ = nullptr;
    efd_ = -1;
    return;
  }
  new_address_ = address_hex_;
  LOG(WARNING) << "UCX: new worker created (address of " << address_hex_.size() / 2
               << " bytes), published with the segment's descriptor";
}

void UcxWorker::Run() {
  auto next_scan = Clock::now() + kScanInterval;
  int idle = 0;
  for (;;) {
    bool sleep = false;
    int timeout_ms = 0;
    std::vector<std::string> names;
    std::string address;
    {
      MutexLock lock(&mu_);
      if (stopping_) break;
      unsigned progressed = 0;
      for (int i = 0; i < 64 && worker_ != nullptr; ++i) {
        unsigned n = api_->worker_progress(worker_);
        progressed += n;
        if (n == 0) break;
      }
      for (auto& [raw, status] : failed_) {
        for (auto& [key, st] : peers_) {
          if (st.get() != raw) continue;
          LOG(WARNING) << "UCX: endpoint to segment " << key << " failed: "
                       << api_->status_string(status);
          failed_names_.push_back(st->name);
          ClosePeerLocked(st, std::string("the peer failed (") + api_->status_string(status) + ")",
                          false);
          break;
        }
      }
      failed_.clear();
      if (!ready_.empty()) {
        std::vector<std::shared_ptr<PeerState>> ready;
        ready.swap(ready_);
        for (auto& st : ready) {
          if (!st->failed && st->confirmed && !st->draining) PostDeferredLocked(st);
        }
      }
      if (!closing_.empty()) ReapClosingLocked();
      const auto now = Clock::now();
      if (now >= next_scan) {
        ScanTimeoutsLocked(now);
        next_scan = now + kScanInterval;
      }
      names.swap(failed_names_);
      address.swap(new_address_);
      idle = progressed > 0 ? 0 : idle + 1;
      // Spins a while after the last progress even with nothing of ours outstanding: a
      // target serving a peer's gets (software RMA) must keep pushing the replies.
      if (progressed == 0 && idle > kSpinRounds && closing_.empty()) {
        ucs_status_t a = worker_ != nullptr ? api_->worker_arm(worker_) : UCS_OK;
        if (a == UCS_OK) {
          sleep = true;
          timeout_ms = outstanding_ == 0 ? 1000 : static_cast<int>(kScanInterval.count());
          sleeping_.store(true, std::memory_order_release);
        }
      }
    }
    for (const auto& n : names) {
      if (config_.on_peer_failure) config_.on_peer_failure(n);
    }
    if (!address.empty() && config_.on_address_changed) config_.on_address_changed(address);
    if (sleep) {
      pollfd fds[2] = {{efd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      ::poll(fds, 2, timeout_ms);
      sleeping_.store(false, std::memory_order_release);
      uint64_t v;
      if (fds[1].revents & POLLIN) (void)!::read(wake_fd_, &v, sizeof(v));
      idle = 0;
    } else if (idle > 0) {
      ::sched_yield();
    }
  }
}

}  // namespace mooncake::ucx
