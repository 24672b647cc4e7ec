#include "store/disk/disk_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <random>
#include <set>
#include <unordered_set>

#include <glog/logging.h>

#include "common/crc32c.h"
#include "store/disk/bucket_io.h"

namespace mooncake {
namespace store {
namespace {

constexpr char kLockName[] = ".mooncake_offload.lock";
constexpr char kIdName[] = ".mooncake_offload.id";
constexpr char kLogName[] = "removed.log";
constexpr size_t kLogEntry = 16;  // {u64 bucket, u32 slot, u32 crc32c of the 12 before}

using disk::Errno;

void EncodeLogEntry(char* e, uint64_t bucket, uint32_t slot) {
  std::memcpy(e, &bucket, 8);
  std::memcpy(e + 8, &slot, 4);
  const uint32_t crc = Crc32c(0, e, 12);
  std::memcpy(e + 12, &crc, 4);
}

bool SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

uint64_t FreeBytes(const std::string& dir) {
  struct statvfs v {};
  if (::statvfs(dir.c_str(), &v) != 0) return 0;
  return static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
}

}  // namespace

DiskStore::DiskStore(DiskConfig config) : config_(std::move(config)) {}

DiskStore::~DiskStore() {
  for (auto& r : roots_) {
    if (r.removal_log_fd >= 0) ::close(r.removal_log_fd);
    if (r.lock_fd >= 0) ::close(r.lock_fd);  // releases the flock
  }
}

Result<std::unique_ptr<DiskStore>> DiskStore::Open(const DiskConfig& config) {
  if (config.roots.empty()) return Status::InvalidArgument("no SSD offload directory");
  std::unique_ptr<DiskStore> s(new DiskStore(config));
  MC_RETURN_IF_ERROR(s->OpenRoots());
  MC_RETURN_IF_ERROR(s->LoadStoreId());
  std::map<uint64_t, Bucket> found;
  for (uint32_t r = 0; r < s->roots_.size(); ++r) MC_RETURN_IF_ERROR(s->ScanRoot(r, &found));
  MutexLock l(&s->mu_);
  s->buckets_ = std::move(found);
  // Newest copy wins: buckets in id order, slots in order.
  std::vector<std::string> to_delete;
  std::vector<uint32_t> logs;
  s->root_used_.assign(s->roots_.size(), 0);
  s->root_reserved_.assign(s->roots_.size(), 0);
  for (auto& [id, b] : s->buckets_) {
    s->used_bytes_ += b.file_size;
    s->root_used_[b.root] += b.file_size;
    s->next_bucket_ = std::max(s->next_bucket_, id + 1);
  }
  std::vector<std::pair<uint64_t, uint32_t>> order;
  for (auto& [id, b] : s->buckets_) {
    for (uint32_t i = 0; i < b.records.size(); ++i) {
      if (b.live[i]) order.emplace_back(id, i);
    }
  }
  for (const auto& [id, slot] : order) {
    Bucket& b = s->buckets_.at(id);
    if (!b.live[slot]) continue;
    auto [it, fresh] = s->index_.try_emplace(b.records[slot].key, Where{id, slot});
    if (!fresh) {
      const Where old = it->second;
      it->second = Where{id, slot};
      s->KillLocked(old, &to_delete, &logs);
    }
    s->live_bytes_ += b.records[slot].value_len;
  }
  // Buckets with nothing live go; every root's log is rewritten with the dead slots of the
  // buckets that stay.
  for (auto it = s->buckets_.begin(); it != s->buckets_.end();) {
    if (it->second.live_count == 0) {
      to_delete.push_back(s->PathOf(it->first, it->second.root));
      s->DropUsedLocked(it->second);
      it = s->buckets_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& p : to_delete) ::unlink(p.c_str());
  for (uint32_t r = 0; r < s->roots_.size(); ++r) {
    Root& root = s->roots_[r];
    const std::string path = root.dir + "/" + kLogName;
    const std::string tmp = path + ".tmp";
    std::string body;
    for (const auto& [id, b] : s->buckets_) {
      if (b.root != r) continue;
      for (uint32_t i = 0; i < b.live.size(); ++i) {
        if (b.live[i]) continue;
        char e[kLogEntry];
        EncodeLogEntry(e, id, i);
        body.append(e, kLogEntry);
      }
    }
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::Internal(Errno("cannot create " + tmp));
    const bool ok = ::write(fd, body.data(), body.size()) == static_cast<ssize_t>(body.size()) &&
                    ::fdatasync(fd) == 0;
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0 || !SyncDir(root.dir)) {
      return Status::Internal(Errno("cannot rewrite " + path));
    }
    if (root.removal_log_fd >= 0) ::close(root.removal_log_fd);
    root.removal_log_fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (root.removal_log_fd < 0) return Status::Internal(Errno("cannot open " + path));
  }
  LOG(INFO) << "disk tier: " << s->index_.size() << " objects in " << s->buckets_.size()
            << " buckets over " << s->roots_.size() << " directories, "
            << s->used_bytes_ << " bytes; capacity " << s->CapacityLocked() << " bytes";
  return s;
}

Status DiskStore::OpenRoots() {
  std::set<dev_t> devices;
  for (const auto& dir : config_.roots) {
    MC_RETURN_IF_ERROR(CheckRoot(dir));
    Root r;
    r.dir = dir;
    const std::string lock = dir + "/" + kLockName;
    r.lock_fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (r.lock_fd < 0) return Status::Internal(Errno("cannot open " + lock));
    if (::flock(r.lock_fd, LOCK_EX | LOCK_NB) != 0) {
      char pid[32] = {};
      (void)::pread(r.lock_fd, pid, sizeof(pid) - 1, 0);
      ::close(r.lock_fd);
      return Status::FailedPrecondition(
          "the SSD offload directory \"" + dir + "\" is in use by another process (pid " +
          std::string(pid) + "): give each client its own directory");
    }
    const std::string me = std::to_string(::getpid());
    if (::ftruncate(r.lock_fd, 0) != 0 ||
        ::pwrite(r.lock_fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
      LOG(WARNING) << Errno("cannot write the pid into " + lock);
    }
    struct statvfs v {};
    struct stat st {};
    if (::statvfs(dir.c_str(), &v) == 0 && ::stat(dir.c_str(), &st) == 0 &&
        devices.insert(st.st_dev).second) {
      r.fs_total = static_cast<uint64_t>(v.f_blocks) * v.f_frsize;
    }
    roots_.push_back(std::move(r));
  }
  return Status::OK();
}

Status DiskStore::LoadStoreId() {
  const std::string path = roots_[0].dir + "/" + kIdName;
  char buf[64] = {};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
    std::string s(buf, n > 0 ? static_cast<size_t>(n) : 0);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    if (s.size() == 32 && s.find_first_not_of("0123456789abcdef") == std::string::npos) {
      id_ = s;
      return Status::OK();
    }
    LOG(WARNING) << path << " does not hold a store id; writing a new one";
  }
  std::random_device rd;
  static const char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) id_ += kHex[rd() & 15];
  const std::string tmp = path + ".tmp";
  const int w = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w < 0) return Status::Internal(Errno("cannot create " + tmp));
  const std::string line = id_ + "\n";
  const bool ok = ::write(w, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                  ::fdatasync(w) == 0;
  ::close(w);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0 || !SyncDir(roots_[0].dir)) {
    return Status::Internal(Errno("cannot write " + path));
  }
  return Status::OK();
}

