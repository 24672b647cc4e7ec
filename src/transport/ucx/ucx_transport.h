// UcxTransport: one-sided RMA (ucp_put_nbx / ucp_get_nbx) over UCX, for RDMA networks (ib,
// rc, dc) and GPU memory where the UCX library has CUDA. See README.md in this folder.
//
// Selection: with every transport started (Init's transport "" / "rdma"), it reaches a peer
// only when UCX's endpoint to it has an RDMA-class or GPU lane (ucx_env.h: FastLanes);
// otherwise shm and tcp keep the peer. Named (transport "ucx"), it reaches any peer that
// publishes a UCX worker address, over whatever lanes UCX has (UCX_TLS=tcp, sm, ...).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "common/thread_annotations.h"
#include "engine/transport.h"
#include "transport/ucx/ucx_worker.h"

namespace mooncake::ucx {

class UcxTransport : public Transport {
 public:
  UcxTransport() = default;
  ~UcxTransport() override;

  const char* name() const override { return "ucx"; }
  // Unavailable when libucp cannot be loaded or UCX finds no usable transport.
  Status Start(const TransportContext& ctx, SegmentDesc* local_desc) override;
  void Stop() override;
  bool CanReach(const SegmentDesc& peer) override;
  // Host memory at both ends; device memory at either end only where UCX has CUDA. The
  // peer's buffer must carry a key (mc_ucx_rkey).
  bool CanMove(const SegmentDesc& peer, const BufferDesc& remote, int local_device) override;
  // One put or get per slice; UCX fragments internally.
  uint64_t slice_size() const override { return kSliceSize; }
  Status Submit(const std::shared_ptr<const SegmentDesc>& peer, const Slice* slices,
                size_t count) override;
  void DropPeer(const SegmentDesc& peer) override;
  Status RegisterMemory(const RegionInfo& region) override;
  void UnregisterMemory(uint64_t addr) override;
  void DescribeBuffer(const RegionInfo& region, BufferDesc* out) override;

  static constexpr uint64_t kSliceSize = 16 << 20;

 private:
  std::unique_ptr<UcxWorker> worker_;
  bool chosen_by_name_ = false;
  // Registration calls may come after Stop (an engine unregistering memory as it shuts
  // down): they find the worker's memory table gone and do nothing.
  RwMutex state_mu_;
  bool stopped_ MC_GUARDED_BY(state_mu_) = false;
  Mutex mu_;
  std::map<std::string, bool> reach_ MC_GUARDED_BY(mu_);  // by peer name + worker address
};

}  // namespace mooncake::ucx
