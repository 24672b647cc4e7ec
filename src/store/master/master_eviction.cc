// MasterService: the object lists (in flight; least recently used, plain and soft-pinned:
// RecordList in master_records.h) and eviction along them, in passes of bounded size.
#include <glog/logging.h>

#include <algorithm>

#include "store/master/master_service.h"
#include "store/master/master_service_internal.h"

namespace mooncake {
namespace store {

void MasterService::UnlistLocked(ObjectEntry* e) {
  for (RecordList<ObjectEntry>* l : {&in_flight_, &lru_, &pinned_lru_}) {
    if (l->contains(e)) return l->remove(e);
  }
}

void MasterService::ListLocked(ObjectEntry* e) {
  UnlistLocked(e);
  const Object& obj = e->second;
  if (!obj.complete) {
    in_flight_.push_back(e);
  } else if (!obj.hard_pin) {
    (obj.soft_pin ? pinned_lru_ : lru_).push_back(e);
  }
}

uint64_t MasterService::EvictLocked(uint64_t needed, Clock::time_point now) {
  // Just promoted: what eviction frees waits out the previous leader's leases (lease_floor_),
  // so evicting now would lose objects and free nothing usable.
  if (lease_floor_ > now) return 0;
  const uint64_t capacity = CapacityLocked();
  const uint64_t allocated = AllocatedLocked();
  const double target_ratio =
      std::max(0.0, config_.eviction_high_watermark_ratio - config_.eviction_ratio);
  const uint64_t target = static_cast<uint64_t>(target_ratio * static_cast<double>(capacity));
  uint64_t to_free = allocated + needed > target ? allocated + needed - target : 0;
  to_free = std::max(to_free, needed);
  if (to_free == 0) {
    evicting_ = false;
    return 0;
  }
  ++counters_.eviction_runs;
  uint64_t freed = 0;
  size_t victims = 0;
  size_t held = 0;  // --offload_on_evict's victims kept (below)
  auto done = [&] {
    return freed >= to_free || (victims >= kEvictChunk && freed >= needed) || held >= kEvictChunk;
  };
  // The disk tier: a victim waiting for its disk is kept (--offload_on_evict: queued for it
  // first; not with --offload_force_evict); a walk keeps at most kEvictChunk of them.
  size_t offload_queued = 0;
  auto evict = [&](ObjectEntry* e) MC_REQUIRES(mu_) {
    if (HeldForOffloadLocked(e, &offload_queued, now)) {
      ++held;
      return;
    }
    freed += e->second.size * e->second.replicas.size();
    ++victims;
    ++counters_.evicted_objects;
    EraseObjectLocked(objects_.find(e->first), now);
  };
  auto pinned = [&](const ObjectEntry* e) {
    return e->second.last_access + e->second.soft_pin_ttl > now;
  };
  // First plain objects and soft-pinned ones whose pin has lapsed, least recently accessed
  // first: both lists are in order of last access, so this merges them. The walk of
  // pinned_lru_ stops where no pin can have lapsed yet (accessed within the shortest TTL).
  ObjectEntry* plain = lru_.front();
  ObjectEntry* soft = pinned_lru_.front();
  auto next_plain = [&]() MC_REQUIRES(mu_) {
    while (plain != nullptr && (Leased(plain->second, now) || CopyingLocked(plain->first))) {
      plain = lru_.next(plain);
    }
  };
  auto next_lapsed = [&]() MC_REQUIRES(mu_) {
    while (soft != nullptr && now - soft->second.last_access >= min_soft_pin_ttl_ &&
           (pinned(soft) || Leased(soft->second, now) || CopyingLocked(soft->first))) {
      soft = pinned_lru_.next(soft);
    }
    if (soft != nullptr && now - soft->second.last_access < min_soft_pin_ttl_) soft = nullptr;
  };
  while (!done()) {
    next_plain();
    next_lapsed();
    ObjectEntry* victim = nullptr;
    if (plain != nullptr &&
        (soft == nullptr || plain->second.last_access <= soft->second.last_access)) {
      victim = plain;
      plain = lru_.next(plain);
    } else if (soft != nullptr) {
      victim = soft;
      soft = pinned_lru_.next(soft);
    } else {
      break;
    }
    evict(victim);
  }
  // Then soft-pinned objects still pinned, least recently accessed first.
  for (ObjectEntry* e = pinned_lru_.front(); e != nullptr && !done();) {
    ObjectEntry* victim = e;
    e = pinned_lru_.next(e);
    if (!Leased(victim->second, now) && !CopyingLocked(victim->first)) evict(victim);
  }
  counters_.evicted_bytes += freed;
  if (victims > 0) ++counters_.eviction_successes;
  // Still above the low watermark with something taken: the next call goes on.
  evicting_ = victims > 0 && allocated - std::min(allocated, freed) > target;
  if (freed > 0) VLOG(1) << "evicted " << freed << " bytes (" << victims << " objects)";
  return freed;
}

void MasterService::EvictIfFullLocked(Clock::time_point now) {
  const uint64_t capacity = CapacityLocked();
  if (capacity == 0) return;
  if (evicting_ || static_cast<double>(AllocatedLocked()) >
                       config_.eviction_high_watermark_ratio * static_cast<double>(capacity)) {
    EvictLocked(0, now);
  }
}

}  // namespace store
}  // namespace mooncake
