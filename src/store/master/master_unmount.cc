// MasterService: unmounting a segment (UnmountSegment, and a client's expiry in Tick) in two
// steps, so that the lock is not held for the whole table walk: the segment drains (nothing
// placed there, its replicas no longer handed out, puts in flight keep their other
// replicas), then the complete objects are walked in chunks and the segment is erased.
#include <glog/logging.h>

#include <algorithm>

#include "store/common/limits.h"
#include "store/master/master_service.h"
#include "store/master/master_service_internal.h"

namespace mooncake {
namespace store {

void MasterService::BeginUnmountLocked(const std::vector<uint64_t>& segment_ids,
                                       Clock::time_point now) {
  std::vector<Segment*> going;
  for (uint64_t id : segment_ids) {
    auto it = segments_.find(id);
    if (it == segments_.end() || it->second->draining) continue;
    Segment& seg = *it->second;
    seg.draining = true;
    draining_.insert(id);
    auto client = clients_.find(seg.client_id);
    if (client != clients_.end()) client->second.segments.erase(id);
    going.push_back(&seg);
  }
  if (going.empty()) return;
  placeable_.erase(std::remove_if(placeable_.begin(), placeable_.end(),
                                  [](const auto& p) { return p.second->draining; }),
                   placeable_.end());
  ++view_version_;
  // Puts and upserts in flight lose their replicas on draining segments and keep the others,
  // whose space stays theirs until the writer ends, revokes or is discarded: a writer may be
  // writing there now. One walk for all the segments (bounded: the writers' reservations,
  // max_client_inflight_ratio).
  std::unordered_set<uint64_t> written;  // draining segments a put or upsert in flight was on
  auto drop = [&](const std::string& key, Object* obj) MC_REQUIRES(mu_) {
    for (const auto& p : obj->replicas) {
      if (draining_.count(p.segment_id)) written.insert(p.segment_id);
    }
    const uint64_t before = InFlightBytes(*obj);
    const bool none_left = DropDrainingLocked(key, obj);
    ReleaseLocked(obj->owner, before - InFlightBytes(*obj));
    return none_left;
  };
  for (ObjectEntry* e = in_flight_.front(); e != nullptr;) {
    ObjectEntry* put = e;
    e = in_flight_.next(e);
    if (!OnDrainingLocked(put->second)) continue;
    if (drop(put->first, &put->second)) {
      EraseObjectLocked(objects_.find(put->first), now);
    } else {
      LogObjectLocked(oplog::Entry::OBJECT, put->first, put->second);
    }
  }
  for (auto up = upserts_.begin(); up != upserts_.end();) {
    if (!OnDrainingLocked(up->second)) {
      ++up;
    } else if (drop(up->first, &up->second)) {
      up = EraseUpsertLocked(up, now);
    } else {
      LogObjectLocked(oplog::Entry::UPSERT_OBJECT, up->first, up->second);
      ++up;
    }
  }
  // Replica tasks running lose their space there too (the task fails when it reports).
  for (auto c = copies_.begin(); c != copies_.end();) {
    if (!OnDrainingLocked(c->second)) {
      ++c;
      continue;
    }
    for (const auto& p : c->second.replicas) {
      if (draining_.count(p.segment_id)) written.insert(p.segment_id);
    }
    if (DropDrainingLocked(c->first, &c->second)) {
      if (const ReplicaTask* t = tasks_.RunningOf(c->first)) {  // nothing left to write to
        tasks_.Finish(t->id, false,
                      "REPLICA_IS_GONE: its target segments were unmounted while it ran", now);
      }
      LogKeyLocked(oplog::Entry::COPY_ERASE, c->first);
      c = copies_.erase(c);
    } else {
      LogObjectLocked(oplog::Entry::COPY_OBJECT, c->first, c->second);
      ++c;
    }
  }
  // Readers may hold addresses in these segments for one more lease TTL, and writers whose
  // put had a replica there may write there until their put is discarded: a segment mounted
  // again under one of these names (the same memory, perhaps) takes no new objects before then.
  const auto lease = std::chrono::duration_cast<Clock::duration>(
      std::chrono::milliseconds(config_.default_kv_lease_ttl_ms));
  const auto discard = std::max<Clock::duration>(
      lease, std::chrono::seconds(config_.put_start_discard_timeout_s));
  for (uint64_t id : segment_ids) {
    auto it = segments_.find(id);
    if (it == segments_.end()) continue;
    auto& until = dropped_names_[it->second->name];
    until = std::max(until, now + (written.count(id) ? discard : lease));
  }
}

bool MasterService::OnDrainingLocked(const Object& obj) const {
  if (draining_.empty()) return false;
  for (const auto& p : obj.replicas) {
    if (draining_.count(p.segment_id)) return true;
  }
  return false;
}

bool MasterService::DropDrainingLocked(const std::string& key, Object* obj) {
  auto& reps = obj->replicas;
  const size_t before = reps.size();
  reps.erase(std::remove_if(reps.begin(), reps.end(),
                            [&](const auto& p) MC_REQUIRES(mu_) {
                              return draining_.count(p.segment_id) > 0;
                            }),
             reps.end());
  UnchargeLocked(key, obj->size * (before - reps.size()));
  return reps.empty();
}

void MasterService::FinishUnmount(const std::vector<uint64_t>& segment_ids) {
  if (segment_ids.empty()) return;
  bool walk = false;
  {
    MutexLock lock(&mu_);
    for (uint64_t id : segment_ids) {
      auto it = segments_.find(id);
      // Nothing allocated there: no object has a replica on it (the walk is skipped).
      walk |= it != segments_.end() && it->second->alloc.allocated() > 0;
    }
  }
  // The complete objects, about kRemoveChunk keys per hold of the lock (as RemoveWhere):
  // every object present throughout is looked at; none placed meanwhile is on a draining
  // segment.
  ObjectMap::Cursor cursor;
  std::vector<std::string> hit;
  for (bool done = !walk; !done;) {
    MutexLock lock(&mu_);
    const auto now = now_();
    done = objects_.Scan(&cursor, 2 * kRemoveChunk, [&](const ObjectEntry& e) {
      mu_.AssertHeld();  // Scan calls it here
      if (OnDrainingLocked(e.second)) hit.push_back(e.first);
    });
    for (const std::string& key : hit) {
      auto it = objects_.find(key);
      if (it == objects_.end()) continue;
      if (!it->second.complete) {  // (BeginUnmountLocked took these already: defensive)
        const uint64_t before = InFlightBytes(it->second);
        const bool none_left = DropDrainingLocked(it->first, &it->second);
        ReleaseLocked(it->second.owner, before - InFlightBytes(it->second));
        if (none_left) {
          EraseObjectLocked(it, now);
        } else {
          LogObjectLocked(oplog::Entry::OBJECT, it->first, it->second);
        }
        continue;
      }
      if (DropDrainingLocked(it->first, &it->second)) {
        EraseObjectLocked(it, now);
      } else {
        LogObjectLocked(oplog::Entry::OBJECT, it->first, it->second);
      }
    }
    hit.clear();
  }
  std::vector<std::string> gone;  // logged after the lock: a line per segment is slow
  {
    MutexLock lock(&mu_);
    for (uint64_t id : segment_ids) {
      auto it = segments_.find(id);
      if (it == segments_.end()) continue;
      gone.push_back(it->second->name + " of client " + it->second->client_id);
      draining_.erase(id);
      segments_.erase(it);
      if (sink_ != nullptr) {
        oplog::Entry e;
        e.set_kind(oplog::Entry::UNMOUNT);
        e.set_segment_id(static_cast<uint32_t>(id));
        LogLocked(std::move(e));
      }
    }
  }
  constexpr size_t kNamed = 8;  // a client's expiry may drop many: the first few by name
  for (size_t i = 0; i < gone.size() && i < kNamed; ++i) {
    LOG(INFO) << "unmounted segment " << gone[i];
  }
  if (gone.size() > kNamed) {
    LOG(INFO) << "unmounted " << gone.size() - kNamed << " more segments";
  }
}

rpc::UnmountSegmentResponse MasterService::UnmountSegment(const rpc::UnmountSegmentRequest& req) {
  rpc::UnmountSegmentResponse resp = UnmountSegmentUncounted(req);
  MutexLock lock(&mu_);
  ++counters_.unmounts;
  if (resp.code() != Code(ErrorCode::OK)) ++counters_.unmount_failures;
  return resp;
}

rpc::UnmountSegmentResponse MasterService::UnmountSegmentUncounted(
    const rpc::UnmountSegmentRequest& req) {
  rpc::UnmountSegmentResponse resp;
  uint64_t id = 0;
  {
    MutexLock lock(&mu_);
    bool going = false;
    for (const auto& [sid, seg] : segments_) {
      if (seg->name != req.segment_name() || seg->base != req.base()) continue;
      if (seg->draining) {
        going = true;  // being unmounted already (a retry, or its client's expiry)
        continue;
      }
      if (seg->client_id != req.client_id()) {
        resp.set_code(Code(ErrorCode::ILLEGAL_CLIENT));
        resp.set_message("segment " + req.segment_name() + " belongs to another client");
        return resp;
      }
      id = sid;
      break;
    }
    if (id == 0) {
      resp.set_code(Code(going ? ErrorCode::OK : ErrorCode::SEGMENT_NOT_FOUND));
      if (!going) resp.set_message("no segment " + req.segment_name() + " is mounted at that base");
      return resp;
    }
    BeginUnmountLocked({id}, now_());
  }
  FinishUnmount({id});
  resp.set_code(Code(ErrorCode::OK));
  return resp;
}

}  // namespace store
}  // namespace mooncake
