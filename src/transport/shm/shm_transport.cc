// Initiator side of the same-host transport, and the Transport glue.
#include "transport/shm/shm_transport.h"

#include <glog/logging.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <chrono>
#include <random>

#include "common/auth.h"
#include "transport/shm/shm_wire.h"

namespace mooncake::shm {

Result<UniqueFd> ConnectAndHello(const std::string& path, int timeout_ms,
                                 const std::string& auth_secret, const std::string& segment) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("unix socket", errno);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() + 1 > sizeof(addr.sun_path)) return Status::InvalidArgument("socket name too long");
  std::memcpy(addr.sun_path + 1, path.data(), path.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return ErrnoStatus("connect @" + path, errno);
  }
  MC_RETURN_IF_ERROR(Authenticator(auth_secret).Answer(fd.get(), "shm", segment, timeout_ms));
  // The target proves it may access our memory by reading this word.
  std::random_device rd;
  volatile uint64_t probe = (static_cast<uint64_t>(rd()) << 32) | rd() | 1;
  HelloRequest hello;
  hello.probe_addr = reinterpret_cast<uint64_t>(&probe);
  hello.probe_value = probe;
  MC_RETURN_IF_ERROR(WriteFull(fd.get(), &hello, sizeof(hello), timeout_ms));
  HelloReply reply;
  MC_RETURN_IF_ERROR(ReadFull(fd.get(), &reply, sizeof(reply), timeout_ms));
  if (reply.magic != kMagic) return Status::DataLoss("@" + path + ": bad hello reply");
  if (reply.status != kOk) {
    return Status::PermissionDenied(
        "the target may not access this process's memory (process_vm_readv: " +
        std::string(std::strerror(reply.err)) + "; ptrace policy or container)");
  }
  return fd;
}

ShmStream::ShmStream(std::string path, const EngineOptions& options, MemoryRegistry* registry,
                     std::function<void()> on_failure, Hold hold, std::string segment)
    : path_(std::move(path)),
      segment_(std::move(segment)),
      options_(options),
      on_failure_(std::move(on_failure)),
      hold_(std::move(hold)),
      registry_(registry) {
  thread_ = std::thread([this] { Run(); });
}

ShmStream::~ShmStream() { Stop(); }

void ShmStream::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  int fd = fd_.load();
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
}

void ShmStream::Enqueue(const Slice* slices, size_t count, uint64_t bytes) {
  queued_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      queue_.insert(queue_.end(), slices, slices + count);
      cv_.notify_one();
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
    s.task->OnSliceDone(result, 0, why.c_str());
  }
  slices.clear();
}

Status ShmStream::Connect() {
  auto fd = ConnectAndHello(path_, options_.tcp_connect_timeout_ms, options_.auth_secret, segment_);
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
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  size_t want = sizeof(h) + ranges.size() * sizeof(SharedRange);
  ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  if (n < 0) return ErrnoStatus("send shared ranges", errno);
  if (static_cast<size_t>(n) < want) {
    const char* rest = reinterpret_cast<const char*>(ranges.data()) + (n - sizeof(h));
    MC_RETURN_IF_ERROR(WriteFull(fd, rest, want - n, options_.slice_timeout_ms));
  }
  ReplyHeader rh;
  MC_RETURN_IF_ERROR(ReadFull(fd, &rh, sizeof(rh), options_.slice_timeout_ms));
  if (rh.magic != kMapMagic || rh.seq != h.seq) {
    return Status::DataLoss("malformed reply to the shared-range announcement");
  }
  if (rh.count != h.count) {
    LOG(WARNING) << "ShmTransport @" << path_ << ": the target mapped " << rh.count << " of "
                 << h.count << " shared ranges; the rest go through process_vm_readv/writev";
  }
  announced_version_ = version;
  return Status::OK();
}

Status ShmStream::SendRequest(int fd, const std::vector<Slice>& batch, uint64_t seq) {
  thread_local std::vector<Item> items;
  items.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    items[i] = {batch[i].local, batch[i].remote, batch[i].length,
                static_cast<uint32_t>(batch[i].opcode), 0};
  }
  RequestHeader h;
  h.count = static_cast<uint32_t>(batch.size());
  h.seq = seq;
  MC_RETURN_IF_ERROR(WriteFull(fd, &h, sizeof(h), options_.slice_timeout_ms));
  return WriteFull(fd, items.data(), items.size() * sizeof(Item), options_.slice_timeout_ms);
}

