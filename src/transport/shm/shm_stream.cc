// Initiator side of the same-host transport: ShmStream, one connection to a target driven by
// its own thread (shm_wire.h, README.md in this folder).
#include <glog/logging.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "transport/shm/shm_transport.h"
#include "transport/shm/shm_wire.h"

namespace mooncake::shm {

ShmStream::ShmStream(std::string path, const EngineOptions& options, MemoryRegistry* registry,
                     std::function<void()> on_failure, Hold hold, Fence fence,
                     std::string segment)
    : path_(std::move(path)),
      segment_(std::move(segment)),
      options_(options),
      on_failure_(std::move(on_failure)),
      hold_(std::move(hold)),
      fence_(std::move(fence)),
      registry_(registry) {
  thread_ = std::thread([this] { Run(); });
}

ShmStream::~ShmStream() { Stop(); }

void ShmStream::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.SignalAll();
  int fd = fd_.load();
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
}

void ShmStream::Enqueue(const Slice* slices, size_t count, uint64_t bytes) {
  queued_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  {
    MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.insert(queue_.end(), slices, slices + count);
      cv_.Signal();
      return;
    }
  }
  std::vector<Slice> dropped(slices, slices + count);
  Fail(dropped, FAILED, "the same-host connection was closed (engine stopping)");
}

void ShmStream::Fail(std::vector<Slice>& slices, TransferStatusEnum result,
                     const std::string& why) {
  for (const Slice& s : slices) {
    queued_bytes_.fetch_sub(s.length, std::memory_order_relaxed);
    s.Done(result, 0, why.c_str());
  }
  slices.clear();
}

Status ShmStream::Connect() {
  // Bounded by the request's own deadline too: a stopped target's kernel still accepts the
  // connection, and its hello must not hold the request past the slice timeout.
  const int timeout = std::min(options_.tcp_connect_timeout_ms, options_.slice_timeout_ms);
  auto fd = ConnectAndHello(path_, timeout, options_.auth_secret, segment_);
  if (!fd.ok()) return fd.status();
  fd_.store(fd->Release());
  announced_version_ = UINT64_MAX;  // a new connection knows nothing yet
  return Status::OK();
}

Status ShmStream::SyncSharedRanges(int fd) {
  uint64_t version = registry_->version();
  if (version == announced_version_) return Status::OK();
  std::vector<SharedRange> ranges;
  std::vector<int> fds;
  for (const RegionInfo& r : registry_->List()) {
    if (r.shared_fd < 0 || ranges.size() == kMaxSharedRanges) continue;
    ranges.push_back({r.addr, r.length});
    fds.push_back(r.shared_fd);
  }
  if (ranges.empty() && announced_version_ == UINT64_MAX) {
    announced_version_ = version;  // nothing shared, nothing mapped there yet
    return Status::OK();
  }
  RequestHeader h;
  h.magic = kMapMagic;
  h.count = static_cast<uint32_t>(ranges.size());
  h.seq = ++seq_;
  iovec iov[2] = {{&h, sizeof(h)}, {ranges.data(), ranges.size() * sizeof(SharedRange)}};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxSharedRanges)];
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = ranges.empty() ? 1 : 2;
  AttachFds(&msg, control, fds.data(), fds.size());
  size_t want = sizeof(h) + ranges.size() * sizeof(SharedRange);
  ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  if (n < 0) return ErrnoStatus("send shared ranges", errno);
  if (static_cast<size_t>(n) < want) {
    const char* rest = reinterpret_cast<const char*>(ranges.data()) + (n - sizeof(h));
    MC_RETURN_IF_ERROR(WriteFull(fd, rest, want - n, options_.slice_timeout_ms));
  }
  MapReply rh;
  MC_RETURN_IF_ERROR(ReadFull(fd, &rh, sizeof(rh), options_.slice_timeout_ms));
  if (rh.magic != kMapMagic || rh.seq != h.seq) {
    return Status::DataLoss("malformed reply to the shared-range announcement");
  }
  if (rh.count != h.count) {
    static const char* const kWhy[] = {
        "", "descriptor count mismatch", "a range is not a sealed memfd of its length",
        "over the target's mapping cap (MC_SHM_MAX_MAP_PER_CONN_GB / MC_SHM_MAX_MAP_TOTAL_GB)",
        "mmap failed in the target",
        "the target holds its limit of passed descriptors"};
    LOG(WARNING) << "ShmTransport @" << path_ << ": the target mapped " << rh.count << " of "
                 << h.count << " shared ranges ("
                 << (rh.status < 6 ? kWhy[rh.status] : "unknown reason")
                 << "); the rest go through process_vm_readv/writev";
  }
  announced_version_ = version;
  return Status::OK();
}

