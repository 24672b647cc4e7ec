// Moving objects: put (start, write every replica, end or revoke), the copies (RunJobs), and
// staging of unregistered memory through the local buffer. Gets: store_client_get.cc.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#include "store/client/store_client_impl.h"

namespace mooncake {
namespace store {

namespace {

constexpr size_t kMaxStagingChunk = 4 << 20;

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

size_t Total(const std::vector<Span>& parts) {
  size_t n = 0;
  for (const auto& p : parts) n += p.size;
  return n;
}

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

void AddJobs(TransferRequest::OpCode op, const std::vector<Span>& parts,
             const std::string* segment, uint64_t remote, size_t owner, std::vector<Job>* jobs) {
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

}  // namespace store
}  // namespace mooncake
