#include "store/master/master_service.h"

#include <glog/logging.h>

#include <algorithm>
#include <set>

#include "mooncake/store/error_code.h"
#include "store/common/limits.h"
#include "store/master/master_service_internal.h"

namespace mooncake {
namespace store {

MasterService::MasterService(MasterConfig config, NowFn now)
    : config_(config), now_(std::move(now)), tasks_(config_.task_limits) {
  standby_ = config_.standby;
  std::random_device rd;
  lease_ids_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
  // Versions start at the wall clock's microsecond times 256: a master started later (a
  // restart, a leader without the log) gives no version an earlier one gave, unless its clock
  // went back or the earlier one gave over 256 a microsecond. A log's versions raise it.
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  next_version_ = (static_cast<uint64_t>(us) << 8) | 1;
}

MasterService::~MasterService() = default;

uint64_t MasterService::CapacityLocked() const {
  uint64_t total = 0;
  for (const auto& [id, seg] : placeable_) total += seg->alloc.capacity();
  return total;
}

uint64_t MasterService::AllocatedLocked() const {
  uint64_t total = 0;
  for (const auto& [id, seg] : placeable_) total += seg->alloc.allocated();
  return total;
}

rpc::MountSegmentResponse MasterService::MountSegment(const rpc::MountSegmentRequest& req) {
  rpc::MountSegmentResponse resp = MountSegmentUncounted(req);
  MutexLock lock(&mu_);
  ++(req.remount() ? counters_.remounts : counters_.mounts);
  if (resp.code() != Code(ErrorCode::OK)) ++(req.remount() ? counters_.remount_failures : counters_.mount_failures);
  return resp;
}

rpc::MountSegmentResponse MasterService::MountSegmentUncounted(const rpc::MountSegmentRequest& req) {
  rpc::MountSegmentResponse resp;
  if (req.client_id().empty() || req.segment_name().empty() || req.size() == 0 ||
      req.base() == 0 || req.base() + req.size() < req.base()) {
    resp.set_code(Code(ErrorCode::INVALID_PARAMS));
    resp.set_message("MountSegment needs a client id, a segment name, a non-null base and a "
                     "size > 0 that does not wrap around");
    return resp;
  }
  for (const std::string& problem : {NameProblem("client id", req.client_id()),
                                     NameProblem("segment name", req.segment_name())}) {
    if (!problem.empty()) {
      resp.set_code(Code(ErrorCode::INVALID_PARAMS));
      resp.set_message(problem);
      return resp;
    }
  }
  MutexLock lock(&mu_);
  for (const auto& [id, seg] : segments_) {
    if (seg->draining) continue;  // going: a mount of the same range is a new segment
    const bool overlap = req.base() < seg->base + seg->size && seg->base < req.base() + req.size();
    if (seg->name == req.segment_name() && overlap) {
      if (seg->base == req.base() && seg->size == req.size() && seg->client_id == req.client_id()) {
        resp.set_code(Code(ErrorCode::OK));  // a remount after a lost reply: idempotent
        clients_[req.client_id()].last_ping = now_();
        return resp;
      }
      resp.set_code(Code(ErrorCode::SEGMENT_ALREADY_EXISTS));
      resp.set_message("segment " + req.segment_name() + " already has a mounted range there");
      return resp;
    }
  }
  {
    auto known = clients_.find(req.client_id());
    const size_t mine = known == clients_.end() ? 0 : known->second.segments.size();
    if (mine >= kMaxSegmentsPerClient || placeable_.size() >= kMaxSegments) {
      resp.set_code(Code(ErrorCode::INVALID_PARAMS));
      resp.set_message(mine >= kMaxSegmentsPerClient
                           ? "client " + req.client_id() + " has " + std::to_string(mine) +
                                 " segments mounted, the limit per client: unmount one first"
                           : "this master has " + std::to_string(placeable_.size()) +
                                 " segments mounted, its limit");
      ++counters_.refused_requests;
      return resp;
    }
  }
  if (next_segment_id_ > UINT32_MAX) {  // replicas keep 32-bit segment ids (master_records.h)
    resp.set_code(Code(ErrorCode::INTERNAL_ERROR));
    resp.set_message("this master has mounted 2^32 - 1 segments: restart it to mount more");
    return resp;
  }
  const uint64_t id = next_segment_id_++;
  auto seg = std::make_unique<Segment>(req.segment_name(), req.base(), req.size(),
                                       req.client_id());
  // A remount: leases granted before (by a previous master, or before this segment was
  // dropped) may still be read from; nothing new goes here until they have lapsed.
  const auto now = now_();
  if (req.remount()) {
    seg->alloc_after = now + std::chrono::milliseconds(config_.default_kv_lease_ttl_ms);
  }
  auto dropped = dropped_names_.find(req.segment_name());
  if (dropped != dropped_names_.end()) seg->alloc_after = std::max(seg->alloc_after, dropped->second);
  if (seg->alloc_after > now) {
    LOG(INFO) << "segment " << req.segment_name() << " was mounted before: it takes new objects in "
              << std::chrono::duration_cast<std::chrono::milliseconds>(seg->alloc_after - now).count()
              << " ms (once leases granted before have lapsed)";
  }
  placeable_.emplace_back(id, seg.get());
  segments_.emplace(id, std::move(seg));
  Client& client = clients_[req.client_id()];
  client.last_ping = now_();
  client.segments.insert(id);
  ++view_version_;
  if (sink_ != nullptr) {
    oplog::Entry e;
    e.set_kind(oplog::Entry::MOUNT);
    e.set_segment_id(static_cast<uint32_t>(id));
    e.set_segment_name(req.segment_name());
    e.set_base(req.base());
    e.set_size(req.size());
    e.set_client_id(req.client_id());
    LogLocked(std::move(e));
  }
  LOG(INFO) << "mounted segment " << req.segment_name() << " (" << req.size() << " bytes at 0x"
            << std::hex << req.base() << std::dec << ") of client " << req.client_id();
  resp.set_code(Code(ErrorCode::OK));
  return resp;
}

rpc::PingResponse MasterService::Ping(const rpc::PingRequest& req) {
  rpc::PingResponse resp;
  MutexLock lock(&mu_);
  ++counters_.ping;
  auto it = clients_.find(req.client_id());
  resp.set_code(Code(ErrorCode::OK));
  resp.set_view_version(view_version_);
  if (it == clients_.end()) {
    resp.set_client_known(false);
  } else {
    it->second.last_ping = now_();
    resp.set_client_known(true);
  }
  resp.set_tasks_waiting(static_cast<uint32_t>(tasks_.PendingCount(req.client_id())));
  resp.set_offload_waiting(OffloadWaitingLocked(req.client_id()));
  return resp;
}

MasterService::ObjectMap::iterator MasterService::EraseObjectLocked(ObjectMap::iterator it,
                                                                   Clock::time_point now) {
  if (!it->second.complete) ReleaseLocked(it->second.owner, InFlightBytes(it->second));
  UnchargeLocked(it->first, InFlightBytes(it->second));
  if (it->second.complete && events_ != nullptr) events_->ObjectRemoved(it->first);
  LogKeyLocked(oplog::Entry::ERASE, it->first);
  UnlistLocked(&*it);
  FreeObjectLocked(it->second, now);
  return objects_.erase(it);
}

bool MasterService::PlaceLocked(const std::string& key, uint64_t size,
                                const rpc::ReplicateConfig& config, Object* obj,
                                Clock::time_point now) {
  const size_t want = std::max<uint32_t>(1, config.replica_num());
  // One replica per segment name (a client's segments count as one place).
  auto name_used = [&](const std::string& name) MC_REQUIRES(mu_) {
    for (const auto& p : obj->replicas) {
      if (segments_.at(p.segment_id)->name == name) return true;
    }
    return false;
  };
  auto try_place = [&](uint64_t id, Segment* seg) MC_REQUIRES(mu_) {
    if (seg->alloc_after > now || (!obj->replicas.empty() && name_used(seg->name))) return;
    auto space = seg->alloc.Allocate(size);
    if (!space) return;
    obj->replicas.push_back({static_cast<uint32_t>(id), space->handle, space->offset});
  };
  // Preferred segments first, in the caller's order (a scratch vector of the master: no heap
  // allocation per object).
  auto& preferred = place_order_;
  preferred.clear();
  for (const auto& name : config.preferred_segments()) {
    for (const auto& [id, seg] : placeable_) {
      if (obj->replicas.size() == want) break;
      if (seg->name != name) continue;
      const uint64_t seg_id = id;
      if (std::any_of(preferred.begin(), preferred.end(),
                      [&](const auto& o) { return o.first == seg_id; })) {
        continue;
      }
      preferred.emplace_back(id, seg);
      try_place(id, seg);
    }
  }
  // Then the others from a rotating cursor, so that objects spread over segments; the walk
  // stops once the object has its replicas (it costs the segments tried, not all of them).
  const size_t n = placeable_.size();
  if (n > 0 && obj->replicas.size() < want) {
    const size_t start = placement_cursor_++ % n;
    for (size_t k = 0; k < n && obj->replicas.size() < want; ++k) {
      const auto& [id, seg] = placeable_[(start + k) % n];
      const uint64_t seg_id = id;
      if (!preferred.empty() && std::any_of(preferred.begin(), preferred.end(),
                                            [&](const auto& o) { return o.first == seg_id; })) {
        continue;
      }
      try_place(id, seg);
    }
  }
  VLOG(1) << "placed " << key << " (" << size << " bytes): " << obj->replicas.size() << "/"
          << want << " replicas";
  return !obj->replicas.empty();
}

namespace {

// "" when the PutStart request as a whole is acceptable, else why not.
std::string PutStartProblem(const rpc::PutStartRequest& req) {
  std::string p = BatchProblem("PutStart", req.items_size());
  if (p.empty()) p = NameProblem("client id", req.client_id());
  if (p.empty() && req.config().replica_num() > kMaxReplicaNum) {
    p = "replica_num " + std::to_string(req.config().replica_num()) + " is above the limit of " +
        std::to_string(kMaxReplicaNum);
  }
  if (p.empty() && req.config().preferred_segments_size() > static_cast<int>(kMaxPreferredSegments)) {
    p = "more than " + std::to_string(kMaxPreferredSegments) + " preferred segments";
  }
  for (const auto& name : req.config().preferred_segments()) {
    if (p.empty()) p = NameProblem("preferred segment name", name);
  }
  return p;
}

template <class Req>
std::string KeysProblem(const char* what, const Req& req) {
  std::string p = BatchProblem(what, req.keys_size());
  if (p.empty()) p = NameProblem("client id", req.client_id());
  return p;
}

}  // namespace

rpc::PutStartResponse MasterService::PutStart(const rpc::PutStartRequest& req) {
  rpc::PutStartResponse resp;
  PutStartInto(req, &resp);
  return resp;
}

void MasterService::PutStartInto(const rpc::PutStartRequest& req, rpc::PutStartResponse* out) {
  rpc::PutStartResponse& resp = *out;
  const std::string problem = PutStartProblem(req);
  MutexLock lock(&mu_);
  if (!problem.empty()) {
    resp.set_code(Code(ErrorCode::INVALID_PARAMS));
    resp.set_message(problem);
    ++counters_.refused_requests;
    return;
  }
  const auto now = now_();
  ReapGraveyardLocked(now);
  EvictIfFullLocked(now);
  const ClientName owner = client_names_.Get(req.client_id());
  admit_capacity_ = CapacityLocked();  // mounts do not change during the call
  quota_evict_failed_ = false;
  const uint64_t inflight_limit = static_cast<uint64_t>(
      config_.max_client_inflight_ratio * static_cast<double>(admit_capacity_));
  const uint64_t copies = std::max<uint32_t>(1, req.config().replica_num());
  PrefetchLocked(req.items_size(), [&](size_t i) -> const std::string& {
    return req.items(static_cast<int>(i)).key();
  });
  for (int i = 0; i < req.items_size(); ++i) {
    const auto& item = req.items(i);
    rpc::PutStartResult* result = resp.add_results();
    const std::string key_problem = StoredKeyProblem(item.key());
    if (!key_problem.empty() || item.size() == 0) {
      result->set_code(Code(!key_problem.empty() ? ErrorCode::INVALID_KEY : ErrorCode::INVALID_PARAMS));
      result->set_message(!key_problem.empty() ? key_problem : "an object needs at least 1 byte");
      continue;
    }
    auto held = inflight_bytes_.find(req.client_id());
    if (held != inflight_bytes_.end() && held->second + item.size() * copies > inflight_limit) {
      result->set_code(Code(ErrorCode::NO_AVAILABLE_HANDLE));
      result->set_message("client " + req.client_id() + " has " + std::to_string(held->second) +
                          " bytes of puts in flight; with this one it would hold more than " +
                          std::to_string(inflight_limit) +
                          " (max_client_inflight_ratio of the capacity): end or revoke them first");
      continue;
    }
    if (req.upsert()) {
      UpsertStartLocked(req, item, owner, now, result);
        continue;
    }
    auto existing = objects_.find(item.key(), hashes_[i]);
    if (existing != objects_.end() && !existing->second.complete && req.put_nonce() != 0 &&
        existing->second.lease_id == req.put_nonce() && existing->second.owner == req.client_id()) {
      // This very request, sent again (its first sending was acted on, by this master or
      // by the leader before it): the same space again.
      result->set_code(Code(ErrorCode::OK));
      FillReplicasLocked(existing->second, false, result->mutable_replicas());
      if (result->replicas_size() == 0) {  // its every segment is being unmounted
        result->set_code(Code(ErrorCode::NO_AVAILABLE_HANDLE));
        result->set_message("key " + item.key() + ": the space of this put is being unmounted");
      }
      continue;
    }
    if (req.promote_version() != 0) {
      // A promotion: the value on a disk, of that version, back into memory.
      auto on_disk = disk_objects_.find(item.key());
      if (existing != objects_.end() || on_disk == disk_objects_.end() ||
          on_disk->second.version != req.promote_version() ||
          on_disk->second.size != item.size()) {
        result->set_code(Code(existing != objects_.end() ? ErrorCode::OBJECT_ALREADY_EXISTS
                                                         : ErrorCode::OBJECT_NOT_FOUND));
        result->set_message("key " + item.key() + ": not a disk-only value of version " +
                            std::to_string(req.promote_version()));
        continue;
      }
    } else if (existing == objects_.end() && DiskServedLocked(item.key())) {
      result->set_code(Code(ErrorCode::OBJECT_ALREADY_EXISTS));
      result->set_message("key " + item.key() + " already exists (on a disk)");
      continue;
    }
    if (existing != objects_.end() || (!upserts_.empty() && upserts_.count(item.key()))) {
      const bool stale = existing != objects_.end() && !existing->second.complete &&
                         existing->second.stamp +
                                 std::chrono::seconds(config_.put_start_discard_timeout_s) <= now;
      if (!stale) {
        result->set_code(Code(ErrorCode::OBJECT_ALREADY_EXISTS));
        result->set_message("key " + item.key() + " already exists");
        continue;
      }
      EraseObjectLocked(existing, now);
      ++counters_.discarded_puts;
    }
    if (!AdmitLocked(item.key(), item.size() * copies, result, now)) {
      continue;
    }
    Object obj = NewObjectLocked(req, item.size(), owner, now);
    if (req.promote_version() != 0) obj.version = req.promote_version();
    if (!PlaceOrFailLocked(item.key(), item.size(), req.config(), &obj, result, now)) {
      continue;
    }
    ReserveLocked(owner, InFlightBytes(obj));
    ChargeLocked(item.key(), InFlightBytes(obj));
    counters_.value_sizes.Observe(item.size());
    ObjectEntry* placed = &*objects_.emplace(item.key(), std::move(obj)).first;
    in_flight_.push_back(placed);
    LogObjectLocked(oplog::Entry::OBJECT, placed->first, placed->second);
  }
  counters_.put_start.Count(resp.results_size(), Failed(resp.results()));
}

void MasterService::ReserveLocked(const ClientName& owner, uint64_t bytes) {
  if (bytes > 0) inflight_bytes_[owner.str()] += bytes;
}

void MasterService::ReleaseLocked(const ClientName& owner, uint64_t bytes) {
  if (bytes == 0) return;
  auto it = inflight_bytes_.find(owner.str());
  if (it == inflight_bytes_.end()) return;
  it->second -= std::min(it->second, bytes);
  if (it->second == 0) inflight_bytes_.erase(it);
}

MasterService::Object MasterService::NewObjectLocked(const rpc::PutStartRequest& req,
                                                     uint64_t size, const ClientName& owner,
                                                     Clock::time_point now) {
  Object obj;
  obj.size = size;
  obj.owner = owner;
  obj.soft_pin = req.config().with_soft_pin();
  obj.soft_pin_ttl = std::chrono::milliseconds(req.config().soft_pin_ttl_ms() > 0
                                                   ? req.config().soft_pin_ttl_ms()
                                                   : config_.default_kv_soft_pin_ttl_ms);
  obj.hard_pin = req.config().with_hard_pin();
  obj.lease_id = req.put_nonce();
  obj.version = next_version_++;
  obj.stamp = now;
  obj.last_access = now;
  if (obj.soft_pin) {
    min_soft_pin_ttl_ = std::min<Clock::duration>(min_soft_pin_ttl_, obj.soft_pin_ttl);
  }
  return obj;
}

bool MasterService::PlaceOrFailLocked(const std::string& key, uint64_t size,
                                      const rpc::ReplicateConfig& config, Object* obj,
                                      rpc::PutStartResult* result, Clock::time_point now) {
  if (!PlaceLocked(key, size, config, obj, now)) {
    // Nothing fits: make room (approximately LRU) until the object fits, since the bytes
    // freed need not be contiguous, or nothing evictable is left. An object larger than
    // every segment can never fit: evicting for it would only lose data.
    bool could_fit = false;
    for (const auto& [id, seg] : placeable_) could_fit |= seg->alloc.capacity() >= size;
    while (could_fit && EvictLocked(size, now) > 0 && !PlaceLocked(key, size, config, obj, now)) {
    }
  }
  if (obj->replicas.empty()) {
    bool waiting = false;
    for (const auto& [id, seg] : placeable_) waiting |= seg->alloc_after > now;
    ++counters_.put_start_alloc_failures;
    result->set_code(Code(ErrorCode::NO_AVAILABLE_HANDLE));
    result->set_message(placeable_.empty()
                            ? "no segment is mounted: start a client with global_segment_size > 0"
                            : "no space for " + std::to_string(size) +
                                  " bytes and nothing evictable" +
                                  (waiting ? " (segments mounted again take new objects one "
                                             "lease TTL after their mount)"
                                           : ""));
    return false;
  }
  result->set_code(Code(ErrorCode::OK));
  FillReplicasLocked(*obj, false, result->mutable_replicas());
  return true;
}

void MasterService::FillReplicasLocked(
    const Object& obj, bool complete_only,
    google::protobuf::RepeatedPtrField<rpc::Replica>* out) const {
  if (complete_only && !obj.complete) return;
  for (const auto& p : obj.replicas) {
    auto found = segments_.find(p.segment_id);
    if (found == segments_.end() || found->second->draining) continue;  // being unmounted
    const Segment& seg = *found->second;
    rpc::Replica* r = out->Add();
    r->set_status(obj.complete ? rpc::Replica::COMPLETE : rpc::Replica::PROCESSING);
    r->mutable_buffer()->set_segment_name(seg.name);
    r->mutable_buffer()->set_addr(seg.base + p.offset);
    r->mutable_buffer()->set_size(obj.size);
  }
}

ErrorCode MasterService::FindInFlightLocked(const std::string& key, uint64_t hash,
                                            const std::string& client, ObjectMap::iterator* it) {
  *it = objects_.find(key, hash);
  if (*it == objects_.end()) return ErrorCode::OBJECT_NOT_FOUND;  // discarded, or segment gone
  if ((*it)->second.complete) return ErrorCode::INVALID_WRITE;
  if ((*it)->second.owner != client) return ErrorCode::ILLEGAL_CLIENT;
  return ErrorCode::OK;
}

rpc::CodesResponse MasterService::PutEnd(const rpc::KeysRequest& req) {
  rpc::CodesResponse resp;
  const std::string problem = KeysProblem("PutEnd", req);
  MutexLock lock(&mu_);
  if (!problem.empty()) {
    resp.set_code(Code(ErrorCode::INVALID_PARAMS));
    resp.set_message(problem);
    ++counters_.refused_requests;
    return resp;
  }
  const auto now = now_();
  PrefetchLocked(req.keys_size(), [&](size_t i) -> const std::string& {
    return req.keys(static_cast<int>(i));
  });
  for (int i = 0; i < req.keys_size(); ++i) {
    const std::string& key = req.keys(i);
    if (!StoredKeyProblem(key).empty()) {
      resp.add_codes(Code(ErrorCode::INVALID_KEY));
      continue;
    }
    if (!upserts_.empty() && UpsertEndLocked(key, req.client_id(), /*commit=*/true, now)) {
      resp.add_codes(Code(ErrorCode::OK));
      continue;
    }
    ObjectMap::iterator it;
    const ErrorCode code = FindInFlightLocked(key, hashes_[i], req.client_id(), &it);
    if (code == ErrorCode::OK) {
      ReleaseLocked(it->second.owner, InFlightBytes(it->second));
      it->second.complete = true;
      it->second.lease_id = 0;  // was the put's nonce
      it->second.last_access = now;
      it->second.stamp = now;
      ListLocked(&*it);
      LogObjectLocked(oplog::Entry::OBJECT, it->first, it->second);
      if (events_ != nullptr) events_->ObjectStored(it->first);
      DiskOnCompleteLocked(it->first, &it->second);
    }
    resp.add_codes(Code(code));
  }
  counters_.put_end.Count(resp.codes_size(), FailedCodes(resp.codes()));
  return resp;
}

rpc::CodesResponse MasterService::PutRevoke(const rpc::KeysRequest& req) {
  rpc::CodesResponse resp;
  const std::string problem = KeysProblem("PutRevoke", req);
  MutexLock lock(&mu_);
  if (!problem.empty()) {
    resp.set_code(Code(ErrorCode::INVALID_PARAMS));
    resp.set_message(problem);
    ++counters_.refused_requests;
    return resp;
  }
  const auto now = now_();
  for (const auto& key : req.keys()) {
    if (!StoredKeyProblem(key).empty()) {
      resp.add_codes(Code(ErrorCode::INVALID_KEY));
      continue;
    }
    if (UpsertEndLocked(key, req.client_id(), /*commit=*/false, now)) {
      resp.add_codes(Code(ErrorCode::OK));
      continue;
    }
    ObjectMap::iterator it;
    const ErrorCode code = FindInFlightLocked(key, ObjectMap::Hash(key), req.client_id(), &it);
    if (code == ErrorCode::OK) EraseObjectLocked(it, now);
    resp.add_codes(Code(code));
  }
  counters_.put_revoke.Count(resp.codes_size(), FailedCodes(resp.codes()));
  return resp;
}

rpc::GetReplicaListResponse MasterService::GetReplicaList(const rpc::KeysRequest& req) {
  rpc::GetReplicaListResponse resp;
  GetReplicaListInto(req, &resp);
  return resp;
}

void MasterService::GetReplicaListInto(const rpc::KeysRequest& req,
                                       rpc::GetReplicaListResponse* out) {
  rpc::GetReplicaListResponse& resp = *out;
  const std::string problem = KeysProblem("GetReplicaList", req);
  MutexLock lock(&mu_);
  if (!problem.empty()) {
    resp.set_code(Code(ErrorCode::INVALID_PARAMS));
    resp.set_message(problem);
    ++counters_.refused_requests;
    return;
  }
  const auto now = now_();
  PrefetchLocked(req.keys_size(), [&](size_t i) -> const std::string& {
    return req.keys(static_cast<int>(i));
  });
  for (int i = 0; i < req.keys_size(); ++i) {
    const std::string& key = req.keys(i);
    ++counters_.total_gets;
    rpc::GetReplicaListResult* result = resp.add_results();
    if (!StoredKeyProblem(key).empty()) {
      result->set_code(Code(ErrorCode::INVALID_KEY));
      continue;
    }
    auto it = objects_.find(key, hashes_[i]);
    // No memory replica readable: the disk replica, if any (the disk tier, master_disk.cc).
    auto from_disk = [&]() MC_REQUIRES(mu_) {
      uint64_t size = 0, version = 0;
      // A query of where replicas lie (with_disk: get_replica_desc) is not a read of the data.
      if (!FillDiskLocked(key, !req.with_disk(), result->mutable_replicas(), &size, &version)) {
        return false;
      }
      result->set_code(Code(ErrorCode::OK));
      result->set_size(size);
      result->set_version(version);
      result->set_lease_ttl_ms(config_.default_kv_lease_ttl_ms);
      ++counters_.valid_gets;
      return true;
    };
    if (it == objects_.end() || !it->second.complete) {
      // (an upsert in flight of a key on a disk: readers get the value there until it ends)
      if (from_disk()) continue;
      result->set_code(Code(it == objects_.end() ? ErrorCode::OBJECT_NOT_FOUND
                                                 : ErrorCode::REPLICA_IS_NOT_READY));
      continue;
    }
    Object& obj = it->second;
    if (!draining_.empty() && std::all_of(obj.replicas.begin(), obj.replicas.end(),
                                          [&](const auto& p) MC_REQUIRES(mu_) {
                                            return draining_.count(p.segment_id) > 0;
                                          })) {
      // every replica is on a segment being unmounted: gone from memory
      if (OnDiskLocked(key, obj.version) && from_disk()) continue;
      result->set_code(Code(ErrorCode::OBJECT_NOT_FOUND));
      continue;
    }
    obj.last_access = now;
    ListLocked(&*it);  // the most recently used now
    if (obj.lease_client != req.client_id()) {
      obj.foreign_until = std::max(obj.foreign_until, obj.lease_until);
    }
    obj.lease_until = std::max(obj.lease_until,
                               now + std::chrono::milliseconds(config_.default_kv_lease_ttl_ms));
    result->set_code(Code(ErrorCode::OK));
    result->set_size(obj.size);
    ++counters_.valid_gets;
    counters_.hit_bytes += obj.size;
    result->set_lease_ttl_ms(config_.default_kv_lease_ttl_ms);
    obj.lease_id = lease_ids_() | 1;  // never 0
    if (obj.lease_client != req.client_id()) {
      obj.lease_client = client_names_.Get(req.client_id());
    }
    result->set_lease_id(obj.lease_id);
    result->set_version(obj.version);
    FillReplicasLocked(obj, true, result->mutable_replicas());
    if (req.with_disk() && OnDiskLocked(key, obj.version)) {
      uint64_t size = 0, version = 0;
      FillDiskLocked(key, false, result->mutable_replicas(), &size, &version);
    }
  }
  counters_.get_replica_list.Count(resp.results_size(), Failed(resp.results()));
}

rpc::ExistResponse MasterService::ExistKey(const rpc::KeysRequest& req) {
  rpc::ExistResponse resp;
  const std::string problem = KeysProblem("ExistKey", req);
  MutexLock lock(&mu_);
  if (!problem.empty()) {
    resp.set_code(Code(ErrorCode::INVALID_PARAMS));
    resp.set_message(problem);
    ++counters_.refused_requests;
    return resp;
  }
  PrefetchLocked(req.keys_size(), [&](size_t i) -> const std::string& {
    return req.keys(static_cast<int>(i));
  });
  for (int i = 0; i < req.keys_size(); ++i) {
    const std::string& key = req.keys(i);
    rpc::ExistResult* result = resp.add_results();
    if (!StoredKeyProblem(key).empty()) {
      result->set_code(Code(ErrorCode::INVALID_KEY));
      continue;
    }
    auto it = objects_.find(key, hashes_[i]);
    auto disk = (it == objects_.end() || !it->second.complete) && DiskServedLocked(key)
                    ? disk_objects_.find(key)
                    : disk_objects_.end();
    if (disk != disk_objects_.end()) {
      result->set_code(Code(ErrorCode::OK));
      result->set_size(disk->second.size);
    } else if (it == objects_.end() || !it->second.complete) {
      result->set_code(Code(ErrorCode::OBJECT_NOT_FOUND));
    } else {
      result->set_code(Code(ErrorCode::OK));
      result->set_size(it->second.size);
    }
  }
  // As upstream: an absent key is an answer (false), not a failure.
  size_t bad = 0;
  for (const auto& r : resp.results()) bad += r.code() == Code(ErrorCode::INVALID_KEY);
  counters_.exist_key.Count(resp.results_size(), bad);
  return resp;
}

}  // namespace store
}  // namespace mooncake
