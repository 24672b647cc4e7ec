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

void MasterService::BeginUnmountLocked(uint64_t segment_id, Clock::time_point now) {
  auto it = segments_.find(segment_id);
  if (it == segments_.end() || it->second->draining) return;
  Segment& seg = *it->second;
  seg.draining = true;
  draining_.insert(segment_id);
  placeable_.erase(std::find_if(placeable_.begin(), placeable_.end(),
                                [&](const auto& p) { return p.first == segment_id; }));
  auto client = clients_.find(seg.client_id);
  if (client != clients_.end()) client->second.segments.erase(segment_id);
  ++view_version_;
  bool writers = false;  // a put or upsert in flight had a replica here
  // Puts and upserts in flight lose their replicas here and keep the others, whose space
  // stays theirs until the writer ends, revokes or is discarded: a writer may be writing
  // there now. (Bounded: the writers' reservations, max_client_inflight_ratio.)
  for (ObjectEntry* e = in_flight_.front(); e != nullptr;) {
    ObjectEntry* put = e;
    e = in_flight_.next(e);
    if (!OnDrainingLocked(put->second)) continue;
    writers = true;
    const uint64_t before = InFlightBytes(put->second);
    const bool none_left = DropDrainingLocked(&put->second);
    ReleaseLocked(put->second.owner, before - InFlightBytes(put->second));
    if (none_left) EraseObjectLocked(objects_.find(put->first), now);
  }
  for (auto up = upserts_.begin(); up != upserts_.end();) {
    if (!OnDrainingLocked(up->second)) {
      ++up;
      continue;
    }
    writers = true;
    const uint64_t before = InFlightBytes(up->second);
    const bool none_left = DropDrainingLocked(&up->second);
    ReleaseLocked(up->second.owner, before - InFlightBytes(up->second));
    up = none_left ? EraseUpsertLocked(up, now) : std::next(up);
  }
  // Readers may hold addresses in this segment for one more lease TTL, and writers whose put
  // had a replica here may write there until their put is discarded: a segment mounted again
  // under this name (the same memory, perhaps) takes no new objects before then.
  auto wait = std::chrono::duration_cast<Clock::duration>(
      std::chrono::milliseconds(config_.default_kv_lease_ttl_ms));
  if (writers) {
    wait = std::max<Clock::duration>(wait,
                                     std::chrono::seconds(config_.put_start_discard_timeout_s));
  }
  dropped_names_[seg.name] = now + wait;
}

bool MasterService::OnDrainingLocked(const Object& obj) const {
  if (draining_.empty()) return false;
  for (const auto& p : obj.replicas) {
    if (draining_.count(p.segment_id)) return true;
  }
  return false;
}

bool MasterService::DropDrainingLocked(Object* obj) {
  auto& reps = obj->replicas;
  reps.erase(std::remove_if(reps.begin(), reps.end(),
                            [&](const auto& p) { return draining_.count(p.segment_id) > 0; }),
             reps.end());
  return reps.empty();
}

void MasterService::FinishUnmount(const std::vector<uint64_t>& segment_ids) {
  if (segment_ids.empty()) return;
  bool walk = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = now_();
    done = objects_.Scan(&cursor, 2 * kRemoveChunk, [&](const ObjectEntry& e) {
      if (OnDrainingLocked(e.second)) hit.push_back(e.first);
    });
    for (const std::string& key : hit) {
      auto it = objects_.find(key);
      if (it == objects_.end()) continue;
      if (!it->second.complete) {  // (BeginUnmountLocked took these already: defensive)
        const uint64_t before = InFlightBytes(it->second);
        const bool none_left = DropDrainingLocked(&it->second);
        ReleaseLocked(it->second.owner, before - InFlightBytes(it->second));
        if (none_left) EraseObjectLocked(it, now);
        continue;
      }
      if (DropDrainingLocked(&it->second)) EraseObjectLocked(it, now);
    }
    hit.clear();
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t id : segment_ids) {
    auto it = segments_.find(id);
    if (it == segments_.end()) continue;
    LOG(INFO) << "unmounted segment " << it->second->name << " of client "
              << it->second->client_id;
    draining_.erase(id);
    segments_.erase(it);
    ++counters_.unmounts;
  }
}

rpc::UnmountSegmentResponse MasterService::UnmountSegment(const rpc::UnmountSegmentRequest& req) {
  rpc::UnmountSegmentResponse resp;
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    BeginUnmountLocked(id, now_());
  }
  FinishUnmount({id});
  resp.set_code(Code(ErrorCode::OK));
  return resp;
}

}  // namespace store
}  // namespace mooncake
