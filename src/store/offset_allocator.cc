#include "store/offset_allocator.h"

namespace mooncake {
namespace store {

OffsetAllocator::OffsetAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity & ~(alignment - 1)), alignment_(alignment) {
  if (capacity_ > 0) InsertFree(0, capacity_);
}

void OffsetAllocator::InsertFree(uint64_t offset, uint64_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void OffsetAllocator::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

std::optional<uint64_t> OffsetAllocator::Allocate(uint64_t size) {
  if (size == 0 || size > capacity_) return std::nullopt;
  const uint64_t rounded = (size + alignment_ - 1) & ~(alignment_ - 1);
  auto fit = free_by_size_.lower_bound({rounded, 0});
  if (fit == free_by_size_.end()) return std::nullopt;
  const uint64_t offset = fit->second;
  const uint64_t free_size = fit->first;
  EraseFree(free_by_offset_.find(offset));
  if (free_size > rounded) InsertFree(offset + rounded, free_size - rounded);
  live_.emplace(offset, rounded);
  allocated_ += rounded;
  return offset;
}

bool OffsetAllocator::Free(uint64_t offset) {
  auto live = live_.find(offset);
  if (live == live_.end()) return false;
  uint64_t start = offset;
  uint64_t size = live->second;
  allocated_ -= size;
  live_.erase(live);
  // Merge with the free neighbour after, then the one before.
  auto next = free_by_offset_.lower_bound(start);
  if (next != free_by_offset_.end() && next->first == start + size) {
    size += next->second;
    EraseFree(next);
  }
  auto after = free_by_offset_.lower_bound(start);
  if (after != free_by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      EraseFree(prev);
    }
  }
  InsertFree(start, size);
  return true;
}

uint64_t OffsetAllocator::largest_free() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

}  // namespace store
}  // namespace mooncake
