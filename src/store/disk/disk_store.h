// DiskStore: the objects one client keeps on its local disks (the disk tier's data side).
// It owns its roots (a lock file each: one process per directory), groups objects into
// bucket files (bucket_file.h), indexes them in memory, reads them back checked, records
// removals durably (a removal log per root, so a restart never brings back a removed
// object), keeps its caps (bytes, keys, free space of each root) and picks what to evict
// (whole buckets, oldest first or least recently read). It knows nothing of the master: the
// caller reports what it wrote and asks before deleting (Plan/FinishEviction), so no key
// ever points at a deleted file. Thread-safe; file I/O runs outside its lock.
//
// Lock: mu_, a leaf.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/thread_annotations.h"
#include "mooncake/status.h"
#include "store/disk/bucket_file.h"
#include "store/disk/disk_config.h"

namespace mooncake {
namespace store {

struct DiskObject {
  std::string key;
  uint64_t size = 0;
  uint64_t put_id = 0;
};

struct DiskStats {
  uint64_t used_bytes = 0;  // bucket files' sizes, dead records included until the file goes
  uint64_t live_bytes = 0;  // values of live objects
  uint64_t keys = 0;
  uint64_t buckets = 0;
  uint64_t capacity_bytes = 0;
  uint64_t keys_limit = 0;
  uint64_t corrupted_reads = 0;  // reads refused for a failed check (the key dropped)
};

class DiskStore {
 public:
  // Locks and scans every root: deletes leftover .tmp buckets, reads each bucket's index,
  // applies the removal logs (then rewrites them compacted), drops buckets whose every
  // object is removed, and keeps the newest copy of a key found twice. FailedPrecondition
  // when another process holds a root.
  static Result<std::unique_ptr<DiskStore>> Open(const DiskConfig& config);
  ~DiskStore();
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  // A stable id of this store, kept in its first root (created on first open): a client
  // restarted on the same directories has the same id.
  const std::string& id() const { return id_; }
  const DiskConfig& config() const { return config_; }

  // Every live object (after Open: what the scan found).
  std::vector<DiskObject> Objects() const MC_EXCLUDES(mu_);

  struct Item {
    std::string key;
    uint64_t put_id = 0;
    const void* data = nullptr;
    uint64_t size = 0;
  };
  // Writes `items` (distinct keys) as one bucket, on the root with the most room. A key
  // already stored is replaced (the older copy removed). ResourceExhausted when the bytes,
  // the keys or every root's free space would be exceeded (evict first, or keep the
  // objects in memory); InvalidArgument for a batch over the bucket limits or a bad key;
  // Internal on an I/O error. On any error nothing was stored. `helper`: the thread that
  // writes the direct chunks (WriteBucket); null: one started for this call.
  Status Write(const std::vector<Item>& items, disk::IoHelper* helper = nullptr)
      MC_EXCLUDES(mu_);

  // The size of a stored object, or NotFound.
  Result<uint64_t> Size(const std::string& key) const MC_EXCLUDES(mu_);
  // Reads the whole value of `key` into dst[0, len): len must be its size. DataLoss when the
  // record fails a check (the key is then dropped, and counted); NotFound when absent (or
  // evicted meanwhile), or when `put_id` is not 0 and the copy stored has another.
  // *crc (optional): the record's CRC32C of key and value, for a copy checked end to end.
  Status Read(const std::string& key, void* dst, uint64_t len, uint64_t put_id = 0,
              uint32_t* crc = nullptr) MC_EXCLUDES(mu_);
  // Read of several objects, each status (and crc) in its entry: large records' reads one
  // behind the other with the next in flight (disk::ReadRecordsDirect), so a batch keeps the
  // disk busy while the one before is checked.
  struct ReadItem {
    const std::string* key = nullptr;  // lives through the call
    void* dst = nullptr;
    uint64_t len = 0;
    uint64_t put_id = 0;
    uint32_t crc = 0;             // out: as Read's *crc
    Status status;                // out: as Read's
  };
  void ReadMany(std::vector<ReadItem>* items) MC_EXCLUDES(mu_);
  // Keys dropped since the last call because their record failed a check (the caller tells
  // the master), and keys the caller asked to report later (ReportLater).
  std::vector<std::string> TakeDropped() MC_EXCLUDES(mu_);
  void ReportLater(std::vector<std::string> keys) MC_EXCLUDES(mu_);

  // Forgets `keys` (absent ones are skipped), durably under the fsync policy, and deletes
  // buckets left with no live object. Returns how many were removed; Internal when the
  // removal log could not be written or synced (the removal is then not durable: do not
  // acknowledge it).
  Result<size_t> Remove(const std::vector<std::string>& keys) MC_EXCLUDES(mu_);
  // The same for the keys whose stored copy has a put_id of at most the one given (a
  // removal of an older value leaves a newer copy).
  Result<size_t> RemoveUpTo(const std::vector<std::pair<std::string, uint64_t>>& keys)
      MC_EXCLUDES(mu_);

