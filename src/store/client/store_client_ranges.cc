// Ranged reads (GetRanges: upstream's get_into_ranges) and get sessions (upstream's
// batch_get_session_start / batch_get_into_multi_buffer_ranges / batch_get_session_end), and
// batch_replica_clear. A range read follows the rules of a get (src/store/README.md): the
// lease bounds it, a read that ends after it is LEASE_EXPIRED, never trusted.
#include <algorithm>

#include "store/client/store_client_impl.h"

namespace mooncake {
namespace store {

namespace {
using Steady = std::chrono::steady_clock;
}  // namespace

std::vector<KeyPlan> StoreClient::Impl::Plan(const std::vector<std::string>& keys,
                                             std::vector<uint64_t>* lease_ids) {
  std::vector<KeyPlan> plans(keys.size());
  lease_ids->assign(keys.size(), 0);
  if (keys.empty()) return plans;
  if (keys.size() > kMaxBatchItems) {
    for (auto& p : plans) p.code = ToInt(ErrorCode::INVALID_PARAMS);
    LOG(WARNING) << "ranged get: more than " << kMaxBatchItems << " keys in one call";
    return plans;
  }
  rpc::KeysRequest req;
  req.set_client_id(client_id);
  req.set_tenant_id(opt.tenant_id);
  for (const auto& k : keys) req.add_keys(k);
  rpc::GetReplicaListResponse resp;
  const auto sent = Steady::now();
  int rc = Checked("GetReplicaList", master->GetReplicaList(req, &resp));
  if (rc == 0 && resp.code() != 0) {
    LOG(WARNING) << "ranged get: the master refused the request: " << resp.message();
    rc = resp.code();
  } else if (rc == 0 && resp.results_size() != static_cast<int>(keys.size())) {
    rc = ToInt(ErrorCode::RPC_FAIL);
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (rc != 0) {
      plans[i].code = rc;
      continue;
    }
    const auto& r = resp.results(static_cast<int>(i));
    (*lease_ids)[i] = r.lease_id();
    if (r.code() != 0) {
      plans[i].code = r.code();
      continue;
    }
    plans[i].size = r.size();
    plans[i].deadline = LeaseDeadline(sent, r.lease_ttl_ms());
    for (const auto& rep : r.replicas()) {
      auto& reps = plans[i].replicas;
      if (rep.buffer().segment_name() == seg_name) reps.insert(reps.begin(), rep);
      else reps.push_back(rep);
    }
    if (plans[i].replicas.empty()) plans[i].code = ToInt(ErrorCode::INVALID_REPLICA);
  }
  return plans;
}

std::vector<int64_t> StoreClient::Impl::ReadRanges(const std::vector<std::string>& keys,
                                                   const std::vector<KeyPlan>& plans,
                                                   const std::vector<StoreClient::RangeRead>& ranges) {
  std::vector<int64_t> out(ranges.size(), 0);
  std::vector<size_t> pending;
  for (size_t r = 0; r < ranges.size(); ++r) {
    const auto& rr = ranges[r];
    if (rr.key >= keys.size()) {
      out[r] = ToInt(ErrorCode::INVALID_PARAMS);
      continue;
    }
    const KeyPlan& p = plans[rr.key];
    if (p.code != 0) {
      out[r] = p.code;
      continue;
    }
    if (rr.offset > p.size || rr.dst.size > p.size - rr.offset) {
      LOG(WARNING) << "ranged get " << keys[rr.key] << ": bytes [" << rr.offset << ", "
                   << rr.offset + rr.dst.size << ") are past the object's end (" << p.size
                   << " bytes)";
      out[r] = ToInt(ErrorCode::INVALID_PARAMS);
      continue;
    }
    if (!Stageable("ranged get", keys[rr.key], {rr.dst})) {
      out[r] = ToInt(ErrorCode::INVALID_PARAMS);
      continue;
    }
    out[r] = static_cast<int64_t>(rr.dst.size);
    if (rr.dst.size > 0) pending.push_back(r);
  }
  std::vector<size_t> attempt(ranges.size(), 0);
  while (!pending.empty()) {
    std::vector<Job> jobs;
    std::vector<char> failed(ranges.size(), 0);
    for (size_t r : pending) {
      const auto& rr = ranges[r];
      const rpc::Replica& rep = plans[rr.key].replicas[attempt[r]];
      jobs.push_back({TransferRequest::READ, static_cast<char*>(rr.dst.ptr), rr.dst.size,
                      &rep.buffer().segment_name(), rep.buffer().addr() + rr.offset, r});
    }
    copier->Run(jobs, &failed);
    const auto done = Steady::now();
    std::vector<size_t> retry;
    for (size_t r : pending) {
      const KeyPlan& p = plans[ranges[r].key];
      if (done > p.deadline) {
        LOG(WARNING) << "ranged get " << keys[ranges[r].key] << ": the read ended after the "
                     << "object's lease: its bytes cannot be trusted (LEASE_EXPIRED)";
        out[r] = ToInt(ErrorCode::LEASE_EXPIRED);
        continue;
      }
      if (!failed[r]) continue;
      if (++attempt[r] < p.replicas.size()) retry.push_back(r);
      else out[r] = ToInt(ErrorCode::TRANSFER_FAIL);
    }
    pending.swap(retry);
  }
  return out;
}

std::vector<int64_t> StoreClient::GetRanges(const std::vector<std::string>& keys,
                                            const std::vector<RangeRead>& ranges) {
  // Distinct keys, each looked up once.
  std::vector<std::string> uniq;
  std::unordered_map<std::string, size_t> index;
  std::vector<RangeRead> mapped = ranges;
  for (auto& rr : mapped) {
    if (rr.key >= keys.size()) continue;  // ReadRanges reports it
    auto [it, added] = index.emplace(keys[rr.key], uniq.size());
    if (added) uniq.push_back(keys[rr.key]);
    rr.key = it->second;
  }
  Impl& m = *impl_;
  // Marked before the lookup: the leases it grants are covered (read_marks.h).
  std::vector<uint64_t> hashes(uniq.size());
  for (size_t i = 0; i < uniq.size(); ++i) hashes[i] = ReadTracker::Hash(uniq[i]);
  std::vector<ReadTracker::Mark*> marks;
  m.reads.Begin(hashes, &marks);
  std::vector<uint64_t> lease_ids;
  auto plans = m.Plan(uniq, &lease_ids);
  auto out = m.ReadRanges(uniq, plans, mapped);
  m.reads.End(marks, hashes, lease_ids);
  return out;
}

std::vector<int> StoreClient::GetSessionStart(const std::vector<std::string>& keys) {
  Impl& m = *impl_;
  // Each key marked as read before the lookup, so that a forced RemoveAll meanwhile cannot
  // tell the master our reads are done while it grants the session's lease.
  std::vector<ReadTracker::Mark*> marks(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) marks[i] = m.reads.BeginOne(ReadTracker::Hash(keys[i]));
  std::vector<uint64_t> lease_ids;
  auto plans = m.Plan(keys, &lease_ids);
  std::vector<int> out(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) out[i] = plans[i].code;
  m.get_sessions.Start(keys, &plans, lease_ids, marks);
  return out;
}

std::vector<int64_t> StoreClient::GetSessionRanges(const std::vector<std::string>& keys,
                                                   const std::vector<RangeRead>& ranges) {
  Impl& m = *impl_;
  std::vector<KeyPlan> plans = m.get_sessions.Find(keys);
  auto per_range = m.ReadRanges(keys, plans, ranges);
  std::vector<int64_t> out(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (plans[i].code != 0) out[i] = plans[i].code;
  }
  for (size_t r = 0; r < ranges.size(); ++r) {
    if (ranges[r].key >= keys.size()) continue;
    int64_t& o = out[ranges[r].key];
    if (o < 0) continue;
    o = per_range[r] < 0 ? per_range[r] : o + per_range[r];
  }
  // A lapsed lease ends the session (as upstream).
  std::vector<char> lapsed(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) lapsed[i] = out[i] == ToInt(ErrorCode::LEASE_EXPIRED);
  m.get_sessions.EndWhere(keys, lapsed);
  return out;
}

int StoreClient::GetSessionEnd(const std::vector<std::string>& keys) {
  impl_->get_sessions.End(keys);
  return 0;
}

std::vector<std::string> StoreClient::BatchReplicaClear(const std::vector<std::string>& keys,
                                                        const std::string& segment_name) {
  std::vector<std::string> cleared;
  for (size_t at = 0; at < keys.size(); at += kMaxBatchItems) {
    rpc::ReplicaClearRequest req;
    req.set_client_id(impl_->client_id);
    req.set_tenant_id(impl_->opt.tenant_id);
    req.set_segment_name(segment_name);
    for (size_t i = at; i < std::min(keys.size(), at + kMaxBatchItems); ++i) req.add_keys(keys[i]);
    rpc::ReplicaClearResponse resp;
    if (Impl::Checked("ReplicaClear", impl_->master->ReplicaClear(req, &resp)) != 0) {
      break;
    }
    if (resp.code() != 0) {
      LOG(WARNING) << "batch_replica_clear: " << ErrorCodeName(resp.code()) << ": "
                   << resp.message();
      break;
    }
    for (const auto& k : resp.cleared_keys()) cleared.push_back(k);
  }
  return cleared;
}

}  // namespace store
}  // namespace mooncake
