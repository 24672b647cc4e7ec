// Getting objects: GetMany's rounds (each round's GetReplicaList sent before the previous
// round's objects are read, where copies are same-host memcpy), the leases that bound a
// read, and the fallback to the next replica.
#include <google/protobuf/arena.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "store/client/store_client_impl.h"

namespace mooncake {
namespace store {

std::vector<int64_t> StoreClient::Impl::GetMany(const std::vector<std::string>& keys,
                                                const StoreClient::PartsFor& parts_for) {
  // Rounds of at most kMaxBatchItems keys, each round's GetReplicaList sent before the
  // previous round's objects are read, so that the master's lookups overlap this client's
  // copies. Where the last copies ended within their Submit (same-host memory a holder
  // lends), a batch of kPipelineKeys or more is split in two for that; where they go over a
  // network transport, two transfer waits would cost more than the overlap gains.
  constexpr size_t kPipelineKeys = 64;
  std::vector<std::pair<size_t, size_t>> rounds;  // [at, end)
  const bool pipeline = keys.size() >= kPipelineKeys && copier->copies_inline();
  const size_t per_round =
      pipeline ? std::min(kMaxBatchItems, (keys.size() + 1) / 2) : kMaxBatchItems;
  for (size_t at = 0; at < keys.size(); at += per_round) {
    rounds.emplace_back(at, std::min(keys.size(), at + per_round));
  }
  // Each round's keys (a copy unless one round covers them all).
  std::vector<std::vector<std::string>> copies(rounds.size() > 1 ? rounds.size() : 0);
  auto keys_of = [&](size_t r) -> const std::vector<std::string>& {
    if (rounds.size() == 1) return keys;
    if (copies[r].empty()) {
      copies[r].assign(keys.begin() + rounds[r].first, keys.begin() + rounds[r].second);
    }
    return copies[r];
  };
  std::vector<int64_t> out;
  out.reserve(keys.size());
  std::unique_ptr<GetRoundState> next = rounds.empty() ? nullptr : BeginGet(keys_of(0));
  for (size_t r = 0; r < rounds.size(); ++r) {
    std::unique_ptr<GetRoundState> cur = std::move(next);
    if (r + 1 < rounds.size()) next = BeginGet(keys_of(r + 1));
    const size_t at = rounds[r].first;
    const std::vector<std::string>& chunk = keys_of(r);
    auto chunk_parts = [&](size_t i, uint64_t size) { return parts_for(at + i, size); };
    std::vector<char> lapsed;
    std::vector<int64_t> got = FinishGet(cur.get(), chunk_parts, &lapsed, next ? 2 : 1);
    cur.reset();  // this round's reads are over
    // Reads that outlasted their lease: once more with a fresh lease (parts_for is asked
    // again for those keys: the object may have changed meanwhile).
    std::vector<size_t> again;
    for (size_t i = 0; i < chunk.size(); ++i) {
      if (lapsed[i]) again.push_back(i);
    }
    if (!again.empty()) {
      std::vector<std::string> keys2;
      for (size_t i : again) keys2.push_back(chunk[i]);
      std::vector<char> lapsed2;
      auto got2 = GetRound(
          keys2, [&](size_t j, uint64_t size) { return chunk_parts(again[j], size); }, &lapsed2);
      for (size_t j = 0; j < again.size(); ++j) {
        got[again[j]] = got2[j];
        if (lapsed2[j]) {
          LOG(WARNING) << "get " << keys2[j] << ": the read ended after the object's lease "
                       << "(twice): its bytes cannot be trusted (LEASE_EXPIRED)";
          got[again[j]] = ToInt(ErrorCode::LEASE_EXPIRED);
        }
      }
    }
    out.insert(out.end(), got.begin(), got.end());
  }
  return out;
}

std::chrono::steady_clock::time_point LeaseDeadline(std::chrono::steady_clock::time_point sent,
                                                    uint64_t ttl_ms) {
  if (ttl_ms == 0) return std::chrono::steady_clock::time_point::max();
  const auto lease = std::chrono::milliseconds(ttl_ms);
  return sent + lease - std::min<std::chrono::milliseconds>(lease / 10,
                                                            std::chrono::milliseconds(500));
}

// One round's reads, marked (ReadTracker) from BeginGet until the state goes, and its
// GetReplicaList, sent by BeginGet and answered in FinishGet.
struct StoreClient::Impl::GetRoundState {
  GetRoundState(ReadTracker* r, const std::vector<std::string>& k)
      : reads(r), keys(k), hashes(k.size()), lease_ids(k.size(), 0),
        arena(ArenaOptionsFor(k.size())) {}
  ~GetRoundState() {
    if (marked) reads->End(marks, hashes, lease_ids);
  }
  ReadTracker* const reads;
  const std::vector<std::string>& keys;
  std::vector<ReadTracker::Mark*> marks;
  std::vector<uint64_t> hashes;
  std::vector<uint64_t> lease_ids;
  bool marked = false;
  google::protobuf::Arena arena;  // before `reply`: the request lives on it
  std::chrono::steady_clock::time_point sent;
  std::optional<MasterStub::Reply<rpc::GetReplicaListResponse>> reply;
  // Per key: its read's deadline, and its replicas in the order tried (ours first, a
  // memcpy; then the master's): choices[choice_at[i] ..], choice_n[i] of them.
  std::vector<std::chrono::steady_clock::time_point> deadline;
  std::vector<const rpc::Replica*> choices;
  std::vector<uint32_t> choice_at, choice_n;
  // The local hot cache (empty without one): keys served from it, the versions of the others.
  std::vector<char> served;
  std::vector<uint64_t> versions;
};

std::unique_ptr<StoreClient::Impl::GetRoundState> StoreClient::Impl::BeginGet(
    const std::vector<std::string>& keys) {
  auto st = std::make_unique<GetRoundState>(&reads, keys);
  if (keys.empty()) return st;
  for (size_t i = 0; i < keys.size(); ++i) st->hashes[i] = ReadTracker::Hash(keys[i]);
  reads.Begin(st->hashes, &st->marks);
  st->marked = true;
  auto& req = *google::protobuf::Arena::CreateMessage<rpc::KeysRequest>(&st->arena);
  req.set_client_id(client_id);
  req.set_tenant_id(opt.tenant_id);
  for (const auto& k : keys) req.add_keys(k);
  st->sent = std::chrono::steady_clock::now();  // the lease starts later (LeaseDeadline)
  st->reply.emplace(master->StartGetReplicaList(req));
  return st;
}

std::vector<int64_t> StoreClient::Impl::GetRound(const std::vector<std::string>& keys,
                                                 const StoreClient::PartsFor& parts_for,
                                                 std::vector<char>* lapsed) {
  auto st = BeginGet(keys);
  return FinishGet(st.get(), parts_for, lapsed, 1);
}

std::vector<int64_t> StoreClient::Impl::FinishGet(GetRoundState* st,
                                                  const StoreClient::PartsFor& parts_for,
                                                  std::vector<char>* lapsed, int own_calls) {
  const std::vector<std::string>& keys = st->keys;
  std::vector<int64_t> out(keys.size(), 0);
  lapsed->assign(keys.size(), 0);
  if (keys.empty()) return out;
  auto& resp = *google::protobuf::Arena::CreateMessage<rpc::GetReplicaListResponse>(&st->arena);
  if (int rc = Checked("GetReplicaList", st->reply->Finish(&resp, own_calls)); rc != 0) {
    std::fill(out.begin(), out.end(), rc);
    return out;
  }
  if (resp.code() != 0) {
    LOG(WARNING) << "get: the master refused the request: " << resp.message();
    std::fill(out.begin(), out.end(), resp.code());
    return out;
  }
  if (resp.results_size() != static_cast<int>(keys.size())) {
    std::fill(out.begin(), out.end(), ToInt(ErrorCode::RPC_FAIL));
    return out;
  }
  // Per key: its lease, where its bytes go, and the replicas to try.
  std::vector<std::vector<Span>> parts(keys.size());
  st->deadline.resize(keys.size());
  st->choices.reserve(keys.size());
  st->choice_at.assign(keys.size(), 0);
  st->choice_n.assign(keys.size(), 0);
  std::vector<size_t> from_disk;  // keys whose only replica is on a disk
  if (hot_cache) {  // nothing per key for it without one
    st->served.assign(keys.size(), 0);
    st->versions.assign(keys.size(), 0);
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto& r = resp.results(static_cast<int>(i));
    st->lease_ids[i] = r.lease_id();
    st->deadline[i] = LeaseDeadline(st->sent, r.lease_ttl_ms());
    if (r.code() != 0) {
      out[i] = r.code();
      continue;
    }
    parts[i] = parts_for(i, r.size());
    if (!Stageable("get", keys[i], parts[i])) {
      out[i] = ToInt(ErrorCode::INVALID_PARAMS);
      continue;
    }
    if (r.size() > Total(parts[i])) {
      LOG(WARNING) << "get " << keys[i] << ": the buffer holds " << Total(parts[i])
                   << " bytes but the object has " << r.size();
      out[i] = ToInt(ErrorCode::INVALID_PARAMS);
      continue;
    }
    out[i] = static_cast<int64_t>(r.size());
    if (hot_cache) {
      st->versions[i] = r.version();
      if (hot_cache->Read(keys[i], r.version(), r.size(), parts[i])) {
        st->served[i] = 1;  // the master names the version cached: the bytes are the value
        continue;
      }
    }
    st->choice_at[i] = static_cast<uint32_t>(st->choices.size());
    bool disk_replica = false;
    for (const auto& rep : r.replicas()) {
      disk_replica |= rep.has_disk();
      if (rep.has_buffer() && rep.buffer().segment_name() == seg_name) st->choices.push_back(&rep);
    }
    for (const auto& rep : r.replicas()) {
      if (rep.has_buffer() && rep.buffer().segment_name() != seg_name) st->choices.push_back(&rep);
    }
    st->choice_n[i] = static_cast<uint32_t>(st->choices.size()) - st->choice_at[i];
    if (st->choice_n[i] == 0 && disk_replica) {
      from_disk.push_back(i);  // no memory replica left: its owner's disk serves it
      out[i] = 0;
    } else if (st->choice_n[i] == 0) {
      out[i] = ToInt(ErrorCode::INVALID_REPLICA);
    }
  }
  ReadReplicas(st, parts, &out, lapsed);
  if (!from_disk.empty()) ReadFromDisks(keys, from_disk, resp, parts, &out);
  if (hot_cache) {
    for (size_t i = 0; i < keys.size(); ++i) {
      // Read whole from another client's segment, within the lease: keep a copy.
      const bool remote = st->choice_n[i] > 0 &&
                          st->choices[st->choice_at[i]]->buffer().segment_name() != seg_name;
      if (!st->served[i] && out[i] > 0 && !(*lapsed)[i] && remote) {
        hot_cache->Fill(keys[i], st->versions[i], static_cast<uint64_t>(out[i]), parts[i]);
      }
    }
  }
  return out;
}

void StoreClient::Impl::ReadReplicas(GetRoundState* st, const std::vector<std::vector<Span>>& parts,
                                     std::vector<int64_t>* out, std::vector<char>* lapsed) {
  const std::vector<std::string>& keys = st->keys;
  // Replica 0 of every key in one round; keys that failed try their next replica.
  std::vector<size_t> attempt(keys.size(), 0);
  std::vector<size_t> pending;
  for (size_t i = 0; i < keys.size(); ++i) {
    if ((*out)[i] > 0 && (st->served.empty() || !st->served[i])) pending.push_back(i);
  }
  std::vector<Job> jobs;
  std::vector<Span> clipped;
  while (!pending.empty()) {
    jobs.clear();
    std::vector<char> failed(keys.size(), 0);
    for (size_t i : pending) {
      const rpc::Replica* rep = st->choices[st->choice_at[i] + attempt[i]];
      // Only the object's bytes: clip the parts to its size.
      size_t left = rep->buffer().size();
      clipped.clear();
      for (const auto& p : parts[i]) {
        if (left == 0) break;
        clipped.push_back({p.ptr, std::min(left, p.size)});
        left -= clipped.back().size;
      }
      AddJobs(TransferRequest::READ, clipped, &rep->buffer().segment_name(),
              rep->buffer().addr(), i, &jobs);
    }
    copier->Run(jobs, &failed);
    const auto done = std::chrono::steady_clock::now();
    std::vector<size_t> retry;
    for (size_t i : pending) {
      if (done > st->deadline[i]) {
        (*lapsed)[i] = 1;  // failed or not: no other replica may be read under this lease
        (*out)[i] = ToInt(ErrorCode::LEASE_EXPIRED);
        continue;
      }
      if (!failed[i]) continue;
      if (++attempt[i] < st->choice_n[i]) {
        LOG(WARNING) << "get " << keys[i] << ": replica failed, trying the next one";
        retry.push_back(i);
      } else {
        (*out)[i] = ToInt(ErrorCode::TRANSFER_FAIL);
      }
    }
    pending.swap(retry);
  }
}

}  // namespace store
}  // namespace mooncake
