// MasterService: removal (Remove, RemoveByRegex, RemoveAll) and the freeing of space, which
// waits in the graveyard while a reader's lease on the object lasts.
#include <glog/logging.h>
#include <re2/re2.h>

#include <algorithm>
#include <limits>

#include "store/common/limits.h"
#include "store/master/master_service.h"
#include "store/master/master_service_internal.h"
#include "store/tenants/tenant_id.h"

namespace mooncake {
namespace store {

void MasterService::FreeObjectLocked(const Object& obj, Clock::time_point now) {
  if (standby_) return HoldLocked(obj, nullptr, now);
  // After a promotion, readers of the previous leader may hold leases this master never
  // granted: until lease_floor_ every object it inherited counts as leased (one written
  // since has no such readers: a fresh cluster's first leader reuses space at once).
  const bool inherited = lease_floor_ > now && obj.stamp <= promoted_at_;
  const bool leased = obj.lease_until > now || inherited;
  const auto free_at = inherited ? std::max(obj.lease_until, lease_floor_) : obj.lease_until;
  for (const auto& p : obj.replicas) {
    auto seg = segments_.find(p.segment_id);
    if (seg == segments_.end()) continue;
    if (leased) {
      // A reader may be copying these bytes now: the space is reused only after its lease.
      graveyard_.push({p.segment_id, {p.offset, p.handle}, obj.size, free_at});
      graveyard_bytes_ += obj.size;
      ++counters_.deferred_frees;
    } else {
      seg->second->alloc.Free({p.offset, p.handle});
    }
  }
}

void MasterService::ReapGraveyardLocked(Clock::time_point now) {
  while (!graveyard_.empty() && graveyard_.top().free_at <= now) {
    const Grave& g = graveyard_.top();
    auto seg = segments_.find(g.segment_id);
    if (seg != segments_.end()) seg->second->alloc.Free(g.space);
    graveyard_bytes_ -= g.size;
    graveyard_.pop();
  }
}

uint64_t MasterService::GraveyardBytesLocked() const { return graveyard_bytes_; }

void MasterService::EndOwnLeaseLocked(Object* obj, const std::string& client,
                                      Clock::time_point now) {
  if (!client.empty() && obj->lease_client == client && obj->foreign_until <= now) {
    obj->lease_until = std::min(obj->lease_until, now);
  }
}

rpc::CodesResponse MasterService::Remove(const rpc::KeysRequest& req) {
  rpc::CodesResponse resp;
  const std::string batch = BatchProblem("Remove", req.keys_size());
  if (!batch.empty()) {
    resp.set_code(Code(ErrorCode::INVALID_PARAMS));
    resp.set_message(batch);
    MutexLock lock(&mu_);
    ++counters_.refused_requests;
    return resp;
  }
  MutexLock lock(&mu_);
  const auto now = now_();
  PrefetchLocked(req.keys_size(), [&](size_t i) -> const std::string& {
    return req.keys(static_cast<int>(i));
  });
  for (int i = 0; i < req.keys_size(); ++i) {
    const std::string& key = req.keys(i);
    ++counters_.remove;
    if (!StoredKeyProblem(key).empty()) {
      resp.add_codes(Code(ErrorCode::INVALID_KEY));
      continue;
    }
    auto it = objects_.find(key, hashes_[i]);
    if (it == objects_.end()) {
      // Only on a disk (served, or its client away: the removal waits for it all the same).
      const bool served = DiskServedLocked(key);
      DiskForgetLocked(key);
      resp.add_codes(Code(served ? ErrorCode::OK : ErrorCode::OBJECT_NOT_FOUND));
    } else if (!it->second.complete) {
      resp.add_codes(Code(ErrorCode::REPLICA_IS_NOT_READY));
    } else if (!req.force() && Leased(it->second, now)) {
      resp.add_codes(Code(ErrorCode::OBJECT_HAS_LEASE));
    } else if (!req.force() && tasks_.RunningOf(key) != nullptr) {
      resp.add_codes(Code(ErrorCode::OBJECT_HAS_REPLICATION_TASK));
    } else {
      // The remover's own completed read holds the latest lease and every lease granted to
      // other clients has lapsed (the client vouches that none of its reads of the key is in
      // flight): nobody can be copying the bytes, so the space is freed at once.
      const uint64_t done = i < req.read_lease_ids_size() ? req.read_lease_ids(i) : 0;
      if (done != 0 && done == it->second.lease_id) {
        EndOwnLeaseLocked(&it->second, req.client_id(), now);
      }
      EraseObjectLocked(it, now);  // forced while leased: invisible now, space freed after the lease
      DiskForgetLocked(key);
      resp.add_codes(Code(ErrorCode::OK));
    }
  }
  counters_.remove_failures += FailedCodes(resp.codes());
  return resp;
}

rpc::CountResponse MasterService::RemoveByRegex(const rpc::RemoveByRegexRequest& req) {
  rpc::CountResponse resp = RemoveByRegexUncounted(req);
  MutexLock lock(&mu_);
  ++counters_.remove_by_regex;
  if (resp.code() != Code(ErrorCode::OK)) ++counters_.remove_by_regex_failures;
  return resp;
}

rpc::CountResponse MasterService::RemoveByRegexUncounted(const rpc::RemoveByRegexRequest& req) {
  rpc::CountResponse resp;
  if (req.regex().size() > kMaxRegexBytes) {
    resp.set_code(Code(ErrorCode::INVALID_PARAMS));
    resp.set_message("regular expression of " + std::to_string(req.regex().size()) +
                     " bytes is longer than the limit of " + std::to_string(kMaxRegexBytes) +
                     " bytes");
    return resp;
  }
  // RE2: linear time in the key's length, bounded memory, no recursion (std::regex overflowed
  // the stack on a long key and took exponential time on patterns like ^(a|a)*$).
  RE2::Options options;
  options.set_log_errors(false);
  options.set_max_mem(8 << 20);
  RE2 re(req.regex(), options);
  if (!re.ok()) {
    resp.set_code(Code(ErrorCode::INVALID_PARAMS));
    resp.set_message("invalid regular expression (RE2 syntax): " + re.error());
    return resp;
  }
  // Where RE2's DFA runs out of memory it matches with its NFA, at up to the program's size
  // per byte of key (a 4 KiB key against '(a|b)*a(a|b){1000}c': ~37 ms): such patterns are
  // refused, and matching happens outside the master's lock (RemoveWhere).
  if (re.ProgramSize() > kMaxRegexProgramSize) {
    resp.set_code(Code(ErrorCode::INVALID_PARAMS));
    resp.set_message("regular expression is too complex: its RE2 program has " +
                     std::to_string(re.ProgramSize()) + " instructions, at most " +
                     std::to_string(kMaxRegexProgramSize) +
                     " (large counted repetitions like {1000} cost that much per key byte)");
    return resp;
  }
  // Strict mode: the sender's objects only, matched as it named them.
  const std::string* tenant = multi_tenants() ? &req.tenant_id() : nullptr;
  return RemoveWhere(req.force(), req.own_reads_done() ? req.client_id() : "", tenant,
                     [&](const std::string& key) {
                       const std::string_view local = LocalKey(key);
                       return tenant ? RE2::PartialMatch(re2::StringPiece(local.data(), local.size()), re)
                                     : RE2::PartialMatch(key, re);
                     });
}

rpc::CountResponse MasterService::RemoveAll(const rpc::KeysRequest& req) {
  {
    MutexLock lock(&mu_);
    ++counters_.remove_all;
  }
  return RemoveWhere(req.force(), req.own_reads_done() ? req.client_id() : "",
                     multi_tenants() ? &req.tenant_id() : nullptr,
                     [](const std::string&) { return true; });
}

rpc::CountResponse MasterService::RemoveWhere(bool force, const std::string& done_client,
                                              const std::string* tenant,
                                              const std::function<bool(const std::string&)>& match) {
  rpc::CountResponse resp;
  int64_t count = 0;
  // About kRemoveChunk keys per hold of the lock (the table's slots are half to three
  // quarters full: 2 x kRemoveChunk slots), other RPCs served between chunks. The scan
  // resumes at its cursor; a shard rehashed meanwhile by inserts is walked again from its
  // start, so every complete object present throughout is looked at. The candidates' keys
  // are matched with the lock released (a costly pattern delays only its caller), then
  // removed if still complete (and unleased, unless `force`). Keys put meanwhile may or may
  // not be removed.
  ObjectMap::Cursor cursor;
  std::vector<std::string> candidates, victims;
  for (bool done = false; !done;) {
    {
      MutexLock lock(&mu_);
      const auto now = now_();
      done = objects_.Scan(&cursor, 2 * kRemoveChunk, [&](const ObjectEntry& e) {
        if (e.second.complete && (force || !Leased(e.second, now)) &&
            (tenant == nullptr || TenantOf(e.first) == *tenant)) {
          candidates.push_back(e.first);
        }
      });
    }
    for (std::string& key : candidates) {
      if (match(key)) victims.push_back(std::move(key));
    }
    candidates.clear();
    if (victims.empty()) continue;
    MutexLock lock(&mu_);
    const auto now = now_();
    for (const std::string& key : victims) {
      auto it = objects_.find(key);
      if (it == objects_.end() || !it->second.complete || (!force && Leased(it->second, now))) {
        continue;  // removed, replaced by a put in flight, or leased meanwhile
      }
      if (!force && tasks_.RunningOf(key) != nullptr) continue;  // a replica task runs
      if (force) EndOwnLeaseLocked(&it->second, done_client, now);
      EraseObjectLocked(it, now);
      DiskForgetLocked(key);
      ++count;
    }
    victims.clear();
  }
  // Objects left only on disks (their memory replicas evicted): matched the same way.
  {
    MutexLock lock(&mu_);
    for (const auto& [key, entry] : disk_objects_) {
      if (objects_.find(key) == objects_.end() &&
          (tenant == nullptr || TenantOf(key) == *tenant)) {
        candidates.push_back(key);
      }
    }
  }
  for (std::string& key : candidates) {
    if (match(key)) victims.push_back(std::move(key));
  }
  if (!victims.empty()) {
    MutexLock lock(&mu_);
    for (const std::string& key : victims) {
      if (objects_.find(key) != objects_.end() || disk_objects_.count(key) == 0) continue;
      count += DiskServedLocked(key);  // one whose disk's client is away: not counted, told
      DiskForgetLocked(key);
    }
  }
  resp.set_code(Code(ErrorCode::OK));
  resp.set_count(count);
  return resp;
}

rpc::ReplicaClearResponse MasterService::ReplicaClear(const rpc::ReplicaClearRequest& req) {
  rpc::ReplicaClearResponse resp;
  std::string problem = BatchProblem("ReplicaClear", req.keys_size());
  if (problem.empty()) problem = NameProblem("client id", req.client_id());
  if (problem.empty() && !req.segment_name().empty()) {
    problem = NameProblem("segment name", req.segment_name());
  }
  MutexLock lock(&mu_);
  if (!problem.empty()) {
    resp.set_code(Code(ErrorCode::INVALID_PARAMS));
    resp.set_message(problem);
    ++counters_.refused_requests;
    return resp;
  }
  const auto now = now_();
  ++counters_.replica_clear.batch_requests;  // upstream's BatchReplicaClear, whatever the size
  counters_.replica_clear.batch_items += static_cast<uint64_t>(req.keys_size());
  for (const std::string& key : req.keys()) {
    if (!StoredKeyProblem(key).empty()) continue;
    auto it = objects_.find(key);
    // Only the writer's own, complete objects that nobody holds a lease on (upstream's rule;
    // as upstream, a write counts as a lease of one TTL from its PutEnd).
    if (it == objects_.end() || !it->second.complete || it->second.owner != req.client_id() ||
        Leased(it->second, now) || lease_floor_ > now ||
        it->second.stamp + std::chrono::milliseconds(config_.default_kv_lease_ttl_ms) > now) {
      VLOG(1) << "ReplicaClear: " << key << " skipped (absent, in flight, another client's or "
              << "leased)";
      continue;
    }
    if (req.segment_name().empty()) {
      EraseObjectLocked(it, now);
      resp.add_cleared_keys(key);
      continue;
    }
    auto& reps = it->second.replicas;
    const size_t before = reps.size();
    for (auto r = reps.begin(); r != reps.end();) {
      auto seg = segments_.find(r->segment_id);
      if (seg != segments_.end() && seg->second->name == req.segment_name()) {
        seg->second->alloc.Free({r->offset, r->handle});  // unleased: nobody reads it
        UnchargeLocked(it->first, it->second.size);
        r = reps.erase(r);
      } else {
        ++r;
      }
    }
    if (reps.size() == before) continue;  // no replica there
    if (reps.empty()) {
      if (it->second.complete && events_ != nullptr) events_->ObjectRemoved(it->first);
      LogKeyLocked(oplog::Entry::ERASE, it->first);
      UnlistLocked(&*it);
      objects_.erase(it);
    } else {
      LogObjectLocked(oplog::Entry::OBJECT, it->first, it->second);
    }
    resp.add_cleared_keys(key);
  }
  resp.set_code(Code(ErrorCode::OK));
  return resp;
}

}  // namespace store
}  // namespace mooncake
