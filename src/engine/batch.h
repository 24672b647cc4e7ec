// Tasks, batches and the table of checked batch ids.
//
// A TransferTask is one request of a batch. The engine cuts it into slices and hands them to a
// transport; each slice reports once, through TransferTask::OnSliceDone, from any thread.
// Counters are atomics: the data path takes no lock here.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/thread_annotations.h"
#include "engine/memory_registry.h"
#include "mooncake/status.h"
#include "mooncake/types.h"

namespace mooncake {

class Batch;

// One pin of a local region shared by several tasks of a submit (consecutive requests in the
// same registered range): the region is pinned once and unpinned when the last of them ends,
// so a batch of small requests costs one pin and one unpin of the region's shared counter
// instead of one per request (two threads submitting from one range made that counter's
// cache line the hot spot). It lives in the batch (Batch::SharePin).
struct PinShare {
  MemoryRegion* region = nullptr;
  std::atomic<uint32_t> left{0};  // tasks of the share not yet finished
};

class TransferTask {
 public:
  // REQUIRES: reserved in `owner`, not yet started, `slices` > 0. `local` (pinned by the
  // caller, may be null) is unpinned when the last slice reports; or, with `share`, `local`
  // is share->region and the share's pin is dropped when its last task reports.
  void Start(uint32_t slices, uint64_t length, MemoryRegion* local, PinShare* share = nullptr);

  // Called once per slice. `result` is COMPLETED, FAILED or TIMEOUT; `bytes` counts towards
  // transferred_bytes only when COMPLETED. `message` is kept for the first failure.
  void OnSliceDone(TransferStatusEnum result, uint64_t bytes, const char* message = nullptr);

  bool started() const { return started_; }
  // The pinned local region (may be null); valid until the last slice reports.
  MemoryRegion* local_region() const { return local_; }
  bool finished() const { return pending_.load(std::memory_order_acquire) == 0; }
  uint64_t length() const { return length_; }
  // WAITING while slices are out; then COMPLETED, FAILED or TIMEOUT.
  TransferStatus status() const;
  // The first failure's message; empty if none. Valid once finished().
  std::string error() const;

 private:
  friend class Batch;
  Batch* owner_ = nullptr;
  bool started_ = false;
  uint64_t length_ = 0;
  MemoryRegion* local_ = nullptr;
  PinShare* share_ = nullptr;
  std::atomic<uint32_t> pending_{0};
  std::atomic<uint64_t> transferred_{0};
  std::atomic<int> result_{COMPLETED};  // worst result seen
  std::atomic<bool> error_claimed_{false};
  std::string error_;  // written by the first failing slice before its pending_ decrement
};

class Batch {
 public:
  explicit Batch(size_t capacity);
  size_t capacity() const { return capacity_; }

  // Reserves `n` task slots for a submit; nullptr (and no change) when the batch would
  // exceed its capacity. Serialized per batch.
  TransferTask* Reserve(size_t n, size_t* first_index) MC_EXCLUDES(mu_);
  size_t size() const { return size_.load(std::memory_order_acquire); }
  TransferTask& task(size_t i) { return tasks_[i]; }
  // A share of `region`'s pin (held by the caller) among `tasks` tasks of this batch, which
  // drops it when the last of them finishes. Stable until the batch is destroyed.
  PinShare* SharePin(MemoryRegion* region, uint32_t tasks) MC_EXCLUDES(mu_);
  // True when every reserved task has finished.
  bool AllFinished() MC_EXCLUDES(mu_);
  TransferStatus Aggregate() const;
  // Blocks until every reserved task has finished or `timeout` passes; true if finished.
  bool WaitAll(std::chrono::milliseconds timeout) MC_EXCLUDES(mu_);

  // Notify to send once the batch completes (SubmitTransferWithNotify).
  Mutex notify_mu;
  std::optional<std::pair<SegmentID, NotifyDesc>> pending_notify MC_GUARDED_BY(notify_mu);

 private:
  friend class TransferTask;
  // Called by a task after its last slice reported; its last touch of the batch. The batch
  // may be destroyed (by BatchTable::Free, which takes mu_) as soon as this returns.
  void TaskFinished() MC_EXCLUDES(mu_);

  const size_t capacity_;
  std::unique_ptr<TransferTask[]> tasks_;
  // Taken inside BatchTable's lock (BatchTable::Free -> AllFinished), never around it.
  Mutex mu_;
  CondVar cv_;
  size_t unfinished_ MC_GUARDED_BY(mu_) = 0;
  std::atomic<size_t> size_{0};  // written under mu_
  std::deque<PinShare> shares_ MC_GUARDED_BY(mu_);  // elements never move
};

// Maps checked ids to batches. An id is (generation << 32) | (slot + 1): a freed or
// never-allocated id is rejected with NotFound / InvalidArgument, never dereferenced.
class BatchTable {
 public:
  Result<BatchID> Allocate(size_t capacity) MC_EXCLUDES(mu_);
  // The batch, kept alive for the caller even if another thread frees the id meanwhile.
  Result<std::shared_ptr<Batch>> Get(BatchID id) const MC_EXCLUDES(mu_);
  // FailedPrecondition while any task has slices outstanding; the id stays valid then.
  Status Free(BatchID id) MC_EXCLUDES(mu_);
  size_t live() const MC_EXCLUDES(mu_);

  static constexpr size_t kMaxBatchSize = 1 << 20;

 private:
  struct Slot {
    uint32_t generation = 1;
    std::shared_ptr<Batch> batch;
  };
  Result<size_t> SlotOf(BatchID id) const MC_REQUIRES_SHARED(mu_);

  // Held (exclusively) around Batch::mu_ in Free.
  mutable RwMutex mu_;
  std::vector<Slot> slots_ MC_GUARDED_BY(mu_);
  std::vector<uint32_t> free_ MC_GUARDED_BY(mu_);
  size_t live_ MC_GUARDED_BY(mu_) = 0;
};

}  // namespace mooncake