Status DiskStore::ScanRoot(uint32_t r, std::map<uint64_t, Bucket>* found) {
  const std::string& dir = roots_[r].dir;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Status::Internal(Errno("cannot list " + dir));
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  uint64_t max_logged = 0;
  for (const auto& name : names) {
    uint64_t id = 0;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      if (disk::ParseBucketName(name.substr(0, name.size() - 4), &id)) {
        ::unlink((dir + "/" + name).c_str());  // never reported: a write cut short
        MutexLock l(&mu_);
        next_bucket_ = std::max(next_bucket_, id + 1);
      }
      continue;
    }
    if (!disk::ParseBucketName(name, &id)) continue;
    if (found->count(id) != 0) {
      LOG(WARNING) << "disk tier: bucket " << name << " is in two directories; " << dir
                   << "'s copy is ignored";
      continue;
    }
    Bucket b;
    b.root = r;
    bool walked = false;
    const std::string path = dir + "/" + name;
    Status s = disk::ReadBucketIndex(path, id, &b.records, &b.file_size, &walked);
    if (!s.ok()) {
      LOG(ERROR) << "disk tier: " << s.message() << "; set aside as " << path
                 << ".unreadable (its objects are not served)";
      ::rename(path.c_str(), (path + ".unreadable").c_str());
      continue;
    }
    if (walked) {
      LOG(WARNING) << "disk tier: " << path << " has a damaged index; " << b.records.size()
                   << " records found by walking it (each is checked when read)";
    }
    b.live.assign(b.records.size(), true);
    b.live_count = static_cast<uint32_t>(b.records.size());
    found->emplace(id, std::move(b));
  }
  // The removal log: entries for buckets of this root; a torn tail is ignored.
  const std::string log = dir + "/" + kLogName;
  const int fd = ::open(log.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char e[kLogEntry];
    uint64_t off = 0;
    while (::pread(fd, e, kLogEntry, static_cast<off_t>(off)) == static_cast<ssize_t>(kLogEntry)) {
      off += kLogEntry;
      uint32_t crc;
      std::memcpy(&crc, e + 12, 4);
      if (crc != Crc32c(0, e, 12)) continue;
      uint64_t bucket;
      uint32_t slot;
      std::memcpy(&bucket, e, 8);
      std::memcpy(&slot, e + 8, 4);
      max_logged = std::max(max_logged, bucket);
      auto it = found->find(bucket);
      if (it == found->end() || it->second.root != r || slot >= it->second.live.size() ||
          !it->second.live[slot]) {
        continue;
      }
      it->second.live[slot] = false;
      --it->second.live_count;
    }
    ::close(fd);
  }
  // Ids named in the log are never reused, so its stale entries cannot hit a new bucket.
  MutexLock l(&mu_);
  next_bucket_ = std::max(next_bucket_, max_logged + 1);
  return Status::OK();
}

