// Moving objects: put (start, write every replica, end or revoke), get (replica list, read with
// fallback to the next replica), and staging of unregistered memory through the local buffer.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#include "store/store_client_impl.h"

namespace mooncake {
namespace store {

namespace {

constexpr size_t kMaxStagingChunk = 4 << 20;

size_t Total(const std::vector<Span>& parts) {
  size_t n = 0;
  for (const auto& p : parts) n += p.size;
  return n;
}

rpc::ReplicateConfig ToProto(const ReplicateConfig& c) {
  rpc::ReplicateConfig out;
  out.set_replica_num(static_cast<uint32_t>(std::max<size_t>(1, c.replica_num)));
  out.set_with_soft_pin(c.with_soft_pin);
  out.set_soft_pin_ttl_ms(c.soft_pin_ttl_ms);
  out.set_with_hard_pin(c.with_hard_pin);
  for (const auto& s : c.preferred_segments) out.add_preferred_segments(s);
  out.set_prefer_alloc_in_same_node(c.prefer_alloc_in_same_node);
  out.set_keep_soft_pin(c.keep_soft_pin);
  return out;
}

}  // namespace

rpc::ReplicateConfig ConfigToProto(const ReplicateConfig& c) { return ToProto(c); }

google::protobuf::ArenaOptions ArenaOptionsFor(size_t items) {
  google::protobuf::ArenaOptions o;
  // About what a round of `items` keys takes (request and reply), so one block serves it.
  o.start_block_size = std::min<size_t>(4096 + items * 256, 1 << 20);
  o.max_block_size = 1 << 20;
  return o;
}

void StoreClient::Impl::RunJobs(const std::vector<Job>& jobs, std::vector<char>* failed) {
  struct Staged {
    const Job* job;
    size_t offset;  // within the job
    size_t len;
  };
  std::vector<TransferRequest> direct;
  std::vector<size_t> direct_owner;
  std::vector<Staged> staged;
  // No local buffer: PutMany / GetRound refused unregistered memory before this.
  const size_t chunk = staging ? std::min<size_t>(kMaxStagingChunk, staging->capacity()) : 0;
  // A batch's jobs mostly name one segment and one registered buffer: the last ones found are
  // tried first (no lock, no lookup).
  const std::string* last_segment = nullptr;
  SegmentID last_target = 0;
  const char* reg_lo = nullptr;
  const char* reg_hi = nullptr;
  direct.reserve(jobs.size());
  direct_owner.reserve(jobs.size());
  for (const Job& job : jobs) {
    if ((*failed)[job.owner]) continue;
    if (*job.segment == seg_name) {  // a replica in our own segment: plain memory
      void* remote = reinterpret_cast<void*>(job.remote);
      if (job.op == TransferRequest::WRITE) {
        std::memcpy(remote, job.local, job.len);
      } else {
        std::memcpy(job.local, remote, job.len);
      }
      continue;
    }
    if (last_segment == nullptr || *job.segment != *last_segment) {
      auto target = Open(*job.segment);
      if (!target.ok()) {
        LOG(ERROR) << "store: cannot reach segment " << *job.segment << ": "
                   << target.status().ToString();
        (*failed)[job.owner] = 1;
        continue;
      }
      last_segment = job.segment;
      last_target = *target;
    }
    bool registered = reg_lo != nullptr && job.local >= reg_lo && job.local <= reg_hi &&
                      job.len <= static_cast<size_t>(reg_hi - job.local);
    if (!registered) {
      uint64_t lo = 0, len = 0;
      registered = RegisteredRange(job.local, job.len, &lo, &len);
      if (registered) {
        reg_lo = reinterpret_cast<const char*>(lo);
        reg_hi = reg_lo + len;
      }
    }
    if (registered) {
      direct.push_back({job.op, job.local, last_target, job.remote, job.len});
      direct_owner.push_back(job.owner);
    } else if (chunk == 0) {
      LOG(ERROR) << "store: unregistered memory and no local buffer to stage it";
      (*failed)[job.owner] = 1;
    } else {
      for (size_t off = 0; off < job.len; off += chunk) {
        staged.push_back({&job, off, std::min(chunk, job.len - off)});
      }
    }
  }
  size_t next_staged = 0;
  bool first = true;
  bool all_inline = true;
  struct Report {
    std::atomic<bool>& to;
    const bool& inline_;
    ~Report() { to.store(inline_, std::memory_order_relaxed); }
  } report{copies_inline, all_inline};
  while (first || next_staged < staged.size()) {
    std::vector<TransferRequest> reqs;
    std::vector<size_t> owners;
    std::vector<std::pair<const Staged*, char*>> round;
    if (first) {
      reqs = std::move(direct);
      owners = std::move(direct_owner);
      first = false;
    }
    while (next_staged < staged.size()) {
      const Staged& s = staged[next_staged];
      if ((*failed)[s.job->owner]) {
        ++next_staged;
        continue;
      }
      char* buf = static_cast<char*>(AllocStaging(s.len, reqs.empty()));
      if (buf == nullptr) {
        if (!reqs.empty()) break;  // submit what we have, then wait for room
        LOG(ERROR) << "store: no staging space for " << s.len << " bytes within the timeout";
        (*failed)[s.job->owner] = 1;
        ++next_staged;
        continue;
      }
      if (s.job->op == TransferRequest::WRITE) std::memcpy(buf, s.job->local + s.offset, s.len);
      auto target = Open(*s.job->segment);  // cached by now
      reqs.push_back({s.job->op, buf, *target, s.job->remote + s.offset, s.len});
      owners.push_back(s.job->owner);
      round.emplace_back(&s, buf);
      ++next_staged;
    }
    if (reqs.empty()) break;
    std::vector<char> req_failed(reqs.size(), 0);
    auto batch = engine->AllocateBatchID(reqs.size());
    if (!batch.ok()) {
      LOG(ERROR) << "store: " << batch.status().ToString();
      std::fill(req_failed.begin(), req_failed.end(), 1);
    } else {
      Status s = engine->SubmitTransfer(*batch, reqs);
      if (!s.ok()) {
        LOG(ERROR) << "store: transfer refused: " << s.ToString();
        std::fill(req_failed.begin(), req_failed.end(), 1);
      } else {
        // Ended by the time Submit returned (same-host copies through memory a holder lends):
        // overlapping the master's next lookups with these copies pays (see GetMany).
        auto now = engine->GetBatchTransferStatus(*batch);
        if (!now.ok() || now->s == WAITING) all_inline = false;
        size_t bytes = 0;
        for (const auto& r : reqs) bytes += r.length;
        const auto timeout = opt.transfer_timeout + std::chrono::milliseconds(bytes >> 20);
        // The engine ends every request (its slice timeout bounds a silent peer); staging
        // memory must outlive the requests, so wait for the end even past our timeout.
        auto st = engine->WaitBatch(*batch, timeout);
        while (st.ok() && st->s == WAITING) {
          LOG(WARNING) << "store: transfer of " << bytes << " bytes still running after "
                       << timeout.count() << " ms";
          st = engine->WaitBatch(*batch, std::chrono::seconds(5));
        }
        for (size_t i = 0; i < reqs.size(); ++i) {
          auto ts = engine->GetTransferStatus(*batch, i);
          if (!ts.ok() || ts->s != COMPLETED) {
            req_failed[i] = 1;
            auto err = engine->GetTransferError(*batch, i);
            LOG(ERROR) << "store: transfer " << (reqs[i].opcode == TransferRequest::WRITE ? "to" : "from")
                       << " a replica failed: " << (err.ok() ? *err : err.status().ToString());
          }
        }
      }
      (void)engine->FreeBatchID(*batch);
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (req_failed[i]) (*failed)[owners[i]] = 1;
    }
    for (const auto& [s, buf] : round) {
      if (s->job->op == TransferRequest::READ && !(*failed)[s->job->owner]) {
        std::memcpy(s->job->local + s->offset, buf, s->len);
      }
      FreeStaging(buf);
    }
  }
}

// Lays `parts` (the object, in order) over one replica at `remote`.
static void AddJobs(TransferRequest::OpCode op, const std::vector<Span>& parts,
                    const std::string* segment, uint64_t remote, size_t owner,
                    std::vector<Job>* jobs) {
  uint64_t off = 0;
  for (const auto& p : parts) {
    if (p.size == 0) continue;
    jobs->push_back({op, static_cast<char*>(p.ptr), p.size, segment, remote + off, owner});
    off += p.size;
  }
}

bool StoreClient::Impl::Stageable(const char* what, const std::string& key,
                                  const std::vector<Span>& parts) {
  if (local_buf != nullptr) return true;
  for (const auto& p : parts) {
    if (p.size != 0 && !IsRegistered(p.ptr, p.size)) {
      LOG(WARNING) << what << " " << key << ": the memory is not registered and this client has "
                   << "no local buffer to stage it (local_buffer_size=0): register_buffer it, "
                   << "or set up with a local_buffer_size > 0";
      return false;
    }
  }
  return true;
}

std::vector<int> StoreClient::Impl::PutMany(const std::vector<std::string>& keys,
                                            const std::vector<std::vector<Span>>& parts,
                                            const ReplicateConfig& config, bool upsert) {
  if (keys.size() != parts.size()) {
    LOG(WARNING) << "put: " << keys.size() << " keys but " << parts.size() << " values";
    return std::vector<int>(keys.size(), ToInt(ErrorCode::INVALID_PARAMS));
  }
  if (local_buf == nullptr) {  // refuse unregistered values up front, put the rest
    std::vector<int> codes(keys.size(), ToInt(ErrorCode::INVALID_PARAMS));
    std::vector<std::string> ok_keys;
    std::vector<std::vector<Span>> ok_parts;
    std::vector<size_t> idx;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!Stageable("put", keys[i], parts[i])) continue;
      ok_keys.push_back(keys[i]);
      ok_parts.push_back(parts[i]);
      idx.push_back(i);
    }
    if (idx.size() != keys.size()) {
      if (!idx.empty()) {
        auto got = PutMany(ok_keys, ok_parts, config, upsert);
        for (size_t j = 0; j < idx.size(); ++j) codes[idx[j]] = got[j];
      }
      return codes;
    }
  }
  std::vector<int> codes = PutSplit(keys, parts, config, upsert);
  if (!upsert) return codes;
  // Another writer's put or upsert of a key is in flight: wait for it (bounded), then ours.
  const auto deadline = std::chrono::steady_clock::now() + opt.rpc_timeout;
  auto pause = std::chrono::milliseconds(2);
  const int busy = ToInt(ErrorCode::OBJECT_REPLICA_BUSY);
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<std::string> again_keys;
    std::vector<std::vector<Span>> again_parts;
    std::vector<size_t> idx;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (codes[i] != busy) continue;
      again_keys.push_back(keys[i]);
      again_parts.push_back(parts[i]);
      idx.push_back(i);
    }
    if (idx.empty()) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
    auto got = PutSplit(again_keys, again_parts, config, upsert);
    for (size_t j = 0; j < idx.size(); ++j) codes[idx[j]] = got[j];
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (codes[i] == busy) {
      LOG(WARNING) << "upsert " << keys[i] << ": another put or upsert of the key was still in "
                   << "flight after " << opt.rpc_timeout.count() << " ms (OBJECT_REPLICA_BUSY)";
    }
  }
  return codes;
}

