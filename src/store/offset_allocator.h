// OffsetAllocator: best-fit allocation of [offset, offset+size) ranges inside one contiguous
// region of `capacity` bytes, with neighbouring free ranges merged on release. The master
// uses one per mounted segment (placement only: it never touches the memory); the client uses
// one over its local staging buffer. Not thread safe: callers hold their own lock.
//
// Every allocation is rounded up to `alignment` (a power of two), so offsets stay aligned.
// Allocate and Free are O(log n) in the number of free ranges.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace mooncake {
namespace store {

class OffsetAllocator {
 public:
  explicit OffsetAllocator(uint64_t capacity, uint64_t alignment = 64);

  // The offset of a free range of at least `size` bytes (the smallest that fits), or nullopt.
  // A size of 0 is refused (nullopt).
  std::optional<uint64_t> Allocate(uint64_t size);
  // Releases the range Allocate returned at `offset`. Returns false (and changes nothing) for
  // an offset that is not the start of a live allocation.
  bool Free(uint64_t offset);

  uint64_t capacity() const { return capacity_; }
  uint64_t allocated() const { return allocated_; }
  uint64_t largest_free() const;
  size_t live_allocations() const { return live_.size(); }

 private:
  void InsertFree(uint64_t offset, uint64_t size);
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_;
  uint64_t alignment_;
  uint64_t allocated_ = 0;
  std::map<uint64_t, uint64_t> free_by_offset_;          // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (size, offset)
  std::map<uint64_t, uint64_t> live_;                     // offset -> rounded size
};

}  // namespace store
}  // namespace mooncake