std::string DiskStore::PathOf(uint64_t bucket, uint32_t root) const {
  return roots_[root].dir + "/" + disk::BucketName(bucket);
}

uint64_t DiskStore::CapacityLocked() const {
  uint64_t fs = 0;
  for (const auto& r : roots_) fs += r.fs_total;
  const uint64_t max_total =
      config_.bucket_max_total_size != 0 ? config_.bucket_max_total_size : fs / 10 * 9;
  return std::min(config_.total_size_limit, max_total);
}

void DiskStore::KillLocked(const Where& w, std::vector<std::string>* to_delete,
                           std::vector<uint32_t>* logs) {
  auto it = buckets_.find(w.bucket);
  if (it == buckets_.end()) return;
  Bucket& b = it->second;
  if (w.slot >= b.live.size() || !b.live[w.slot]) return;
  b.live[w.slot] = false;
  --b.live_count;
  live_bytes_ -= std::min(live_bytes_, b.records[w.slot].value_len);
  Root& root = roots_[b.root];
  if (root.removal_log_fd >= 0) {
    char e[kLogEntry];
    EncodeLogEntry(e, w.bucket, w.slot);
    if (::write(root.removal_log_fd, e, kLogEntry) != static_cast<ssize_t>(kLogEntry)) {
      LOG(ERROR) << Errno("disk tier: cannot append to " + root.dir + "/" + kLogName);
      log_failed_ = true;
    }
    if (std::find(logs->begin(), logs->end(), b.root) == logs->end()) logs->push_back(b.root);
  }
  if (b.live_count == 0 && !b.evicting) {
    to_delete->push_back(PathOf(w.bucket, b.root));
    DropUsedLocked(b);
    buckets_.erase(it);
  }
}