std::vector<int> StoreClient::Impl::PutSplit(const std::vector<std::string>& keys,
                                             const std::vector<std::vector<Span>>& parts,
                                             const ReplicateConfig& config, bool upsert) {
  if (keys.size() <= kMaxBatchItems) return PutRound(keys, parts, config, upsert);
  std::vector<int> codes;
  for (size_t at = 0; at < keys.size(); at += kMaxBatchItems) {
    const size_t end = std::min(keys.size(), at + kMaxBatchItems);
    auto part = PutRound({keys.begin() + at, keys.begin() + end},
                         {parts.begin() + at, parts.begin() + end}, config, upsert);
    codes.insert(codes.end(), part.begin(), part.end());
  }
  return codes;
}

std::vector<int> StoreClient::Impl::PutRound(const std::vector<std::string>& keys,
                                             const std::vector<std::vector<Span>>& parts,
                                             const ReplicateConfig& config, bool upsert) {
  std::vector<int> codes(keys.size(), 0);
  if (keys.empty()) return codes;
  // The messages of a round live on one arena: a batch's hundreds of small messages and
  // strings cost no malloc / free each.
  google::protobuf::Arena arena(ArenaOptionsFor(keys.size()));
  // A batch of kPipelineKeys or more whose copies end within their Submit (as GetMany) asks
  // for its space in two PutStarts, the second sent before the first half is written, so that
  // the master places the second half while this client copies the first; one PutEnd ends
  // them all.
  constexpr size_t kPipelineKeys = 64;
  const size_t halves =
      keys.size() >= kPipelineKeys && copies_inline.load(std::memory_order_relaxed) ? 2 : 1;
  const size_t split = halves == 2 ? keys.size() / 2 : keys.size();
  struct Half {
    size_t at, end;
    rpc::PutStartRequest* req;
    std::optional<RpcClient::PendingCall> call;
  };
  std::vector<Half> half(halves);
  for (size_t h = 0; h < halves; ++h) {
    half[h].at = h == 0 ? 0 : split;
    half[h].end = h + 1 == halves ? keys.size() : split;
    auto& req = *google::protobuf::Arena::CreateMessage<rpc::PutStartRequest>(&arena);
    req.set_client_id(client_id);
    req.set_upsert(upsert);
    *req.mutable_config() = ToProto(config);
    for (size_t i = half[h].at; i < half[h].end; ++i) {
      auto* item = req.add_items();
      item->set_key(keys[i]);
      item->set_size(Total(parts[i]));
    }
    half[h].req = &req;
    half[h].call.emplace(master->Start(MasterMethod::kPutStart, req, opt.rpc_timeout));
  }
  std::vector<Job> jobs;
  std::vector<char> failed(keys.size(), 0);
  for (size_t h = 0; h < halves; ++h) {
    const size_t at = half[h].at, n = half[h].end - half[h].at;
    auto& resp = *google::protobuf::Arena::CreateMessage<rpc::PutStartResponse>(&arena);
    Status s = master->Finish(&*half[h].call, &resp, static_cast<int>(halves - h));
    if (!s.ok()) LOG(ERROR) << "PutStart: " << s.message();
    if (s.ok() && resp.code() != 0) {
      LOG(WARNING) << "put: the master refused the request: " << resp.message();
      std::fill(codes.begin() + at, codes.begin() + at + n, resp.code());
      continue;
    }
    if (!s.ok() || resp.results_size() != static_cast<int>(n)) {
      std::fill(codes.begin() + at, codes.begin() + at + n, ToInt(ErrorCode::RPC_FAIL));
      continue;
    }
    jobs.clear();
    for (size_t i = at; i < at + n; ++i) {
      const auto& r = resp.results(static_cast<int>(i - at));
      codes[i] = r.code();
      if (r.code() != 0) {
        if (r.code() != ToInt(ErrorCode::OBJECT_ALREADY_EXISTS) &&
            r.code() != ToInt(ErrorCode::OBJECT_REPLICA_BUSY)) {
          LOG(WARNING) << "put " << keys[i] << ": " << ErrorCodeName(r.code()) << ": "
                       << r.message();
        }
        continue;
      }
      for (const auto& rep : r.replicas()) {
        AddJobs(TransferRequest::WRITE, parts[i], &rep.buffer().segment_name(),
                rep.buffer().addr(), i, &jobs);
      }
    }
    RunJobs(jobs, &failed);
  }
  auto& end = *google::protobuf::Arena::CreateMessage<rpc::KeysRequest>(&arena);
  auto& revoke = *google::protobuf::Arena::CreateMessage<rpc::KeysRequest>(&arena);
  end.set_client_id(client_id);
  revoke.set_client_id(client_id);
  std::vector<size_t> end_idx;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (codes[i] != 0) continue;
    if (failed[i]) {
      revoke.add_keys(keys[i]);
      codes[i] = ToInt(ErrorCode::TRANSFER_FAIL);
    } else {
      end.add_keys(keys[i]);
      end_idx.push_back(i);
    }
  }
  if (revoke.keys_size() > 0) {
    rpc::CodesResponse r;
    (void)Call("PutRevoke", MasterMethod::kPutRevoke, revoke, &r);
  }
  if (end.keys_size() > 0) {
    rpc::CodesResponse r;
    if (Call("PutEnd", MasterMethod::kPutEnd, end, &r) != 0 ||
        r.codes_size() != end.keys_size()) {
      for (size_t i : end_idx) codes[i] = ToInt(ErrorCode::RPC_FAIL);
    } else {
      for (size_t j = 0; j < end_idx.size(); ++j) {
        codes[end_idx[j]] = r.codes(static_cast<int>(j));
        if (r.codes(static_cast<int>(j)) != 0) {
          LOG(WARNING) << "put " << keys[end_idx[j]] << ": PutEnd: "
                       << ErrorCodeName(r.codes(static_cast<int>(j)));
        }
      }
    }
  }
  return codes;
}

