// ManagedBufferPool: the memory behind allocate_managed_buffer / free_managed_buffer.
//
// Requests up to 256 MiB are rounded up to a power-of-two size class (8 KiB .. 256 MiB, 16
// classes, as upstream) and served from a per-class free list, refilled by carving 1 GiB
// arenas. Each arena is mapped once (anonymous, MAP_NORESERVE: pages cost memory only when
// touched), registered with the engine as one buffer, and kept until the pool dies. Larger
// requests get a mapping of their own, registered alone and unregistered/unmapped on free.
//
// Thread-safe. The pool unmaps everything in its destructor: the engine that registered the
// arenas must be destroyed (or have unregistered them) first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "mooncake/status.h"
#include "mooncake/transfer_engine.h"

namespace mooncake {
namespace pyapi {

class ManagedBufferPool {
 public:
  static constexpr size_t kMinClass = 8 << 10;
  static constexpr size_t kMaxClass = 256 << 20;
  static constexpr int kClasses = 16;
  static constexpr size_t kArenaSize = 1ull << 30;

  ManagedBufferPool() = default;
  ~ManagedBufferPool();
  ManagedBufferPool(const ManagedBufferPool&) = delete;
  ManagedBufferPool& operator=(const ManagedBufferPool&) = delete;

  // A block of at least `length` bytes inside memory registered with `engine`.
  // Errors: InvalidArgument (length 0), ResourceExhausted (mmap failed), or the engine's
  // registration error.
  Result<uintptr_t> Allocate(TransferEngine& engine, size_t length);
  // `addr` must come from Allocate and not be freed yet (NotFound otherwise); `length` must
  // fall in the same size class as the allocation (InvalidArgument otherwise).
  Status Free(TransferEngine& engine, uintptr_t addr, size_t length);

 private:
  static int ClassOf(size_t length);  // -1 for a dedicated mapping
  Result<uintptr_t> Carve(TransferEngine& engine, int cls);  // REQUIRES: mu_ held

  struct Mapping {
    void* base;
    size_t size;
  };
  std::mutex mu_;
  std::vector<Mapping> arenas_;                   // GUARDED_BY(mu_)
  size_t arena_used_ = kArenaSize;                // bytes carved from arenas_.back()
  std::vector<uintptr_t> free_[kClasses];         // GUARDED_BY(mu_)
  std::unordered_map<uintptr_t, int> live_;       // GUARDED_BY(mu_): block -> class
  std::unordered_map<uintptr_t, Mapping> dedicated_;  // GUARDED_BY(mu_)
};

}  // namespace pyapi
}  // namespace mooncake