void DiskStore::DropUsedLocked(const Bucket& b) {
  used_bytes_ -= std::min(used_bytes_, b.file_size);
  root_used_[b.root] -= std::min(root_used_[b.root], b.file_size);
}

bool DiskStore::SyncLogs(const std::vector<uint32_t>& roots) {
  bool ok = true;
  {
    MutexLock l(&mu_);
    ok = !log_failed_;
    log_failed_ = false;
  }
  if (config_.fsync != DiskFsyncPolicy::kBucket) return ok;
  for (uint32_t r : roots) {
    if (roots_[r].removal_log_fd >= 0 && ::fdatasync(roots_[r].removal_log_fd) != 0) {
      LOG(ERROR) << Errno("disk tier: cannot sync " + roots_[r].dir + "/" + kLogName);
      ok = false;
    }
  }
  return ok;
}

std::vector<std::string> DiskStore::TakeDropped() {
  MutexLock l(&mu_);
  std::vector<std::string> out;
  out.swap(dropped_);
  return out;
}

void DiskStore::ReportLater(std::vector<std::string> keys) {
  MutexLock l(&mu_);
  if (dropped_.size() > (1u << 20)) return;  // bounded; the master learns at a read anyway
  dropped_.insert(dropped_.end(), std::make_move_iterator(keys.begin()),
                  std::make_move_iterator(keys.end()));
}

std::vector<DiskObject> DiskStore::Objects() const {
  MutexLock l(&mu_);
  std::vector<DiskObject> out;
  out.reserve(index_.size());
  for (const auto& [key, w] : index_) {
    const auto& r = buckets_.at(w.bucket).records[w.slot];
    out.push_back(DiskObject{key, r.value_len, r.put_id});
  }
  return out;
}

Status DiskStore::Write(const std::vector<Item>& items, disk::IoHelper* helper) {
  if (!io_observer_) return WriteUntimed(items, helper);
  const auto start = std::chrono::steady_clock::now();
  Status s = WriteUntimed(items, helper);
  if (s.ok() && !items.empty()) {
    uint64_t bytes = 0;
    for (const Item& i : items) bytes += i.size;
    io_observer_(true, items.size(), bytes, MicrosSince(start));
  }
  return s;
}

