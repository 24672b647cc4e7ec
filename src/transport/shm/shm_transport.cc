// The same-host transport: the initiator's hello (ConnectAndHello) and the Transport glue;
// the connections themselves are ShmStreams (shm_stream.cc).
#include "transport/shm/shm_transport.h"

#include <glog/logging.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <random>

#include "common/auth.h"
#include "transport/shm/shm_peer.h"
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
  // It reads the nonce it sends us back from here, through our pid (shm_wire.h): that binds
  // the connection to this process. Zero until then (a v1 target then accepts at once,
  // which tells us it is one).
  volatile uint8_t proof[kNonceSize] = {};
  HelloRequest hello;
  hello.proof_addr = reinterpret_cast<uint64_t>(&proof[0]);
  // Every step within the one deadline.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto left = [&] {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - std::chrono::steady_clock::now()).count();
    return static_cast<int>(std::max<int64_t>(1, ms));
  };
  MC_RETURN_IF_ERROR(WriteFull(fd.get(), &hello, sizeof(hello), left()));
  HelloReply reply;
  MC_RETURN_IF_ERROR(ReadFull(fd.get(), &reply, sizeof(reply), left()));
  if (reply.magic != kMagic) return Status::DataLoss("@" + path + ": bad hello reply");
  if (reply.status == kBadVersion || reply.status == kOk) {
    return Status::FailedPrecondition(
        "@" + path + " speaks same-host protocol v" +
        std::to_string(reply.status == kOk ? 1 : reply.version) + ", this process v" +
        std::to_string(kVersion) + ": upgrade both ends (using TCP meanwhile)");
  }
  if (reply.status == kChallenge) {
    uint8_t nonce[kNonceSize];
    MC_RETURN_IF_ERROR(ReadFull(fd.get(), nonce, sizeof(nonce), left()));
    for (uint32_t i = 0; i < kNonceSize; ++i) proof[i] = nonce[i];
    HelloProof written;
    MC_RETURN_IF_ERROR(WriteFull(fd.get(), &written, sizeof(written), left()));
    MC_RETURN_IF_ERROR(ReadFull(fd.get(), &reply, sizeof(reply), left()));
    if (reply.magic != kMagic) return Status::DataLoss("@" + path + ": bad hello reply");
    if (reply.status == kOk) return fd;
  }
  return Status::PermissionDenied(std::string("same-host target @") + path + " refused us: " +
                                  ProofRefusalReason(reply.err) + " (" +
                                  std::strerror(reply.err) + ")");
}

ShmTransport::~ShmTransport() { Stop(); }

void ShmTransport::Hold(const std::string& path, int fd, std::vector<MemoryRegion*> pins) {
  MutexLock lock(&zombie_mu_);
  if (reaper_stop_ || reaper_wake_ < 0) {
    for (MemoryRegion* r : pins) MemoryRegistry::Unpin(r);
    ::close(fd);
    return;
  }
  zombies_.push_back({path, fd, std::move(pins)});
  zombie_count_.store(zombies_.size());
  if (!reaper_.joinable()) reaper_ = std::thread([this] { ReapLoop(); });
  uint64_t one = 1;
  (void)!::write(reaper_wake_, &one, sizeof(one));
}

bool ShmTransport::HasZombie(const std::string& path) {
  for (const Zombie& z : zombies_) {
    if (z.path == path) return true;
  }
  return false;
}

Status ShmTransport::WaitForZombies(const std::string& path, int timeout_ms) {
  if (zombie_count_.load() == 0) return Status::OK();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  {
    MutexLock lock(&zombie_mu_);
    while (!reaper_stop_ && HasZombie(path)) {
      if (!zombie_cv_.WaitUntil(&zombie_mu_, deadline)) break;  // timed out: one last look
    }
    if (reaper_stop_ || !HasZombie(path)) return Status::OK();
  }
  return Status::DeadlineExceeded(
      "a connection to this peer given up on earlier is still open at the peer after " +
      std::to_string(timeout_ms) + " ms (MC_SLICE_TIMEOUT): the peer may still apply what it "
      "holds, so nothing newer is sent before it has closed it (is the peer stopped?)");
}

bool ShmTransport::ReapClosed() {
  bool reaped = false;
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
      reaped = true;
    } else {
      ++i;
    }
  }
  zombie_count_.store(zombies_.size());
  return reaped;
}

void ShmTransport::ReapLoop() {
  // Only this thread closes zombies (and Stop, after joining it), so it may poll their fds
  // without the lock.
  std::vector<pollfd> fds;
  for (;;) {
    {
      MutexLock lock(&zombie_mu_);
      if (reaper_stop_) return;
      if (ReapClosed()) zombie_cv_.SignalAll();
      fds.assign(1, pollfd{reaper_wake_, POLLIN, 0});
      for (const Zombie& z : zombies_) fds.push_back(pollfd{z.fd, POLLIN, 0});
    }
    // Wakes when a target closes (or answers) a zombie, or a new one arrives.
    if (::poll(fds.data(), fds.size(), 1000) > 0 && (fds[0].revents & POLLIN)) {
      uint64_t v;
      (void)!::read(reaper_wake_, &v, sizeof(v));
    }
  }
}