Status ShmStream::ReceiveReply(int fd, std::vector<Slice>& batch, uint64_t seq) {
  thread_local std::vector<uint32_t> statuses;
  ReplyHeader rh;
  MC_RETURN_IF_ERROR(ReadFull(fd, &rh, sizeof(rh), options_.slice_timeout_ms));
  if (rh.magic != kMagic || rh.seq != seq || rh.count != batch.size()) {
    return Status::DataLoss("malformed reply from the same-host target");
  }
  statuses.resize(batch.size());
  MC_RETURN_IF_ERROR(ReadFull(fd, statuses.data(), statuses.size() * sizeof(uint32_t),
                              options_.slice_timeout_ms));
  for (size_t i = 0; i < batch.size(); ++i) {
    const Slice& sl = batch[i];
    queued_bytes_.fetch_sub(sl.length, std::memory_order_relaxed);
    if (statuses[i] == kOk) {
      sl.task->OnSliceDone(COMPLETED, sl.length);
    } else {
      const char* why = statuses[i] == kRejected
                            ? "the target rejected the range: not within memory it registered "
                              "for remote access"
                            : "the target's process_vm_readv/writev failed (bad local address?)";
      sl.task->OnSliceDone(FAILED, 0, why);
    }
  }
  batch.clear();
  return Status::OK();
}

