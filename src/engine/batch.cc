#include "engine/batch.h"

#include <sstream>

namespace mooncake {

const char* TransferStatusName(TransferStatusEnum s) {
  switch (s) {
    case WAITING: return "WAITING";
    case PENDING: return "PENDING";
    case INVALID: return "INVALID";
    case CANCELED: return "CANCELED";
    case COMPLETED: return "COMPLETED";
    case TIMEOUT: return "TIMEOUT";
    case FAILED: return "FAILED";
  }
  return "UNKNOWN";
}


void TransferTask::Start(uint32_t slices, uint64_t length, MemoryRegion* local,
                         PinShare* share) {
  started_ = true;
  length_ = length;
  local_ = local;
  share_ = share;
  pending_.store(slices, std::memory_order_release);
}

void TransferTask::OnSliceDone(TransferStatusEnum result, uint64_t bytes, const char* message) {
  if (result == COMPLETED) {
    transferred_.fetch_add(bytes, std::memory_order_relaxed);
  } else {
    // FAILED outranks TIMEOUT: a task with one of each reports FAILED.
    int prev = result_.load(std::memory_order_relaxed);
    while (prev != FAILED && !result_.compare_exchange_weak(prev, result)) {
    }
    if (!error_claimed_.exchange(true, std::memory_order_acq_rel)) {
      error_ = message ? message : TransferStatusName(result);
    }
  }
  if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    if (share_ != nullptr) {
      if (share_->left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        MemoryRegistry::Unpin(share_->region);
      }
    } else if (local_ != nullptr) {
      MemoryRegistry::Unpin(local_);
    }
    owner_->TaskFinished();  // last touch: the batch may go away after this
  }
}

TransferStatus TransferTask::status() const {
  TransferStatus st;
  st.transferred_bytes = transferred_.load(std::memory_order_relaxed);
  if (!finished()) {
    st.s = WAITING;
  } else {
    st.s = static_cast<TransferStatusEnum>(result_.load(std::memory_order_relaxed));
  }
  return st;
}

std::string TransferTask::error() const { return finished() ? error_ : std::string(); }

Batch::Batch(size_t capacity) : capacity_(capacity), tasks_(new TransferTask[capacity]) {}

TransferTask* Batch::Reserve(size_t n, size_t* first_index) {
  MutexLock lock(&mu_);
  size_t cur = size_.load(std::memory_order_relaxed);
  if (n > capacity_ - cur) return nullptr;
  for (size_t i = cur; i < cur + n; ++i) {
    tasks_[i].owner_ = this;
    tasks_[i].pending_.store(1, std::memory_order_relaxed);  // until Start sets the count
  }
  *first_index = cur;
  unfinished_ += n;
  size_.store(cur + n, std::memory_order_release);
  return &tasks_[cur];
}

PinShare* Batch::SharePin(MemoryRegion* region, uint32_t tasks) {
  MutexLock lock(&mu_);
  PinShare& share = shares_.emplace_back();
  share.region = region;
  share.left.store(tasks, std::memory_order_relaxed);
  return &share;
}

void Batch::TaskFinished() {
  MutexLock lock(&mu_);
  if (--unfinished_ == 0) cv_.SignalAll();
}

bool Batch::AllFinished() {
  MutexLock lock(&mu_);
  return unfinished_ == 0;
}

bool Batch::WaitAll(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  while (unfinished_ != 0) {
    if (!cv_.WaitUntil(&mu_, deadline)) break;  // timed out: one last look
  }
  return unfinished_ == 0;
}

TransferStatus Batch::Aggregate() const {
  TransferStatus agg;
  agg.s = COMPLETED;
  bool waiting = false, failed = false;
  size_t n = size();
  for (size_t i = 0; i < n; ++i) {
    TransferStatus st = tasks_[i].status();
    agg.transferred_bytes += st.transferred_bytes;
    if (st.s == WAITING) waiting = true;
    if (st.s == FAILED || st.s == TIMEOUT) failed = true;
  }
  if (failed) {
    agg.s = FAILED;
  } else if (waiting) {
    agg.s = WAITING;
  }
  return agg;
}

Result<BatchID> BatchTable::Allocate(size_t capacity) {
  if (capacity == 0 || capacity > kMaxBatchSize) {
    return Status::InvalidArgument("batch size " + std::to_string(capacity) +
                                   " is not in 1.." + std::to_string(kMaxBatchSize));
  }
  auto batch = std::make_shared<Batch>(capacity);
  WriterLock lock(&mu_);
  size_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    if (slots_.size() >= UINT32_MAX - 1) return Status::ResourceExhausted("too many batches");
    slot = slots_.size();
    slots_.emplace_back();
  }
  slots_[slot].batch = std::move(batch);
  ++live_;
  return (static_cast<uint64_t>(slots_[slot].generation) << 32) | (slot + 1);
}

Result<size_t> BatchTable::SlotOf(BatchID id) const {
  uint64_t low = id & 0xffffffffu;
  uint32_t gen = static_cast<uint32_t>(id >> 32);
  if (low == 0 || low > slots_.size()) {
    std::ostringstream os;
    os << "batch id " << id << " was never allocated by this engine";
    return Status::InvalidArgument(os.str());
  }
  size_t slot = low - 1;
  if (slots_[slot].generation != gen || !slots_[slot].batch) {
    return Status::NotFound("batch id " + std::to_string(id) + " was already freed");
  }
  return slot;
}

Result<std::shared_ptr<Batch>> BatchTable::Get(BatchID id) const {
  ReaderLock lock(&mu_);
  MC_ASSIGN_OR_RETURN(size_t slot, SlotOf(id));
  return slots_[slot].batch;
}

Status BatchTable::Free(BatchID id) {
  WriterLock lock(&mu_);
  MC_ASSIGN_OR_RETURN(size_t slot, SlotOf(id));
  if (!slots_[slot].batch->AllFinished()) {
    return Status::FailedPrecondition("batch " + std::to_string(id) +
                                      " still has requests in flight; poll until they finish");
  }
  slots_[slot].batch.reset();
  // Skip generation 0 on wrap so that an id is never (0 << 32) | n from a fresh table.
  if (++slots_[slot].generation == 0) slots_[slot].generation = 1;
  free_.push_back(static_cast<uint32_t>(slot));
  --live_;
  return Status::OK();
}

size_t BatchTable::live() const {
  ReaderLock lock(&mu_);
  return live_;
}

}  // namespace mooncake
