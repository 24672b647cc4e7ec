// TcpTransport: upstream-compatible TCP data path (protocol v1/v2), with persistent pipelined
// streams per peer. See README.md in this folder.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/thread_annotations.h"
#include "engine/transport.h"
#include "transport/tcp/tcp_server.h"
#include "transport/tcp/tcp_staging.h"
#include "transport/tcp/tcp_stream.h"

namespace mooncake::tcp {

class TcpTransport : public Transport {
 public:
  TcpTransport() = default;
  ~TcpTransport() override;

  const char* name() const override { return "tcp"; }
  Status Start(const TransportContext& ctx, SegmentDesc* local_desc) override;
  void Stop() override;
  bool CanReach(const SegmentDesc& peer) override;
  // Any memory at either end: device memory is staged through pinned host buffers
  // (tcp_staging.h) on whichever side holds it.
  bool CanMove(const SegmentDesc&, const BufferDesc&, int) override { return true; }
  uint64_t slice_size() const override { return options_.tcp_split_size; }
  Status Submit(const std::shared_ptr<const SegmentDesc>& peer, const Slice* slices,
                size_t count) override;
  void DropPeer(const SegmentDesc& peer) override;

  uint16_t data_port() const { return data_port_; }
  // Submits run on the submitting thread (TcpStream::TryInline), over all peers: completed
  // there / with slices left to a stream's thread (tests, benches).
  uint64_t inline_done() const { return SumOverStreams(&TcpStream::inline_done); }
  uint64_t inline_left() const { return SumOverStreams(&TcpStream::inline_left); }

 private:
  // A counter of every stream of every peer, added up.
  uint64_t SumOverStreams(uint64_t (TcpStream::*counter)() const) const MC_EXCLUDES(mu_);
  struct Peer {
    std::vector<std::unique_ptr<TcpStream>> streams;
  };
  static std::string PeerKey(const SegmentDesc& peer);
  std::shared_ptr<Peer> GetOrCreatePeer(const SegmentDesc& peer) MC_EXCLUDES(mu_);
  // Host-memory slices to the peer's streams. `may_wait`: a submit of less than 1 MiB may
  // run on this thread for up to MC_TCP_SPIN_US when its stream is idle (TcpStream::
  // TryInline); not for the device stagers' thread, which keeps its buffers in flight.
  Status SubmitHost(const std::shared_ptr<const SegmentDesc>& peer, const Slice* slices,
                    size_t count, bool may_wait = false);
  // The stager of `device`, created at first use.
  Result<DeviceStager*> StagerFor(int device) MC_EXCLUDES(stager_mu_, mu_);

  EngineOptions options_;
  std::function<void(const std::string&)> on_peer_failure_;
  uint16_t data_port_ = 0;
  std::unique_ptr<TcpServer> server_;
  mutable RwMutex mu_;
  std::map<std::string, std::shared_ptr<Peer>> peers_ MC_GUARDED_BY(mu_);
  // Fence sessions by peer key; kept when a peer is dropped, so that the connections it had
  // are still fenced by the next ones (tcp_fence.h).
  std::map<std::string, std::shared_ptr<PeerFence>> fences_ MC_GUARDED_BY(mu_);
  bool stopped_ MC_GUARDED_BY(mu_) = false;
  // StagerFor reads stopped_ under it.
  Mutex stager_mu_ MC_ACQUIRED_BEFORE(mu_);
  std::map<int, std::unique_ptr<DeviceStager>> stagers_ MC_GUARDED_BY(stager_mu_);  // by device
};

}  // namespace mooncake::tcp
