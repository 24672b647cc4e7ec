// Engine-side helpers of the failure tests and the soak program: page-aligned buffers,
// batch outcome counting, a barrier. Header-only.
#pragma once

#include <sys/mman.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mooncake/transfer_engine.h"

namespace mc_failure {

// Anonymous mapping, unmapped on destruction.
class Buffer {
 public:
  explicit Buffer(size_t n) : n_(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~Buffer() {
    if (p_) ::munmap(p_, n_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() const { return p_; }
  size_t size() const { return n_; }
  uint64_t addr(size_t off = 0) const { return reinterpret_cast<uint64_t>(p_) + off; }

 private:
  uint8_t* p_ = nullptr;
  size_t n_ = 0;
};

// How the requests of some batches ended.
struct Outcome {
  size_t completed = 0, failed = 0, timeout = 0, waiting = 0, other = 0;
  uint64_t bytes = 0;
  std::string first_error;
  size_t total() const { return completed + failed + timeout + waiting + other; }
  std::string ToString() const {
    return std::to_string(completed) + " completed, " + std::to_string(failed) + " failed, " +
           std::to_string(timeout) + " timed out, " + std::to_string(waiting) + " waiting";
  }
};

inline void Count(mooncake::TransferEngine& e, mooncake::BatchID id, size_t n, Outcome* out) {
  for (size_t i = 0; i < n; ++i) {
    auto st = e.GetTransferStatus(id, i);
    if (!st.ok()) {
      ++out->other;
      continue;
    }
    out->bytes += st->transferred_bytes;
    switch (st->s) {
      case mooncake::COMPLETED: ++out->completed; break;
      case mooncake::FAILED: ++out->failed; break;
      case mooncake::TIMEOUT: ++out->timeout; break;
      case mooncake::WAITING: ++out->waiting; break;
      default: ++out->other; break;
    }
    if ((st->s == mooncake::FAILED || st->s == mooncake::TIMEOUT) && out->first_error.empty()) {
      auto err = e.GetTransferError(id, i);
      if (err.ok()) out->first_error = *err;
    }
  }
}

// How many of the batches have requests still running.
inline size_t Unfinished(mooncake::TransferEngine& e, const std::vector<mooncake::BatchID>& ids) {
  size_t n = 0;
  for (auto id : ids) {
    auto st = e.GetBatchTransferStatus(id);
    n += st.ok() && st->s == mooncake::WAITING;
  }
  return n;
}

// Sum of transferred_bytes over batches (progress while they run).
inline uint64_t Transferred(mooncake::TransferEngine& e, const std::vector<mooncake::BatchID>& ids) {
  uint64_t sum = 0;
  for (auto id : ids) {
    auto st = e.GetBatchTransferStatus(id);
    if (st.ok()) sum += st->transferred_bytes;
  }
  return sum;
}

// Submits up to `count` batches of `per_batch` requests of `len` bytes each, cycling over
// [0, span) of `local` and of the remote buffer at `remote`, keeping at most `window`
// batches unfinished (so that a transport never holds more than a window's worth: its
// progress stays fine-grained), until the batches have moved `stop_at` bytes (returning
// right after topping the window up, so that work is in flight), `count` batches are
// submitted, or `max_s` passed. Odd batches are READs when `mixed`. Returns the
// ids of every batch submitted (empty on a submit error).
inline std::vector<mooncake::BatchID> SubmitWindowed(mooncake::TransferEngine& e,
                                                     mooncake::SegmentID seg, uint8_t* local,
                                                     uint64_t remote, uint64_t span, uint64_t len,
                                                     size_t per_batch, size_t count, size_t window,
                                                     uint64_t stop_at, bool mixed, double max_s) {
  using namespace mooncake;
  std::vector<BatchID> all;
  size_t first_unfinished = 0;
  auto start = std::chrono::steady_clock::now();
  uint64_t next_off = 0;
  for (;;) {
    while (first_unfinished < all.size()) {
      auto st = e.GetBatchTransferStatus(all[first_unfinished]);
      if (st.ok() && st->s == WAITING) break;
      ++first_unfinished;
    }
    bool full = all.size() - first_unfinished >= window;
    // Stop only with a full window just topped up, so that work is in flight at the return
    // (a transport may finish a whole window at once).
    if ((full && Transferred(e, all) >= stop_at) || all.size() >= count ||
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > max_s) {
      return all;
    }
    if (full) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    auto id = e.AllocateBatchID(per_batch);
    if (!id.ok()) return {};
    auto op = mixed && (all.size() % 2) ? TransferRequest::READ : TransferRequest::WRITE;
    std::vector<TransferRequest> reqs;
    for (size_t i = 0; i < per_batch; ++i) {
      reqs.push_back({op, local + next_off, seg, remote + next_off, len});
      next_off = (next_off + len) % span;
    }
    if (!e.SubmitTransfer(*id, reqs).ok()) return {};
    all.push_back(*id);
  }
}

class Barrier {
 public:
  explicit Barrier(size_t n) : n_(n) {}
  void Wait() {
    std::unique_lock lock(mu_);
    size_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen != gen_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const size_t n_;
  size_t count_ = 0;
  size_t gen_ = 0;
};

}  // namespace mc_failure
