// The local hot cache (MC_STORE_LOCAL_HOT_CACHE_SIZE): a client-side DRAM copy of objects this
// client read from other clients' segments, so that reading them again moves no bytes.
//
// Never stale: an entry is the value of (key, version), where version is the master's
// GetReplicaListResult.version, new for every put and upsert of the key. A get still asks the
// master (it must: the object may be gone or replaced, by any client) and serves from the cache
// only when the master names the cached version; otherwise it reads the replica and replaces
// the entry. Removes, upserts and overwrites by any client are therefore seen at once.
//
// Capacity is counted in bytes: each entry's value and key plus kEntryOverhead (the map's and
// list's nodes), so the cache never holds more than MC_STORE_LOCAL_HOT_CACHE_SIZE. Objects over
// one block (MC_STORE_LOCAL_HOT_BLOCK_SIZE, 16 MiB by default as upstream) are not cached.
// Upstream gives every entry a whole block, so 4 KiB objects fill a 1 GiB cache at 64
// entries; here they take what they use. The least recently used entries go first. Memory is
// taken per entry as it is filled, not reserved up front. Thread-safe; copies happen outside
// the lock.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/thread_annotations.h"
#include "mooncake/status.h"
#include "mooncake/store/store_client.h"

namespace mooncake {
namespace store {

class HotCache {
 public:
  struct Config {
    uint64_t capacity_bytes = 0;
    uint64_t block_size = 16 << 20;
  };
  static constexpr uint64_t kEntryOverhead = 128;
  // From MC_STORE_LOCAL_HOT_CACHE_SIZE and MC_STORE_LOCAL_HOT_BLOCK_SIZE: nullopt when the
  // cache is off (size unset, empty or 0); InvalidArgument, naming the variable and its value,
  // for anything but plain decimal bytes (no "8GB", signs or spaces), a block size of 0 or over
  // 1 GiB, or a cache smaller than one block.
  static Result<std::optional<Config>> FromEnv();

  explicit HotCache(Config config);

  // Copies (key, version)'s value into `parts` (at least `size` bytes; they may be device
  // memory, device_copy.h) and returns true when it is cached; version 0 (unknown) never
  // hits, and a failed device copy is a miss.
  bool Read(const std::string& key, uint64_t version, uint64_t size,
            const std::vector<Span>& parts);
  // Keeps a copy of `size` bytes of `parts` as (key, version)'s value, replacing any other
  // version of key; nothing when version is 0 or the value is over one block.
  void Fill(const std::string& key, uint64_t version, uint64_t size,
            const std::vector<Span>& parts);
  void Erase(const std::string& key);

  using Stats = StoreClient::HotCacheStats;  // enabled: true
  Stats stats() const;
  const Config& config() const { return config_; }

 private:
  struct Entry {
    uint64_t version;
    std::shared_ptr<const std::vector<char>> bytes;
    std::list<std::string>::iterator lru;  // position in lru_ (front: most recent)
  };
  void EraseLocked(std::unordered_map<std::string, Entry>::iterator it) MC_REQUIRES(mu_);

  static uint64_t Cost(const std::string& key, uint64_t size) {
    return size + key.size() + kEntryOverhead;
  }

  const Config config_;
  uint64_t used_ MC_GUARDED_BY(mu_) = 0;  // Cost() of every entry
  mutable Mutex mu_;
  std::unordered_map<std::string, Entry> entries_ MC_GUARDED_BY(mu_);
  std::list<std::string> lru_ MC_GUARDED_BY(mu_);
  Stats stats_ MC_GUARDED_BY(mu_);
};

}  // namespace store
}  // namespace mooncake
