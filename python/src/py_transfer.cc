// PyTransferEngine: the transfer methods. Sync calls submit one batch and wait for it with
// TransferEngine::WaitBatch (no polling) for MC_TRANSFER_TIMEOUT + 1 ns per byte. A batch
// whose caller stops waiting (timeout, or a failure elsewhere in get_batch_transfer_status)
// is "abandoned": kept here and freed by a later call once its requests have ended, which
// the engine bounds by its slice timeout. Nothing leaks and no call waits past its deadline.
#include <glog/logging.h>

#include <numeric>

#include "error_codes.h"
#include "py_engine.h"

namespace mooncake {
namespace pyapi {

bool PyTransferEngine::BuildRequests(TransferEngine& engine, const std::string& what,
                                     const std::string& target, const BatchArgs& args,
                                     Opcode op, std::vector<TransferRequest>* out) {
  if (args.buffers.size() != args.peer_addresses.size() ||
      args.buffers.size() != args.lengths.size()) {
    LOG(WARNING) << what << ": the lists differ in length (" << args.buffers.size()
                 << " buffers, " << args.peer_addresses.size() << " peer addresses, "
                 << args.lengths.size() << " lengths)";
    return false;
  }
  auto segment = engine.OpenSegment(target);
  if (!segment.ok()) {
    LOG(ERROR) << what << ": cannot open the target segment: " << segment.status().ToString();
    return false;
  }
  out->clear();
  out->reserve(args.buffers.size());
  for (size_t i = 0; i < args.buffers.size(); ++i) {
    if (args.lengths[i] == 0) continue;
    TransferRequest r;
    r.opcode = op == Opcode::kWrite ? TransferRequest::WRITE : TransferRequest::READ;
    r.source = reinterpret_cast<void*>(args.buffers[i]);
    r.target_id = *segment;
    r.target_offset = args.peer_addresses[i];
    r.length = args.lengths[i];
    out->push_back(r);
  }
  return true;
}

uint64_t PyTransferEngine::Submit(TransferEngine& engine, const std::string& what,
                                  const std::vector<TransferRequest>& requests,
                                  const TransferNotify* notify) {
  auto batch = engine.AllocateBatchID(std::max<size_t>(requests.size(), 1));
  if (!batch.ok()) {
    LOG(ERROR) << what << ": " << batch.status().ToString();
    return 0;
  }
  Status s = notify != nullptr
                 ? engine.SubmitTransferWithNotify(*batch, requests,
                                                   NotifyDesc{notify->name, notify->msg})
                 : engine.SubmitTransfer(*batch, requests);
  if (!s.ok()) {
    LOG(ERROR) << what << ": " << s.ToString();
    (void)engine.FreeBatchID(*batch);  // nothing was submitted
    return 0;
  }
  return *batch;
}

PyTransferEngine::Failure PyTransferEngine::DescribeFailure(TransferEngine& engine,
                                                            uint64_t batch, size_t requests) {
  Failure f;
  for (size_t i = 0; i < requests; ++i) {
    auto st = engine.GetTransferStatus(batch, i);
    if (!st.ok() || st->s == COMPLETED || st->s == WAITING) continue;
    f.timed_out = f.timed_out || st->s == TIMEOUT;
    if (f.message.empty()) {
      auto err = engine.GetTransferError(batch, i);
      f.message = "request " + std::to_string(i) + " of " + std::to_string(requests) + " " +
                  TransferStatusName(st->s) + ": " + (err.ok() ? *err : err.status().ToString());
    }
  }
  if (f.message.empty()) f.message = "failed (no request reported why)";
  return f;
}

void PyTransferEngine::Release(TransferEngine& engine, uint64_t batch) {
  Status s = engine.FreeBatchID(batch);
  if (s.ok()) return;
  if (s.IsFailedPrecondition()) {
    std::lock_guard lock(mu_);
    abandoned_.push_back(batch);
    return;
  }
  LOG(WARNING) << "free batch " << batch << ": " << s.ToString();
}

void PyTransferEngine::ReapAbandoned(TransferEngine& engine) {
  std::vector<uint64_t> batches;
  {
    std::lock_guard lock(mu_);
    if (abandoned_.empty()) return;
    batches.swap(abandoned_);
  }
  std::vector<uint64_t> busy;
  for (uint64_t b : batches) {
    if (engine.FreeBatchID(b).IsFailedPrecondition()) busy.push_back(b);
  }
  std::lock_guard lock(mu_);
  abandoned_.insert(abandoned_.end(), busy.begin(), busy.end());
}

int PyTransferEngine::Finish(TransferEngine& engine, const std::string& what, uint64_t batch,
                             size_t requests, Clock::time_point deadline) {
  auto now = Clock::now();
  auto wait = deadline > now
                  ? std::chrono::ceil<std::chrono::milliseconds>(deadline - now)
                  : std::chrono::milliseconds(0);
  auto st = engine.WaitBatch(batch, wait);
  if (!st.ok()) {
    LOG(ERROR) << what << ": batch " << batch << ": " << st.status().ToString();
    return -1;
  }
  if (st->s == COMPLETED) {
    Release(engine, batch);
    return 0;
  }
  if (st->s == WAITING) {
    LOG(ERROR) << what << ": timed out (MC_TRANSFER_TIMEOUT " << base_timeout_.count() / 1000
               << " s + 1 ns per byte); " << st->transferred_bytes << " bytes had completed";
  } else {
    LOG(ERROR) << what << ": " << DescribeFailure(engine, batch, requests).message;
  }
  Release(engine, batch);
  return -1;
}

int PyTransferEngine::TransferSync(const char* method, const std::string& target,
                                   uintptr_t buffer, uintptr_t peer_address, size_t length,
                                   Opcode op, const TransferNotify* notify) {
  std::vector<uintptr_t> buffers{buffer};
  std::vector<uintptr_t> peers{peer_address};
  std::vector<size_t> lengths{length};
  return BatchTransferSync(method, target, BatchArgs{buffers, peers, lengths}, op, notify);
}

int PyTransferEngine::BatchTransferSync(const char* method, const std::string& target,
                                        const BatchArgs& args, Opcode op,
                                        const TransferNotify* notify) {
  auto h = Ready(method);
  if (h == nullptr) return -1;
  TransferEngine& engine = *h->engine;
  ReapAbandoned(engine);
  const std::string what = std::string(method) + " to '" + target + "'";
  std::vector<TransferRequest> requests;
  if (!BuildRequests(engine, what, target, args, op, &requests)) return -1;
  if (requests.empty()) {
    if (notify == nullptr) return 0;
    Status s = engine.SendNotifyByName(target, NotifyDesc{notify->name, notify->msg});
    if (!s.ok()) LOG(ERROR) << what << ": notify: " << s.ToString();
    return s.ok() ? 0 : -1;
  }
  const uint64_t bytes = std::accumulate(args.lengths.begin(), args.lengths.end(), uint64_t{0});
  const auto deadline = Clock::now() + TimeoutFor(bytes);
  const uint64_t batch = Submit(engine, what, requests, notify);
  if (batch == 0) return -1;
  return Finish(engine, what, batch, requests.size(), deadline);
}

uint64_t PyTransferEngine::BatchTransferAsync(const char* method, const std::string& target,
                                              const BatchArgs& args, Opcode op) {
  auto h = Ready(method);
  if (h == nullptr) return 0;
  TransferEngine& engine = *h->engine;
  ReapAbandoned(engine);
  const std::string what = std::string(method) + " to '" + target + "'";
  std::vector<TransferRequest> requests;
  if (!BuildRequests(engine, what, target, args, op, &requests)) return 0;
  const uint64_t bytes = std::accumulate(args.lengths.begin(), args.lengths.end(), uint64_t{0});
  const auto deadline = Clock::now() + TimeoutFor(bytes);
  const uint64_t batch = Submit(engine, what, requests, nullptr);
  if (batch == 0) return 0;
  std::lock_guard lock(mu_);
  async_[batch] = AsyncBatch{deadline, requests.size()};
  return batch;
}

int PyTransferEngine::GetBatchTransferStatus(const std::vector<uint64_t>& batch_ids) {
  auto h = Ready("get_batch_transfer_status");
  if (h == nullptr) return -1;
  TransferEngine& engine = *h->engine;
  ReapAbandoned(engine);
  int rc = 0;
  for (uint64_t id : batch_ids) {
    AsyncBatch info{};
    bool known = false;
    {
      std::lock_guard lock(mu_);
      auto it = async_.find(id);
      if (it != async_.end()) {
        known = true;
        info = it->second;
        async_.erase(it);
      }
    }
    if (!known) {
      LOG(WARNING) << "get_batch_transfer_status: batch id " << id
                   << " is unknown (not returned by batch_transfer_async_* or "
                      "transfer_submit_write, or already reported and freed)";
      rc = -1;
      continue;
    }
    if (rc != 0) {
      Release(engine, id);  // after a failure the rest are freed once their requests end
      continue;
    }
    const std::string what = "get_batch_transfer_status: batch " + std::to_string(id);
    rc = Finish(engine, what, id, info.requests, info.deadline);
  }
  return rc;
}

int PyTransferEngine::TransferCheckStatus(uint64_t batch_id) {
  auto h = Ready("transfer_check_status");
  if (h == nullptr) return -1;
  TransferEngine& engine = *h->engine;
  ReapAbandoned(engine);
  AsyncBatch info{};
  {
    std::lock_guard lock(mu_);
    auto it = async_.find(batch_id);
    if (it == async_.end()) {
      LOG(WARNING) << "transfer_check_status: batch id " << batch_id
                   << " is unknown (not returned by transfer_submit_write or "
                      "batch_transfer_async_*, or already reported and freed)";
      return -1;
    }
    info = it->second;
  }
  const std::string what = "transfer_check_status: batch " + std::to_string(batch_id);
  auto st = engine.GetBatchTransferStatus(batch_id);
  int rc = 0;
  if (!st.ok()) {
    LOG(ERROR) << what << ": " << st.status().ToString();
    rc = -1;
  } else if (st->s == COMPLETED) {
    rc = 1;
  } else if (st->s == WAITING) {
    if (Clock::now() < info.deadline) return 0;
    LOG(ERROR) << what << ": timed out (MC_TRANSFER_TIMEOUT " << base_timeout_.count() / 1000
               << " s + 1 ns per byte)";
    rc = -2;
  } else {
    Failure f = DescribeFailure(engine, batch_id, info.requests);
    LOG(ERROR) << what << ": " << f.message;
    rc = f.timed_out ? -2 : -1;
  }
  {
    std::lock_guard lock(mu_);
    if (async_.erase(batch_id) == 0) return rc;  // another thread reported it meanwhile
  }
  Release(engine, batch_id);
  return rc;
}

}  // namespace pyapi
}  // namespace mooncake
