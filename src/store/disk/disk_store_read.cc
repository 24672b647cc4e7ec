// DiskStore's reads (disk_store.h): the records looked up under the lock, read without it,
// large ones with O_DIRECT and the next in flight, a record failing its checks dropped.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <unordered_map>

#include <glog/logging.h>

#include "store/disk/bucket_io.h"
#include "store/disk/disk_store.h"

namespace mooncake {
namespace store {
namespace {

// Records of at least this many bytes are read with O_DIRECT where the file system allows
// (the buckets were written so too: on this project's VM a cold buffered read of a large set
// ran at a third of a direct one); smaller ones through the page cache, whose readahead
// brings their neighbours (a direct read of each small record pays the device's latency).
constexpr uint64_t kDirectReadMin = 256 << 10;

// At most this many bucket files open at once by one ReadMany (a batch of up to 4096 keys
// may name as many buckets: opened together they could take the process past its limit on
// open files, failing its sockets too).
constexpr size_t kMaxOpenFiles = 32;

// The files one ReadMany has open, each once: fd, or -1 with the errno of its open.
class Files {
 public:
  explicit Files(int flags) : flags_(flags) {}
  ~Files() { Close(); }
  int Open(const std::string& path) {
    auto it = open_.find(path);
    if (it == open_.end()) {
      const int fd = ::open(path.c_str(), flags_ | O_RDONLY | O_CLOEXEC);
      it = open_.emplace(path, std::make_pair(fd, fd < 0 ? errno : 0)).first;
    }
    errno = it->second.second;
    return it->second.first;
  }
  // Whether `path` would be one more file than the bound.
  bool Full(const std::string& path) const {
    return open_.size() >= kMaxOpenFiles && open_.count(path) == 0;
  }
  void Close() {
    for (const auto& f : open_) {
      if (f.second.first >= 0) ::close(f.second.first);
    }
    open_.clear();
  }

 private:
  const int flags_;
  std::unordered_map<std::string, std::pair<int, int>> open_;
};

}  // namespace

Status DiskStore::Read(const std::string& key, void* dst, uint64_t len, uint64_t put_id,
                       uint32_t* crc) {
  std::vector<ReadItem> one(1);
  one[0].key = &key;
  one[0].dst = dst;
  one[0].len = len;
  one[0].put_id = put_id;
  ReadMany(&one);
  if (one[0].status.ok() && crc != nullptr) *crc = one[0].crc;
  return one[0].status;
}

void DiskStore::ReadMany(std::vector<ReadItem>* items) {
  if (!io_observer_) return ReadManyUntimed(items);
  const auto start = std::chrono::steady_clock::now();
  ReadManyUntimed(items);
  uint64_t keys = 0, bytes = 0;
  for (const ReadItem& i : *items) {
    if (!i.status.ok()) continue;
    ++keys;
    bytes += i.len;
  }
  if (keys > 0) io_observer_(false, keys, bytes, MicrosSince(start));
}

void DiskStore::ReadManyUntimed(std::vector<ReadItem>* items) {
  std::vector<ReadItem>& it = *items;
  const size_t n = it.size();
  struct Found {
    disk::RecordRef ref;
    Where where;
    std::string path;
    bool pending = false;  // found, not read yet
  };
  std::vector<Found> found(n);
  {
    MutexLock l(&mu_);
    for (size_t i = 0; i < n; ++i) {
      const std::string& key = *it[i].key;
      auto at = index_.find(key);
      if (at == index_.end()) {
        it[i].status = Status::NotFound("\"" + key + "\" is not on disk");
        continue;
      }
      Found& f = found[i];
      f.where = at->second;
      Bucket& b = buckets_.at(f.where.bucket);
      f.ref = b.records[f.where.slot];
      if (it[i].put_id != 0 && f.ref.put_id != it[i].put_id) {
        it[i].status = Status::NotFound("\"" + key + "\" on disk is another value (put " +
                                        std::to_string(f.ref.put_id) + ", not " +
                                        std::to_string(it[i].put_id) + ")");
        continue;
      }
      b.last_read = ++read_clock_;
      f.path = PathOf(f.where.bucket, b.root);
      f.pending = true;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (found[i].pending && it[i].len != found[i].ref.value_len) {
      it[i].status = Status::InvalidArgument(
          "\"" + *it[i].key + "\" is " + std::to_string(found[i].ref.value_len) +
          " bytes on disk, not " + std::to_string(it[i].len));
      found[i].pending = false;
    }
  }
  auto evicted = [&](size_t i) {
    it[i].status = Status::NotFound("\"" + *it[i].key + "\" was evicted from the disk");
    found[i].pending = false;
  };
  // Large records past the page cache, the next read in flight behind each; one the file
  // system refuses to read so (InvalidArgument) is read through it below.
  if (config_.direct_io) {
    Files files(O_DIRECT);
    std::vector<disk::DirectRead> direct;
    std::vector<size_t> of;
    auto read = [&]() {  // what is gathered, then its files closed
      disk::ReadRecordsDirect(&direct);
      for (size_t k = 0; k < direct.size(); ++k) {
        if (direct[k].status.code() == Status::Code::kInvalidArgument) continue;
        it[of[k]].status = std::move(direct[k].status);
        found[of[k]].pending = false;
      }
      direct.clear();
      of.clear();
      files.Close();
    };
    for (size_t i = 0; i < n; ++i) {
      if (!found[i].pending || found[i].ref.value_len < kDirectReadMin) continue;
      if (files.Full(found[i].path)) read();
      const int fd = files.Open(found[i].path);
      if (fd < 0) {
        if (errno == ENOENT) evicted(i);
        continue;
      }
      disk::DirectRead r;
      r.fd = fd;
      r.ref = &found[i].ref;
      r.dst = it[i].dst;
      direct.push_back(std::move(r));
      of.push_back(i);
    }
    read();
  }
  {
    Files files(0);
    for (size_t i = 0; i < n; ++i) {
      if (!found[i].pending) continue;
      if (files.Full(found[i].path)) files.Close();
      const int fd = files.Open(found[i].path);
      if (fd < 0) {
        if (errno == ENOENT) {
          evicted(i);
        } else {
          it[i].status = Status::Internal(disk::Errno("cannot open " + found[i].path));
        }
        continue;
      }
      it[i].status = disk::ReadRecord(fd, found[i].ref, it[i].dst);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (it[i].status.ok()) it[i].crc = found[i].ref.data_crc;
    if (it[i].status.code() != Status::Code::kDataLoss) continue;
    // Never served: the key is dropped (if it is still that record), counted, and its
    // removal logged like any other, so a restart does not bring it back.
    const Found& f = found[i];
    corrupted_reads_.fetch_add(1, std::memory_order_relaxed);
    LOG(ERROR) << "disk tier: " << f.path << ": " << it[i].status.message()
               << "; the key is dropped";
    std::vector<std::string> to_delete;
    std::vector<uint32_t> logs;
    {
      MutexLock l(&mu_);
      auto at = index_.find(*it[i].key);
      if (at != index_.end() && at->second.bucket == f.where.bucket &&
          at->second.slot == f.where.slot) {
        index_.erase(at);
        KillLocked(f.where, &to_delete, &logs);
        if (dropped_.size() < (1u << 20)) dropped_.push_back(*it[i].key);
      }
    }
    for (const auto& p : to_delete) ::unlink(p.c_str());
    (void)SyncLogs(logs);
  }
}

}  // namespace store
}  // namespace mooncake