Status ShmStream::SendRequest(int fd, const std::vector<Slice>& batch, uint64_t seq) {
  // One message, the header and the items, in one send where the socket takes it all.
  RequestHeader h;
  h.count = static_cast<uint32_t>(batch.size());
  h.seq = seq;
  out_.resize(sizeof(h) + batch.size() * sizeof(Item));
  std::memcpy(out_.data(), &h, sizeof(h));
  for (size_t i = 0; i < batch.size(); ++i) {
    const Item item{batch[i].local, batch[i].remote, batch[i].length,
                    static_cast<uint32_t>(batch[i].opcode), 0};
    std::memcpy(out_.data() + sizeof(h) + i * sizeof(Item), &item, sizeof(item));
  }
  return WriteFull(fd, out_.data(), out_.size(), options_.slice_timeout_ms);
}

Status ShmStream::ReadReply(int fd, Answered* out) {
  const InFlight& oldest = inflight_.front();
  ReplyHeader rh;
  MC_RETURN_IF_ERROR(ReadFull(fd, &rh, sizeof(rh), options_.slice_timeout_ms));
  if (rh.magic != kMagic || rh.seq != oldest.seq || rh.count != oldest.batch.size()) {
    return Status::DataLoss("malformed reply from the same-host target");
  }
  out->statuses.resize(oldest.batch.size());
  MC_RETURN_IF_ERROR(ReadFull(fd, out->statuses.data(), out->statuses.size() * sizeof(uint32_t),
                              options_.slice_timeout_ms));
  out->batch = std::move(inflight_.front().batch);
  inflight_.pop_front();
  return Status::OK();
}

void ShmStream::Complete(Answered& a) {
  for (size_t i = 0; i < a.batch.size(); ++i) {
    const Slice& sl = a.batch[i];
    queued_bytes_.fetch_sub(sl.length, std::memory_order_relaxed);
    if (a.statuses[i] == kOk) {
      sl.Done(COMPLETED, sl.length);
    } else {
      const char* why =
          a.statuses[i] == kRejected
              ? "the target rejected the range: not within memory it registered for remote "
                "access"
          : a.statuses[i] == kPeerExited
              ? "the target refused the copy: the process that opened this same-host "
                "connection has exited (a connection serves only the process that opened it)"
              : "the target's process_vm_readv/writev failed (bad local address?)";
      sl.Done(FAILED, 0, why);
    }
  }
  a.batch.clear();
}

namespace {
// Up to kPipeline requests in flight, so the target finds the next one waiting when it
// finishes a copy.
constexpr size_t kPipeline = 2;
// Bounded requests: the reply deadline (slice timeout) then measures progress, not the size
// of what was queued.
constexpr uint64_t kMaxBytesPerRequest = 32 << 20;
constexpr const char* kStopping = "the same-host connection was closed (engine stopping)";
}  // namespace

