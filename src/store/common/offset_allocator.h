// OffsetAllocator: [offset, offset+size) ranges inside one contiguous region of `capacity`
// bytes, neighbouring free ranges merged on release, in O(1) per Allocate and Free. The master
// uses one per mounted segment (placement only: it never touches the memory); clients use an
// AddressedAllocator (below) over their local staging buffer. Not thread safe: callers hold
// their own lock.
//
// How: every range, free or allocated, is a node in a pool (chunks of 64, 128, 256, ... nodes:
// no malloc per range, a node never moves, and an allocator with few ranges stays small),
// linked to its neighbours in address order. Free ranges
// sit in one of ~500 size classes (8 per power of two, so a class spans 12.5% of its sizes)
// with a bitmap of the classes that hold any: Allocate takes a range from the smallest class
// whose every range fits (a good fit, not always the best), or, when no larger class has one,
// looks through the sizes' own class, so a refusal still means that no free range is large
// enough. Free(handle) finds the node without a search and merges it with free neighbours.
//
// Every allocation is rounded up to `alignment` (a power of two), so offsets stay aligned.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>

namespace mooncake {
namespace store {

struct OffsetAllocation {
  uint64_t offset = 0;
  uint32_t handle = UINT32_MAX;  // the allocator's node: what Free needs
};

class OffsetAllocator {
 public:
  explicit OffsetAllocator(uint64_t capacity, uint64_t alignment = 64);
  OffsetAllocator(const OffsetAllocator&) = delete;
  OffsetAllocator& operator=(const OffsetAllocator&) = delete;

  // A free range of at least `size` bytes, or nullopt (size 0, or nothing large enough).
  std::optional<OffsetAllocation> Allocate(uint64_t size);
  // Releases what Allocate returned. Returns false (and changes nothing) for a handle that
  // does not name a live allocation at that offset (a handle names it until it is freed).
  bool Free(OffsetAllocation a);
  // Rebuilding an allocator from placements made elsewhere (an HA standby promoted to
  // leader: src/store/master/master_replica.cc): takes exactly [offset, offset + size
  // rounded up to the alignment) as allocated. Calls must come in increasing offset order on
  // an allocator nothing else has allocated from, each range after the previous one's end;
  // nullopt (nothing changes) for a range out of order, overlapping the previous one, past
  // the capacity, misaligned or empty.
  std::optional<OffsetAllocation> ClaimAscending(uint64_t offset, uint64_t size);

  uint64_t capacity() const { return capacity_; }
  uint64_t allocated() const { return allocated_; }
  uint64_t largest_free() const;
  size_t live_allocations() const { return live_; }
  size_t free_ranges() const { return free_ranges_; }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  static constexpr uint32_t kBins = 512;
  // Chunk c holds nodes [64 (2^c - 1), 64 (2^(c+1) - 1)): 26 chunks cover 2^32 nodes.
  static constexpr int kFirstChunkBits = 6;
  static constexpr int kChunks = 27;
  struct Node {
    uint64_t offset;
    uint64_t size : 63;
    uint64_t used : 1;
    uint32_t prev, next;          // neighbours in address order (kNone at the ends)
    uint32_t bin_prev, bin_next;  // free: the class's list; spare: bin_next links spares
  };
  static int ChunkOf(uint32_t i) {
    return 31 - __builtin_clz((i >> kFirstChunkBits) + 1);
  }
  static uint32_t ChunkStart(int c) { return ((1u << c) - 1) << kFirstChunkBits; }
  Node& N(uint32_t i) {
    const int c = ChunkOf(i);
    return chunks_[c][i - ChunkStart(c)];
  }
  const Node& N(uint32_t i) const {
    const int c = ChunkOf(i);
    return chunks_[c][i - ChunkStart(c)];
  }
  uint32_t NewNode();  // kNone when 2^32 - 1 nodes exist
  void ReleaseNode(uint32_t i);
  void Link(uint32_t i);    // into its size class's list
  void Unlink(uint32_t i);  // out of it
  uint32_t FirstBinFrom(uint32_t bin) const;  // kBins when none holds a range

  uint64_t capacity_;
  uint64_t alignment_;
  uint64_t allocated_ = 0;
  size_t live_ = 0;
  size_t free_ranges_ = 0;
  std::unique_ptr<Node[]> chunks_[kChunks];
  uint32_t nodes_ = 0;        // slots handed out of chunks_ so far
  uint32_t spare_ = kNone;    // released slots
  uint32_t claim_tail_ = 0;   // ClaimAscending: the free range at the end (kNone: none)
  uint64_t claim_end_ = 0;    // ClaimAscending: the end of the last range claimed
  uint32_t heads_[kBins];     // each class's list
  uint64_t bin_bits_[kBins / 64] = {};
  uint8_t word_bits_ = 0;     // which bin_bits_ words are non-zero
};

// An OffsetAllocator freed by offset alone (a buffer handed out as a pointer): an index of
// the live allocations beside it. For clients' staging buffers, where allocations are few.
class AddressedAllocator {
 public:
  explicit AddressedAllocator(uint64_t capacity, uint64_t alignment = 64)
      : alloc_(capacity, alignment) {}
  std::optional<uint64_t> Allocate(uint64_t size);
  // False (and nothing changes) for an offset that is not the start of a live allocation.
  bool Free(uint64_t offset);
  uint64_t capacity() const { return alloc_.capacity(); }
  uint64_t allocated() const { return alloc_.allocated(); }
  uint64_t largest_free() const { return alloc_.largest_free(); }
  size_t live_allocations() const { return alloc_.live_allocations(); }

 private:
  OffsetAllocator alloc_;
  std::unordered_map<uint64_t, uint32_t> handles_;  // offset -> handle
};

}  // namespace store
}  // namespace mooncake
