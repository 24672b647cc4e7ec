// MasterService: upsert (a put that replaces an existing value). The new value is written into
// new space while readers keep reading the old one; PutEnd swaps them and frees the old space
// as a removal does, so a reader holding a lease on the old value never sees new bytes in its
// space, and every get returns one complete version.
#include <glog/logging.h>

#include "store/master_service.h"
#include "store/master_service_internal.h"

namespace mooncake {
namespace store {

void MasterService::UpsertStartLocked(const rpc::PutStartRequest& req,
                                      const rpc::PutStartItem& item,
                                      rpc::PutStartResult* result) {
  const std::string& key = item.key();
  const auto now = now_();
  const auto discard = std::chrono::seconds(config_.put_start_discard_timeout_s);
  auto busy = [&](const char* why) {
    result->set_code(Code(ErrorCode::OBJECT_REPLICA_BUSY));
    result->set_message("key " + key + " " + why + ": retry once it has ended");
  };
  auto pending = upserts_.find(key);
  if (pending != upserts_.end()) {
    if (pending->second.stamp + discard > now) return busy("has an upsert in flight");
    FreeObjectLocked(pending->second);  // never read: freed at once
    upserts_.erase(pending);
    ++counters_.discarded_puts;
  }
  auto existing = objects_.find(key);
  if (existing != objects_.end() && !existing->second.complete) {
    if (existing->second.stamp + discard > now) return busy("has a put in flight");
    EraseObjectLocked(existing);
    ++counters_.discarded_puts;
    existing = objects_.end();
  }
  Object obj = NewObjectLocked(req, item.size());
  obj.keep_soft_pin = req.config().keep_soft_pin() && !req.config().with_soft_pin();
  // Placement may evict, the old value among others: look it up again afterwards.
  if (!PlaceOrFailLocked(key, item.size(), req.config(), &obj, result)) return;
  if (objects_.count(key)) {
    upserts_.emplace(key, std::move(obj));  // the old value stays visible until PutEnd
  } else {
    in_flight_.insert(key);  // nothing to replace: a plain put
    objects_.emplace(key, std::move(obj));
  }
}

bool MasterService::UpsertEndLocked(const std::string& key, const std::string& client,
                                    bool commit) {
  auto pending = upserts_.find(key);
  if (pending == upserts_.end() || pending->second.owner != client) return false;
  if (!commit) {
    FreeObjectLocked(pending->second);
    upserts_.erase(pending);
    return true;
  }
  Object obj = std::move(pending->second);
  upserts_.erase(pending);
  const auto now = now_();
  obj.complete = true;
  obj.last_access = now;
  obj.stamp = now;
  auto old = objects_.find(key);
  if (old != objects_.end()) {
    if (obj.keep_soft_pin && old->second.complete) {
      obj.soft_pin = old->second.soft_pin;
      obj.soft_pin_ttl = old->second.soft_pin_ttl;
    }
    // Readers of the old value hold leases on its space: it goes to the graveyard until then.
    EraseObjectLocked(old);
  }
  obj.keep_soft_pin = false;
  objects_.emplace(key, std::move(obj));
  return true;
}

}  // namespace store
}  // namespace mooncake