void ShmStream::Run() {
  for (;;) {
    std::vector<Slice> batch;
    if (!TakeBatch(&batch)) break;  // stopping
    if (!batch.empty()) {
      if (!SendBatch(batch)) continue;  // failed (the batch with it)
      if (inflight_.size() < kPipeline) continue;  // send another before waiting
    }
    if (!inflight_.empty()) {
      Status s = ReadReply(fd_.load(), &answered_);
      if (!s.ok()) {
        Broken(s, nullptr);
        continue;
      }
      // With nothing else to do, the connection is free before the slices are reported: a
      // caller that submits again from its completion finds the stream idle (TryInline).
      bool idle = false;
      if (inflight_.empty()) {
        MutexLock lock(&mu_);
        idle = idle_ = queue_.empty() && !stopping_;
      }
      Complete(answered_);
      if (idle) {
        MutexLock lock(&mu_);
        WaitWhileIdle();
      }
    }
  }
  for (auto& f : inflight_) Fail(f.batch, FAILED, kStopping);
  inflight_.clear();
  std::vector<Slice> rest = TakeQueue();
  Fail(rest, FAILED, kStopping);
  int fd = fd_.exchange(-1);
  if (fd >= 0) ::close(fd);
}

bool ShmStream::TakeBatch(std::vector<Slice>* batch) {
  MutexLock lock(&mu_);
  if (inflight_.empty()) {
    idle_ = true;
    WaitWhileIdle();
  }
  if (stopping_) return false;
  if (inflight_.size() < kPipeline && !queue_.empty()) {
    size_t n = 0;
    uint64_t bytes = 0;
    while (n < queue_.size() && n < kMaxItems && (n == 0 || bytes < kMaxBytesPerRequest)) {
      bytes += queue_[n].length;
      ++n;
    }
    batch->assign(queue_.begin(), queue_.begin() + n);
    queue_.erase(queue_.begin(), queue_.begin() + n);
  }
  return true;
}

void ShmStream::WaitWhileIdle() {
  // A submitting thread may run a request on the connection meanwhile (TryInline); what it
  // leaves in flight is ours again once it is done (inflight_ is read here only while no
  // caller has the connection).
  while (!stopping_ && (inline_ || (queue_.empty() && inflight_.empty()))) cv_.Wait(&mu_);
  while (inline_) cv_.Wait(&mu_);  // stopping: the caller gives the connection back first
  idle_ = false;
}

bool ShmStream::TryInline(const Slice* slices, size_t count) {
  if (count == 0 || count > kMaxItems || options_.shm_spin_us <= 0) return false;
  {
    MutexLock lock(&mu_);
    if (stopping_ || !idle_ || inline_ || !queue_.empty()) return false;
    inline_ = true;  // the connection is ours until EndInline
  }
  const int fd = fd_.load();
  if (fd < 0 || registry_->version() != announced_version_ || (fence_ && !fence_(0).ok())) {
    EndInline();  // to connect, announce or wait is the thread's work
    return false;
  }
  uint64_t bytes = 0;
  for (size_t i = 0; i < count; ++i) bytes += slices[i].length;
  queued_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  std::vector<Slice> batch(slices, slices + count);
  const uint64_t seq = ++seq_;
  Status sent = SendRequest(fd, batch, seq);
  if (!sent.ok()) {
    Broken(sent, &batch);
    EndInline();
    return true;
  }
  inflight_.push_back({std::move(batch), seq});
  // The whole reply, awake: only then is it read here, so this call never blocks on the
  // target. One message of the target's, so it arrives at once.
  const int want = static_cast<int>(sizeof(ReplyHeader) + count * sizeof(uint32_t));
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::microseconds(options_.shm_spin_us);
  int avail = 0;
  while ((::ioctl(fd, FIONREAD, &avail) != 0 || avail < want) &&
         std::chrono::steady_clock::now() < end) {
    ::sched_yield();  // a thread that has work here (the target's, on few cores) goes first
  }
  if (avail < want) {
    inline_left_.fetch_add(1, std::memory_order_relaxed);
    EndInline();
    return true;
  }
  inline_done_.fetch_add(1, std::memory_order_relaxed);
  Answered answered;
  Status got = ReadReply(fd, &answered);
  if (!got.ok()) Broken(got, nullptr);
  EndInline();
  Complete(answered);  // the connection is free again meanwhile
  return true;
}

