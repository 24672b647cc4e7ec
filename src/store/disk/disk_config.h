// The disk tier's settings: upstream's MOONCAKE_OFFLOAD_* environment variables (its
// FileStorageConfig / BucketBackendConfig: names, aliases and defaults), several roots, and the
// checks that refuse a bad value with a message naming the variable (upstream falls back to
// the default in silence).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mooncake/status.h"

namespace mooncake {
namespace store {

enum class DiskEvictionPolicy { kNone, kFifo, kLru };
// kBucket: a bucket file is fdatasync'd and renamed into place, and its directory synced,
// before any of its objects is reported; removals are synced before they are acknowledged.
// kNone: the page cache decides (a process crash loses nothing, a host crash may lose the
// newest buckets: their checksums catch it and they are dropped, never served).
enum class DiskFsyncPolicy { kNone, kBucket };

struct DiskConfig {
  // Offload roots, one directory each (a disk each, for bandwidth and capacity): the
  // ssd_offload_path argument, else MOONCAKE_OFFLOAD_FILE_STORAGE_PATH (upstream's default
  // /data/file_storage); several separated by ':' or ','.
  std::vector<std::string> roots;
  uint64_t total_size_limit = 2ull << 40;     // MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES
  uint64_t total_keys_limit = 10'000'000;     // MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT
  uint32_t heartbeat_interval_seconds = 10;   // MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS
  uint64_t local_buffer_size = 1342177280;    // MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES
  uint64_t bucket_size_limit = 256ull << 20;  // MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES
  uint64_t bucket_keys_limit = 500;           // MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT
  // MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE (alias MOONCAKE_BUCKET_MAX_TOTAL_SIZE): 0 is 90 %
  // of the roots' file systems.
  uint64_t bucket_max_total_size = 0;
  // MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY (alias MOONCAKE_BUCKET_EVICTION_POLICY): fifo
  // (default), lru, none (upstream reads any other value as none; here it is an error).
  DiskEvictionPolicy eviction_policy = DiskEvictionPolicy::kFifo;
  bool watermark_eviction = true;   // MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION
  double high_watermark = 0.90;     // MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO
  double low_watermark = 0.80;      // MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO
  bool use_uring = false;           // MOONCAKE_OFFLOAD_USE_URING (alias MOONCAKE_USE_URING)
  DiskFsyncPolicy fsync = DiskFsyncPolicy::kBucket;  // MOONCAKE_OFFLOAD_FSYNC (ours)
  // MOONCAKE_OFFLOAD_DIRECT_IO (ours): buckets written and read with O_DIRECT, past the
  // page cache.
  bool direct_io = true;

  using Getenv = std::function<const char*(const char*)>;
  // Reads the environment (`getenv`, replaceable for tests); `path` (setup's
  // ssd_offload_path), when not empty, names the roots instead of the variable. Every value
  // is checked, and the roots with CheckRoot.
  static Result<DiskConfig> FromEnvironment(const std::string& path, const Getenv& getenv);
  static Result<DiskConfig> FromEnvironment(const std::string& path);
};

// Refuses, naming it and saying what to do: an empty or relative path, one with a ".."
// component, one that does not exist, is not a directory, is a symbolic link, or cannot be
// written and searched by this process.
Status CheckRoot(const std::string& path);

// "a:b,c" -> {"a", "b", "c"} (empty parts dropped).
std::vector<std::string> SplitRoots(const std::string& s);

}  // namespace store
}  // namespace mooncake
