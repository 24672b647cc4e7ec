#include "store/disk/disk_config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include <glog/logging.h>

namespace mooncake {
namespace store {
namespace {

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The first of `names` that is set (and not empty), or null.
const char* First(const DiskConfig::Getenv& env, std::initializer_list<const char*> names,
                  const char** which) {
  for (const char* n : names) {
    const char* v = env(n);
    if (v != nullptr && *v != '\0') {
      *which = n;
      return v;
    }
  }
  return nullptr;
}

Status ReadU64(const DiskConfig::Getenv& env, std::initializer_list<const char*> names,
               uint64_t min, uint64_t* out) {
  const char* which = nullptr;
  const char* v = First(env, names, &which);
  if (v == nullptr) return Status::OK();
  errno = 0;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || v[0] == '-' || x < min) {
    return Status::InvalidArgument(std::string(which) + "=\"" + v +
                                   "\" is not a whole number of at least " +
                                   std::to_string(min) + "; set it to one, or unset it");
  }
  *out = x;
  return Status::OK();
}

Status ReadBool(const DiskConfig::Getenv& env, std::initializer_list<const char*> names,
                bool* out) {
  const char* which = nullptr;
  const char* v = First(env, names, &which);
  if (v == nullptr) return Status::OK();
  const std::string s = Lower(v);
  if (s == "true" || s == "1" || s == "yes" || s == "on") {
    *out = true;
  } else if (s == "false" || s == "0" || s == "no" || s == "off") {
    *out = false;
  } else {
    return Status::InvalidArgument(std::string(which) + "=\"" + v +
                                   "\" is not true or false");
  }
  return Status::OK();
}

Status ReadRatio(const DiskConfig::Getenv& env, std::initializer_list<const char*> names,
                 double* out) {
  const char* which = nullptr;
  const char* v = First(env, names, &which);
  if (v == nullptr) return Status::OK();
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(x) || x <= 0.0 || x > 1.0) {
    return Status::InvalidArgument(std::string(which) + "=\"" + v +
                                   "\" is not a ratio in (0, 1]");
  }
  *out = x;
  return Status::OK();
}

}  // namespace

