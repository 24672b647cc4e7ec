// Staging: the client's local buffer (local_buffer_size bytes), through which values in
// memory the engine does not know are copied on their way to or from a replica. It is
// registered with the engine for local use only (never in the segment's descriptor: a
// peer's request for a range in it is refused), as upstream does.
//
// Lock: mu_, a leaf.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "common/thread_annotations.h"
#include "mooncake/status.h"
#include "store/common/offset_allocator.h"

namespace mooncake {
class TransferEngine;

namespace store {

class Staging {
 public:
  // Maps `size` bytes and registers them with `engine` (which must outlive it). With
  // `huge_page_size` (2 MiB or 1 GiB; huge_pages.h) on HugeTLB pages of that size, `size`
  // a multiple of it; ResourceExhausted when the host's pool has too few free.
  static Result<std::unique_ptr<Staging>> Create(TransferEngine* engine, size_t size,
                                                 size_t huge_page_size = 0);
  ~Staging();  // Release()
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // `size` bytes of the buffer, or null: none free (with `wait`, none freed before
  // `deadline`), or released.
  char* Alloc(size_t size, bool wait, std::chrono::steady_clock::time_point deadline)
      MC_EXCLUDES(mu_);
  void Free(char* p) MC_EXCLUDES(mu_);

  // Unregisters and unmaps the buffer (kept mapped, and logged, when a transfer the engine
  // has not ended still uses it); Alloc returns null from then on. Idempotent.
  void Release() MC_EXCLUDES(mu_);

  char* base() const { return base_; }
  size_t size() const { return size_; }
  // The most one Alloc can return (size() rounded down to the allocator's alignment).
  size_t capacity() const { return capacity_; }

 private:
  Staging(TransferEngine* engine, char* base, size_t size);

  TransferEngine* const engine_;
  char* const base_;
  const size_t size_;
  const size_t capacity_;
  Mutex mu_;
  CondVar freed_;
  AddressedAllocator alloc_ MC_GUARDED_BY(mu_);
  bool released_ MC_GUARDED_BY(mu_) = false;
};

}  // namespace store
}  // namespace mooncake
