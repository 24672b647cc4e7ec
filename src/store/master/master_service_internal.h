// MasterService's private records (segments, objects, clients), shared by master_service.cc
// and master_remove.cc.
#pragma once

#include <chrono>
#include <deque>
#include <unordered_map>
#include <unordered_set>
#include <set>
#include <string>
#include <vector>

#include "store/master/master_records.h"
#include "store/master/master_service.h"

namespace mooncake {
namespace store {

struct MasterService::Segment {
  Segment(std::string n, uint64_t b, uint64_t s, std::string c)
      : name(std::move(n)), base(b), size(s), client_id(std::move(c)), alloc(s) {}
  std::string name;
  uint64_t base;
  uint64_t size;
  std::string client_id;
  OffsetAllocator alloc;
  // Nothing new is placed here before this (a remount: see MasterService).
  MasterService::Clock::time_point alloc_after{};
  // Being unmounted (BeginUnmountLocked .. FinishUnmount): nothing new is placed here, its
  // replicas are no longer handed out, and the table walk drops them.
  bool draining = false;
  // A standby's count of the placements (objects and upserts in flight) on it: the log
  // unmounts a segment only after dropping them (ApplyLocked refuses an UNMOUNT otherwise).
  uint64_t standby_placements = 0;
};

// One object: 120 bytes (ClientName and Replicas in master_records.h keep it off the heap
// but for its key), so that a table node with its key string is 168 bytes.
struct MasterService::Object {
  using Placement = store::Placement;
  // Its place in one of the master's RecordLists (master_records.h): in flight, least
  // recently used, soft-pinned least recently used, or none (hard-pinned, or not in objects_:
  // an upsert in flight, a record being built). Records are only moved while in none.
  ObjectEntry* prev = nullptr;
  ObjectEntry* next = nullptr;
  uint64_t size = 0;
  Replicas replicas;
  ClientName owner;
  // !complete: when PutStart placed it (a put older than put_start_discard_timeout is
  // discarded); complete: its PutEnd (ReplicaClear treats a fresh write as leased).
  Clock::time_point stamp;
  Clock::time_point last_access;
  Clock::time_point lease_until;
  // Complete: the latest read grant's id. In flight (a put): its PutStartRequest.put_nonce,
  // so that the same request sent again is granted the same space (no read lease exists
  // before PutEnd, which sets it to 0).
  uint64_t lease_id = 0;
  uint64_t version = 0;  // GetReplicaListResult.version: set when the value is placed
  ClientName lease_client;   // ... and who got it
  Clock::time_point foreign_until;  // the latest lease end of grants to other clients
  std::chrono::milliseconds soft_pin_ttl{0};  // how long after the last access the pin holds
  bool complete = false;
  bool soft_pin = false;
  bool hard_pin = false;
  bool keep_soft_pin = false;  // an upsert in flight: take the replaced value's soft pin
  uint8_t list = 0;            // the RecordList holding it (its id), 0 for none
};

// A client's local disk (the disk tier): what waits for it to write, what it must delete.
struct MasterService::Disk {
  std::string client_id;  // "" : detached (its client expired; its replicas not served)
  std::string store_id;
  std::string endpoint;
  bool offloading = false;
  // Objects to write, oldest first (key, version), and the version queued last per key (an
  // entry whose version is not that one is stale, skipped when fetched).
  std::deque<std::pair<std::string, uint64_t>> queue;
  std::unordered_map<std::string, uint64_t> queued;
  // Objects handed out by the client's last OffloadFetch, not yet reported: the lease each
  // had before the fetch, and the one the fetch gave it (a report restores the former unless
  // a read since extended it); the version handed out, kept from eviction until hold_until
  // (the lease alone may end before a slow write does).
  struct Fetched {
    MasterService::Clock::time_point before, granted;
    uint64_t version = 0;
    MasterService::Clock::time_point hold_until;
  };
  std::unordered_map<std::string, Fetched> fetched;
  // Removals to apply (key, version), numbered from removals_base; the client acknowledges
  // them by number (OffloadFetchRequest.removals_done).
  std::deque<std::pair<std::string, uint64_t>> removals;
  uint64_t removals_base = 0;
  // --promotion_on_hit: keys (and the version on this disk) to bring back to memory.
  std::deque<std::pair<std::string, uint64_t>> promotions;
  std::unordered_set<std::string> promoting;
  // The client is closing (OffloadFetchRequest.end_wait): its next fetch does not wait
  // (MayWaitForDiskWork).
  bool wait_ended = false;
  uint64_t keys = 0, bytes = 0;  // its disk replicas
  MasterService::Clock::time_point detached_at{};
};

struct MasterService::Client {
  Clock::time_point last_ping;
  std::set<uint64_t> segments;
};

// Bytes a client holds in puts and upserts it has started and not ended (replica bytes),
// against MasterConfig::max_client_inflight_ratio.
inline uint64_t MasterService::InFlightBytes(const Object& obj) {
  return obj.size * obj.replicas.size();
}

inline bool MasterService::CopyingLocked(const std::string& key) const {
  return !copies_.empty() && copies_.count(key) > 0;
}

inline bool MasterService::Leased(const Object& obj, Clock::time_point now) {
  return obj.lease_until > now;
}

inline int32_t Code(ErrorCode c) { return ToInt(c); }

// Results (each with a code()) or codes that are not OK.
template <class Results>
size_t Failed(const Results& results) {
  size_t n = 0;
  for (const auto& r : results) n += r.code() != Code(ErrorCode::OK);
  return n;
}
template <class Codes>
size_t FailedCodes(const Codes& codes) {
  size_t n = 0;
  for (int32_t c : codes) n += c != Code(ErrorCode::OK);
  return n;
}

template <class KeyAt>
void MasterService::PrefetchLocked(size_t n, KeyAt&& key_at) {
  hashes_.resize(n);
  // Below this a batch has too few misses to overlap for the passes to pay.
  constexpr size_t kPrefetchMin = 4;
  if (n < kPrefetchMin) {
    for (size_t i = 0; i < n; ++i) hashes_[i] = ObjectMap::Hash(key_at(i));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    hashes_[i] = ObjectMap::Hash(key_at(i));
    objects_.PrefetchSlot(hashes_[i]);
  }
  prefetched_.resize(n);
  for (size_t i = 0; i < n; ++i) prefetched_[i] = objects_.PrefetchNode(hashes_[i]);
  for (const ObjectEntry* e : prefetched_) {
    if (e == nullptr) continue;
    ObjectMap::PrefetchKey(e);
    if (e->second.prev != nullptr) __builtin_prefetch(&e->second.prev->second);
    if (e->second.next != nullptr) __builtin_prefetch(&e->second.next->second);
  }
}

}  // namespace store
}  // namespace mooncake
