// OplogWriter: the HA leader's ChangeSink. Append() (under the master's lock) queues the
// entry and gives it the next sequence number; one thread writes what is queued to etcd as
// batches, one transaction in flight: everything appended meanwhile goes in the next batch
// (at most max_entries entries and kMaxBatchBytes), so the cost is about one etcd round trip
// per batch, not per change.
//
// Each transaction is fenced: it succeeds only while master_view's create revision is this
// leader's view version and the batch's key does not exist yet. A transaction that failed
// its compares is looked at again (its Else part reads both keys): if the batch there is
// ours (an earlier attempt whose reply was lost) it is durable; otherwise another master
// leads and the writer stops, calling on_fail. An etcd that does not answer is retried
// (every 100 ms) for retry_timeout, then on_fail. After on_fail nothing more is written and
// the entries still queued are never durable (their callers' replies fail: ha_master.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "metadata/stores/etcd_kv.h"
#include "store/master/master_service.h"

namespace mooncake {
namespace store {
namespace ha {

class OplogWriter : public ChangeSink {
 public:
  struct Options {
    std::string cluster_id;
    int64_t view_version = 0;    // master_view's create revision when this master won it
    uint64_t next_batch_id = 1;  // the first batch this writer writes
    uint64_t next_seq = 1;       // the sequence number of the first entry appended
    uint32_t max_entries = 1024;
    std::chrono::milliseconds retry_timeout{180000};
    int txn_timeout_ms = 2000;
  };
  using DurableFn = std::function<void(uint64_t durable_seq)>;
  using FailFn = std::function<void(const std::string& why)>;

  // `kv` must outlive this. Starts the thread.
  OplogWriter(EtcdKv* kv, Options options, DurableFn on_durable, FailFn on_fail);
  ~OplogWriter() override;  // Stop()
  OplogWriter(const OplogWriter&) = delete;
  OplogWriter& operator=(const OplogWriter&) = delete;

  uint64_t Append(oplog::Entry&& entry) override;
  // Ends the thread (a transaction in flight is waited for, bounded by its timeout); queued
  // entries are dropped. Idempotent.
  void Stop();

  uint64_t last_appended() const { return last_appended_.load(); }
  uint64_t durable() const { return durable_.load(); }
  uint64_t next_batch_id() const { return next_batch_id_.load(); }
  bool failed() const { return failed_.load(); }
  uint64_t batches() const { return batches_.load(); }
  uint64_t entries() const { return entries_.load(); }
  uint64_t fenced() const { return fenced_.load(); }
  // The largest batch id whose entries all have sequence numbers <= seq: of the batches this
  // writer wrote, else (when seq reaches back before them) the last batch before its first;
  // 0 when none. Forgets the batches it answered for (they are about to be deleted).
  uint64_t LastBatchUpTo(uint64_t seq);

 private:
  void Run();
  // Writes one batch; false when the writer is done (fenced, out of retries, stopping).
  bool WriteBatch(const oplog::Batch& batch, const std::string& value);

  EtcdKv* const kv_;
  const Options options_;
  const DurableFn on_durable_;
  const FailFn on_fail_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<oplog::Entry> queue_;  // sequence numbers durable_ + 1 + (in flight) ...
  uint64_t queued_first_seq_ = 0;   // the sequence number of queue_.front()
  bool stop_ = false;
  std::atomic<uint64_t> last_appended_{0};
  std::atomic<uint64_t> durable_{0};
  std::atomic<uint64_t> next_batch_id_{0};
  std::atomic<bool> failed_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> batches_{0}, entries_{0}, fenced_{0};
  std::mutex written_mu_;
  std::deque<std::pair<uint64_t, uint64_t>> written_;  // {batch id, its last sequence number}
  std::thread thread_;
};

}  // namespace ha
}  // namespace store
}  // namespace mooncake
