#include "store/common/offset_allocator.h"

#include <algorithm>

namespace mooncake {
namespace store {

namespace {

// Size classes: sizes below 8 have one each; above, each power of two is split into 8 by the
// three bits after the leading one. BinMin(BinOf(s)) <= s < BinMin(BinOf(s) + 1).
constexpr int kMantissaBits = 3;
constexpr uint64_t kSub = 1u << kMantissaBits;

uint32_t BinOf(uint64_t s) {
  if (s < kSub) return static_cast<uint32_t>(s);
  const int top = 63 - __builtin_clzll(s);
  const int shift = top - kMantissaBits;
  return (static_cast<uint32_t>(shift + 1) << kMantissaBits) |
         static_cast<uint32_t>((s >> shift) & (kSub - 1));
}

uint64_t BinMin(uint32_t bin) {
  if (bin < kSub) return bin;
  const int shift = static_cast<int>(bin >> kMantissaBits) - 1;
  return (kSub | (bin & (kSub - 1))) << shift;
}

}  // namespace

OffsetAllocator::OffsetAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity & ~(alignment - 1) & ((1ull << 63) - 1)), alignment_(alignment) {
  std::fill(std::begin(heads_), std::end(heads_), kNone);
  if (capacity_ == 0) return;
  const uint32_t all = NewNode();
  Node& n = N(all);
  n.offset = 0;
  n.size = capacity_;
  Link(all);
}

uint32_t OffsetAllocator::NewNode() {
  uint32_t i = spare_;
  if (i != kNone) {
    spare_ = N(i).bin_next;
  } else {
    if (nodes_ == kNone) return kNone;
    const int c = ChunkOf(nodes_);
    // Not value-initialized: the pages of a large chunk are touched only as nodes are used.
    if (!chunks_[c]) chunks_[c].reset(new Node[size_t{1} << (c + kFirstChunkBits)]);
    i = nodes_++;
  }
  N(i) = Node{0, 0, 0, kNone, kNone, kNone, kNone};
  return i;
}

void OffsetAllocator::ReleaseNode(uint32_t i) {
  Node& n = N(i);
  n.used = 0;
  n.size = 0;  // a spare is neither free (size > 0, unused) nor live: Free refuses it
  n.offset = UINT64_MAX;
  n.bin_next = spare_;
  spare_ = i;
}

void OffsetAllocator::Link(uint32_t i) {
  Node& n = N(i);
  const uint32_t bin = BinOf(n.size);
  n.bin_prev = kNone;
  n.bin_next = heads_[bin];
  if (heads_[bin] != kNone) N(heads_[bin]).bin_prev = i;
  heads_[bin] = i;
  bin_bits_[bin / 64] |= 1ull << (bin % 64);
  word_bits_ |= static_cast<uint8_t>(1u << (bin / 64));
  ++free_ranges_;
}

void OffsetAllocator::Unlink(uint32_t i) {
  Node& n = N(i);
  const uint32_t bin = BinOf(n.size);
  if (n.bin_prev != kNone) {
    N(n.bin_prev).bin_next = n.bin_next;
  } else {
    heads_[bin] = n.bin_next;
  }
  if (n.bin_next != kNone) N(n.bin_next).bin_prev = n.bin_prev;
  if (heads_[bin] == kNone) {
    bin_bits_[bin / 64] &= ~(1ull << (bin % 64));
    if (bin_bits_[bin / 64] == 0) word_bits_ &= static_cast<uint8_t>(~(1u << (bin / 64)));
  }
  --free_ranges_;
}

uint32_t OffsetAllocator::FirstBinFrom(uint32_t bin) const {
  if (bin >= kBins) return kBins;
  const uint32_t word = bin / 64;
  const uint64_t here = bin_bits_[word] & (~0ull << (bin % 64));
  if (here != 0) return word * 64 + static_cast<uint32_t>(__builtin_ctzll(here));
  const uint32_t later = word_bits_ & ~((2u << word) - 1);
  if (later == 0) return kBins;
  const uint32_t w = static_cast<uint32_t>(__builtin_ctz(later));
  return w * 64 + static_cast<uint32_t>(__builtin_ctzll(bin_bits_[w]));
}

std::optional<OffsetAllocation> OffsetAllocator::Allocate(uint64_t size) {
  if (size == 0 || size > capacity_) return std::nullopt;
  const uint64_t rounded = (size + alignment_ - 1) & ~(alignment_ - 1);
  const uint32_t own = BinOf(rounded);
  // Every range in a class above `own` fits; in `own` itself, only those of `rounded` or more.
  const uint32_t bin = FirstBinFrom(BinMin(own) == rounded ? own : own + 1);
  uint32_t i = bin < kBins ? heads_[bin] : kNone;
  if (i == kNone) {
    for (i = heads_[own]; i != kNone && N(i).size < rounded; i = N(i).bin_next) {
    }
  }
  if (i == kNone) return std::nullopt;
  uint32_t rest = kNone;
  if (N(i).size > rounded) {
    rest = NewNode();
    if (rest == kNone) return std::nullopt;  // 2^32 - 1 ranges: nothing more can be tracked
  }
  Unlink(i);
  Node& n = N(i);
  if (rest != kNone) {
    Node& r = N(rest);
    r.offset = n.offset + rounded;
    r.size = n.size - rounded;
    r.prev = i;
    r.next = n.next;
    if (n.next != kNone) N(n.next).prev = rest;
    n.next = rest;
    n.size = rounded;
    Link(rest);
  }
  n.used = 1;
  allocated_ += rounded;
  ++live_;
  return OffsetAllocation{n.offset, i};
}

bool OffsetAllocator::Free(OffsetAllocation a) {
  if (a.handle >= nodes_) return false;
  uint32_t i = a.handle;
  if (!N(i).used || N(i).offset != a.offset) return false;
  Node* n = &N(i);
  n->used = 0;
  allocated_ -= n->size;
  --live_;
  if (n->next != kNone && !N(n->next).used) {  // merge the free range after
    const uint32_t next = n->next;
    Node& m = N(next);
    Unlink(next);
    n->size += m.size;
    n->next = m.next;
    if (m.next != kNone) N(m.next).prev = i;
    ReleaseNode(next);
  }
  if (n->prev != kNone && !N(n->prev).used) {  // ... and the one before: it takes this one
    const uint32_t prev = n->prev;
    Node& p = N(prev);
    Unlink(prev);
    p.size += n->size;
    p.next = n->next;
    if (n->next != kNone) N(n->next).prev = prev;
    ReleaseNode(i);
    i = prev;
  }
  Link(i);
  return true;
}

std::optional<OffsetAllocation> OffsetAllocator::ClaimAscending(uint64_t offset, uint64_t size) {
  const uint64_t rounded = (size + alignment_ - 1) & ~(alignment_ - 1);
  if (size == 0 || (offset & (alignment_ - 1)) != 0 || offset < claim_end_ ||
      offset > capacity_ || rounded > capacity_ - offset || claim_tail_ == kNone ||
      claim_tail_ >= nodes_) {
    return std::nullopt;
  }
  const uint32_t t = claim_tail_;
  if (N(t).used || N(t).offset > offset || N(t).offset + N(t).size < offset + rounded) {
    return std::nullopt;  // something else allocated from it
  }
  // [tail.offset, offset) stays free in t; [offset, +rounded) is the claim; the rest a new tail.
  const bool gap = N(t).offset < offset;
  const bool rest = N(t).offset + N(t).size > offset + rounded;
  uint32_t u = t, r = kNone;
  if (gap) {
    u = NewNode();
    if (u == kNone) return std::nullopt;
  }
  if (rest) {
    r = NewNode();
    if (r == kNone) {
      if (gap) ReleaseNode(u);
      return std::nullopt;
    }
  }
  Unlink(t);
  const uint64_t end = N(t).offset + N(t).size;
  const uint32_t after = N(t).next;
  if (gap) {
    N(t).size = offset - N(t).offset;
    Node& un = N(u);
    un.offset = offset;
    un.prev = t;
    N(t).next = u;
    Link(t);
  }
  Node& un = N(u);
  un.offset = offset;
  un.size = rounded;
  un.used = 1;
  un.next = after;
  if (after != kNone) N(after).prev = u;
  if (rest) {
    Node& rn = N(r);
    rn.offset = offset + rounded;
    rn.size = end - (offset + rounded);
    rn.prev = u;
    rn.next = un.next;
    if (un.next != kNone) N(un.next).prev = r;
    un.next = r;
    Link(r);
  }
  allocated_ += rounded;
  ++live_;
  claim_end_ = offset + rounded;
  claim_tail_ = r;
  return OffsetAllocation{offset, u};
}

uint64_t OffsetAllocator::largest_free() const {
  for (int w = static_cast<int>(kBins / 64) - 1; w >= 0; --w) {
    if (bin_bits_[w] == 0) continue;
    const uint32_t bin = static_cast<uint32_t>(w) * 64 + 63 -
                         static_cast<uint32_t>(__builtin_clzll(bin_bits_[w]));
    uint64_t largest = 0;
    for (uint32_t i = heads_[bin]; i != kNone; i = N(i).bin_next) {
      largest = std::max<uint64_t>(largest, N(i).size);
    }
    return largest;
  }
  return 0;
}

std::optional<uint64_t> AddressedAllocator::Allocate(uint64_t size) {
  auto a = alloc_.Allocate(size);
  if (!a) return std::nullopt;
  handles_.emplace(a->offset, a->handle);
  return a->offset;
}

bool AddressedAllocator::Free(uint64_t offset) {
  auto it = handles_.find(offset);
  if (it == handles_.end()) return false;
  const bool freed = alloc_.Free({offset, it->second});
  handles_.erase(it);
  return freed;
}

}  // namespace store
}  // namespace mooncake
