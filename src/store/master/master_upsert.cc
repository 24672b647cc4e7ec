// MasterService: upsert (a put that replaces an existing value). The new value is written into
// new space while readers keep reading the old one; PutEnd swaps them and frees the old space
// as a removal does, so a reader holding a lease on the old value never sees new bytes in its
// space, and every get returns one complete version.
#include <glog/logging.h>

#include "store/master/master_service.h"
#include "store/master/master_service_internal.h"

namespace mooncake {
namespace store {

void MasterService::UpsertStartLocked(const rpc::PutStartRequest& req,
                                      const rpc::PutStartItem& item, const ClientName& owner,
                                      Clock::time_point now, rpc::PutStartResult* result) {
  const std::string& key = item.key();
  const auto discard = std::chrono::seconds(config_.put_start_discard_timeout_s);
  auto busy = [&](const char* why) {
    result->set_code(Code(ErrorCode::OBJECT_REPLICA_BUSY));
    result->set_message("key " + key + " " + why + ": retry once it has ended");
  };
  auto pending = upserts_.find(key);
  if (pending != upserts_.end()) {
    if (pending->second.stamp + discard > now) return busy("has an upsert in flight");
    EraseUpsertLocked(pending, now);  // never read: freed at once
    ++counters_.discarded_puts;
  }
  auto existing = objects_.find(key);
  if (existing != objects_.end() && !existing->second.complete) {
    if (existing->second.stamp + discard > now) return busy("has a put in flight");
    EraseObjectLocked(existing, now);
    ++counters_.discarded_puts;
    existing = objects_.end();
  }
  const uint64_t copies = std::max<uint32_t>(1, req.config().replica_num());
  if (!AdmitLocked(key, item.size() * copies, result, now)) return;
  Object obj = NewObjectLocked(req, item.size(), owner, now);
  obj.keep_soft_pin = req.config().keep_soft_pin() && !req.config().with_soft_pin();
  // Placement may evict, the old value among others: look it up again afterwards.
  if (!PlaceOrFailLocked(key, item.size(), req.config(), &obj, result, now)) return;
  ReserveLocked(owner, InFlightBytes(obj));
  ChargeLocked(key, InFlightBytes(obj));
  counters_.value_sizes.Observe(item.size());
  if (objects_.count(key)) {
    // The old value stays visible until PutEnd.
    auto up = upserts_.emplace(key, std::move(obj)).first;
    LogObjectLocked(oplog::Entry::UPSERT_OBJECT, key, up->second);
  } else {
    // Nothing to replace: a plain put.
    ObjectEntry* placed = &*objects_.emplace(key, std::move(obj)).first;
    in_flight_.push_back(placed);
    LogObjectLocked(oplog::Entry::OBJECT, key, placed->second);
  }
}

std::unordered_map<std::string, MasterService::Object>::iterator MasterService::EraseUpsertLocked(
    std::unordered_map<std::string, Object>::iterator it, Clock::time_point now) {
  ReleaseLocked(it->second.owner, InFlightBytes(it->second));
  UnchargeLocked(it->first, InFlightBytes(it->second));
  LogKeyLocked(oplog::Entry::UPSERT_ERASE, it->first);
  FreeObjectLocked(it->second, now);
  return upserts_.erase(it);
}

bool MasterService::UpsertEndLocked(const std::string& key, const std::string& client,
                                    bool commit, Clock::time_point now) {
  auto pending = upserts_.find(key);
  if (pending == upserts_.end() || pending->second.owner != client) return false;
  if (!commit) {
    EraseUpsertLocked(pending, now);
    return true;
  }
  ReleaseLocked(pending->second.owner, InFlightBytes(pending->second));
  Object obj = std::move(pending->second);
  upserts_.erase(pending);
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
    EraseObjectLocked(old, now);
  }
  obj.keep_soft_pin = false;
  ObjectEntry* done = &*objects_.emplace(key, std::move(obj)).first;
  ListLocked(done);
  LogObjectLocked(oplog::Entry::UPSERT_COMMIT, key, done->second);
  if (events_ != nullptr) events_->ObjectStored(key);
  DiskOnCompleteLocked(key, &done->second);
  return true;
}

}  // namespace store
}  // namespace mooncake
