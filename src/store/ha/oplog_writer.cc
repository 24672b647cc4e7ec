#include "store/ha/oplog_writer.h"

#include <glog/logging.h>

#include "store/ha/master_view.h"
#include "store/ha/oplog_codec.h"

namespace mooncake {
namespace store {
namespace ha {

OplogWriter::OplogWriter(EtcdKv* kv, Options options, DurableFn on_durable, FailFn on_fail)
    : kv_(kv),
      options_(std::move(options)),
      on_durable_(std::move(on_durable)),
      on_fail_(std::move(on_fail)) {
  last_appended_ = options_.next_seq - 1;
  durable_ = options_.next_seq - 1;
  next_batch_id_ = options_.next_batch_id;
  queued_first_seq_ = options_.next_seq;
  thread_ = std::thread([this] { Run(); });
}

OplogWriter::~OplogWriter() { Stop(); }

void OplogWriter::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t OplogWriter::Append(oplog::Entry&& entry) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> l(mu_);
    seq = last_appended_.load() + 1;
    last_appended_ = seq;
    queue_.push_back(std::move(entry));
  }
  cv_.notify_one();
  return seq;
}

void OplogWriter::Run() {
  while (true) {
    oplog::Batch batch;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      batch.set_first_seq(queued_first_seq_);
      size_t bytes = 0;
      while (!queue_.empty() && batch.entries_size() < static_cast<int>(options_.max_entries)) {
        const size_t n = queue_.front().ByteSizeLong();
        if (batch.entries_size() > 0 && bytes + n > kMaxBatchBytes) break;
        bytes += n;
        *batch.add_entries() = std::move(queue_.front());
        queue_.pop_front();
      }
      queued_first_seq_ += static_cast<uint64_t>(batch.entries_size());
    }
    batch.set_batch_id(next_batch_id_.load());
    batch.set_view_version(options_.view_version);
    batch.set_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count());
    if (!WriteBatch(batch, EncodeBatch(batch))) return;
    const uint64_t last = batch.first_seq() + static_cast<uint64_t>(batch.entries_size()) - 1;
    {
      std::lock_guard<std::mutex> l(written_mu_);
      written_.emplace_back(batch.batch_id(), last);
    }
    durable_ = last;
    next_batch_id_ = batch.batch_id() + 1;
    ++batches_;
    entries_ += static_cast<uint64_t>(batch.entries_size());
    if (on_durable_) on_durable_(last);
  }
}

uint64_t OplogWriter::LastBatchUpTo(uint64_t seq) {
  // Batches before this writer's first hold sequence numbers below options_.next_seq.
  uint64_t id = seq + 1 >= options_.next_seq && options_.next_batch_id > 1
                    ? options_.next_batch_id - 1
                    : 0;
  std::lock_guard<std::mutex> l(written_mu_);
  while (!written_.empty() && written_.front().second <= seq) {
    id = written_.front().first;
    written_.pop_front();
  }
  return id;
}

bool OplogWriter::WriteBatch(const oplog::Batch& batch, const std::string& value) {
  const std::string view_key = MasterViewKey(options_.cluster_id);
  const std::string key = OplogKey(options_.cluster_id, batch.batch_id());
  EtcdCompare fence;
  fence.key = view_key;
  fence.target = EtcdCompare::Target::kCreateRevision;
  fence.op = EtcdCompare::Op::kEqual;
  fence.number = options_.view_version;
  EtcdCompare fresh;
  fresh.key = key;
  fresh.target = EtcdCompare::Target::kCreateRevision;
  fresh.op = EtcdCompare::Op::kEqual;
  fresh.number = 0;
  const auto give_up = std::chrono::steady_clock::now() + options_.retry_timeout;
  std::string last_error;
  while (!stopping_.load()) {
    auto r = kv_->Txn({fence, fresh}, {EtcdOp::Put(key, value)},
                      {EtcdOp::Get(view_key), EtcdOp::Get(key)}, options_.txn_timeout_ms);
    if (r.ok() && r->succeeded) return true;
    if (r.ok()) {
      // The compares failed: our own earlier attempt (its reply lost), or another leader.
      const bool view_ours = r->responses.size() == 2 && r->responses[0].kvs.size() == 1 &&
                             r->responses[0].kvs[0].create_revision == options_.view_version;
      const bool batch_ours = r->responses.size() == 2 && r->responses[1].kvs.size() == 1 &&
                              r->responses[1].kvs[0].value == value;
      if (view_ours && batch_ours) return true;
      ++fenced_;
      failed_ = true;
      std::string why =
          view_ours ? "oplog batch " + std::to_string(batch.batch_id()) +
                          " was written by someone else (two writers on one view?)"
                    : "master_view is no longer this master's (view version " +
                          std::to_string(options_.view_version) + "): another master leads";
      LOG(WARNING) << "HA: oplog write fenced: " << why;
      if (on_fail_) on_fail_(why);
      return false;
    }
    last_error = r.status().ToString();
    if (std::chrono::steady_clock::now() >= give_up) break;
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, std::chrono::milliseconds(100), [this] { return stop_; });
  }
  failed_ = true;
  if (!stopping_.load() && on_fail_) {
    on_fail_("etcd did not take oplog batch " + std::to_string(batch.batch_id()) + " within " +
             std::to_string(options_.retry_timeout.count()) + " ms: " + last_error);
  }
  return false;
}

}  // namespace ha
}  // namespace store
}  // namespace mooncake
