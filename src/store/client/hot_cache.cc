#include "store/client/hot_cache.h"

#include <cstdlib>

#include "store/client/device_copy.h"

namespace mooncake {
namespace store {
namespace {

// A plain decimal number of bytes (digits only, below 2^63); nullopt for anything else.
std::optional<uint64_t> PlainBytes(const std::string& s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

}  // namespace

Result<std::optional<HotCache::Config>> HotCache::FromEnv() {
  const std::string size = Env("MC_STORE_LOCAL_HOT_CACHE_SIZE");
  if (size.empty()) return std::optional<Config>();
  auto bytes = PlainBytes(size);
  if (!bytes) {
    return Status::InvalidArgument("MC_STORE_LOCAL_HOT_CACHE_SIZE=\"" + size +
                                   "\" is not a plain number of bytes (e.g. 1073741824)");
  }
  if (*bytes == 0) return std::optional<Config>();
  Config c;
  c.capacity_bytes = *bytes;
  const std::string block = Env("MC_STORE_LOCAL_HOT_BLOCK_SIZE");
  if (!block.empty()) {
    auto b = PlainBytes(block);
    if (!b || *b == 0 || *b > (uint64_t{1} << 30)) {
      return Status::InvalidArgument("MC_STORE_LOCAL_HOT_BLOCK_SIZE=\"" + block +
                                     "\" is not a plain number of bytes from 1 to 1073741824");
    }
    c.block_size = *b;
  }
  if (c.capacity_bytes < c.block_size) {
    return Status::InvalidArgument(
        "MC_STORE_LOCAL_HOT_CACHE_SIZE=" + size + " is less than one block (" +
        std::to_string(c.block_size) + " bytes, MC_STORE_LOCAL_HOT_BLOCK_SIZE)");
  }
  return std::optional<Config>(c);
}

HotCache::HotCache(Config config) : config_(config) { stats_.enabled = true; }

bool HotCache::Read(const std::string& key, uint64_t version, uint64_t size,
                    const std::vector<Span>& parts) {
  std::shared_ptr<const std::vector<char>> bytes;
  {
    MutexLock l(&mu_);
    auto it = version == 0 ? entries_.end() : entries_.find(key);
    if (it == entries_.end() || it->second.version != version ||
        it->second.bytes->size() != size) {
      ++stats_.misses;
      return false;
    }
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    bytes = it->second.bytes;
    ++stats_.hits;
  }
  size_t at = 0;
  for (const Span& p : parts) {
    if (at == bytes->size()) break;
    const size_t n = std::min(p.size, bytes->size() - at);
    // The caller's memory may be device memory (device_copy.h); a failed copy is a miss.
    if (!CopyBytes(p.ptr, bytes->data() + at, n).ok()) {
      MutexLock l(&mu_);
      --stats_.hits;
      ++stats_.misses;
      return false;
    }
    at += n;
  }
  return true;
}

void HotCache::Fill(const std::string& key, uint64_t version, uint64_t size,
                    const std::vector<Span>& parts) {
  if (version == 0 || size > config_.block_size ||
      Cost(key, size) > config_.capacity_bytes) {
    return;
  }
  auto bytes = std::make_shared<std::vector<char>>(size);
  size_t at = 0;
  for (const Span& p : parts) {
    if (at == size) break;
    const size_t n = std::min(p.size, size - at);
    if (!CopyBytes(bytes->data() + at, p.ptr, n).ok()) return;
    at += n;
  }
  if (at != size) return;  // the parts did not hold the value
  MutexLock l(&mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    if (it->second.version > version) return;  // a newer value was filled meanwhile
    EraseLocked(it);
  }
  while (!lru_.empty() && used_ + Cost(key, size) > config_.capacity_bytes) {
    EraseLocked(entries_.find(lru_.back()));
    ++stats_.evictions;
  }
  used_ += Cost(key, size);
  lru_.push_front(key);
  entries_.emplace(key, Entry{version, std::move(bytes), lru_.begin()});
  ++stats_.fills;
  ++stats_.entries;
  stats_.bytes += size;
}

void HotCache::Erase(const std::string& key) {
  MutexLock l(&mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) EraseLocked(it);
}

void HotCache::EraseLocked(std::unordered_map<std::string, Entry>::iterator it) {
  stats_.bytes -= it->second.bytes->size();
  used_ -= Cost(it->first, it->second.bytes->size());
  --stats_.entries;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

HotCache::Stats HotCache::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

}  // namespace store
}  // namespace mooncake
