// MasterService and the HA operation log (src/store/ha/README.md): a serving master hands
// each change to its ChangeSink as an entry (oplog.proto: the state of one segment or object
// after the change); a standby applies entries, and Promote() makes it serve.
//
// What a standby keeps: segments, objects and upserts in flight with their placements (no
// allocator is used: a placement's handle is set at promotion), and the space the log freed
// during the last lease TTL (held_), which the old leader's readers may still be reading.
#include <glog/logging.h>

#include <algorithm>

#include "store/master/master_service.h"
#include "store/master/master_service_internal.h"

namespace mooncake {
namespace store {

namespace {

thread_local uint64_t tl_log_position = 0;

uint64_t Rounded(uint64_t size) { return (size + 63) & ~uint64_t{63}; }  // the allocators' 64

}  // namespace

void MasterService::SetEventSink(ObjectEventSink* events) {
  MutexLock lock(&mu_);
  events_ = events;
}

void MasterService::SetDiskWorkWaker(std::function<void(const std::string&)> waker) {
  MutexLock lock(&mu_);
  disk_waker_ = std::move(waker);
}

void MasterService::ForEachCompleteKey(const std::function<void(const std::string&)>& fn) const {
  MutexLock lock(&mu_);
  for (const auto& [key, obj] : objects_) {
    if (obj.complete) fn(key);
  }
}

void MasterService::SetChangeSink(ChangeSink* sink) {
  MutexLock lock(&mu_);
  sink_ = sink;
}

uint64_t MasterService::TakeLogPosition() {
  const uint64_t p = tl_log_position;
  tl_log_position = 0;
  return p;
}

bool MasterService::standby() const {
  MutexLock lock(&mu_);
  return standby_;
}

void MasterService::MarkLoadedFromCheckpoint() {
  MutexLock lock(&mu_);
  checkpoint_loaded_at_ = now_();
}

void MasterService::LogLocked(oplog::Entry&& entry) {
  if (sink_ == nullptr) return;
  tl_log_position = sink_->Append(std::move(entry));
}

namespace {

template <class Obj>
void FillState(const Obj& obj, oplog::ObjectState* st) {
  st->set_size(obj.size);
  for (const auto& p : obj.replicas) {
    oplog::Placement* r = st->add_replicas();
    r->set_segment_id(p.segment_id);
    r->set_offset(p.offset);
  }
  st->set_owner(obj.owner.str());
  st->set_complete(obj.complete);
  st->set_soft_pin(obj.soft_pin);
  st->set_hard_pin(obj.hard_pin);
  st->set_soft_pin_ttl_ms(static_cast<uint64_t>(obj.soft_pin_ttl.count()));
  st->set_keep_soft_pin(obj.keep_soft_pin);
  if (!obj.complete) st->set_put_nonce(obj.lease_id);
  st->set_version(obj.version);
}

}  // namespace

void MasterService::LogObjectLocked(oplog::Entry::Kind kind, const std::string& key,
                                    const Object& obj) {
  if (sink_ == nullptr) return;
  oplog::Entry e;
  e.set_kind(kind);
  e.set_key(key);
  FillState(obj, e.mutable_object());
  LogLocked(std::move(e));
}

void MasterService::LogKeyLocked(oplog::Entry::Kind kind, const std::string& key) {
  if (sink_ == nullptr) return;
  oplog::Entry e;
  e.set_kind(kind);
  e.set_key(key);
  LogLocked(std::move(e));
}

void MasterService::ExportState(const std::function<void(oplog::Entry&&)>& emit) const {
  MutexLock lock(&mu_);
  for (const auto& [id, seg] : segments_) {
    oplog::Entry e;
    e.set_kind(oplog::Entry::MOUNT);
    e.set_segment_id(static_cast<uint32_t>(id));
    e.set_segment_name(seg->name);
    e.set_base(seg->base);
    e.set_size(seg->size);
    e.set_client_id(seg->client_id);
    emit(std::move(e));
  }
  for (const auto& entry : objects_) {
    oplog::Entry e;
    e.set_kind(oplog::Entry::OBJECT);
    e.set_key(entry.first);
    FillState(entry.second, e.mutable_object());
    emit(std::move(e));
  }
  for (const auto& [key, obj] : upserts_) {
    oplog::Entry e;
    e.set_kind(oplog::Entry::UPSERT_OBJECT);
    e.set_key(key);
    FillState(obj, e.mutable_object());
    emit(std::move(e));
  }
  for (const auto& [key, obj] : copies_) {
    oplog::Entry e;
    e.set_kind(oplog::Entry::COPY_OBJECT);
    e.set_key(key);
    FillState(obj, e.mutable_object());
    emit(std::move(e));
  }
}

void MasterService::HoldLocked(const Object& old, const Object* now_in, Clock::time_point now) {
  const auto until = now + std::chrono::milliseconds(config_.default_kv_lease_ttl_ms);
  for (const auto& p : old.replicas) {
    bool kept = false;
    if (now_in != nullptr) {
      for (const auto& q : now_in->replicas) {
        kept |= q.segment_id == p.segment_id && q.offset == p.offset && now_in->size == old.size;
      }
    }
    if (!kept) held_.push_back({p.segment_id, p.offset, old.size, until});
  }
}

void MasterService::SetStateLocked(const oplog::ObjectState& st, Object* obj,
                                   Clock::time_point now) {
  obj->size = st.size();
  obj->replicas.clear();
  for (const auto& r : st.replicas()) obj->replicas.push_back({r.segment_id(), 0, r.offset()});
  obj->owner = client_names_.Get(st.owner());
  obj->complete = st.complete();
  obj->soft_pin = st.soft_pin();
  obj->hard_pin = st.hard_pin();
  obj->soft_pin_ttl = std::chrono::milliseconds(st.soft_pin_ttl_ms());
  obj->keep_soft_pin = st.keep_soft_pin();
  obj->lease_id = st.complete() ? 0 : st.put_nonce();
  obj->version = st.version();
  next_version_ = std::max(next_version_, st.version() + 1);
  obj->stamp = now;
  obj->last_access = now;
  if (obj->soft_pin) {
    min_soft_pin_ttl_ = std::min<Clock::duration>(min_soft_pin_ttl_, obj->soft_pin_ttl);
  }
}

Status MasterService::Apply(const oplog::Entry& entry) {
  MutexLock lock(&mu_);
  if (!standby_) return Status::FailedPrecondition("a serving master applies no log");
  return ApplyLocked(entry, now_());
}

Status MasterService::ApplyLocked(const oplog::Entry& e, Clock::time_point now) {
  auto diverged = [&](const std::string& what) {
    return Status::FailedPrecondition("log entry " + oplog::Entry::Kind_Name(e.kind()) +
                                      (e.key().empty() ? "" : " of key " + e.key().substr(0, 256)) +
                                      ": " + what + " (the log and this state have diverged)");
  };
  const bool keyed = e.kind() == oplog::Entry::OBJECT || e.kind() == oplog::Entry::ERASE ||
                     e.kind() == oplog::Entry::UPSERT_OBJECT ||
                     e.kind() == oplog::Entry::UPSERT_ERASE || e.kind() == oplog::Entry::UPSERT_COMMIT ||
                     e.kind() == oplog::Entry::COPY_OBJECT || e.kind() == oplog::Entry::COPY_ERASE ||
                     e.kind() == oplog::Entry::COPY_COMMIT;
  const bool needs_object = e.kind() == oplog::Entry::OBJECT ||
                            e.kind() == oplog::Entry::UPSERT_OBJECT ||
                            e.kind() == oplog::Entry::UPSERT_COMMIT ||
                            e.kind() == oplog::Entry::COPY_OBJECT ||
                            e.kind() == oplog::Entry::COPY_COMMIT;
  if (keyed && e.key().empty()) return diverged("an entry of an object with no key");
  if (needs_object && !e.has_object()) return diverged("an entry with no object state");
  if (e.has_object()) {
    if (e.object().size() == 0) return diverged("an object of 0 bytes");
    for (const auto& r : e.object().replicas()) {
      auto seg = segments_.find(r.segment_id());
      if (seg == segments_.end()) return diverged("a replica on unknown segment " +
                                                  std::to_string(r.segment_id()));
      if (r.offset() > seg->second->size || e.object().size() > seg->second->size - r.offset()) {
        return diverged("a replica past its segment's end");
      }
    }
  }
  auto count = [&](const Object& obj, int64_t delta) MC_REQUIRES(mu_) {
    for (const auto& p : obj.replicas) {
      auto seg = segments_.find(p.segment_id);
      if (seg != segments_.end()) seg->second->standby_placements += delta;
    }
  };
  switch (e.kind()) {
    case oplog::Entry::MOUNT: {
      if (e.segment_id() == 0 || segments_.count(e.segment_id())) {
        return diverged("segment id " + std::to_string(e.segment_id()) + " taken or 0");
      }
      auto seg = std::make_unique<Segment>(e.segment_name(), e.base(), e.size(), e.client_id());
      segments_.emplace(e.segment_id(), std::move(seg));
      Client& client = clients_[e.client_id()];
      client.last_ping = now;
      client.segments.insert(e.segment_id());
      next_segment_id_ = std::max<uint64_t>(next_segment_id_, uint64_t{e.segment_id()} + 1);
      return Status::OK();
    }
    case oplog::Entry::UNMOUNT: {
      auto it = segments_.find(e.segment_id());
      if (it == segments_.end()) return diverged("unknown segment " + std::to_string(e.segment_id()));
      if (it->second->standby_placements != 0) {
        return diverged("segment " + std::to_string(e.segment_id()) + " still holds " +
                        std::to_string(it->second->standby_placements) + " placements");
      }
      auto client = clients_.find(it->second->client_id);
      if (client != clients_.end()) client->second.segments.erase(e.segment_id());
      segments_.erase(it);
      return Status::OK();
    }
    case oplog::Entry::OBJECT: {
      auto it = objects_.find(e.key());
      if (it == objects_.end()) {
        Object obj;
        SetStateLocked(e.object(), &obj, now);
        count(obj, 1);
        ListLocked(&*objects_.emplace(e.key(), std::move(obj)).first);
        return Status::OK();
      }
      Object old;  // its placements, to hold those the new state no longer has
      old.size = it->second.size;
      old.replicas = it->second.replicas;
      count(old, -1);
      SetStateLocked(e.object(), &it->second, now);  // in place: its list links stay
      count(it->second, 1);
      HoldLocked(old, &it->second, now);
      ListLocked(&*it);
      return Status::OK();
    }
    case oplog::Entry::ERASE: {
      auto it = objects_.find(e.key());
      if (it == objects_.end()) return diverged("no such object");
      count(it->second, -1);
      HoldLocked(it->second, nullptr, now);
      UnlistLocked(&*it);
      objects_.erase(it);
      return Status::OK();
    }
    case oplog::Entry::UPSERT_OBJECT: {
      Object next;
      SetStateLocked(e.object(), &next, now);
      count(next, 1);
      auto it = upserts_.find(e.key());
      if (it != upserts_.end()) {
        count(it->second, -1);
        HoldLocked(it->second, &next, now);
        it->second = std::move(next);
      } else {
        upserts_.emplace(e.key(), std::move(next));
      }
      return Status::OK();
    }
    case oplog::Entry::UPSERT_ERASE: {
      auto it = upserts_.find(e.key());
      if (it == upserts_.end()) return diverged("no such upsert in flight");
      count(it->second, -1);
      HoldLocked(it->second, nullptr, now);
      upserts_.erase(it);
      return Status::OK();
    }
    case oplog::Entry::UPSERT_COMMIT: {
      auto up = upserts_.find(e.key());
      if (up == upserts_.end()) return diverged("no such upsert in flight");
      if (objects_.find(e.key()) != objects_.end()) return diverged("the old value is still there");
      Object next;
      SetStateLocked(e.object(), &next, now);
      count(up->second, -1);
      count(next, 1);
      HoldLocked(up->second, &next, now);  // its space moves to the value (nothing held)
      upserts_.erase(up);
      ListLocked(&*objects_.emplace(e.key(), std::move(next)).first);
      return Status::OK();
    }
    case oplog::Entry::COPY_OBJECT: {
      Object next;
      SetStateLocked(e.object(), &next, now);
      count(next, 1);
      auto it = copies_.find(e.key());
      if (it != copies_.end()) {
        count(it->second, -1);
        HoldLocked(it->second, &next, now);
        it->second = std::move(next);
      } else {
        copies_.emplace(e.key(), std::move(next));
      }
      return Status::OK();
    }
    case oplog::Entry::COPY_ERASE: {
      auto it = copies_.find(e.key());
      if (it == copies_.end()) return diverged("no such replica task in flight");
      count(it->second, -1);
      HoldLocked(it->second, nullptr, now);
      copies_.erase(it);
      return Status::OK();
    }
    case oplog::Entry::COPY_COMMIT: {
      auto c = copies_.find(e.key());
      if (c == copies_.end()) return diverged("no such replica task in flight");
      auto it = objects_.find(e.key());
      if (it == objects_.end()) return diverged("no such object");
      // The task's space and the object's as they were, against the object's state now:
      // what it no longer has (a move's source) is held.
      Object old;
      old.size = it->second.size;
      old.replicas = it->second.replicas;
      for (const auto& p : c->second.replicas) old.replicas.push_back(p);
      count(c->second, -1);
      count(it->second, -1);
      copies_.erase(c);
      SetStateLocked(e.object(), &it->second, now);
      count(it->second, 1);
      HoldLocked(old, &it->second, now);
      ListLocked(&*it);
      return Status::OK();
    }
    default:
      return diverged("unknown kind " + std::to_string(e.kind()) +
                      " (is the log newer than this master?)");
  }
}

Status MasterService::Promote() {
  MutexLock lock(&mu_);
  if (!standby_) return Status::OK();
  const auto now = now_();
  const auto lease = std::chrono::milliseconds(config_.default_kv_lease_ttl_ms);
  // Per segment: the live placements (objects, upserts in flight) and the held ranges.
  struct Claim {
    uint64_t offset;
    uint64_t size;  // rounded
    Placement* placement;  // null: held until free_at
    Clock::time_point free_at;
  };
  std::unordered_map<uint32_t, std::vector<Claim>> live, held;
  auto add = [&](Object& obj) {
    for (Placement& p : obj.replicas) {
      live[p.segment_id].push_back({p.offset, Rounded(obj.size), &p, {}});
    }
  };
  for (auto& entry : objects_) add(entry.second);
  for (auto& [key, obj] : upserts_) add(obj);
  for (auto& [key, obj] : copies_) add(obj);  // no task knows them here: freed when discarded
  for (const Held& h : held_) {
    if (h.free_at > now && segments_.count(h.segment_id)) {
      held[h.segment_id].push_back({h.offset, Rounded(h.size), nullptr, h.free_at});
    }
  }
  auto by_offset = [](const Claim& a, const Claim& b) { return a.offset < b.offset; };
  size_t held_kept = 0;
  for (auto& [id, seg] : segments_) {
    std::vector<Claim>& mine = live[static_cast<uint32_t>(id)];
    std::sort(mine.begin(), mine.end(), by_offset);
    for (size_t i = 1; i < mine.size(); ++i) {
      if (mine[i].offset < mine[i - 1].offset + mine[i - 1].size) {
        return Status::FailedPrecondition(
            "segment " + seg->name + ": two replicas overlap at offset " +
            std::to_string(mine[i].offset) + " (the log is inconsistent; not serving)");
      }
    }
    // A held range that overlaps a live one was reused by the old leader, which had freed
    // it as a whole once its readers were done: dropped. Held ranges overlapping each other
    // (freed, reused, freed again) are trimmed to what the earlier ones leave.
    std::vector<Claim>& hs = held[static_cast<uint32_t>(id)];
    std::sort(hs.begin(), hs.end(), by_offset);
    std::vector<Claim> claims;
    claims.reserve(mine.size() + hs.size());
    size_t li = 0;
    uint64_t held_end = 0;
    for (Claim h : hs) {
      while (li < mine.size() && mine[li].offset + mine[li].size <= h.offset) ++li;
      if (li < mine.size() && mine[li].offset < h.offset + h.size) continue;  // reused
      const uint64_t end = h.offset + h.size;
      if (end <= held_end) continue;
      h.offset = std::max(h.offset, held_end);
      h.size = end - h.offset;
      held_end = end;
      claims.push_back(h);
    }
    held_kept += claims.size();
    claims.insert(claims.end(), mine.begin(), mine.end());
    std::sort(claims.begin(), claims.end(), by_offset);
    for (const Claim& c : claims) {
      auto got = seg->alloc.ClaimAscending(c.offset, c.size);
      if (!got) {
        return Status::FailedPrecondition("segment " + seg->name + ": cannot place " +
                                          std::to_string(c.size) + " bytes at offset " +
                                          std::to_string(c.offset) + " (not serving)");
      }
      if (c.placement != nullptr) {
        c.placement->handle = got->handle;
      } else {
        graveyard_.push({id, *got, c.size, c.free_at});
        graveyard_bytes_ += c.size;
      }
    }
    // Loaded from a checkpoint lately: its free space may have been freed by the old leader
    // less than a lease TTL before; nothing new goes there until then.
    if (checkpoint_loaded_at_ != Clock::time_point{}) {
      seg->alloc_after = std::max(seg->alloc_after, checkpoint_loaded_at_ + lease);
    }
    placeable_.emplace_back(id, seg.get());
  }
  held_.clear();
  lease_floor_ = now + lease;
  promoted_at_ = now;
  for (auto& [name, client] : clients_) client.last_ping = now;
  inflight_bytes_.clear();
  for (ObjectEntry* e = in_flight_.front(); e != nullptr; e = in_flight_.next(e)) {
    ReserveLocked(e->second.owner, InFlightBytes(e->second));
  }
  for (auto& [key, obj] : upserts_) ReserveLocked(obj.owner, InFlightBytes(obj));
  standby_ = false;
  RechargeLocked();  // the tenants' charges, from the objects it holds
  ++view_version_;
  LOG(INFO) << "promoted: " << segments_.size() << " segments, " << objects_.size()
            << " objects (" << in_flight_.size() << " puts in flight), " << upserts_.size()
            << " upserts in flight, " << copies_.size() << " replica tasks' space, " << held_kept << " freed ranges kept out of use for "
            << "the old leader's readers; freed space reused from "
            << lease.count() << " ms on";
  return Status::OK();
}

}  // namespace store
}  // namespace mooncake
