// CudaIpcTransport: same-host transfers whose remote end is another process's device memory.
// The owner exports a CUDA IPC handle for each registered device buffer (descriptor fields
// mc_ipc_handle / mc_ipc_offset); the initiator opens it once (cached per peer and handle,
// closed when the peer's descriptor changes and at Stop) and copies with cudaMemcpyAsync,
// device to device, or host to device and back where the local end is host memory. See
// README.md in this folder.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"
#include "engine/transport.h"
#include "platform/device.h"

namespace mooncake::cuda_ipc {

class CudaIpcTransport : public Transport {
 public:
  CudaIpcTransport() = default;
  ~CudaIpcTransport() override;

  const char* name() const override { return "cuda_ipc"; }
  // Unavailable (the transport is not offered) without a usable device backend.
  Status Start(const TransportContext& ctx, SegmentDesc* local_desc) override;
  void Stop() override;
  // Same host (mc_host_id), another process.
  bool CanReach(const SegmentDesc& peer) override;
  // The remote buffer is device memory with an IPC handle; the local end may be either.
  bool CanMove(const SegmentDesc& peer, const BufferDesc& remote, int local_device) override;
  uint64_t slice_size() const override { return kSliceSize; }
  Status Submit(const std::shared_ptr<const SegmentDesc>& peer, const Slice* slices,
                size_t count) override;
  void DropPeer(const SegmentDesc& peer) override;

  static constexpr uint64_t kSliceSize = 64ull << 20;

 private:
  struct Item {
    Slice slice;                               // unset for a close request
    std::shared_ptr<const SegmentDesc> peer;   // keeps slice.remote_buffer alive
    std::string close_peer;                    // set: close this peer's mappings
  };
  struct InFlight {
    Slice slice;
    platform::EventHandle event;
  };
  struct Mapping {
    void* base = nullptr;
    int device = -1;
  };
  void Run() MC_EXCLUDES(mu_);
  // Issues one slice's copy; reports it FAILED itself if that fails.
  void Issue(Item& item, std::deque<InFlight>* in_flight);
  Result<void*> MappingFor(const SegmentDesc& peer, const BufferDesc& buf);
  Result<platform::StreamHandle> StreamFor(int device);
  void CloseMappings(const std::string& peer_name);

  platform::DeviceBackend* dev_ = nullptr;
  std::string host_id_;

  Mutex mu_;
  CondVar cv_;
  std::deque<Item> queue_ MC_GUARDED_BY(mu_);
  bool stopping_ MC_GUARDED_BY(mu_) = false;
  bool started_ = false;
  std::thread thread_;

  // Owned by the worker thread.
  std::map<std::string, Mapping> mappings_;  // "<peer name>/<handle hex>"
  std::map<int, platform::StreamHandle> streams_;
  std::vector<platform::EventHandle> free_events_;
};

}  // namespace mooncake::cuda_ipc