Status DiskStore::WriteUntimed(const std::vector<Item>& items, disk::IoHelper* helper) {
  if (items.empty()) return Status::OK();
  if (items.size() > config_.bucket_keys_limit) {
    return Status::InvalidArgument(std::to_string(items.size()) +
                                   " objects in one bucket, over its limit of " +
                                   std::to_string(config_.bucket_keys_limit));
  }
  std::vector<disk::BucketItem> bi;
  bi.reserve(items.size());
  std::unordered_set<std::string_view> keys;
  uint64_t values = 0;
  for (const auto& it : items) {
    if (!keys.insert(it.key).second) {
      return Status::InvalidArgument("\"" + it.key + "\" twice in one bucket");
    }
    bi.push_back(disk::BucketItem{it.key, it.put_id, it.data, it.size});
    values += it.size;
  }
  const uint64_t fsize = disk::BucketFileSize(bi);
  if (items.size() > 1 && fsize > config_.bucket_size_limit) {
    return Status::InvalidArgument("a bucket of " + std::to_string(fsize) +
                                   " bytes, over its limit of " +
                                   std::to_string(config_.bucket_size_limit));
  }
  std::vector<uint64_t> free(roots_.size());
  for (size_t r = 0; r < roots_.size(); ++r) free[r] = FreeBytes(roots_[r].dir);
  uint64_t id = 0;
  uint32_t root = 0;
  {
    MutexLock l(&mu_);
    uint64_t replaced = 0;
    for (const auto& it : items) replaced += index_.count(it.key);
    if (index_.size() - replaced + reserved_keys_ + items.size() > config_.total_keys_limit) {
      return Status::ResourceExhausted("the disk tier holds " + std::to_string(index_.size()) +
                                       " objects, its limit is " +
                                       std::to_string(config_.total_keys_limit));
    }
    const uint64_t cap = CapacityLocked();
    if (used_bytes_ + reserved_bytes_ + fsize > cap) {
      return Status::ResourceExhausted(
          "the disk tier uses " + std::to_string(used_bytes_ + reserved_bytes_) + " of " +
          std::to_string(cap) + " bytes; " + std::to_string(fsize) + " more do not fit");
    }
    // Spread over the roots: the one holding the fewest bytes (written and being written)
    // among those with room for the file.
    bool any = false;
    uint64_t least = 0;
    for (uint32_t r = 0; r < roots_.size(); ++r) {
      if (free[r] < fsize + fsize / 64 + root_reserved_[r]) continue;
      const uint64_t load = root_used_[r] + root_reserved_[r];
      if (!any || load < least) {
        least = load;
        root = r;
        any = true;
      }
    }
    if (!any) {
      return Status::ResourceExhausted("no SSD offload directory has " +
                                       std::to_string(fsize) + " bytes free");
    }
    id = next_bucket_++;
    reserved_bytes_ += fsize;
    reserved_keys_ += items.size();
    root_reserved_[root] += fsize;
  }
  std::vector<disk::RecordRef> refs;
  uint64_t written = 0;
  Status s = disk::WriteBucket(roots_[root].dir, id, bi, config_.fsync == DiskFsyncPolicy::kBucket,
                               &refs, &written, config_.direct_io, helper);
  std::vector<std::string> to_delete;
  std::vector<uint32_t> logs;
  {
    MutexLock l(&mu_);
    reserved_bytes_ -= fsize;
    reserved_keys_ -= items.size();
    root_reserved_[root] -= fsize;
    if (!s.ok()) return s;
    Bucket b;
    b.root = root;
    b.file_size = written;
    b.records = std::move(refs);
    b.live.assign(b.records.size(), true);
    b.live_count = static_cast<uint32_t>(b.records.size());
    b.last_read = read_clock_;
    buckets_.emplace(id, std::move(b));
    used_bytes_ += written;
    root_used_[root] += written;
    live_bytes_ += values;
    for (uint32_t i = 0; i < items.size(); ++i) {
      auto [it, fresh] = index_.try_emplace(items[i].key, Where{id, i});
      if (!fresh) {
        const Where old = it->second;
        it->second = Where{id, i};
        KillLocked(old, &to_delete, &logs);
      }
    }
  }
  for (const auto& p : to_delete) ::unlink(p.c_str());
  (void)SyncLogs(logs);
  return Status::OK();
}

