// Transport: the seam between the engine core and whatever moves bytes.
//
// The engine validates every request against the local and the remote registrations, cuts it
// into slices and hands the slices to the transport chosen for the peer. A transport moves
// them and reports each exactly once through Slice::task->OnSliceDone, from any thread, in
// any order. It never looks up address tables of its own for local memory: what reaches it
// is already checked. On the serving side it checks every remote-supplied range against the
// MemoryRegistry before touching a byte.
//
// Adding a transport: a folder under src/transport/, a class implementing this interface,
// and one line in src/engine/transport_registry.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/batch.h"
#include "engine/memory_registry.h"
#include "metadata/segment_desc.h"
#include "mooncake/options.h"
#include "mooncake/status.h"

namespace mooncake {

struct Slice;

// Intercepts a slice's completion (a transport staging device memory through host buffers
// hands the inner transport slices with a hook, and reports to the task itself once the
// bytes are in place). Called exactly once per hooked slice, from any thread.
class SliceHook {
 public:
  virtual void OnSliceDone(const Slice& slice, TransferStatusEnum result, uint64_t bytes,
                           const char* message) = 0;

 protected:
  ~SliceHook() = default;
};

struct Slice {
  TransferTask* task = nullptr;
  TransferRequest::OpCode opcode = TransferRequest::READ;
  uint64_t local = 0;   // local address
  uint64_t remote = 0;  // absolute address in the peer
  uint64_t length = 0;
  int local_device = -1;   // CUDA device of the local memory, -1 for host memory
  // The peer's buffer holding the remote range (valid while the peer's descriptor is held).
  const BufferDesc* remote_buffer = nullptr;
  SliceHook* hook = nullptr;  // when set, completion goes to it instead of the task
  uint64_t hook_cookie = 0;   // the hook's own use

  // Reports the slice (to the hook if any, else to its task).
  void Done(TransferStatusEnum result, uint64_t bytes, const char* message = nullptr) const {
    if (hook != nullptr) {
      hook->OnSliceDone(*this, result, bytes, message);
    } else {
      task->OnSliceDone(result, bytes, message);
    }
  }
};

// What a transport gets from the engine at start.
struct TransportContext {
  EngineOptions options;
  MemoryRegistry* registry = nullptr;  // outlives the transport
  std::string local_host;              // host part of the segment name
  // Called (from a transport thread) when a peer's connection fails: its cached descriptor
  // is dropped so the next request fetches it again (a restarted peer is found anew).
  std::function<void(const std::string& segment_name)> on_peer_failure;
  // True when the caller named this transport (Init's `transport`), false when every
  // built-in one was started: a transport that would not be the best choice for a peer (ucx
  // over plain TCP sockets) declines peers in CanReach unless it was named.
  bool chosen_by_name = false;
  // The protocol Init was given ("", "rdma", "ucx", ...), for transports whose start-up
  // message depends on what was asked for.
  std::string protocol;
  // Called (from a transport thread, with none of its locks held) when a running transport
  // changes its own fields of the local descriptor: `update` runs under the engine's
  // descriptor lock, then the descriptor is published again (ucx: a rebuilt worker's address).
  std::function<void(const std::function<void(SegmentDesc*)>& update)> update_local_desc;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;

  // Starts listeners and fills this transport's fields of the local descriptor.
  virtual Status Start(const TransportContext& ctx, SegmentDesc* local_desc) = 0;
  // Stops listeners and connections; outstanding slices report FAILED. Idempotent.
  virtual void Stop() = 0;

  // Whether this transport can reach the peer described by `peer`. May contact the peer the
  // first time (and cache the answer); thread-safe.
  virtual bool CanReach(const SegmentDesc& peer) = 0;
  // Whether this transport moves bytes between local memory on `local_device` (-1: host)
  // and the peer's buffer `remote` (whose `device` says where it lives). The engine asks
  // this per request when either end is device memory, per peer otherwise. Default: host
  // memory at both ends only.
  virtual bool CanMove(const SegmentDesc& peer, const BufferDesc& remote, int local_device) {
    (void)peer;
    return remote.device < 0 && local_device < 0;
  }
  // Requests longer than this are cut into slices of this size.
  virtual uint64_t slice_size() const = 0;

  // Queues slices to the peer; they complete asynchronously. Returns an error only when
  // nothing was queued (every slice is then still owned by the caller).
  virtual Status Submit(const std::shared_ptr<const SegmentDesc>& peer, const Slice* slices,
                        size_t count) = 0;

  // Forget cached connections to a peer (its descriptor changed).
  virtual void DropPeer(const SegmentDesc& peer) = 0;

  // Memory registration, for transports that need a handle per range (ucx). The engine calls
  // RegisterMemory before a range is published and UnregisterMemory after the registry has
  // removed it (no local slice uses it any more); then no peer may reach it through this
  // transport. An error from RegisterMemory is logged and leaves the range without this
  // transport's fields (peers reach it over another transport). Thread-safe.
  virtual Status RegisterMemory(const RegionInfo& region) {
    (void)region;
    return Status::OK();
  }
  virtual void UnregisterMemory(uint64_t addr) { (void)addr; }
  // Fills this transport's fields of the descriptor's entry for a registered range.
  virtual void DescribeBuffer(const RegionInfo& region, BufferDesc* out) {
    (void)region;
    (void)out;
  }
};

// src/engine/transport_registry.cc: creates the built-in transport called `name`, or
// Unimplemented naming what is missing.
Result<std::unique_ptr<Transport>> CreateTransport(const std::string& name);
// Names of the transports built into this binary, best first.
std::vector<std::string> BuiltinTransports();

}  // namespace mooncake
