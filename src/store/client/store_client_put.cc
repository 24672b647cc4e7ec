// Puts: PutStart (where the replicas go), the copies into every replica, then PutEnd for
// the objects written whole and PutRevoke for the others. The copies: copier.h.
#include <google/protobuf/arena.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "store/client/store_client_impl.h"

namespace mooncake {
namespace store {

rpc::ReplicateConfig ConfigToProto(const ReplicateConfig& c) {
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

size_t Total(const std::vector<Span>& parts) {
  size_t n = 0;
  for (const auto& p : parts) n += p.size;
  return n;
}

google::protobuf::ArenaOptions ArenaOptionsFor(size_t items) {
  google::protobuf::ArenaOptions o;
  // About what a round of `items` keys takes (request and reply), so one block serves it.
  o.start_block_size = std::min<size_t>(4096 + items * 256, 1 << 20);
  o.max_block_size = 1 << 20;
  return o;
}

bool StoreClient::Impl::Stageable(const char* what, const std::string& key,
                                  const std::vector<Span>& parts) {
  if (staging) return true;
  for (const auto& p : parts) {
    if (p.size != 0 && !registrations.Contains(p.ptr, p.size)) {
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
  if (!staging) {  // refuse unregistered values up front, put the rest
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

// One round's state: its messages on one arena (a batch's hundreds of small messages and
// strings cost no malloc / free each), its PutStart halves, and per key its code and
// whether a copy failed.
struct StoreClient::Impl::PutBatch {
  PutBatch(const std::vector<std::string>& k, const std::vector<std::vector<Span>>& p)
      : keys(k), parts(p), arena(ArenaOptionsFor(k.size())), codes(k.size(), 0),
        failed(k.size(), 0) {}
  struct Half {
    size_t at, end;  // keys [at, end)
    std::optional<MasterStub::Reply<rpc::PutStartResponse>> reply;
  };
  const std::vector<std::string>& keys;
  const std::vector<std::vector<Span>>& parts;
  google::protobuf::Arena arena;  // before `halves`: their requests live on it
  std::vector<Half> halves;
  std::vector<int> codes;
  std::vector<char> failed;
  std::vector<Job> jobs;
};

std::vector<int> StoreClient::Impl::PutRound(const std::vector<std::string>& keys,
                                             const std::vector<std::vector<Span>>& parts,
                                             const ReplicateConfig& config, bool upsert) {
  if (keys.empty()) return {};
  PutBatch b(keys, parts);
  // A batch of kPipelineKeys or more whose copies end within their Submit (as GetMany) asks
  // for its space in two PutStarts, the second sent before the first half is written, so that
  // the master places the second half while this client copies the first; one PutEnd ends
  // them all.
  constexpr size_t kPipelineKeys = 64;
  const size_t halves = keys.size() >= kPipelineKeys && copier->copies_inline() ? 2 : 1;
  const size_t split = halves == 2 ? keys.size() / 2 : keys.size();
  b.halves.resize(halves);
  for (size_t h = 0; h < halves; ++h) {
    auto& half = b.halves[h];
    half.at = h == 0 ? 0 : split;
    half.end = h + 1 == halves ? keys.size() : split;
    auto& req = *google::protobuf::Arena::CreateMessage<rpc::PutStartRequest>(&b.arena);
    req.set_client_id(client_id);
    req.set_tenant_id(opt.tenant_id);
    req.set_upsert(upsert);
    if (!upsert) req.set_put_nonce(NewPutNonce());  // a resend is granted the same space
    *req.mutable_config() = ConfigToProto(config);
    for (size_t i = half.at; i < half.end; ++i) {
      auto* item = req.add_items();
      item->set_key(keys[i]);
      item->set_size(Total(parts[i]));
    }
    half.reply.emplace(master->StartPutStart(req));
  }
  for (size_t h = 0; h < halves; ++h) WriteHalf(&b, h);
  EndPuts(&b);
  return b.codes;
}

// Half h's PutStart reply, and the copies of its keys into their replicas.
void StoreClient::Impl::WriteHalf(PutBatch* b, size_t h) {
  const size_t at = b->halves[h].at, n = b->halves[h].end - at;
  auto fill = [&](int code) { std::fill(b->codes.begin() + at, b->codes.begin() + at + n, code); };
  auto& resp = *google::protobuf::Arena::CreateMessage<rpc::PutStartResponse>(&b->arena);
  const Status s = b->halves[h].reply->Finish(&resp, static_cast<int>(b->halves.size() - h));
  if (int rc = Checked("PutStart", s); rc != 0) return fill(rc);
  if (resp.code() != 0) {
    LOG(WARNING) << "put: the master refused the request: " << resp.message();
    return fill(resp.code());
  }
  if (resp.results_size() != static_cast<int>(n)) return fill(ToInt(ErrorCode::RPC_FAIL));
  b->jobs.clear();
  for (size_t i = at; i < at + n; ++i) {
    const auto& r = resp.results(static_cast<int>(i - at));
    b->codes[i] = r.code();
    if (r.code() != 0) {
      if (r.code() != ToInt(ErrorCode::OBJECT_ALREADY_EXISTS) &&
          r.code() != ToInt(ErrorCode::OBJECT_REPLICA_BUSY)) {
        LOG(WARNING) << "put " << b->keys[i] << ": " << ErrorCodeName(r.code()) << ": "
                     << r.message();
      }
      continue;
    }
    for (const auto& rep : r.replicas()) {
      AddJobs(TransferRequest::WRITE, b->parts[i], &rep.buffer().segment_name(),
              rep.buffer().addr(), i, &b->jobs);
    }
  }
  copier->Run(b->jobs, &b->failed);
}

// PutRevoke for the keys whose copies failed (TRANSFER_FAIL), PutEnd for those written.
void StoreClient::Impl::EndPuts(PutBatch* b) {
  auto& end = *google::protobuf::Arena::CreateMessage<rpc::KeysRequest>(&b->arena);
  auto& revoke = *google::protobuf::Arena::CreateMessage<rpc::KeysRequest>(&b->arena);
  end.set_client_id(client_id);
  end.set_tenant_id(opt.tenant_id);
  revoke.set_client_id(client_id);
  revoke.set_tenant_id(opt.tenant_id);
  std::vector<size_t> end_idx;
  for (size_t i = 0; i < b->keys.size(); ++i) {
    if (b->codes[i] != 0) continue;
    if (b->failed[i]) {
      revoke.add_keys(b->keys[i]);
      b->codes[i] = ToInt(ErrorCode::TRANSFER_FAIL);
    } else {
      end.add_keys(b->keys[i]);
      end_idx.push_back(i);
    }
  }
  if (revoke.keys_size() > 0) {
    rpc::CodesResponse r;
    (void)Checked("PutRevoke", master->PutRevoke(revoke, &r));
  }
  if (end.keys_size() == 0) return;
  rpc::CodesResponse r;
  if (Checked("PutEnd", master->PutEnd(end, &r)) != 0 || r.codes_size() != end.keys_size()) {
    for (size_t i : end_idx) b->codes[i] = ToInt(ErrorCode::RPC_FAIL);
    return;
  }
  for (size_t j = 0; j < end_idx.size(); ++j) {
    const int code = r.codes(static_cast<int>(j));
    b->codes[end_idx[j]] = code;
    if (code != 0) LOG(WARNING) << "put " << b->keys[end_idx[j]] << ": PutEnd: " << ErrorCodeName(code);
  }
}

}  // namespace store
}  // namespace mooncake
