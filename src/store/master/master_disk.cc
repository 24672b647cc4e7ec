// The disk tier's rules (src/store/disk/README.md): clients' local disks, the objects queued
// for them, the disk replicas they report, and what readers are told of them.
#include <algorithm>
#include <sstream>
#include <utility>

#include <glog/logging.h>

#include "store/common/limits.h"
#include "store/master/master_service.h"
#include "store/master/master_service_internal.h"

namespace mooncake {
namespace store {
namespace {

// Removals kept per disk while its client does not take them (past it the oldest go: a
// restart of that client could then bring those keys back from its disk).
constexpr size_t kMaxRemovalsPerDisk = 1 << 20;
// Detached disks kept (with their removals) for a client that comes back.
constexpr size_t kMaxDisks = kMaxSegments;
constexpr uint32_t kMaxFetchItems = 4096;
// How long an object handed to its disk's client stays kept from eviction while the client
// writes it (its report, its next fetch or its expiry end this sooner): beyond it a write
// stuck on a dead disk no longer keeps memory, and its report is refused if the object went.
constexpr std::chrono::seconds kOffloadWriteHold{60};

std::string StoreIdProblem(const std::string& id) {
  if (id.empty() || id.size() > 64 ||
      id.find_first_not_of("0123456789abcdefABCDEF-") != std::string::npos) {
    return "store id \"" + id.substr(0, 80) + "\" is not 1..64 hex digits";
  }
  return "";
}

}  // namespace

rpc::MountLocalDiskResponse MasterService::MountLocalDisk(const rpc::MountLocalDiskRequest& req) {
  rpc::MountLocalDiskResponse resp;
  MutexLock lock(&mu_);
  auto fail = [&](ErrorCode c, const std::string& m) MC_REQUIRES(mu_) {
    ++counters_.disk.mount_failures;
    resp.set_code(Code(c));
    resp.set_message(m);
    return resp;
  };
  if (!config_.offload.enable) {
    return fail(ErrorCode::UNABLE_OFFLOAD,
                "this master runs without --enable_offload: start it with --enable_offload "
                "for clients to offload to their disks (or set up the client without "
                "enable_ssd_offload)");
  }
  std::string p = NameProblem("client id", req.client_id());
  if (p.empty() && req.client_id().empty()) p = "empty client id";
  if (p.empty()) p = StoreIdProblem(req.store_id());
  if (p.empty()) p = NameProblem("offload endpoint", req.endpoint());
  if (p.empty() && req.endpoint().find(':') == std::string::npos) {
    p = "offload endpoint \"" + req.endpoint() + "\" is not host:port";
  }
  if (!p.empty()) return fail(ErrorCode::INVALID_PARAMS, p);
  const auto now = now_();
  if (req.unmount()) {
    DetachDiskOfLocked(req.client_id());
    resp.set_code(Code(ErrorCode::OK));
    return resp;
  }
  // This client's other disk (another store id) goes first.
  auto mine = disk_of_client_.find(req.client_id());
  if (mine != disk_of_client_.end() && disks_.at(mine->second)->store_id != req.store_id()) {
    DetachDiskOfLocked(req.client_id());
  }
  uint32_t id = 0;
  auto known = disk_of_store_.find(req.store_id());
  if (known != disk_of_store_.end()) {
    id = known->second;
    Disk& d = *disks_.at(id);
    if (!d.client_id.empty() && d.client_id != req.client_id()) {
      // The same directories under a new client (a restart within the old one's TTL): the
      // replicas are the same files, so they pass to it (upstream's #3052 drops them).
      LOG(INFO) << "disk " << req.store_id() << " passes from client " << d.client_id
                << " to " << req.client_id();
      disk_of_client_.erase(d.client_id);
    }
    d.client_id = req.client_id();
  } else {
    if (disks_.size() >= kMaxDisks) {
      // Make room: the detached disk detached longest ago.
      auto oldest = disks_.end();
      for (auto it = disks_.begin(); it != disks_.end(); ++it) {
        if (it->second->client_id.empty() &&
            (oldest == disks_.end() || it->second->detached_at < oldest->second->detached_at)) {
          oldest = it;
        }
      }
      if (oldest == disks_.end()) {
        return fail(ErrorCode::INVALID_PARAMS,
                    std::to_string(kMaxDisks) + " disks are mounted: unmount one first");
      }
      disk_of_store_.erase(oldest->second->store_id);
      const uint32_t gone = oldest->first;
      for (auto e = disk_objects_.begin(); e != disk_objects_.end();) {
        e = e->second.disk == gone ? disk_objects_.erase(e) : std::next(e);
      }
      disks_.erase(oldest);
    }
    id = next_disk_id_++;
    auto d = std::make_unique<Disk>();
    d->store_id = req.store_id();
    d->client_id = req.client_id();
    disks_.emplace(id, std::move(d));
    disk_of_store_[req.store_id()] = id;
  }
  Disk& d = *disks_.at(id);
  d.endpoint = req.endpoint();
  d.offloading = req.enable_offloading();
  if (!d.offloading) {
    d.queue.clear();
    d.queued.clear();
  }
  disk_of_client_[req.client_id()] = id;
  // A client with a disk and no segment heartbeats too.
  clients_[req.client_id()].last_ping = now;
  ++counters_.disk.mounts;
  resp.set_code(Code(ErrorCode::OK));
  return resp;
}

void MasterService::DetachDiskOfLocked(const std::string& client) {
  auto it = disk_of_client_.find(client);
  if (it == disk_of_client_.end()) return;
  const uint32_t id = it->second;
  disk_of_client_.erase(it);
  Disk& d = *disks_.at(id);
  d.client_id.clear();
  d.detached_at = now_();
  d.queue.clear();
  d.queued.clear();
  d.fetched.clear();
  // Its disk replicas are kept, not served (FillDiskLocked, DiskServedLocked): a removal or a
  // newer value of such a key still reaches the disk when a client mounts it again, so its
  // registration never brings back a removed or replaced value.
}

bool MasterService::DiskServedLocked(const std::string& key) const {
  if (disk_objects_.empty()) return false;
  auto it = disk_objects_.find(key);
  return it != disk_objects_.end() && !disks_.at(it->second.disk)->client_id.empty();
}

void MasterService::DiskForgetLocked(const std::string& key) {
  if (disk_objects_.empty()) return;
  auto it = disk_objects_.find(key);
  if (it == disk_objects_.end()) return;
  auto d = disks_.find(it->second.disk);
  if (d != disks_.end()) {
    Disk& disk = *d->second;
    disk.keys -= std::min<uint64_t>(disk.keys, 1);
    disk.bytes -= std::min(disk.bytes, it->second.size);
    if (disk.removals.empty() && disk_waker_) disk_waker_(disk.client_id);
    if (disk.removals.size() >= kMaxRemovalsPerDisk) {
      disk.removals.pop_front();
      ++disk.removals_base;
    }
    disk.removals.emplace_back(key, it->second.version);
    ++counters_.disk.removals;
  }
  disk_objects_.erase(it);
}

bool MasterService::OnDiskLocked(const std::string& key, uint64_t version) const {
  if (disk_objects_.empty()) return false;
  auto it = disk_objects_.find(key);
  return it != disk_objects_.end() && it->second.version == version;
}

void MasterService::DiskOnCompleteLocked(const std::string& key, Object* o) {
  const Object& obj = *o;
  if (!disk_objects_.empty()) {
    auto it = disk_objects_.find(key);
    if (it != disk_objects_.end() && it->second.version != obj.version) {
      DiskForgetLocked(key);  // an older value: its disk is told (it is erased here)
    } else if (it != disk_objects_.end()) {
      ++counters_.disk.promotions_done;  // a promotion: its disk replica stays
      o->lease_until = std::max(o->lease_until, now_() + std::chrono::milliseconds(
                                                            config_.default_kv_lease_ttl_ms));
      return;
    }
  }
  if (config_.offload.enable && !config_.offload.on_evict && !disk_of_client_.empty()) {
    QueueOffloadLocked(key, obj);
  }
}

bool MasterService::QueueOffloadLocked(const std::string& key, const Object& obj) {
  for (const auto& p : obj.replicas) {
    auto seg = segments_.find(p.segment_id);
    if (seg == segments_.end() || seg->second->draining) continue;
    auto dit = disk_of_client_.find(seg->second->client_id);
    if (dit == disk_of_client_.end()) continue;
    Disk& d = *disks_.at(dit->second);
    if (!d.offloading) continue;
    auto q = d.queued.find(key);
    if (q != d.queued.end() && q->second == obj.version) return true;
    if (d.queue.size() >= config_.offload.queue_limit) {
      ++counters_.disk.queue_full;
      return false;
    }
    // An empty queue: the disk's client may be waiting for work (a fetch finding any takes
    // it all, up to its bounds, and asks again at once).
    if (d.queue.empty() && disk_waker_) disk_waker_(d.client_id);
    d.queue.emplace_back(key, obj.version);
    d.queued[key] = obj.version;  // an older version's entry, if any, is now stale
    ++counters_.disk.queued;
    return true;
  }
  return false;
}

bool MasterService::WaitingForDiskLocked(const std::string& key, const Object& obj,
                                         Clock::time_point now) const {
  for (const auto& p : obj.replicas) {
    auto seg = segments_.find(p.segment_id);
    if (seg == segments_.end()) continue;
    auto dit = disk_of_client_.find(seg->second->client_id);
    if (dit == disk_of_client_.end()) continue;
    const Disk& d = *disks_.at(dit->second);
    auto q = d.queued.find(key);
    if (q != d.queued.end() && q->second == obj.version) return true;
    // Being written: the fetch's lease may end before a slow write does.
    auto f = d.fetched.find(key);
    if (f != d.fetched.end() && f->second.version == obj.version && now < f->second.hold_until) {
      return true;
    }
  }
  return false;
}

bool MasterService::HeldForOffloadLocked(const ObjectEntry* e, size_t* queued,
                                         Clock::time_point now) {
  if (!config_.offload.enable || disk_of_client_.empty()) return false;
  if (OnDiskLocked(e->first, e->second.version)) return false;  // its memory may go
  // Only objects with a disk to go to are kept: one whose holder has none is evicted as
  // without the tier (upstream keeps those too, and its pool stays full).
  bool waiting = WaitingForDiskLocked(e->first, e->second, now);
  if (!waiting && config_.offload.on_evict) {
    const size_t cap = std::max<size_t>(
        1, static_cast<size_t>(config_.offload.cap_ratio *
                               static_cast<double>(config_.offload.queue_limit)));
    if (*queued < cap && QueueOffloadLocked(e->first, e->second)) {
      ++*queued;
      waiting = true;
    }
  }
  if (!waiting || config_.offload.force_evict) return false;
  ++counters_.disk.held_for_offload;
  return true;
}

bool MasterService::FillDiskLocked(const std::string& key, bool count_read,
                                   google::protobuf::RepeatedPtrField<rpc::Replica>* out,
                                   uint64_t* size, uint64_t* version) {
  if (disk_objects_.empty()) return false;
  auto it = disk_objects_.find(key);
  if (it == disk_objects_.end()) return false;
  const Disk& d = *disks_.at(it->second.disk);
  if (d.client_id.empty()) return false;
  rpc::Replica* r = out->Add();
  r->set_status(rpc::Replica::COMPLETE);
  r->mutable_disk()->set_endpoint(d.endpoint);
  r->mutable_disk()->set_store_id(d.store_id);
  r->mutable_disk()->set_owner(d.client_id);
  r->mutable_disk()->set_key(key);
  *size = it->second.size;
  *version = it->second.version;
  if (count_read) {
    ++it->second.reads;
    ++counters_.disk.disk_gets;
    counters_.disk.disk_get_bytes += it->second.size;
    // Read often: back to memory, by its disk's owner (not in strict tenant mode, whose
    // puts are scoped by the writer's tenant).
    Disk& owner = *disks_.at(it->second.disk);
    if (config_.offload.promotion_on_hit && !config_.enable_multi_tenants &&
        it->second.reads >= config_.offload.promotion_threshold &&
        owner.promotions.size() < config_.offload.promotion_queue_limit &&
        objects_.find(key) == objects_.end() && owner.promoting.insert(key).second) {
      if (owner.promotions.empty() && disk_waker_) disk_waker_(owner.client_id);
      owner.promotions.emplace_back(key, it->second.version);
      ++counters_.disk.promotions_queued;
    }
  }
  return true;
}

void MasterService::EndDiskWait(const std::string& client_id) {
  MutexLock lock(&mu_);
  auto it = disk_of_client_.find(client_id);
  if (it == disk_of_client_.end()) return;
  disks_.at(it->second)->wait_ended = true;
  if (disk_waker_) disk_waker_(client_id);  // its waiting fetch runs again and sees the flag
}

bool MasterService::MayWaitForDiskWork(const std::string& client_id) {
  MutexLock lock(&mu_);
  if (!disk_waker_) return false;  // nothing would wake it
  auto it = disk_of_client_.find(client_id);
  if (it == disk_of_client_.end()) return false;
  return !std::exchange(disks_.at(it->second)->wait_ended, false);
}

uint32_t MasterService::OffloadWaitingLocked(const std::string& client) const {
  if (disk_of_client_.empty()) return 0;
  auto it = disk_of_client_.find(client);
  if (it == disk_of_client_.end()) return 0;
  const Disk& d = *disks_.at(it->second);
  return static_cast<uint32_t>(
      std::min<size_t>(d.queue.size() + d.removals.size() + d.promotions.size(), UINT32_MAX));
}

rpc::OffloadFetchResponse MasterService::OffloadFetch(const rpc::OffloadFetchRequest& req) {
  rpc::OffloadFetchResponse resp;
  MutexLock lock(&mu_);
  resp.set_code(Code(ErrorCode::OK));
  auto dit = disk_of_client_.find(req.client_id());
  if (dit == disk_of_client_.end()) {
    resp.set_disk_unknown(true);
    return resp;
  }
  const auto now = now_();
  Disk& d = *disks_.at(dit->second);
  // The client writes one fetch at a time: what the previous one handed out is reported
  // by now, or was not written (a full disk) and stays in memory only, no longer kept.
  d.fetched.clear();
  // Removals the client applied.
  while (!d.removals.empty() && d.removals_base < req.removals_done()) {
    d.removals.pop_front();
    ++d.removals_base;
  }
  const uint32_t max_items = std::min<uint32_t>(
      req.max_items() == 0 ? kMaxFetchItems : req.max_items(), kMaxFetchItems);
  size_t n = 0;
  for (const auto& [key, version] : d.removals) {
    if (n++ == kMaxFetchItems) break;
    rpc::DiskRemoval* r = resp.add_removals();
    r->set_key(key);
    r->set_version(version);
  }
  resp.set_removals_end(d.removals_base + static_cast<uint64_t>(resp.removals_size()));
  const auto ttl = std::chrono::milliseconds(config_.default_kv_lease_ttl_ms);
  resp.set_lease_ttl_ms(config_.default_kv_lease_ttl_ms);
  // Promotions: still on this disk at that version, still without a memory replica.
  for (uint32_t n = 0; n < config_.offload.promotion_per_fetch && !d.promotions.empty();) {
    auto [key, version] = std::move(d.promotions.front());
    d.promotions.pop_front();
    d.promoting.erase(key);
    auto e = disk_objects_.find(key);
    if (e == disk_objects_.end() || e->second.disk != dit->second ||
        e->second.version != version || objects_.find(key) != objects_.end()) {
      continue;
    }
    e->second.reads = 0;
    rpc::OffloadItem* p = resp.add_promotions();
    p->set_key(key);
    p->set_version(version);
    p->set_size(e->second.size);
    ++counters_.disk.promotions_started;
    ++n;
  }
  uint64_t bytes = 0;
  while (!d.queue.empty() && static_cast<uint32_t>(resp.items_size()) < max_items) {
    auto [key, version] = std::move(d.queue.front());
    d.queue.pop_front();
    auto q = d.queued.find(key);
    if (q == d.queued.end() || q->second != version) continue;  // stale: a newer one is queued
    d.queued.erase(q);
    auto it = objects_.find(key);
    if (it == objects_.end() || !it->second.complete || it->second.version != version ||
        OnDiskLocked(key, version)) {
      continue;  // removed, replaced, or already there
    }
    Object& obj = it->second;
    const Placement* local = nullptr;
    for (const auto& p : obj.replicas) {
      auto seg = segments_.find(p.segment_id);
      if (seg != segments_.end() && !seg->second->draining &&
          seg->second->client_id == req.client_id()) {
        local = &p;
        break;
      }
    }
    if (local == nullptr) continue;  // its replica here went meanwhile
    const Segment& seg = *segments_.at(local->segment_id);
    // Leased as a read: its space is not reused while the client copies it.
    const Clock::time_point before = obj.lease_until;
    if (obj.lease_client != req.client_id()) {
      obj.foreign_until = std::max(obj.foreign_until, obj.lease_until);
      obj.lease_client = client_names_.Get(req.client_id());
    }
    obj.lease_until = std::max(obj.lease_until, now + ttl);
    d.fetched[key] = {before, obj.lease_until, version,
                      now + std::max<Clock::duration>(ttl, kOffloadWriteHold)};
    rpc::OffloadItem* item = resp.add_items();
    item->set_key(key);
    item->set_version(version);
    item->set_size(obj.size);
    item->mutable_buffer()->set_segment_name(seg.name);
    item->mutable_buffer()->set_addr(seg.base + local->offset);
    item->mutable_buffer()->set_size(obj.size);
    ++counters_.disk.fetched;
    bytes += obj.size;
    if (req.max_bytes() != 0 && bytes >= req.max_bytes()) break;
  }
  return resp;
}

rpc::OffloadDoneResponse MasterService::OffloadDone(const rpc::OffloadDoneRequest& req) {
  rpc::OffloadDoneResponse resp;
  MutexLock lock(&mu_);
  const std::string batch = BatchProblem("OffloadDone", req.items_size());
  if (!batch.empty()) {
    resp.set_code(Code(ErrorCode::INVALID_PARAMS));
    resp.set_message(batch);
    ++counters_.refused_requests;
    return resp;
  }
  auto dit = disk_of_client_.find(req.client_id());
  if (dit == disk_of_client_.end()) {
    resp.set_code(Code(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS));
    resp.set_message("client " + req.client_id() + " has no disk mounted: MountLocalDisk first");
    return resp;
  }
  const uint32_t id = dit->second;
  Disk& d = *disks_.at(id);
  resp.set_code(Code(ErrorCode::OK));
  // Removals not yet applied by this disk: a registration of such a copy is refused.
  std::unordered_map<std::string, uint64_t> removed;
  if (req.registration()) {
    for (const auto& [key, version] : d.removals) {
      uint64_t& v = removed[key];
      v = std::max(v, version);
    }
  }
  for (const auto& item : req.items()) {
    const std::string& key = item.key();
    ErrorCode code = ErrorCode::OK;
    auto it = objects_.find(key);
    const bool in_memory = it != objects_.end();
    if (!KeyProblem(key).empty()) {
      code = ErrorCode::INVALID_KEY;
    } else if (in_memory) {
      // The copy must be of the value the object holds now, read from a replica it still
      // holds (a placement held by an object is never given to another, so its bytes were
      // that value throughout the write).
      bool still_there = req.registration() || !item.has_buffer();
      for (const auto& p : it->second.replicas) {
        if (still_there) break;
        auto seg = segments_.find(p.segment_id);
        still_there = seg != segments_.end() &&
                      seg->second->name == item.buffer().segment_name() &&
                      seg->second->base + p.offset == item.buffer().addr();
      }
      if (!it->second.complete || it->second.version != item.version() ||
          it->second.size != item.size() || !still_there) {
        code = ErrorCode::OBJECT_NOT_FOUND;
      }
    } else if (!req.registration()) {
      code = ErrorCode::OBJECT_NOT_FOUND;  // removed or evicted before it was written
    } else {
      auto r = removed.find(key);
      auto other = disk_objects_.find(key);
      if (r != removed.end() && r->second >= item.version()) {
        code = ErrorCode::OBJECT_NOT_FOUND;  // removed while this client was away
      } else if (other != disk_objects_.end() && other->second.version != item.version()) {
        code = ErrorCode::OBJECT_ALREADY_EXISTS;  // another value of the key on a disk
      } else if (item.size() == 0 || item.version() == 0) {
        code = ErrorCode::INVALID_PARAMS;
      }
    }
    if (code == ErrorCode::OK) {
      auto cur = disk_objects_.find(key);
      if (cur != disk_objects_.end() && cur->second.disk != id) DiskForgetLocked(key);
      cur = disk_objects_.find(key);
      if (cur == disk_objects_.end()) {
        disk_objects_.emplace(key, DiskEntry{id, 0, item.size(), item.version()});
        ++d.keys;
        d.bytes += item.size();
      }
      // A value from before a master restart keeps its version: no new one may equal it.
      next_version_ = std::max(next_version_, item.version() + 1);
      // The writer has read the memory: the lease OffloadFetch gave it ends (what the object
      // had before is restored, unless a read since extended it), so that eviction may take
      // the memory replica now.
      auto f = d.fetched.find(key);
      if (in_memory && f != d.fetched.end() && it->second.lease_until == f->second.granted) {
        it->second.lease_until = f->second.before;
      }
      if (f != d.fetched.end()) d.fetched.erase(f);
      ++counters_.disk.recorded;
      if (req.registration()) ++counters_.disk.registered;
    } else {
      ++counters_.disk.refused;
    }
    resp.add_codes(Code(code));
  }
  return resp;
}

rpc::EvictDiskResponse MasterService::EvictDisk(const rpc::EvictDiskRequest& req) {
  rpc::EvictDiskResponse resp;
  MutexLock lock(&mu_);
  ++counters_.disk.evict_requests;
  const std::string batch = BatchProblem("EvictDisk", req.keys_size());
  if (!batch.empty()) {
    ++counters_.disk.evict_failures;
    resp.set_code(Code(ErrorCode::INVALID_PARAMS));
    resp.set_message(batch);
    ++counters_.refused_requests;
    return resp;
  }
  resp.set_code(Code(ErrorCode::OK));
  auto dit = disk_of_client_.find(req.client_id());
  if (dit == disk_of_client_.end()) return resp;  // nothing of it is served anyway
  Disk& d = *disks_.at(dit->second);
  for (const auto& key : req.keys()) {
    auto it = disk_objects_.find(key);
    if (it == disk_objects_.end() || it->second.disk != dit->second) continue;
    d.keys -= std::min<uint64_t>(d.keys, 1);
    d.bytes -= std::min(d.bytes, it->second.size);
    disk_objects_.erase(it);
    ++counters_.disk.evicted;
  }
  return resp;
}

std::string MasterService::DiskMetricsLocked() const {
  std::ostringstream out;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " counter\n"
        << name << ' ' << v << '\n';
  };
  auto gauge = [&](const char* name, const char* help, uint64_t v) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " gauge\n"
        << name << ' ' << v << '\n';
  };
  const DiskCounters& c = counters_.disk;
  uint64_t attached = 0, queued = 0, removals = 0, bytes = 0;
  for (const auto& [id, d] : disks_) {
    attached += !d->client_id.empty();
    queued += d->queue.size();
    removals += d->removals.size();
    bytes += d->bytes;
  }
  // upstream's names (its dashboard's), then ours.
  counter("file_cache_hit_nums_", "GetReplicaList items served from a disk", c.disk_gets);
  counter("file_cache_hit_bytes_total", "Bytes of the GetReplicaList items served from a disk",
          c.disk_get_bytes);
  gauge("file_cache_nums_", "Objects with a disk replica", disk_objects_.size());
  counter("master_evict_disk_replica_requests_total", "EvictDisk calls (a disk's eviction)",
          c.evict_requests);
  counter("master_evict_disk_replica_failures_total", "EvictDisk calls refused",
          c.evict_failures);
  gauge("master_disk_mounted", "Clients' local disks mounted (the disk tier)", attached);
  gauge("master_disk_bytes", "Bytes of the disk replicas", bytes);
  gauge("master_offload_queued", "Objects waiting to be written to a disk", queued);
  gauge("master_disk_removals_pending", "Disk replicas to delete not yet acknowledged", removals);
  counter("master_disk_mount_requests_total", "MountLocalDisk calls accepted", c.mounts);
  counter("master_disk_mount_failures_total", "MountLocalDisk calls refused", c.mount_failures);
  counter("master_offload_queued_total", "Objects queued for offload", c.queued);
  counter("master_offload_queue_full_total", "Objects not queued: their disk's queue was full",
          c.queue_full);
  counter("master_offload_fetched_total", "Objects handed to their disk's client to write",
          c.fetched);
  counter("master_offload_recorded_total", "Disk replicas recorded", c.recorded);
  counter("master_offload_refused_total", "Disk replicas refused (object gone or replaced)",
          c.refused);
  counter("master_offload_registered_total", "Disk replicas found at a client's start",
          c.registered);
  counter("master_disk_removals_total", "Disk replicas dropped by a removal or a newer value",
          c.removals);
  counter("master_disk_evicted_total", "Disk replicas dropped by their disk's eviction",
          c.evicted);
  counter("master_promotion_queued_total", "Disk replicas read often, queued for memory",
          c.promotions_queued);
  counter("master_promotion_started_total", "Promotions handed to their disk's owner",
          c.promotions_started);
  counter("master_promotion_done_total", "Promotions completed (a memory replica again)",
          c.promotions_done);
  counter("master_offload_held_total",
          "Eviction victims kept in memory until offloaded (--offload_on_evict)",
          c.held_for_offload);
  return out.str();
}

}  // namespace store
}  // namespace mooncake
