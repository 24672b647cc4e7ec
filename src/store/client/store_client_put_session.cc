// Put sessions (upstream's batch_put_session_start / batch_put_from_multi_buffer_ranges /
// batch_put_session_end / batch_put_session_revoke): a put whose bytes arrive in ranges. The
// object is PutStart'ed (PROCESSING, invisible to readers) at the start and PutEnd'ed at the
// end, so readers see all of it or nothing, as with a put.
#include <algorithm>

#include "store/client/store_client_impl.h"

namespace mooncake {
namespace store {

std::vector<int> StoreClient::PutSessionStart(const std::vector<std::string>& keys,
                                              const std::vector<uint64_t>& sizes,
                                              const ReplicateConfig& config) {
  Impl& m = *impl_;
  std::vector<int> out(keys.size(), ToInt(ErrorCode::INVALID_PARAMS));
  if (keys.size() != sizes.size() || keys.size() > kMaxBatchItems) {
    LOG(WARNING) << "batch_put_session_start: keys and sizes differ in length, or more than "
                 << kMaxBatchItems << " keys";
    return out;
  }
  const std::vector<size_t> idx = m.put_sessions.Absent(keys);
  if (idx.empty()) return out;
  rpc::PutStartRequest req;
  req.set_client_id(m.client_id);
  req.set_tenant_id(m.opt.tenant_id);
  req.set_put_nonce(NewPutNonce());  // a resend is granted the same space
  *req.mutable_config() = ConfigToProto(config);
  for (size_t i : idx) {
    auto* item = req.add_items();
    item->set_key(keys[i]);
    item->set_size(sizes[i]);
  }
  rpc::PutStartResponse resp;
  int rc = Impl::Checked("PutStart", m.master->PutStart(req, &resp));
  if (rc == 0 && resp.code() != 0) {
    LOG(WARNING) << "batch_put_session_start: the master refused the request: " << resp.message();
    rc = resp.code();
  } else if (rc == 0 && resp.results_size() != static_cast<int>(idx.size())) {
    rc = ToInt(ErrorCode::RPC_FAIL);
  }
  for (size_t j = 0; j < idx.size(); ++j) {
    const size_t i = idx[j];
    if (rc != 0) {
      out[i] = rc;
      continue;
    }
    const auto& r = resp.results(static_cast<int>(j));
    out[i] = r.code();
    if (r.code() != 0) continue;
    m.put_sessions.Open(keys[i], sizes[i], {r.replicas().begin(), r.replicas().end()});
  }
  return out;
}

std::vector<int64_t> StoreClient::PutSessionRanges(const std::vector<std::string>& keys,
                                                   const std::vector<RangeRead>& ranges) {
  Impl& m = *impl_;
  std::vector<int64_t> out(keys.size(), 0);
  const std::vector<PutSessions::Session*> ps = m.put_sessions.BeginWrites(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (ps[i] == nullptr) out[i] = ToInt(ErrorCode::INVALID_PARAMS);
  }
  for (const auto& rr : ranges) {
    if (rr.key >= keys.size() || out[rr.key] < 0) continue;
    const uint64_t size = ps[rr.key]->size;
    if (rr.offset > size || rr.dst.size > size - rr.offset) {
      LOG(WARNING) << "batch_put_from_multi_buffer_ranges " << keys[rr.key] << ": bytes ["
                   << rr.offset << ", " << rr.offset + rr.dst.size << ") are past the object's "
                   << "end (" << size << " bytes)";
      out[rr.key] = ToInt(ErrorCode::INVALID_PARAMS);
    } else if (!m.Stageable("put", keys[rr.key], {rr.dst})) {
      out[rr.key] = ToInt(ErrorCode::INVALID_PARAMS);
    }
  }
  std::vector<Job> jobs;
  for (const auto& rr : ranges) {
    if (rr.key >= keys.size() || out[rr.key] < 0 || rr.dst.size == 0) continue;
    for (const auto& rep : ps[rr.key]->replicas) {
      jobs.push_back({TransferRequest::WRITE, static_cast<char*>(rr.dst.ptr), rr.dst.size,
                      &rep.buffer().segment_name(), rep.buffer().addr() + rr.offset, rr.key});
    }
    out[rr.key] += static_cast<int64_t>(rr.dst.size);
  }
  std::vector<char> failed(keys.size(), 0);
  m.copier->Run(jobs, &failed);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (failed[i] && out[i] >= 0) out[i] = ToInt(ErrorCode::TRANSFER_FAIL);
  }
  m.put_sessions.EndWrites(ps);
  return out;
}

namespace {

// Ends the put sessions of `keys` with PutEnd (commit) or PutRevoke; keys without one get
// INVALID_PARAMS.
std::vector<int> FinishPutSessions(StoreClient::Impl& m, const std::vector<std::string>& keys,
                                   bool commit) {
  std::vector<int> out(keys.size(), ToInt(ErrorCode::INVALID_PARAMS));
  rpc::KeysRequest req;
  req.set_client_id(m.client_id);
  req.set_tenant_id(m.opt.tenant_id);
  std::vector<size_t> idx;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!m.put_sessions.Close(keys[i])) continue;
    req.add_keys(keys[i]);
    idx.push_back(i);
  }
  if (idx.empty()) return out;
  rpc::CodesResponse resp;
  int rc = commit ? StoreClient::Impl::Checked("PutEnd", m.master->PutEnd(req, &resp))
                  : StoreClient::Impl::Checked("PutRevoke", m.master->PutRevoke(req, &resp));
  if (rc == 0 && resp.code() != 0) rc = resp.code();
  if (rc == 0 && resp.codes_size() != static_cast<int>(idx.size())) rc = ToInt(ErrorCode::RPC_FAIL);
  for (size_t j = 0; j < idx.size(); ++j) out[idx[j]] = rc != 0 ? rc : resp.codes(static_cast<int>(j));
  return out;
}

}  // namespace

std::vector<int> StoreClient::PutSessionEnd(const std::vector<std::string>& keys) {
  return FinishPutSessions(*impl_, keys, /*commit=*/true);
}

std::vector<int> StoreClient::PutSessionRevoke(const std::vector<std::string>& keys) {
  return FinishPutSessions(*impl_, keys, /*commit=*/false);
}

}  // namespace store
}  // namespace mooncake
