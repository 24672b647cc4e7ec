// ObjectTable: the master's key -> record table, built for a table of millions of records
// that every batch RPC probes a hundred keys at a time.
//
// - Records are heap nodes (std::pair<const std::string, V>) that never move, so the
//   master's lists can link through them (master_records.h: RecordList).
// - The index is open addressing with linear probing over 16-byte slots {hash, node}: a
//   lookup reads one slot line (no modulo: the capacity is a power of two), then the node
//   whose full 64-bit hash matched. std::unordered_map read a bucket, the node before the
//   chain, then the node: three dependent cache misses per key, most of GetReplicaList's
//   time (perf annotate, 2026-12-02).
// - The index is split into kShards tables by the hash's top bits, so a growth rehashes
//   1/kShards of the keys under the master's lock; a rehash moves slots only (each holds its
//   hash), never touching a node.
// - Erase leaves a tombstone (or an empty slot where the next one is empty); tombstones are
//   dropped when their shard is rehashed, which an insert does once live + dead slots pass
//   3/4 of it. Erase never moves a slot, so iterators other than the erased one stay valid
//   across erases; any insert may invalidate them.
// - Keys are hashed with SipHash under a random per-process key: keys a peer picks to
//   collide (std::hash's MurmurHash2 has collisions for every seed) cannot turn lookups
//   into walks of one long probe run.
// - Prefetch* let a batch issue its cache misses together (see MasterService's batch
//   handlers): the slots of every key, then their nodes, then each node's key bytes and list
//   neighbours, before the keys are handled one by one.
// - Scan walks the table in chunks across releases of the caller's lock; a shard rehashed
//   in between is walked again from its start (so each record present throughout is seen at
//   least once).
// Not thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "store/master/siphash.h"

namespace mooncake {
namespace store {

template <class V, size_t kShards = 256>
class ObjectTable {
  static_assert((kShards & (kShards - 1)) == 0 && kShards >= 2 && kShards <= 65536,
                "kShards: a power of two");
  static constexpr int kShardBits = __builtin_ctzll(kShards);
  static constexpr uint64_t kEmpty = 0, kDead = 1;

  struct Slot {
    uint64_t hash;  // kEmpty, kDead, or the node's hash (>= 2)
    void* node;
  };
  struct Shard {
    Slot* slots = nullptr;
    size_t mask = 0;  // capacity - 1; capacity 0 while slots is null
    size_t live = 0, dead = 0;
    uint64_t gen = 0;  // bumped by each rehash (Scan restarts the shard)
    size_t capacity() const { return slots ? mask + 1 : 0; }
  };

 public:
  using Entry = std::pair<const std::string, V>;
  using value_type = Entry;
  static constexpr size_t kShardCount = kShards;

  // SipHash-1-3 under this process's random key (siphash.h), so that no peer can choose
  // keys that collide; never kEmpty or kDead.
  static uint64_t Hash(std::string_view key) {
    const uint64_t h = KeyedHash(key);
    return h < 2 ? h + 2 : h;
  }

  template <bool kConst>
  class Iter {
    using Table = std::conditional_t<kConst, const ObjectTable, ObjectTable>;

   public:
    using ref = std::conditional_t<kConst, const Entry&, Entry&>;
    using ptr = std::conditional_t<kConst, const Entry*, Entry*>;
    Iter() = default;
    template <bool C = kConst, class = std::enable_if_t<C>>
    Iter(const Iter<false>& o) : t_(o.t_), shard_(o.shard_), slot_(o.slot_) {}
    ref operator*() const { return *static_cast<ptr>(t_->shards_[shard_].slots[slot_].node); }
    ptr operator->() const { return &**this; }
    Iter& operator++() {
      ++slot_;
      Settle();
      return *this;
    }
    bool operator==(const Iter& o) const { return shard_ == o.shard_ && slot_ == o.slot_; }
    bool operator!=(const Iter& o) const { return !(*this == o); }