  // Eviction in two steps so the caller can tell the master first. Plan picks whole
  // buckets (policy order; none with kNone) until `bytes` of files are covered, marks them
  // (not picked again, still readable) and returns their live keys; Finish forgets those
  // keys (unless stored again meanwhile) and deletes the files; Cancel unmarks them.
  struct Plan {
    std::vector<uint64_t> buckets;
    std::vector<std::string> keys;
    uint64_t bytes = 0;
  };
  Plan PlanEviction(uint64_t bytes) MC_EXCLUDES(mu_);
  Status FinishEviction(const Plan& plan) MC_EXCLUDES(mu_);
  void CancelEviction(const Plan& plan) MC_EXCLUDES(mu_);
  // Bytes to evict to come back to the low watermark, when over the high one (else 0;
  // always 0 without watermark eviction).
  uint64_t WatermarkExcess() const MC_EXCLUDES(mu_);
  // Bytes over capacity that writing `bytes` more would need freed (0 when it fits).
  uint64_t NeedFreed(uint64_t bytes) const MC_EXCLUDES(mu_);

  DiskStats stats() const MC_EXCLUDES(mu_);

  // Told of every Write that stored its bucket (write true) and every ReadMany / Read that
  // read something (the records read whole and checked): keys, value bytes and the call's
  // time. The client's mooncake_ssd_* metrics. Set before the store is shared (not
  // synchronised); it runs on the caller's thread, outside the lock.
  using IoObserver = std::function<void(bool write, uint64_t keys, uint64_t bytes, uint64_t us)>;
  void SetIoObserver(IoObserver observer) { io_observer_ = std::move(observer); }

 private:
  struct Root {
    std::string dir;
    int lock_fd = -1;
    int removal_log_fd = -1;
    uint64_t fs_total = 0;
  };
  struct Bucket {
    uint32_t root = 0;
    uint64_t file_size = 0;
    std::vector<disk::RecordRef> records;
    std::vector<bool> live;
    uint32_t live_count = 0;
    uint64_t last_read = 0;  // the read clock's value at its last read (lru)
    bool evicting = false;
  };
  struct Where {
    uint64_t bucket = 0;
    uint32_t slot = 0;
  };

  explicit DiskStore(DiskConfig config);
  Status OpenRoots();
  Status ScanRoot(uint32_t r, std::map<uint64_t, Bucket>* found);
  Status LoadStoreId();
  // Marks `w` dead, appends a removal record to its root's log (not synced) and deletes
  // the bucket when it empties (its path returned through `to_delete`).
  void KillLocked(const Where& w, std::vector<std::string>* to_delete,
                  std::vector<uint32_t>* logs) MC_REQUIRES(mu_);
  std::string PathOf(uint64_t bucket, uint32_t root) const;
  void DropUsedLocked(const Bucket& b) MC_REQUIRES(mu_);
  uint64_t CapacityLocked() const MC_REQUIRES(mu_);
  // False when a log append since the last call, or the sync, failed.
  bool SyncLogs(const std::vector<uint32_t>& roots);

  const DiskConfig config_;
  std::vector<Root> roots_;
  std::string id_;
  mutable Mutex mu_;
  std::map<uint64_t, Bucket> buckets_ MC_GUARDED_BY(mu_);
  std::unordered_map<std::string, Where> index_ MC_GUARDED_BY(mu_);
  uint64_t next_bucket_ MC_GUARDED_BY(mu_) = 1;
  uint64_t used_bytes_ MC_GUARDED_BY(mu_) = 0;
  uint64_t live_bytes_ MC_GUARDED_BY(mu_) = 0;
  uint64_t reserved_bytes_ MC_GUARDED_BY(mu_) = 0;  // buckets being written
  uint64_t reserved_keys_ MC_GUARDED_BY(mu_) = 0;
  uint64_t read_clock_ MC_GUARDED_BY(mu_) = 0;
  // Per root: bytes of its bucket files, and of buckets being written to it.
  std::vector<uint64_t> root_used_ MC_GUARDED_BY(mu_);
  std::vector<uint64_t> root_reserved_ MC_GUARDED_BY(mu_);
  std::atomic<uint64_t> corrupted_reads_{0};
  std::vector<std::string> dropped_ MC_GUARDED_BY(mu_);
  bool log_failed_ MC_GUARDED_BY(mu_) = false;  // a removal-log append failed
  IoObserver io_observer_;
  static uint64_t MicrosSince(std::chrono::steady_clock::time_point t) {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                     std::chrono::steady_clock::now() - t)
                                     .count());
  }

  Status WriteUntimed(const std::vector<Item>& items, disk::IoHelper* helper) MC_EXCLUDES(mu_);
  void ReadManyUntimed(std::vector<ReadItem>* items) MC_EXCLUDES(mu_);
};

}  // namespace store
}  // namespace mooncake