std::vector<int64_t> StoreClient::Impl::GetMany(const std::vector<std::string>& keys,
                                                const StoreClient::PartsFor& parts_for) {
  // Rounds of at most kMaxBatchItems keys, each round's GetReplicaList sent before the
  // previous round's objects are read, so that the master's lookups overlap this client's
  // copies. Where the last copies ended within their Submit (same-host memory a holder
  // lends), a batch of kPipelineKeys or more is split in two for that; where they go over a
  // network transport, two transfer waits would cost more than the overlap gains.
  constexpr size_t kPipelineKeys = 64;
  std::vector<std::pair<size_t, size_t>> rounds;  // [at, end)
  const bool pipeline = keys.size() >= kPipelineKeys && copies_inline.load(std::memory_order_relaxed);
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

// One round's reads, registered (see ReadMark) from BeginGet until the state goes, and its
// GetReplicaList, sent by BeginGet and answered in FinishGet.
struct StoreClient::Impl::GetRoundState {
  explicit GetRoundState(Impl* s, const std::vector<std::string>& k)
      : self(s), keys(k), marks(k.size()), hashes(k.size()), lease_ids(k.size(), 0),
        arena(ArenaOptionsFor(k.size())) {}
  ~GetRoundState() {
    if (!registered) return;
    std::lock_guard<std::mutex> lock(self->reads_mu);
    --self->active_reads;
    for (size_t i = 0; i < marks.size(); ++i) self->reads.End(marks[i], hashes[i], lease_ids[i]);
  }
  Impl* const self;
  const std::vector<std::string>& keys;
  std::vector<ReadMark*> marks;
  std::vector<uint64_t> hashes;
  std::vector<uint64_t> lease_ids;
  bool registered = false;
  google::protobuf::Arena arena;
  rpc::KeysRequest* req = nullptr;
  std::chrono::steady_clock::time_point sent;
  std::optional<RpcClient::PendingCall> call;
};

std::unique_ptr<StoreClient::Impl::GetRoundState> StoreClient::Impl::BeginGet(
    const std::vector<std::string>& keys) {
  auto st = std::make_unique<GetRoundState>(this, keys);
  if (keys.empty()) return st;
  for (size_t i = 0; i < keys.size(); ++i) st->hashes[i] = KeyHash(keys[i]);
  {
    std::lock_guard<std::mutex> lock(reads_mu);
    ++active_reads;
    for (size_t i = 0; i < keys.size(); ++i) st->marks[i] = reads.Begin(st->hashes[i]);
  }
  st->registered = true;
  st->req = google::protobuf::Arena::CreateMessage<rpc::KeysRequest>(&st->arena);
  st->req->set_client_id(client_id);
  for (const auto& k : keys) st->req->add_keys(k);
  // The lease starts when the master answers, later than this: a read that ends before
  // sent + lease (less a margin for clock rates) read bytes the master had not reused.
  st->sent = std::chrono::steady_clock::now();
  st->call.emplace(master->Start(MasterMethod::kGetReplicaList, *st->req, opt.rpc_timeout));
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
  std::vector<uint64_t>& lease_ids = st->lease_ids;
  const auto sent = st->sent;
  std::vector<std::vector<Span>> parts(keys.size());
  auto& resp = *google::protobuf::Arena::CreateMessage<rpc::GetReplicaListResponse>(&st->arena);
  int rc = 0;
  {
    Status s = master->Finish(&*st->call, &resp, own_calls);
    if (!s.ok()) {
      LOG(ERROR) << "GetReplicaList: " << s.message();
      rc = ToInt(ErrorCode::RPC_FAIL);
    }
  }
  if (rc == 0 && resp.code() != 0) {
    LOG(WARNING) << "get: the master refused the request: " << resp.message();
    std::fill(out.begin(), out.end(), resp.code());
    return out;
  }
  if (rc != 0 || resp.results_size() != static_cast<int>(keys.size())) {
    std::fill(out.begin(), out.end(), ToInt(ErrorCode::RPC_FAIL));
    return out;
  }
  std::vector<std::chrono::steady_clock::time_point> deadline(
      keys.size(), std::chrono::steady_clock::time_point::max());
  for (size_t i = 0; i < keys.size(); ++i) {
    lease_ids[i] = resp.results(static_cast<int>(i)).lease_id();
    const uint64_t ttl = resp.results(static_cast<int>(i)).lease_ttl_ms();
    if (ttl == 0) continue;  // no lease known: nothing to bound by
    const auto lease = std::chrono::milliseconds(ttl);
    deadline[i] = sent + lease - std::min<std::chrono::milliseconds>(lease / 10,
                                                                     std::chrono::milliseconds(500));
  }
  // Replica order per key: ours first (a memcpy), then the master's order; key i's are
  // choices[choice_at[i] ..] (choice_n[i] of them).
  std::vector<const rpc::Replica*> choices;
  choices.reserve(keys.size());
  std::vector<uint32_t> choice_at(keys.size(), 0), choice_n(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto& r = resp.results(static_cast<int>(i));
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
    choice_at[i] = static_cast<uint32_t>(choices.size());
    for (const auto& rep : r.replicas()) {
      if (rep.buffer().segment_name() == seg_name) choices.push_back(&rep);
    }
    for (const auto& rep : r.replicas()) {
      if (rep.buffer().segment_name() != seg_name) choices.push_back(&rep);
    }
    choice_n[i] = static_cast<uint32_t>(choices.size()) - choice_at[i];
    if (choice_n[i] == 0) out[i] = ToInt(ErrorCode::INVALID_REPLICA);
  }
  // Try replica 0 of every key in one round; keys that failed try their next replica.
  std::vector<size_t> attempt(keys.size(), 0);
  std::vector<size_t> pending;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (out[i] > 0) pending.push_back(i);
  }
  std::vector<Job> jobs;
  std::vector<Span> clipped;
  while (!pending.empty()) {
    jobs.clear();
    std::vector<char> failed(keys.size(), 0);
    for (size_t i : pending) {
      const rpc::Replica* rep = choices[choice_at[i] + attempt[i]];
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
    RunJobs(jobs, &failed);
    const auto done = std::chrono::steady_clock::now();
    std::vector<size_t> retry;
    for (size_t i : pending) {
      if (done > deadline[i]) {
        (*lapsed)[i] = 1;  // failed or not: no other replica may be read under this lease
        out[i] = ToInt(ErrorCode::LEASE_EXPIRED);
        continue;
      }
      if (!failed[i]) continue;
      if (++attempt[i] < choice_n[i]) {
        LOG(WARNING) << "get " << keys[i] << ": replica failed, trying the next one";
        retry.push_back(i);
      } else {
        out[i] = ToInt(ErrorCode::TRANSFER_FAIL);
      }
    }
    pending.swap(retry);
  }
  return out;
}

}  // namespace store
}  // namespace mooncake