Status ShmTransport::Start(const TransportContext& ctx, SegmentDesc* local_desc) {
  options_ = ctx.options;
  on_peer_failure_ = ctx.on_peer_failure;
  registry_ = ctx.registry;
  export_limits_.max_map_per_conn = options_.shm_max_map_per_conn;
  export_limits_.max_map_total = options_.shm_max_map_total;
  if (!options_.enable_shm) return Status::Unimplemented("disabled by MC_DISABLE_SHM");
  // Let same-host peers read and write our registered memory where Yama restricts ptrace.
  ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  host_id_ = LocalHostId(options_);
  reaper_wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (reaper_wake_ < 0) return ErrnoStatus("eventfd", errno);
  server_ = std::make_unique<ShmServer>(options_, ctx.registry, local_desc->name,
                                        local_desc->mc_auth_instance);
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
    WriterLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    peers.swap(peers_);
    exports_.clear();
  }
  for (auto& [k, p] : peers) {
    for (auto& s : p->streams) s->Stop();
  }
  if (server_) server_->Stop();
  {
    MutexLock lock(&zombie_mu_);
    reaper_stop_ = true;
    zombie_cv_.SignalAll();
    if (reaper_wake_ >= 0) {
      uint64_t one = 1;
      (void)!::write(reaper_wake_, &one, sizeof(one));
    }
  }
  if (reaper_.joinable()) reaper_.join();
  {
    MutexLock lock(&zombie_mu_);  // uncontended: the reaper is gone and Hold refuses now
    for (Zombie& z : zombies_) {
      for (MemoryRegion* r : z.pins) MemoryRegistry::Unpin(r);
      ::close(z.fd);
    }
    zombies_.clear();
    zombie_count_.store(0);
  }
  if (reaper_wake_ >= 0) ::close(reaper_wake_);
  reaper_wake_ = -1;
}

bool ShmTransport::CanReach(const SegmentDesc& peer) {
  if (peer.mc_shm_path.empty() || peer.mc_host_id != host_id_) return false;
  {
    ReaderLock lock(&mu_);
    auto it = reachable_.find(peer.mc_shm_path);
    if (it != reachable_.end()) return it->second;
  }
  auto fd = ConnectAndHello(peer.mc_shm_path, options_.tcp_connect_timeout_ms, options_.auth_secret,
                            Authenticator::AuthName(
                                peer.lookup_name.empty() ? peer.name : peer.lookup_name,
                                peer.mc_auth_instance));
  if (!fd.ok()) {
    LOG(WARNING) << "same-host transport to " << peer.name << " unavailable ("
                 << fd.status().ToString() << "); using TCP";
  }
  // What the target lends us to copy ourselves; without it the target copies everything.
  std::shared_ptr<const PeerExports> lent;
  if (fd.ok() && options_.shm_map_peers) {
    auto ex = FetchExports(std::move(*fd), options_.tcp_connect_timeout_ms, &export_limits_);
    if (ex.ok()) {
      lent = *ex;
      if (lent) {
        VLOG(1) << "same-host peer " << peer.name << " lends " << lent->ranges() << " ranges ("
                << lent->bytes() << " bytes): copied here with memcpy";
      }
    } else {
      LOG(WARNING) << "same-host peer " << peer.name << ": its memory is not mapped here ("
                   << ex.status().ToString() << "); it copies every slice itself";
    }
  }
  const bool ok = fd.ok();
  WriterLock lock(&mu_);
  reachable_[peer.mc_shm_path] = ok;
  if (lent) exports_[peer.mc_shm_path] = std::move(lent);
  return ok;
}