void ShmStream::Run() {
  // Up to kPipeline requests in flight, so the target finds the next one waiting when it
  // finishes a copy.
  constexpr size_t kPipeline = 2;
  constexpr uint64_t kMaxBytesPerRequest = 32 << 20;
  struct InFlight {
    std::vector<Slice> batch;
    uint64_t seq;
  };
  std::deque<InFlight> inflight;
  auto broken = [&](const Status& s, std::vector<Slice>* also) {
    LOG(WARNING) << "ShmTransport @" << path_ << ": " << s.ToString();
    const bool timeout = s.IsDeadlineExceeded();
    TransferStatusEnum result = timeout ? TIMEOUT : FAILED;
    int fd = fd_.exchange(-1);
    if (fd >= 0 && timeout && !inflight.empty() && hold_) {
      // A silent target may still copy into our memory when it resumes: keep the local
      // regions of the requests it holds pinned until it has closed the connection (it
      // does so once it has finished them, or when it dies). Unregistering them waits or
      // reports them in use meanwhile.
      std::vector<MemoryRegion*> pins;
      for (auto& f : inflight) {
        for (const Slice& sl : f.batch) {
          if (MemoryRegion* r = sl.task->local_region()) {
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
    for (auto& f : inflight) Fail(f.batch, result, "same-host peer: " + s.ToString());
    inflight.clear();
    if (also) Fail(*also, result, "same-host peer: " + s.ToString());
    // What is queued behind ends now too, not one connect timeout later.
    std::vector<Slice> queued;
    {
      std::lock_guard lock(mu_);
      queued.assign(queue_.begin(), queue_.end());
      queue_.clear();
    }
    Fail(queued, result, "same-host peer: " + s.ToString());
  };
  for (;;) {
    std::vector<Slice> batch;
    {
      std::unique_lock lock(mu_);
      if (inflight.empty()) cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) break;
      if (inflight.size() < kPipeline && !queue_.empty()) {
        // Bounded requests: the reply deadline (slice timeout) then measures progress, not
        // the size of what was queued.
        size_t n = 0;
        uint64_t bytes = 0;
        while (n < queue_.size() && n < kMaxItems && (n == 0 || bytes < kMaxBytesPerRequest)) {
          bytes += queue_[n].length;
          ++n;
        }
        batch.assign(queue_.begin(), queue_.begin() + n);
        queue_.erase(queue_.begin(), queue_.begin() + n);
      }
    }
    if (!batch.empty()) {
      if (fd_.load() < 0) {  // inflight is empty whenever the connection is down
        Status s = Connect();
        if (!s.ok()) {
          broken(s, &batch);
          continue;
        }
      }
      const int fd = fd_.load();
      if (registry_->version() != announced_version_) {
        // Announce shared ranges with nothing in flight, so replies stay in order.
        Status s;
        while (s.ok() && !inflight.empty()) {
          s = ReceiveReply(fd, inflight.front().batch, inflight.front().seq);
          if (s.ok()) inflight.pop_front();
        }
        if (s.ok()) s = SyncSharedRanges(fd);
        if (!s.ok()) {
          broken(s, &batch);
          continue;
        }
      }
      uint64_t seq = ++seq_;
      Status s = SendRequest(fd, batch, seq);
      if (!s.ok()) {
        broken(s, &batch);
        continue;
      }
      inflight.push_back({std::move(batch), seq});
      if (inflight.size() < kPipeline) continue;  // send another before waiting
    }
    if (!inflight.empty()) {
      Status s = ReceiveReply(fd_.load(), inflight.front().batch, inflight.front().seq);
      if (!s.ok()) {
        broken(s, nullptr);
        continue;
      }
      inflight.pop_front();
    }
  }
  for (auto& f : inflight) Fail(f.batch, FAILED, "the same-host connection was closed (engine stopping)");
  std::vector<Slice> rest;
  {
    std::lock_guard lock(mu_);
    rest.assign(queue_.begin(), queue_.end());
    queue_.clear();
  }
  Fail(rest, FAILED, "the same-host connection was closed (engine stopping)");
  int fd = fd_.exchange(-1);
  if (fd >= 0) ::close(fd);
}

ShmTransport::~ShmTransport() { Stop(); }

void ShmTransport::Hold(int fd, std::vector<MemoryRegion*> pins) {
  std::lock_guard lock(zombie_mu_);
  if (reaper_stop_) {
    for (MemoryRegion* r : pins) MemoryRegistry::Unpin(r);
    ::close(fd);
    return;
  }
  zombies_.push_back({fd, std::move(pins)});
  if (!reaper_.joinable()) reaper_ = std::thread([this] { ReapLoop(); });
  zombie_cv_.notify_all();
}

void ShmTransport::ReapLoop() {
  std::unique_lock lock(zombie_mu_);
  while (!reaper_stop_) {
    for (size_t i = 0; i < zombies_.size();) {
      char sink[4096];
      ssize_t n;
      do {
        n = ::recv(zombies_[i].fd, sink, sizeof(sink), MSG_DONTWAIT);
      } while (n > 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        for (MemoryRegion* r : zombies_[i].pins) MemoryRegistry::Unpin(r);
        ::close(zombies_[i].fd);
        zombies_[i] = std::move(zombies_.back());
        zombies_.pop_back();
      } else {
        ++i;
      }
    }
    zombie_cv_.wait_for(lock, std::chrono::milliseconds(100));
  }
}

Status ShmTransport::Start(const TransportContext& ctx, SegmentDesc* local_desc) {
  options_ = ctx.options;
  on_peer_failure_ = ctx.on_peer_failure;
  registry_ = ctx.registry;
  if (!options_.enable_shm) return Status::Unimplemented("disabled by MC_DISABLE_SHM");
  // Let same-host peers read and write our registered memory where Yama restricts ptrace.
  ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  host_id_ = LocalHostId(options_);
  server_ = std::make_unique<ShmServer>(options_, ctx.registry, local_desc->name);
  std::string path;
  MC_RETURN_IF_ERROR(server_->Start(&path));
  local_desc->mc_host_id = host_id_;
  local_desc->mc_pid = static_cast<uint64_t>(::getpid());
  local_desc->mc_shm_path = path;
  LOG(INFO) << "ShmTransport: unix socket @" << path;
  return Status::OK();
}

void ShmTransport::Stop() {
  std::map<std::string, std::shared_ptr<Peer>> peers;
  {
    std::unique_lock lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    peers.swap(peers_);
  }
  for (auto& [k, p] : peers) {
    for (auto& s : p->streams) s->Stop();
  }
  if (server_) server_->Stop();
  {
    std::lock_guard lock(zombie_mu_);
    reaper_stop_ = true;
    zombie_cv_.notify_all();
  }
  if (reaper_.joinable()) reaper_.join();
  for (Zombie& z : zombies_) {
    for (MemoryRegion* r : z.pins) MemoryRegistry::Unpin(r);
    ::close(z.fd);
  }
  zombies_.clear();
}

bool ShmTransport::CanReach(const SegmentDesc& peer) {
  if (peer.mc_shm_path.empty() || peer.mc_host_id != host_id_) return false;
  {
    std::shared_lock lock(mu_);
    auto it = reachable_.find(peer.mc_shm_path);
    if (it != reachable_.end()) return it->second;
  }
  auto fd = ConnectAndHello(peer.mc_shm_path, options_.tcp_connect_timeout_ms, options_.auth_secret,
                            peer.lookup_name.empty() ? peer.name : peer.lookup_name);
  if (!fd.ok()) {
    LOG(WARNING) << "same-host transport to " << peer.name << " unavailable ("
                 << fd.status().ToString() << "); using TCP";
  }
  std::unique_lock lock(mu_);
  reachable_[peer.mc_shm_path] = fd.ok();
  return fd.ok();
}

Status ShmTransport::Submit(const std::shared_ptr<const SegmentDesc>& desc, const Slice* slices,
                            size_t count) {
  std::shared_ptr<Peer> peer;
  {
    std::shared_lock lock(mu_);
    if (stopped_) return Status::FailedPrecondition("same-host transport is stopped");
    auto it = peers_.find(desc->mc_shm_path);
    if (it != peers_.end()) peer = it->second;
  }
  if (!peer) {
    std::unique_lock lock(mu_);
    if (stopped_) return Status::FailedPrecondition("same-host transport is stopped");
    auto& slot = peers_[desc->mc_shm_path];
    if (!slot) {
      slot = std::make_shared<Peer>();
      for (int i = 0; i < options_.shm_streams_per_peer; ++i) {
        std::function<void()> on_failure;
        if (on_peer_failure_) {
          std::string n = desc->name;
          on_failure = [cb = on_peer_failure_, n] { cb(n); };
        }
        slot->streams.push_back(std::make_unique<ShmStream>(
            desc->mc_shm_path, options_, registry_, on_failure,
            [this](int fd, std::vector<MemoryRegion*> pins) { Hold(fd, std::move(pins)); },
            desc->lookup_name.empty() ? desc->name : desc->lookup_name));
      }
    }
    peer = slot;
  }
  // Round-robin the slices over the streams, starting with the least loaded one.
  const size_t n = peer->streams.size();
  size_t first = 0;
  for (size_t i = 1; i < n; ++i) {
    if (peer->streams[i]->queued_bytes() < peer->streams[first]->queued_bytes()) first = i;
  }
  if (count == 1 || n == 1) {
    peer->streams[first]->Enqueue(slices, count, [&] {
      uint64_t b = 0;
      for (size_t i = 0; i < count; ++i) b += slices[i].length;
      return b;
    }());
    return Status::OK();
  }
  thread_local std::vector<std::vector<Slice>> groups;
  groups.resize(n);
  for (auto& g : groups) g.clear();
  // Contiguous shares keep each stream's items in address order (longer copy runs).
  size_t per = (count + n - 1) / n;
  for (size_t i = 0; i < count; ++i) groups[(first + i / per) % n].push_back(slices[i]);
  for (size_t i = 0; i < n; ++i) {
    if (groups[i].empty()) continue;
    uint64_t b = 0;
    for (const Slice& s : groups[i]) b += s.length;
    peer->streams[i]->Enqueue(groups[i].data(), groups[i].size(), b);
  }
  return Status::OK();
}

void ShmTransport::DropPeer(const SegmentDesc& desc) {
  std::shared_ptr<Peer> peer;
  {
    std::unique_lock lock(mu_);
    reachable_.erase(desc.mc_shm_path);
    auto it = peers_.find(desc.mc_shm_path);
    if (it == peers_.end()) return;
    peer = std::move(it->second);
    peers_.erase(it);
  }
  for (auto& s : peer->streams) s->Stop();
}

}  // namespace mooncake::shm
