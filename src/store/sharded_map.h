// ShardedMap: a hash map split into kShards std::unordered_maps by the key's hash, so that
// growing it rehashes one shard (1/kShards of the keys) at a time: with 10 million objects a
// rehash of one std::unordered_map walks every node under the master's lock (1.9 s of CPU
// measured by tools/master_bench); a shard's rehash walks about 40 thousand.
// The subset of std::unordered_map's interface the master uses, plus shard access for scans
// that resume at a (shard, bucket) position. Not thread safe. The master's object table uses
// it (an integer key works too: its std::hash is mixed before picking the shard).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>

namespace mooncake {
namespace store {

template <class K, class V, size_t kShards = 256>
class ShardedMap {
 public:
  using Shard = std::unordered_map<K, V>;
  using value_type = typename Shard::value_type;
  static constexpr size_t kShardCount = kShards;

  template <bool kConst>
  class Iter {
    using Map = std::conditional_t<kConst, const ShardedMap, ShardedMap>;
    using Inner = std::conditional_t<kConst, typename Shard::const_iterator,
                                     typename Shard::iterator>;

   public:
    using value_ref = std::conditional_t<kConst, const value_type&, value_type&>;
    Iter() = default;
    // A const iterator from a mutable one.
    template <bool C = kConst, class = std::enable_if_t<C>>
    Iter(const Iter<false>& o) : m_(o.m_), shard_(o.shard_), it_(o.it_) {}
    value_ref operator*() const { return *it_; }
    auto* operator->() const { return &*it_; }
    Iter& operator++() {
      ++it_;
      Settle();
      return *this;
    }
    bool operator==(const Iter& o) const {
      return shard_ == o.shard_ && (shard_ == kShards || it_ == o.it_);
    }
    bool operator!=(const Iter& o) const { return !(*this == o); }

   private:
    friend class ShardedMap;
    template <bool>
    friend class Iter;
    Iter(Map* m, size_t shard, Inner it) : m_(m), shard_(shard), it_(it) { Settle(); }
    // Moves past the ends of shards to the next element (or to end(): shard_ == kShards).
    void Settle() {
      while (shard_ < kShards && it_ == m_->shards_[shard_].end()) {
        if (++shard_ < kShards) it_ = m_->shards_[shard_].begin();
      }
    }
    Map* m_ = nullptr;
    size_t shard_ = kShards;
    Inner it_{};
  };
  using iterator = Iter<false>;
  using const_iterator = Iter<true>;

  static size_t ShardOf(const K& key) {
    // The top bits of the hash mixed (std::hash of an integer is the integer itself); the
    // shard's own buckets use the hash modulo a prime.
    const uint64_t h = static_cast<uint64_t>(std::hash<K>{}(key)) * 0x9e3779b97f4a7c15ull;
    return static_cast<size_t>(h >> 40) % kShards;
  }

  iterator begin() { return iterator(this, 0, shards_[0].begin()); }
  iterator end() { return iterator(this, kShards, {}); }
  const_iterator begin() const { return const_iterator(this, 0, shards_[0].begin()); }
  const_iterator end() const { return const_iterator(this, kShards, {}); }

  iterator find(const K& key) {
    const size_t s = ShardOf(key);
    auto it = shards_[s].find(key);
    return it == shards_[s].end() ? end() : iterator(this, s, it);
  }
  const_iterator find(const K& key) const {
    const size_t s = ShardOf(key);
    auto it = shards_[s].find(key);
    return it == shards_[s].end() ? end() : const_iterator(this, s, it);
  }
  size_t count(const K& key) const { return shards_[ShardOf(key)].count(key); }
  V& at(const K& key) { return shards_[ShardOf(key)].at(key); }

  template <class Key, class... Args>
  std::pair<iterator, bool> emplace(Key&& key, Args&&... args) {
    const size_t s = ShardOf(key);
    auto r = shards_[s].emplace(std::forward<Key>(key), std::forward<Args>(args)...);
    if (r.second) ++size_;
    return {iterator(this, s, r.first), r.second};
  }
  // Returns the element after `it`.
  iterator erase(iterator it) {
    auto next = shards_[it.shard_].erase(it.it_);
    --size_;
    return iterator(this, it.shard_, next);
  }
  size_t erase(const K& key) {
    const size_t n = shards_[ShardOf(key)].erase(key);
    size_ -= n;
    return n;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void max_load_factor(float f) {
    for (auto& s : shards_) s.max_load_factor(f);
  }
  // For scans that let go of the caller's lock between chunks (see RemoveWhere).
  Shard& shard(size_t i) { return shards_[i]; }

 private:
  std::array<Shard, kShards> shards_;
  size_t size_ = 0;
};

}  // namespace store
}  // namespace mooncake