Status ShmTransport::Submit(const std::shared_ptr<const SegmentDesc>& desc, const Slice* slices,
                            size_t count) {
  std::shared_ptr<Peer> peer;
  std::shared_ptr<const PeerExports> lent;
  {
    ReaderLock lock(&mu_);
    if (stopped_) return Status::FailedPrecondition("same-host transport is stopped");
    auto it = peers_.find(desc->mc_shm_path);
    if (it != peers_.end()) peer = it->second;
    auto ex = exports_.find(desc->mc_shm_path);
    if (ex != exports_.end()) lent = ex->second;
  }
  if (lent && !lent->Alive()) {
    // The target exited (or broke the protocol): its pages are no place for our bytes. The
    // streams find out the same and report it.
    LOG(WARNING) << "same-host peer " << desc->name << " ended its loan of memory (exited?); "
                 << "its slices go over the connection again";
    WriterLock lock(&mu_);
    auto ex = exports_.find(desc->mc_shm_path);
    if (ex != exports_.end() && ex->second == lent) exports_.erase(ex);
    lent.reset();
  }
  // Slices in memory the target lends us are copied here (memcpy, no message), up to
  // kInlineBytes of them per call (kInlineBusyBytes while other threads copy too); the rest
  // go to the streams first, so that the target copies those meanwhile (a large batch keeps
  // both processes copying).
  thread_local std::vector<Slice> mine, rest;
  mine.clear();
  struct Copier {  // counted in inline_copiers_ while this call has lent memory to copy
    std::atomic<int>* n = nullptr;
    ~Copier() {
      if (n) n->fetch_sub(1, std::memory_order_relaxed);
    }
  } copier;
  if (lent) {
    rest.clear();
    copier.n = &inline_copiers_;
    // Alone: no other thread copying into lent memory, and the target idle on our streams.
    bool alone = inline_copiers_.fetch_add(1, std::memory_order_relaxed) == 0;
    for (size_t i = 0; alone && peer && i < peer->streams.size(); ++i) {
      alone = peer->streams[i]->queued_bytes() == 0;
    }
    uint64_t budget = alone ? kInlineBytes : kInlineBusyBytes;
    for (size_t i = 0; i < count; ++i) {
      const Slice& s = slices[i];
      if (s.local_device < 0 && s.length <= budget && lent->Covers(s)) {
        budget -= s.length;
        mine.push_back(s);
      } else {
        rest.push_back(s);
      }
    }
    slices = rest.data();
    count = rest.size();
  }
  if (count > 0) MC_RETURN_IF_ERROR(ToStreams(desc, peer, slices, count));
  if (mine.empty()) return Status::OK();
  // Ours while we report: a completion that submitted again on this thread would find the
  // thread's vectors empty, not ours changing under us.
  std::vector<Slice> todo;
  todo.swap(mine);
  std::vector<Slice> again;
  uint64_t copied = 0;
  std::vector<uint8_t> ok(todo.size());
  lent->Copy(todo.data(), todo.size(), ok.data());
  for (size_t i = 0; i < todo.size(); ++i) {
    if (ok[i]) {
      ++copied;
      todo[i].Done(COMPLETED, todo[i].length);
    } else {
      again.push_back(todo[i]);  // the loan ended meanwhile: the target decides
    }
  }
  if (copied) mapped_copies_.fetch_add(copied, std::memory_order_relaxed);
  todo.clear();
  if (mine.capacity() < todo.capacity()) mine.swap(todo);  // keep the room for the next call
  if (again.empty()) return Status::OK();
  // Some slices of this call are done already: an error may not go back to the engine
  // (it would end every slice of the call), so these end here.
  Status sent = ToStreams(desc, peer, again.data(), again.size());
  if (!sent.ok()) {
    const std::string why = sent.ToString();
    for (const Slice& s : again) s.Done(FAILED, 0, why.c_str());
  }
  return Status::OK();
}

Status ShmTransport::ToStreams(const std::shared_ptr<const SegmentDesc>& desc,
                               std::shared_ptr<Peer>& peer, const Slice* slices, size_t count) {
  if (!peer) {
    WriterLock lock(&mu_);
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
        const std::string& path = desc->mc_shm_path;
        slot->streams.push_back(std::make_unique<ShmStream>(
            path, options_, registry_, on_failure,
            [this, path](int fd, std::vector<MemoryRegion*> pins) {
              Hold(path, fd, std::move(pins));
            },
            [this, path](int timeout_ms) { return WaitForZombies(path, timeout_ms); },
            Authenticator::AuthName(desc->lookup_name.empty() ? desc->name : desc->lookup_name,
                                    desc->mc_auth_instance)));
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
  // A small request runs on this thread over an idle stream (ShmStream::TryInline): no
  // thread of ours or the target's sleeps in between when the target answers in time.
  if (count <= kMaxItems && options_.shm_spin_us > 0) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < count; ++i) bytes += slices[i].length;
    for (size_t i = 0; bytes <= kInlineRoundTripBytes && i < n; ++i) {
      if (peer->streams[(first + i) % n]->TryInline(slices, count)) return Status::OK();
    }
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

uint64_t ShmTransport::SumOverStreams(uint64_t (ShmStream::*counter)() const) const {
  ReaderLock lock(&mu_);
  uint64_t n = 0;
  for (const auto& [path, peer] : peers_) {
    for (const auto& s : peer->streams) n += (s.get()->*counter)();
  }
  return n;
}

void ShmTransport::DropPeer(const SegmentDesc& desc) {
  std::shared_ptr<Peer> peer;
  {
    WriterLock lock(&mu_);
    reachable_.erase(desc.mc_shm_path);
    exports_.erase(desc.mc_shm_path);
    auto it = peers_.find(desc.mc_shm_path);
    if (it == peers_.end()) return;
    peer = std::move(it->second);
    peers_.erase(it);
  }
  for (auto& s : peer->streams) s->Stop();
}

}  // namespace mooncake::shm
