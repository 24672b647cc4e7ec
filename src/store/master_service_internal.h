// MasterService's private records (segments, objects, clients), shared by master_service.cc
// and master_remove.cc.
#pragma once

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "store/master_service.h"

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
};

struct MasterService::Object {
  struct Placement {
    uint64_t segment_id;
    uint64_t offset;
  };
  uint64_t size = 0;
  std::vector<Placement> replicas;
  bool complete = false;
  bool soft_pin = false;
  std::chrono::milliseconds soft_pin_ttl{0};  // how long after the last access the pin holds
  bool hard_pin = false;
  std::string owner;
  Clock::time_point put_started;
  Clock::time_point last_access;
  Clock::time_point lease_until;
  uint64_t lease_id = 0;     // the latest grant
  std::string lease_client;  // ... and who got it
  Clock::time_point foreign_until;  // the latest lease end of grants to other clients
  bool keep_soft_pin = false;  // an upsert in flight: take the replaced value's soft pin
  Clock::time_point completed_at;  // PutEnd (ReplicaClear treats a fresh write as leased)
};

struct MasterService::Client {
  Clock::time_point last_ping;
  std::set<uint64_t> segments;
};

inline int32_t Code(ErrorCode c) { return ToInt(c); }

}  // namespace store
}  // namespace mooncake
