// Target memory a same-host initiator maps and copies itself, with memcpy on the submitting
// thread: no message, no thread hop, no copy by the target (shm_wire.h, "Export").
//
// The target lends only memfd-backed host memory registered for remote access
// (MemoryRegistry::Export). The initiator maps each range whole after checking it cannot lose
// pages under us (a memfd sealed against shrinking, at least as long as said), within the
// same mapping caps as the target's side (MC_SHM_MAX_MAP_PER_CONN_GB per peer,
// MC_SHM_MAX_MAP_TOTAL_GB in all). A copy runs only while the range's slot in the export page
// holds the gen the target gave, with the copier counted in the slot's users: the target's
// unregistration changes the gen, then waits for the users (engine/memory_registry.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/net.h"
#include "engine/memory_registry.h"
#include "engine/transport.h"
#include "mooncake/status.h"
#include "transport/shm/shm_maps.h"

namespace mooncake {
class PrefaultJob;
}

namespace mooncake::shm {

class PeerExports {
 public:
  PeerExports(const PeerExports&) = delete;
  PeerExports& operator=(const PeerExports&) = delete;
  ~PeerExports();

  // Copies each of the `n` slices (host memory here) with memcpy if its remote range lies in
  // a lent range that is still lent: copied[i] = 1; else 0 (the caller sends it to the
  // target instead). A run of slices in one range counts itself in the range's slot once.
  void Copy(const Slice* s, size_t n, uint8_t* copied) const;
  bool Copy(const Slice& s) const {
    uint8_t copied = 0;
    Copy(&s, 1, &copied);
    return copied != 0;
  }
  // Whether `s`'s remote range lies in a lent range (not whether the loan still holds).
  bool Covers(const Slice& s) const { return Find(s) != nullptr; }
  // False once the target's end of the export connection closed (it exited: what we would
  // copy would go to a dead process's pages) or sent anything (it may not): the loan is over.
  bool Alive() const;
  size_t ranges() const { return ranges_.size(); }
  uint64_t bytes() const { return mapped_; }

 private:
  friend Result<std::shared_ptr<const PeerExports>> FetchExports(UniqueFd, int, ShmLimits*);
  PeerExports(ShmLimits* limits, UniqueFd conn) : limits_(limits), conn_(std::move(conn)) {}
  struct Range {
    uint64_t addr;
    uint64_t length;
    uint8_t* ptr;
    ExportSlot* slot;
    uint64_t gen;
  };
  const Range* Find(const Slice& s) const;
  ShmLimits* const limits_;
  const UniqueFd conn_;  // the export connection, kept open while the loan lasts
  std::vector<Range> ranges_;  // sorted by addr, not overlapping
  // The ranges' page tables filled in the background where the target has the pages
  // (Prefaulter::Mode::kResidentOnly: nothing allocated for the target), so that the first
  // copies into a fresh mapping take no page fault per 4 KiB; cancelled before the unmap.
  std::vector<std::shared_ptr<PrefaultJob>> prefaults_;
  void* page_ = nullptr;
  uint64_t page_bytes_ = 0;
  uint64_t mapped_ = 0;  // bytes of ranges, counted in limits_->mapped
};

// Initiator: asks the target at the other end of `fd` (after the hello) for its lent memory
// and maps it; the connection stays with the loan (its end tells the target's exit). An
// empty set (nullptr) when the target lends none; an error when the target speaks no export
// or sends what we must not map (the caller then lets the target copy).
Result<std::shared_ptr<const PeerExports>> FetchExports(UniqueFd fd, int timeout_ms,
                                                        ShmLimits* limits);

// Target: answers one export request (sequence `seq`) on `fd`. Non-OK: the socket failed.
Status ServeExport(int fd, uint64_t seq, MemoryRegistry* registry, int timeout_ms);

}  // namespace mooncake::shm
