// MemoryRegistry: the ranges of this process's memory registered with the engine.
//
// Every byte the engine moves, locally or on behalf of a peer, lies inside a registered range
// that is pinned for the duration of the copy: Pin() finds the range that wholly contains
// [addr, addr + len) and counts one more user; Unpin() releases it. Remove() takes a range out
// of the table at once (no new Pin can find it) and then waits for its users to finish, so
// that the caller may free the memory as soon as Remove() returns OK.
//
// Thread-safe. Pin/Unpin take a shared lock only; Add/Remove an exclusive one.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/thread_annotations.h"
#include "mooncake/status.h"

namespace mooncake {

struct MemoryRegion {
  uint64_t begin = 0;
  uint64_t length = 0;
  std::string location;        // "cpu:0", "cuda:1", "*"...
  bool remote_accessible = true;
  int shared_fd = -1;     // memfd backing the range (AllocateSharedMemory), else -1
  int device = -1;        // CUDA device holding the range, or -1 (host memory)
  std::string ipc_handle; // device memory: exported IPC handle (hex), "" if none
  uint64_t ipc_offset = 0;  // of `begin` inside the allocation the handle names
  uint64_t sequence = 0;  // registration order
  // These two are guarded by the owning MemoryRegistry's mu_ (which the analysis cannot
  // name from here); only MemoryRegistry touches them.
  bool removing = false;  // being unregistered: Pin skips it, Add still sees it
  int export_slot = -1;   // its ExportSlot while lent to same-host peers (Export)
  std::atomic<int64_t> users{0};
  uint64_t end() const { return begin + length; }
};

struct RegionInfo {
  uint64_t addr;
  uint64_t length;
  std::string location;
  bool remote_accessible;
  int shared_fd = -1;  // memfd mapping the whole range at offset 0, or -1
  int device = -1;     // CUDA device (platform::kHostMemory = -1 for host memory)
  std::string ipc_handle = {};  // see MemoryRegion
  uint64_t ipc_offset = 0;
};

// Same-host peers may map memfd-backed ranges and copy with memcpy themselves (Export, the
// shm transport). Each lent range has one slot in a shared page (the export page), which the
// peers map too: a peer copies only while the slot's `gen` is the value it was given, and
// counts itself in `users` for the length of the copy. Remove changes `gen` first and then
// waits for `users`, so no honest peer copies into or out of a range once it is unregistered.
struct ExportSlot {
  std::atomic<uint64_t> gen;
  std::atomic<uint64_t> users;
};
static_assert(sizeof(ExportSlot) == 16, "wire layout: peers map the export page");

struct ExportedRange {
  uint64_t addr;
  uint64_t length;
  int fd;         // a duplicate of the range's memfd: the caller closes it
  uint32_t slot;  // index in the export page
  uint64_t gen;
};

struct ExportList {
  int page_fd = -1;  // a duplicate of the export page's memfd (-1 when nothing is lent)
  uint64_t page_bytes = 0;
  std::vector<ExportedRange> ranges;
};

class MemoryRegistry {
 public:
  // Slots in the export page (one page): at most this many ranges are lent at once.
  static constexpr uint32_t kExportSlots = 256;

  MemoryRegistry() = default;
  MemoryRegistry(const MemoryRegistry&) = delete;
  MemoryRegistry& operator=(const MemoryRegistry&) = delete;

  // Errors: InvalidArgument for a null address, zero length or a range that wraps around;
  // AlreadyExists when the range overlaps a registered one.
  Status Add(uint64_t addr, uint64_t length, const std::string& location,
             bool remote_accessible) MC_EXCLUDES(mu_);
  // Adds all or nothing; the entries must not overlap each other either.
  Status AddBatch(const std::vector<RegionInfo>& regions) MC_EXCLUDES(mu_);

  // `addr` must be the start of a registered range (NotFound otherwise). From the call on,
  // Pin no longer finds the range (new transfers touching it are refused) while Add still
  // sees it (no overlapping registration meanwhile). Waits up to `wait_ms` for in-flight
  // users; if they are still there, the range stays registered and FailedPrecondition is
  // returned, so memory in use is never reported free.
  Status Remove(uint64_t addr, int wait_ms) MC_EXCLUDES(mu_);

  // Returns the region wholly containing [addr, addr+len) with one more user, or nullptr.
  // With remote_only, ranges registered without remote access are not found.
  // len == 0 and wrap-around never match.
  MemoryRegion* Pin(uint64_t addr, uint64_t len, bool remote_only) MC_EXCLUDES(mu_) {
    return PinIf(addr, len, remote_only, /*while_removing=*/false);
  }
  // Like Pin (remote_only false), and also while a Remove waits for the range's users: for a
  // caller whose transfer holds a pin on the range and that must keep it past the transfer's
  // end (a UCX request reported TIMEOUT that UCX still owns), so that the Remove waiting
  // meanwhile cannot succeed under it.
  MemoryRegion* PinHeld(uint64_t addr, uint64_t len) MC_EXCLUDES(mu_) {
    return PinIf(addr, len, /*remote_only=*/false, /*while_removing=*/true);
  }
  static void Unpin(MemoryRegion* region) {
    region->users.fetch_sub(1, std::memory_order_release);
  }

  // True when [addr, addr+len) lies inside one registered range.
  bool Contains(uint64_t addr, uint64_t len) const MC_EXCLUDES(mu_);

  // In registration order (upstream lists descriptor buffers so; buffers[0] is the first).
  std::vector<RegionInfo> List() const MC_EXCLUDES(mu_);
  // Lends the ranges a same-host peer may map: host memory backed by a memfd
  // (AllocateSharedMemory), registered for remote access, not being removed; at most `max`
  // of them, each with its slot (see ExportSlot). The descriptors are duplicates the caller
  // closes. Errors: the export page could not be made (memfd_create, mmap).
  Result<ExportList> Export(size_t max) MC_EXCLUDES(mu_);
  ~MemoryRegistry();
  size_t size() const MC_EXCLUDES(mu_);
  // Bumped by every Add and every completed Remove.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }

 private:
  MemoryRegion* PinIf(uint64_t addr, uint64_t len, bool remote_only, bool while_removing)
      MC_EXCLUDES(mu_);
  // Index of the first region with begin > addr, minus one; -1 if none.
  long FindLocked(uint64_t addr) const MC_REQUIRES_SHARED(mu_);
  bool OverlapsLocked(uint64_t addr, uint64_t length) const MC_REQUIRES_SHARED(mu_);
  void InsertLocked(std::unique_ptr<MemoryRegion> region) MC_REQUIRES(mu_);

  Status MakeExportPageLocked() MC_REQUIRES(mu_);

  mutable RwMutex mu_;
  int export_fd_ MC_GUARDED_BY(mu_) = -1;                 // the export page's memfd
  ExportSlot* export_page_ MC_GUARDED_BY(mu_) = nullptr;  // kExportSlots slots, shared
  std::vector<uint32_t> free_slots_ MC_GUARDED_BY(mu_);
  uint64_t next_gen_ MC_GUARDED_BY(mu_) = 1;
  std::vector<std::unique_ptr<MemoryRegion>> regions_ MC_GUARDED_BY(mu_);  // sorted by begin
  uint64_t next_sequence_ MC_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> version_{0};
};

}  // namespace mooncake