std::vector<std::string> SplitRoots(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ':' || c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

Status CheckRoot(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string what = "the SSD offload directory \"" + path + "\"";
  if (path.empty()) {
    return Status::InvalidArgument(
        "the SSD offload directory is empty: give ssd_offload_path or set "
        "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH to an existing absolute directory");
  }
  if (!fs::path(path).is_absolute()) {
    return Status::InvalidArgument(what + " is not an absolute path: give it from /");
  }
  for (const auto& part : fs::path(path)) {
    if (part == "..") {
      return Status::InvalidArgument(what + " has a \"..\" component: give the directory "
                                            "itself");
    }
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    return Status::NotFound(what + " cannot be read: " + std::strerror(errno) +
                            "; create it first");
  }
  if (S_ISLNK(st.st_mode)) {
    return Status::InvalidArgument(what + " is a symbolic link: give the directory it "
                                          "points to");
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument(what + " is not a directory");
  }
  if (::access(path.c_str(), W_OK | X_OK) != 0) {
    return Status::PermissionDenied(what + " is not writable by this process: " +
                                    std::strerror(errno));
  }
  return Status::OK();
}

Result<DiskConfig> DiskConfig::FromEnvironment(const std::string& path) {
  return FromEnvironment(path, [](const char* n) { return std::getenv(n); });
}

Result<DiskConfig> DiskConfig::FromEnvironment(const std::string& path, const Getenv& env) {
  DiskConfig c;
  const char* which = nullptr;
  std::string roots = path;
  if (roots.empty()) {
    const char* v = First(env, {"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"}, &which);
    roots = v != nullptr ? v : "/data/file_storage";
  }
  c.roots = SplitRoots(roots);
  if (c.roots.empty()) return Status::InvalidArgument("no SSD offload directory in \"" + roots + "\"");
  std::set<std::string> seen;
  for (const auto& r : c.roots) {
    MC_RETURN_IF_ERROR(CheckRoot(r));
    std::error_code ec;
    const std::string canon = std::filesystem::canonical(r, ec).string();
    if (!seen.insert(ec ? r : canon).second) {
      return Status::InvalidArgument("the SSD offload directory \"" + r +
                                     "\" is given twice");
    }
  }

  if (const char* b = First(env, {"MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR"}, &which)) {
    const std::string s = b;
    if (s == "file_per_key_storage_backend" || s == "offset_allocator_storage_backend") {
      LOG(WARNING) << "MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR=" << s
                   << ": this build stores every object in bucket files "
                      "(bucket_storage_backend); they survive restarts either way";
    } else if (s != "bucket_storage_backend") {
      return Status::InvalidArgument(
          "MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR=\"" + s +
          "\" is not built here: the local-disk tier stores objects in bucket files "
          "(bucket_storage_backend); unset it");
    }
  }
  MC_RETURN_IF_ERROR(ReadU64(env, {"MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"}, 1,
                             &c.total_size_limit));
  MC_RETURN_IF_ERROR(
      ReadU64(env, {"MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT"}, 1, &c.total_keys_limit));
  uint64_t hb = c.heartbeat_interval_seconds;
  MC_RETURN_IF_ERROR(ReadU64(env, {"MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS"}, 1, &hb));
  if (hb > 3600) {
    return Status::InvalidArgument(
        "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS is over 3600 seconds");
  }
  c.heartbeat_interval_seconds = static_cast<uint32_t>(hb);
  MC_RETURN_IF_ERROR(ReadU64(env, {"MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES"}, 1 << 20,
                             &c.local_buffer_size));
  MC_RETURN_IF_ERROR(ReadU64(env, {"MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES"}, 4096,
                             &c.bucket_size_limit));
  MC_RETURN_IF_ERROR(
      ReadU64(env, {"MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT"}, 1, &c.bucket_keys_limit));
  if (c.bucket_keys_limit > 1'000'000) {
    return Status::InvalidArgument("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT is over 1000000");
  }
  MC_RETURN_IF_ERROR(ReadU64(
      env, {"MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE", "MOONCAKE_BUCKET_MAX_TOTAL_SIZE"}, 0,
      &c.bucket_max_total_size));
  if (const char* p = First(env,
                            {"MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY",
                             "MOONCAKE_BUCKET_EVICTION_POLICY"},
                            &which)) {
    const std::string s = Lower(p);
    if (s == "fifo") {
      c.eviction_policy = DiskEvictionPolicy::kFifo;
    } else if (s == "lru") {
      c.eviction_policy = DiskEvictionPolicy::kLru;
    } else if (s == "none") {
      c.eviction_policy = DiskEvictionPolicy::kNone;
    } else {
      return Status::InvalidArgument(std::string(which) + "=\"" + p +
                                     "\" is not fifo, lru or none");
    }
  }
  MC_RETURN_IF_ERROR(
      ReadBool(env, {"MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION"}, &c.watermark_eviction));
  MC_RETURN_IF_ERROR(ReadRatio(env,
                               {"MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO",
                                "MOONCAKE_DISK_EVICTION_HIGH_WATERMARK_RATIO"},
                               &c.high_watermark));
  MC_RETURN_IF_ERROR(ReadRatio(env,
                               {"MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO",
                                "MOONCAKE_DISK_EVICTION_LOW_WATERMARK_RATIO"},
                               &c.low_watermark));
  if (c.low_watermark >= c.high_watermark) {
    return Status::InvalidArgument(
        "the disk's low watermark (" + std::to_string(c.low_watermark) +
        ") is not below its high watermark (" + std::to_string(c.high_watermark) +
        "): MOONCAKE_OFFLOAD_DISK_EVICTION_{LOW,HIGH}_WATERMARK_RATIO");
  }
  MC_RETURN_IF_ERROR(ReadBool(env, {"MOONCAKE_OFFLOAD_USE_URING", "MOONCAKE_USE_URING"},
                              &c.use_uring));
  MC_RETURN_IF_ERROR(ReadBool(env, {"MOONCAKE_OFFLOAD_DIRECT_IO"}, &c.direct_io));
  if (const char* f = First(env, {"MOONCAKE_OFFLOAD_FSYNC"}, &which)) {
    const std::string s = Lower(f);
    if (s == "bucket") {
      c.fsync = DiskFsyncPolicy::kBucket;
    } else if (s == "none") {
      c.fsync = DiskFsyncPolicy::kNone;
    } else {
      return Status::InvalidArgument(std::string("MOONCAKE_OFFLOAD_FSYNC=\"") + f +
                                     "\" is not bucket or none");
    }
  }
  return c;
}

}  // namespace store
}  // namespace mooncake