Result<uint64_t> DiskStore::Size(const std::string& key) const {
  MutexLock l(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return Status::NotFound("\"" + key + "\" is not on disk");
  return buckets_.at(it->second.bucket).records[it->second.slot].value_len;
}

Result<size_t> DiskStore::Remove(const std::vector<std::string>& keys) {
  std::vector<std::pair<std::string, uint64_t>> any;
  any.reserve(keys.size());
  for (const auto& k : keys) any.emplace_back(k, UINT64_MAX);
  return RemoveUpTo(any);
}

Result<size_t> DiskStore::RemoveUpTo(const std::vector<std::pair<std::string, uint64_t>>& keys) {
  std::vector<std::string> to_delete;
  std::vector<uint32_t> logs;
  size_t n = 0;
  {
    MutexLock l(&mu_);
    for (const auto& [k, version] : keys) {
      auto it = index_.find(k);
      if (it == index_.end()) continue;
      const Where w = it->second;
      if (buckets_.at(w.bucket).records[w.slot].put_id > version) continue;
      index_.erase(it);
      KillLocked(w, &to_delete, &logs);
      ++n;
    }
  }
  for (const auto& p : to_delete) ::unlink(p.c_str());
  if (!SyncLogs(logs)) {
    return Status::Internal("the removal log could not be written or synced: the removals "
                            "are not durable");
  }
  return n;
}

DiskStore::Plan DiskStore::PlanEviction(uint64_t bytes) {
  Plan plan;
  if (config_.eviction_policy == DiskEvictionPolicy::kNone || bytes == 0) return plan;
  MutexLock l(&mu_);
  std::vector<std::pair<uint64_t, uint64_t>> order;  // (rank, id)
  for (const auto& [id, b] : buckets_) {
    if (b.evicting) continue;
    order.emplace_back(config_.eviction_policy == DiskEvictionPolicy::kLru ? b.last_read : 0, id);
  }
  std::sort(order.begin(), order.end());
  for (const auto& [rank, id] : order) {
    if (plan.bytes >= bytes) break;
    Bucket& b = buckets_.at(id);
    b.evicting = true;
    plan.buckets.push_back(id);
    plan.bytes += b.file_size;
    for (uint32_t i = 0; i < b.records.size(); ++i) {
      if (b.live[i]) plan.keys.push_back(b.records[i].key);
    }
  }
  return plan;
}

Status DiskStore::FinishEviction(const Plan& plan) {
  std::vector<std::string> paths;
  std::vector<uint32_t> logs;
  {
    MutexLock l(&mu_);
    for (uint64_t id : plan.buckets) {
      auto bit = buckets_.find(id);
      if (bit == buckets_.end()) continue;
      Bucket& b = bit->second;
      for (uint32_t i = 0; i < b.records.size(); ++i) {
        if (!b.live[i]) continue;
        // Logged first: a crash before the unlink must not bring these keys back.
        Root& root = roots_[b.root];
        if (root.removal_log_fd >= 0) {
          char e[kLogEntry];
          EncodeLogEntry(e, id, i);
          if (::write(root.removal_log_fd, e, kLogEntry) != static_cast<ssize_t>(kLogEntry)) {
            log_failed_ = true;
          }
          if (std::find(logs.begin(), logs.end(), b.root) == logs.end()) logs.push_back(b.root);
        }
        auto it = index_.find(b.records[i].key);
        if (it != index_.end() && it->second.bucket == id && it->second.slot == i) {
          index_.erase(it);
        }
        live_bytes_ -= std::min(live_bytes_, b.records[i].value_len);
      }
      DropUsedLocked(b);
      paths.push_back(PathOf(id, b.root));
      buckets_.erase(bit);
    }
  }
  Status s;
  if (!SyncLogs(logs)) LOG(ERROR) << "disk tier: the evicted keys' removals are not durable";
  for (const auto& p : paths) {
    if (::unlink(p.c_str()) != 0 && errno != ENOENT && s.ok()) {
      s = Status::Internal(Errno("cannot delete " + p));
    }
  }
  return s;
}

void DiskStore::CancelEviction(const Plan& plan) {
  std::vector<std::string> to_delete;
  {
    MutexLock l(&mu_);
    for (uint64_t id : plan.buckets) {
      auto it = buckets_.find(id);
      if (it == buckets_.end()) continue;
      it->second.evicting = false;
      if (it->second.live_count == 0) {  // emptied while marked
        to_delete.push_back(PathOf(id, it->second.root));
        DropUsedLocked(it->second);
        buckets_.erase(it);
      }
    }
  }
  for (const auto& p : to_delete) ::unlink(p.c_str());
}

uint64_t DiskStore::WatermarkExcess() const {
  if (!config_.watermark_eviction) return 0;
  MutexLock l(&mu_);
  const double cap = static_cast<double>(CapacityLocked());
  if (static_cast<double>(used_bytes_) <= config_.high_watermark * cap) return 0;
  return used_bytes_ - static_cast<uint64_t>(config_.low_watermark * cap);
}

uint64_t DiskStore::NeedFreed(uint64_t bytes) const {
  MutexLock l(&mu_);
  const uint64_t want = used_bytes_ + reserved_bytes_ + bytes;
  const uint64_t cap = CapacityLocked();
  return want > cap ? want - cap : 0;
}

DiskStats DiskStore::stats() const {
  MutexLock l(&mu_);
  DiskStats s;
  s.used_bytes = used_bytes_;
  s.live_bytes = live_bytes_;
  s.keys = index_.size();
  s.buckets = buckets_.size();
  s.capacity_bytes = CapacityLocked();
  s.keys_limit = config_.total_keys_limit;
  s.corrupted_reads = corrupted_reads_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace store
}  // namespace mooncake