void ShmStream::EndInline() {
  const bool left = !inflight_.empty();  // still ours: read before giving it back
  MutexLock lock(&mu_);
  inline_ = false;
  if (left) idle_ = false;  // the thread's now: no other caller may send before it replies
  // Wake the thread only when it has something to do (a needless wake-up costs as much as
  // the request).
  if (left || stopping_ || !queue_.empty()) cv_.SignalAll();
}

std::vector<Slice> ShmStream::TakeQueue() {
  std::vector<Slice> queued;
  MutexLock lock(&mu_);
  queued.assign(queue_.begin(), queue_.end());
  queue_.clear();
  return queued;
}

bool ShmStream::SendBatch(std::vector<Slice>& batch) {
  if (fd_.load() < 0) {  // inflight_ is empty whenever the connection is down
    Status s = Connect();
    if (!s.ok()) {
      Broken(s, &batch);
      return false;
    }
  }
  const int fd = fd_.load();
  if (registry_->version() != announced_version_) {
    // Announce shared ranges with nothing in flight, so replies stay in order.
    Status s;
    while (s.ok() && !inflight_.empty()) {
      s = ReadReply(fd, &answered_);
      if (s.ok()) Complete(answered_);
    }
    if (s.ok()) s = SyncSharedRanges(fd);
    if (!s.ok()) {
      Broken(s, &batch);
      return false;
    }
  }
  if (fence_) {
    Status fenced = fence_(options_.slice_timeout_ms);
    if (!fenced.ok()) {
      // The connection itself is fine; only this batch waited too long.
      Fail(batch, TIMEOUT, "same-host peer: " + fenced.ToString());
      return false;
    }
  }
  uint64_t seq = ++seq_;
  Status s = SendRequest(fd, batch, seq);
  if (!s.ok()) {
    Broken(s, &batch);
    return false;
  }
  inflight_.push_back({std::move(batch), seq});
  return true;
}

void ShmStream::Broken(const Status& s, std::vector<Slice>* also) {
  LOG(WARNING) << "ShmTransport @" << path_ << ": " << s.ToString();
  const bool timeout = s.IsDeadlineExceeded();
  TransferStatusEnum result = timeout ? TIMEOUT : FAILED;
  int fd = fd_.exchange(-1);
  if (fd >= 0 && !inflight_.empty() && hold_) {
    // A silent (or confused) target may still copy what it has received when it resumes:
    // keep the local regions of the requests it holds pinned until it has closed the
    // connection (it does so once it has finished them, or when it dies); unregistering
    // them waits or reports them in use meanwhile. Until then new requests to this peer
    // wait (fence_), so none of these copies can land after a later request completed.
    std::vector<MemoryRegion*> pins;
    for (auto& f : inflight_) {
      for (const Slice& sl : f.batch) {
        if (MemoryRegion* r = sl.task ? sl.task->local_region() : nullptr) {
          r->users.fetch_add(1, std::memory_order_acq_rel);
          pins.push_back(r);
        }
      }
    }
    ::shutdown(fd, SHUT_WR);
    hold_(fd, std::move(pins));
  } else if (fd >= 0) {
    ::close(fd);
  }
  // Drop the cached descriptor before anyone sees the failure, so a retry refetches it
  // (not on a timeout: a stopped peer's descriptor is not stale, and refetching it would
  // block the next submitter).
  if (!timeout && on_failure_) on_failure_();
  for (auto& f : inflight_) Fail(f.batch, result, "same-host peer: " + s.ToString());
  inflight_.clear();
  if (also) Fail(*also, result, "same-host peer: " + s.ToString());
  // What is queued behind ends now too, not one connect timeout later.
  std::vector<Slice> queued = TakeQueue();
  Fail(queued, result, "same-host peer: " + s.ToString());
}

}  // namespace mooncake::shm
