// OffloadService: a client's side of the disk tier (src/store/disk/README.md) that other
// clients call. A reader of a disk replica this client owns asks for the objects
// (OffloadRead); they are read from the DiskStore (each checked: version and CRC32C) into
// the offload buffer, shared memory the transfer engine serves, and the answer says where;
// the reader copies them with its engine and releases them (OffloadRelease), else they are
// taken back after hold_ms. Served on its own port with the master's RPC framing and bounds
// (rpc_server.h).
//
// Bounds: at most kMaxBatchItems keys a request; a batch that does not fit the buffer
// whole is answered per key (what fits, NO_AVAILABLE_HANDLE for the rest); a reader holds
// at most a quarter of the buffer (its other keys wait for its releases); batches live at
// most hold_ms.
//
// Lock: mu_, a leaf.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/thread_annotations.h"
#include "master.pb.h"
#include "mooncake/status.h"
#include "store/common/offset_allocator.h"
#include "store/disk/disk_store.h"
#include "store/rpc/rpc_server.h"

namespace mooncake {
class TransferEngine;

namespace store {

class OffloadService {
 public:
  struct Options {
    uint64_t buffer_size = 1342177280;  // MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES
    std::chrono::milliseconds hold{5000};  // MOONCAKE_OFFLOAD_CLIENT_BUFFER_GC_TTL_MS
    std::string host;                   // the address to serve on (the engine's host)
    std::string segment_name;           // the engine's segment name (readers open it)
  };
  // Allocates and registers the buffer with `engine` and starts serving on a free port.
  static Result<std::unique_ptr<OffloadService>> Start(TransferEngine* engine, DiskStore* disk,
                                                       Options options);
  ~OffloadService();  // Stop()
  void Stop();

  // host:port, for the master (MountLocalDiskRequest.endpoint).
  std::string endpoint() const;

  // Handles one OffloadRead locally (a reader in this very process): the same rules.
  rpc::OffloadReadResponse Read(const rpc::OffloadReadRequest& req) MC_EXCLUDES(mu_);
  // Only the reader the batch was read for releases it.
  void Release(uint64_t batch_id, const std::string& reader) MC_EXCLUDES(mu_);

  // Batches held now (tests); reads served.
  size_t batches() const MC_EXCLUDES(mu_);
  uint64_t reads_served() const { return reads_served_.load(); }

 private:
  OffloadService(TransferEngine* engine, DiskStore* disk, Options options);
  RpcStatus Handle(uint16_t method, const char* data, size_t n, std::string* out);
  void ExpireLocked(std::chrono::steady_clock::time_point now) MC_REQUIRES(mu_);

  struct Batch {
    std::string reader;
    std::vector<uint64_t> offsets;
    uint64_t bytes = 0;
    std::chrono::steady_clock::time_point expires;
  };

  TransferEngine* const engine_;
  DiskStore* const disk_;
  const Options opt_;
  char* buffer_ = nullptr;
  std::unique_ptr<RpcServer> server_;
  mutable Mutex mu_;
  AddressedAllocator alloc_ MC_GUARDED_BY(mu_);
  std::map<uint64_t, Batch> batches_ MC_GUARDED_BY(mu_);
  std::unordered_map<std::string, uint64_t> held_by_reader_ MC_GUARDED_BY(mu_);
  std::mt19937_64 batch_ids_ MC_GUARDED_BY(mu_);  // unguessable batch ids
  std::atomic<uint64_t> reads_served_{0};
};

}  // namespace store
}  // namespace mooncake
