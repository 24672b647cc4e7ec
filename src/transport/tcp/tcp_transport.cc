#include "transport/tcp/tcp_transport.h"

#include <glog/logging.h>

#include <atomic>

#include "common/auth.h"

namespace mooncake::tcp {
namespace {

// Bounce buffers per device (each MC_TCP_SPLIT_SIZE bytes): slices staged at once.
constexpr size_t kStagingBuffers = 8;
// A submit of fewer bytes goes whole to one stream: spreading it wakes a stream thread and a
// target connection thread per lane for little to move. Batch gets of 128 x 4 KiB through the
// Store over TCP on 2 cores: 217-235k/s spread over 2 lanes, 248-283k/s on one; 16 KiB x 64
// (1 MiB) is faster spread (bench/results/2026-12-06-tcp-small-submits.md).
constexpr uint64_t kSpreadMinBytes = 1 << 20;

}  // namespace

TcpTransport::~TcpTransport() { Stop(); }

Status TcpTransport::Start(const TransportContext& ctx, SegmentDesc* local_desc) {
  options_ = ctx.options;
  on_peer_failure_ = ctx.on_peer_failure;
  uint16_t port = 0;
  MC_ASSIGN_OR_RETURN(UniqueFd fd, ListenTcpInRange(options_.min_rpc_port, options_.max_rpc_port,
                                                     1024, &port, options_.tcp_bind_address));
  server_ = std::make_unique<TcpServer>(options_, ctx.registry, local_desc->name,
                                        local_desc->mc_auth_instance);
  MC_RETURN_IF_ERROR(server_->Start(std::move(fd)));
  data_port_ = port;
  local_desc->tcp_data_port = port;
  local_desc->tcp_proto_version = 2;
  local_desc->mc_tcp_fence = true;
  LOG(INFO) << "TcpTransport: listen on port " << port;
  return Status::OK();
}

void TcpTransport::Stop() {
  std::map<std::string, std::shared_ptr<Peer>> peers;
  {
    WriterLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    peers.swap(peers_);
  }
  for (auto& [key, peer] : peers) {
    for (auto& s : peer->streams) s->Stop();
  }
  {
    MutexLock lock(&stager_mu_);
    for (auto& [device, stager] : stagers_) stager->Stop();
  }
  if (server_) server_->Stop();
}

bool TcpTransport::CanReach(const SegmentDesc& peer) {
  return peer.tcp_data_port != 0 && !peer.host.empty();
}

std::string TcpTransport::PeerKey(const SegmentDesc& peer) {
  return (peer.lookup_name.empty() ? peer.name : peer.lookup_name) + "@" + peer.host + ":" +
         std::to_string(peer.tcp_data_port) + "/v" +
         std::to_string(peer.tcp_proto_version >= 2 ? 2 : 1);
}

std::shared_ptr<TcpTransport::Peer> TcpTransport::GetOrCreatePeer(const SegmentDesc& desc) {
  std::string key = PeerKey(desc);
  {
    ReaderLock lock(&mu_);
    if (stopped_) return nullptr;
    auto it = peers_.find(key);
    if (it != peers_.end()) return it->second;
  }
  WriterLock lock(&mu_);
  if (stopped_) return nullptr;
  auto& slot = peers_[key];
  if (!slot) {
    auto peer = std::make_shared<Peer>();
    bool v2 = desc.tcp_proto_version >= 2 && !options_.tcp_force_v1;
    std::shared_ptr<PeerFence> fence;
    if (desc.mc_tcp_fence) {
      auto& f = fences_[key];
      if (!f) f = std::make_shared<PeerFence>();
      fence = f;
    }
    for (int i = 0; i < options_.tcp_streams_per_peer; ++i) {
      std::function<void()> on_failure;
      if (on_peer_failure_) {
        std::string name = desc.name;
        on_failure = [cb = on_peer_failure_, name] { cb(name); };
      }
      // Authenticated for the name the caller opened, not the one the descriptor claims, and
      // for the engine start that signed the descriptor (a stale one reaches nothing).
      peer->streams.push_back(std::make_unique<TcpStream>(
          desc.host, desc.tcp_data_port, v2, options_, on_failure,
          Authenticator::AuthName(desc.lookup_name.empty() ? desc.name : desc.lookup_name,
                                  desc.mc_auth_instance),
          fence));
    }
    slot = std::move(peer);
  }
  return slot;
}

Result<DeviceStager*> TcpTransport::StagerFor(int device) {
  MutexLock lock(&stager_mu_);
  auto& slot = stagers_[device];
  if (!slot) {
    {
      ReaderLock peers_lock(&mu_);
      if (stopped_) return Status::FailedPrecondition("TCP transport is stopped");
    }
    MC_ASSIGN_OR_RETURN(std::unique_ptr<BounceRing> ring,
                        BounceRing::Create(device, kStagingBuffers, options_.tcp_split_size));
    slot = std::make_unique<DeviceStager>(
        std::move(ring), [this](const std::shared_ptr<const SegmentDesc>& peer,
                                const Slice* slices, size_t count) {
          Status s = SubmitHost(peer, slices, count);
          if (!s.ok()) {
            for (size_t i = 0; i < count; ++i) slices[i].Done(FAILED, 0, s.ToString().c_str());
          }
        });
  }
  return slot.get();
}

Status TcpTransport::Submit(const std::shared_ptr<const SegmentDesc>& desc, const Slice* slices,
                            size_t count) {
  size_t first_device = 0;
  while (first_device < count && slices[first_device].local_device < 0) ++first_device;
  if (first_device == count) return SubmitHost(desc, slices, count, /*may_wait=*/true);
  // Local device memory: those slices go through the device's stager, the rest as usual.
  thread_local std::vector<Slice> host;
  host.assign(slices, slices + first_device);
  for (size_t i = first_device; i < count; ++i) {
    const Slice& s = slices[i];
    if (s.local_device < 0) {
      host.push_back(s);
      continue;
    }
    auto stager = StagerFor(s.local_device);
    if (!stager.ok()) {
      s.Done(FAILED, 0, ("stage device memory for TCP: " + stager.status().ToString()).c_str());
      continue;
    }
    (*stager)->Submit(desc, &s, 1);
  }
  if (host.empty()) return Status::OK();
  std::vector<Slice> mine;
  mine.swap(host);  // SubmitHost may re-enter Submit's thread_local through a stager
  Status st = SubmitHost(desc, mine.data(), mine.size(), /*may_wait=*/true);
  if (!st.ok()) {
    for (const Slice& s : mine) s.Done(FAILED, 0, st.ToString().c_str());
  }
  return Status::OK();
}

Status TcpTransport::SubmitHost(const std::shared_ptr<const SegmentDesc>& desc,
                                const Slice* slices, size_t count, bool may_wait) {
  if (desc->tcp_data_port == 0 || desc->host.empty()) {
    return Status::Unavailable("segment '" + desc->name + "' publishes no TCP data port");
  }
  std::shared_ptr<Peer> peer = GetOrCreatePeer(*desc);
  if (!peer) return Status::FailedPrecondition("TCP transport is stopped");
  const size_t n = peer->streams.size();
  uint64_t total = 0;
  for (size_t i = 0; i < count; ++i) total += slices[i].length;
  if (n == 1 || count == 1 || total < kSpreadMinBytes) {
    // Least-loaded stream takes everything; among equals, this thread's own (so that two
    // threads submitting at once to idle streams take one each).
    static std::atomic<size_t> next_thread{0};
    thread_local const size_t mine = next_thread.fetch_add(1, std::memory_order_relaxed);
    size_t best = mine % n;
    for (size_t k = 1; k < n; ++k) {
      const size_t i = (mine + k) % n;
      if (peer->streams[i]->queued_bytes() < peer->streams[best]->queued_bytes()) best = i;
    }
    // Under 1 MiB on an idle stream: on this thread (TcpStream::TryInline). A single large
    // slice, or everything with one lane, goes to the stream's thread as before.
    if (!may_wait || total >= kSpreadMinBytes ||
        !peer->streams[best]->TryInline(slices, count, total)) {
      peer->streams[best]->Enqueue(slices, count, total);
    }
    return Status::OK();
  }
  // Spread slices over the streams, each to the one with the fewest bytes queued.
  thread_local std::vector<std::vector<Slice>> groups;
  thread_local std::vector<uint64_t> load;
  groups.resize(n);
  load.resize(n);
  for (size_t i = 0; i < n; ++i) {
    groups[i].clear();
    load[i] = peer->streams[i]->queued_bytes();
  }
  for (size_t i = 0; i < count; ++i) {
    size_t best = 0;
    for (size_t j = 1; j < n; ++j) {
      if (load[j] < load[best]) best = j;
    }
    groups[best].push_back(slices[i]);
    load[best] += slices[i].length + 64;  // small requests still spread
  }
  for (size_t i = 0; i < n; ++i) {
    if (groups[i].empty()) continue;
    uint64_t bytes = 0;
    for (const Slice& s : groups[i]) bytes += s.length;
    peer->streams[i]->Enqueue(groups[i].data(), groups[i].size(), bytes);
  }
  return Status::OK();
}

uint64_t TcpTransport::SumOverStreams(uint64_t (TcpStream::*counter)() const) const {
  ReaderLock lock(&mu_);
  uint64_t n = 0;
  for (const auto& [key, peer] : peers_) {
    for (const auto& s : peer->streams) n += (s.get()->*counter)();
  }
  return n;
}

void TcpTransport::DropPeer(const SegmentDesc& desc) {
  std::shared_ptr<Peer> peer;
  {
    WriterLock lock(&mu_);
    auto it = peers_.find(PeerKey(desc));
    if (it == peers_.end()) return;
    peer = std::move(it->second);
    peers_.erase(it);
  }
  // Streams finish (fail) what they hold when stopped; other submitters may still hold the
  // peer, so the streams die with the last reference.
  for (auto& s : peer->streams) s->Stop();
}

}  // namespace mooncake::tcp