   private:
    friend class ObjectTable;
    template <bool>
    friend class Iter;
    Iter(Table* t, size_t shard, size_t slot) : t_(t), shard_(shard), slot_(slot) { Settle(); }
    // Moves to the next live slot at or after this one (or to end(): shard_ == kShards).
    void Settle() {
      while (shard_ < kShards) {
        const Shard& s = t_->shards_[shard_];
        for (; slot_ < s.capacity(); ++slot_) {
          if (s.slots[slot_].hash > kDead) return;
        }
        ++shard_;
        slot_ = 0;
      }
    }
    Table* t_ = nullptr;
    size_t shard_ = kShards;
    size_t slot_ = 0;
  };
  using iterator = Iter<false>;
  using const_iterator = Iter<true>;

  ObjectTable() = default;
  ObjectTable(const ObjectTable&) = delete;
  ObjectTable& operator=(const ObjectTable&) = delete;
  ~ObjectTable() { clear(); }

  iterator begin() { return iterator(this, 0, 0); }
  iterator end() { return iterator(this, kShards, 0); }
  const_iterator begin() const { return const_iterator(this, 0, 0); }
  const_iterator end() const { return const_iterator(this, kShards, 0); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  iterator find(const std::string& key) { return find(key, Hash(key)); }
  iterator find(const std::string& key, uint64_t h) {
    const size_t s = ShardOf(h);
    const size_t at = Locate(shards_[s], key, h);
    return at == kNone ? end() : iterator(this, s, at);
  }
  const_iterator find(const std::string& key) const {
    const uint64_t h = Hash(key);
    const size_t s = ShardOf(h);
    const size_t at = Locate(shards_[s], key, h);
    return at == kNone ? end() : const_iterator(this, s, at);
  }
  size_t count(const std::string& key) const { return find(key) != end() ? 1 : 0; }

  // Inserts key -> V(args...) unless the key is there; may rehash the key's shard.
  template <class... Args>
  std::pair<iterator, bool> emplace(const std::string& key, Args&&... args) {
    const uint64_t h = Hash(key);
    const size_t s = ShardOf(h);
    Shard& sh = shards_[s];
    size_t at = Locate(sh, key, h);
    if (at != kNone) return {iterator(this, s, at), false};
    if ((sh.live + sh.dead + 1) * 4 > sh.capacity() * 3 ||
        (sh.capacity() > kShrinkFloor && (sh.live + 1) * 8 < sh.capacity())) {
      Rehash(&sh);
    }
    // The first slot on the key's probe path that holds no live node.
    for (at = h & sh.mask; sh.slots[at].hash > kDead; at = (at + 1) & sh.mask) {
    }
    Entry* e = new Entry(std::piecewise_construct, std::forward_as_tuple(key),
                         std::forward_as_tuple(std::forward<Args>(args)...));
    if (sh.slots[at].hash == kDead) --sh.dead;
    sh.slots[at] = Slot{h, e};
    ++sh.live;
    ++size_;
    return {iterator(this, s, at), true};
  }

  // Removes the record at `it` (deleting its node); returns the record after it.
  iterator erase(iterator it) {
    Shard& sh = shards_[it.shard_];
    delete static_cast<Entry*>(sh.slots[it.slot_].node);
    sh.slots[it.slot_] = Slot{kDead, nullptr};
    ++sh.dead;
    --sh.live;
    --size_;
    // A tombstone right before an empty slot ends no probe that could go on past it: it
    // and the tombstones before it become empty (erases that leave no trace on short runs).
    if (sh.slots[(it.slot_ + 1) & sh.mask].hash == kEmpty) {
      for (size_t i = it.slot_; sh.slots[i].hash == kDead; i = (i - 1) & sh.mask) {
        sh.slots[i].hash = kEmpty;
        --sh.dead;
      }
    }
    ++it;
    return it;
  }
  size_t erase(const std::string& key) {
    auto it = find(key);
    if (it == end()) return 0;
    erase(it);
    return 1;
  }

  void clear() {
    for (Shard& sh : shards_) {
      for (size_t i = 0; i < sh.capacity(); ++i) {
        if (sh.slots[i].hash > kDead) delete static_cast<Entry*>(sh.slots[i].node);
      }
      std::free(sh.slots);
      sh = Shard{};
    }
    size_ = 0;
  }

  // Batch lookups in three passes, each over every key of the batch before the next: the
  // slot (PrefetchSlot), then the node whose hash matches (PrefetchNode, which reads the
  // slots), then the node's key bytes and the records it links to (PrefetchKey(e): reads
  // the node; `more` names further addresses in it to prefetch, e.g. list neighbours).
  void PrefetchSlot(uint64_t h) const {
    const Shard& sh = shards_[ShardOf(h)];
    if (sh.slots) __builtin_prefetch(&sh.slots[h & sh.mask]);
  }
  // The node whose slot hash is h (the likely match), or null; prefetches it.
  const Entry* PrefetchNode(uint64_t h) const {
    const Shard& sh = shards_[ShardOf(h)];
    if (!sh.slots) return nullptr;
    for (size_t i = h & sh.mask;; i = (i + 1) & sh.mask) {
      const Slot& sl = sh.slots[i];
      if (sl.hash == kEmpty) return nullptr;
      if (sl.hash == h) {
        const auto* p = static_cast<const char*>(sl.node);
        for (size_t off = 0; off < sizeof(Entry); off += 64) __builtin_prefetch(p + off);
        return static_cast<const Entry*>(sl.node);
      }
    }
  }
  static void PrefetchKey(const Entry* e) {
    if (e != nullptr) __builtin_prefetch(e->first.data());
  }

  // A position for Scan; a fresh Cursor starts at the beginning.
  struct Cursor {
    size_t shard = 0;
    size_t slot = 0;
    uint64_t gen = 0;
    bool started = false;  // gen is the shard's as of the last visit
  };
  // Calls f(entry) for the records from `c` on until `max_visits` slots have been looked at
  // (live or not); f must not insert or erase (collect, then act). Returns true when the
  // whole table has been walked. Between calls the table may change: records erased are not
  // visited, records inserted may or may not be, and a shard rehashed since the last call
  // is walked again from its start.
  template <class F>
  bool Scan(Cursor* c, size_t max_visits, F&& f) {
    size_t visits = 0;
    while (c->shard < kShards && visits < max_visits) {
      Shard& sh = shards_[c->shard];
      if (!c->started || c->gen != sh.gen) {
        c->slot = 0;
        c->gen = sh.gen;
        c->started = true;
      }
      for (; c->slot < sh.capacity() && visits < max_visits; ++c->slot, ++visits) {
        if (sh.slots[c->slot].hash > kDead) f(*static_cast<Entry*>(sh.slots[c->slot].node));
      }
      if (c->slot >= sh.capacity()) {
        ++c->shard;
        c->slot = 0;
        c->started = false;
      }
    }
    return c->shard >= kShards;
  }

  // Index bytes (the slot arrays), for the memory figures.
  size_t index_bytes() const {
    size_t n = 0;
    for (const Shard& sh : shards_) n += sh.capacity() * sizeof(Slot);
    return n;
  }

 private:
  static constexpr size_t kNone = ~size_t{0};
  static constexpr size_t kMinCapacity = 8;
  static constexpr size_t kShrinkFloor = 1024;  // shards this small never shrink

  static size_t ShardOf(uint64_t h) { return static_cast<size_t>(h >> (64 - kShardBits)); }

  static size_t Locate(const Shard& sh, const std::string& key, uint64_t h) {
    if (!sh.slots) return kNone;
    for (size_t i = h & sh.mask;; i = (i + 1) & sh.mask) {
      const Slot& sl = sh.slots[i];
      if (sl.hash == kEmpty) return kNone;
      if (sl.hash == h && static_cast<const Entry*>(sl.node)->first == key) return i;
    }
  }

  // Rebuilds the shard's index at the size its live records call for (at most half full
  // after one more insert), without tombstones.
  void Rehash(Shard* sh) {
    size_t cap = kMinCapacity;
    while (cap < (sh->live + 1) * 2) cap *= 2;
    auto* slots = static_cast<Slot*>(std::calloc(cap, sizeof(Slot)));
    if (slots == nullptr) throw std::bad_alloc();
    const size_t mask = cap - 1;
    for (size_t i = 0; i < sh->capacity(); ++i) {
      const Slot& sl = sh->slots[i];
      if (sl.hash <= kDead) continue;
      size_t at = sl.hash & mask;
      while (slots[at].hash != kEmpty) at = (at + 1) & mask;
      slots[at] = sl;
    }
    std::free(sh->slots);
    sh->slots = slots;
    sh->mask = mask;
    sh->dead = 0;
    ++sh->gen;
  }

  Shard shards_[kShards];
  size_t size_ = 0;
};

}  // namespace store
}  // namespace mooncake
