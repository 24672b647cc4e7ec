// MasterService: housekeeping (Tick: expired clients, stale puts, the graveyard, eviction
// above the watermark) and what it reports (GetStats, the Prometheus text of /metrics).
#include <glog/logging.h>

#include <sstream>

#include "store/master/master_service.h"
#include "store/master/master_service_internal.h"

namespace mooncake {
namespace store {

rpc::StatsResponse MasterService::GetStats() {
  rpc::StatsResponse resp;
  MutexLock lock(&mu_);
  resp.set_capacity(CapacityLocked());
  resp.set_allocated(AllocatedLocked());
  resp.set_keys(objects_.size());
  resp.set_segments(placeable_.size());
  resp.set_clients(clients_.size());
  resp.set_evicted_objects(counters_.evicted_objects);
  return resp;
}

void MasterService::Tick() {
  std::vector<uint64_t> dropped;  // segments of expired clients: walked after the lock
  HousekeepUnderLock(&dropped);
  FinishUnmount(dropped);
}

void MasterService::HousekeepUnderLock(std::vector<uint64_t>* dropped) {
  MutexLock lock(&mu_);
  const auto now = now_();
  if (standby_) {  // the leader decides; a standby only lets held space go
    while (!held_.empty() && held_.front().free_at <= now) held_.pop_front();
    return;
  }
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (it->second.last_ping + std::chrono::seconds(config_.client_ttl_s) > now) {
      ++it;
      continue;
    }
    LOG(WARNING) << "client " << it->first << " sent no heartbeat for " << config_.client_ttl_s
                 << " s: unmounting its " << it->second.segments.size() << " segment(s)";
    dropped->insert(dropped->end(), it->second.segments.begin(), it->second.segments.end());
    it = clients_.erase(it);
    ++counters_.expired_clients;
  }
  BeginUnmountLocked(*dropped, now);  // one walk of the puts in flight for all of them
  const auto discard = std::chrono::seconds(config_.put_start_discard_timeout_s);
  // Only puts in flight are looked at: a tick costs nothing per stored object.
  for (ObjectEntry* e = in_flight_.front(); e != nullptr;) {
    ObjectEntry* put = e;
    e = in_flight_.next(e);
    if (put->second.stamp + discard > now) continue;
    LOG(WARNING) << "discarding put of " << put->first << ": no PutEnd within "
                 << config_.put_start_discard_timeout_s << " s";
    EraseObjectLocked(objects_.find(put->first), now);
    ++counters_.discarded_puts;
  }
  for (auto it = upserts_.begin(); it != upserts_.end();) {
    if (it->second.stamp + discard > now) {
      ++it;
      continue;
    }
    LOG(WARNING) << "discarding upsert of " << it->first << ": no PutEnd within "
                 << config_.put_start_discard_timeout_s << " s (the old value stays)";
    it = EraseUpsertLocked(it, now);
    ++counters_.discarded_puts;
  }
  ReapGraveyardLocked(now);
  for (auto it = dropped_names_.begin(); it != dropped_names_.end();) {
    it = it->second <= now ? dropped_names_.erase(it) : std::next(it);
  }
  EvictIfFullLocked(now);
}

std::string MasterService::MetricsText() {
  MutexLock lock(&mu_);
  std::ostringstream out;
  auto gauge = [&](const char* name, const char* help, uint64_t v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n"
        << name << " " << v << "\n";
  };
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
        << name << " " << v << "\n";
  };
  gauge("master_total_capacity_bytes", "Bytes of all mounted segments", CapacityLocked());
  gauge("master_allocated_bytes", "Bytes allocated to replicas", AllocatedLocked());
  gauge("master_key_count", "Objects stored (complete or being written)", objects_.size());
  gauge("master_segment_count", "Mounted segments", placeable_.size());
  gauge("master_client_count", "Clients with a live heartbeat", clients_.size());
  gauge("master_deferred_free_bytes",
        "Bytes of objects removed while leased, freed once the lease lapses (a segment unmounted meanwhile counts until then)",
        GraveyardBytesLocked());
  counter("master_put_start_requests_total", "PutStart items", counters_.put_start);
  counter("master_put_start_failures_total", "PutStart items refused", counters_.put_start_fail);
  counter("master_put_end_requests_total", "PutEnd items", counters_.put_end);
  counter("master_put_revoke_requests_total", "PutRevoke items", counters_.put_revoke);
  counter("master_get_replica_list_requests_total", "GetReplicaList items",
          counters_.get_replica_list);
  counter("master_get_replica_list_misses_total", "GetReplicaList items not found",
          counters_.get_miss);
  counter("master_exist_key_requests_total", "ExistKey items", counters_.exist_key);
  counter("master_remove_requests_total", "Remove items", counters_.remove);
  counter("master_eviction_runs_total", "Eviction passes", counters_.eviction_runs);
  counter("master_evicted_objects_total", "Objects evicted", counters_.evicted_objects);
  counter("master_evicted_bytes_total", "Replica bytes evicted", counters_.evicted_bytes);
  counter("master_expired_clients_total", "Clients dropped after client_ttl",
          counters_.expired_clients);
  counter("master_discarded_puts_total", "Puts discarded without PutEnd", counters_.discarded_puts);
  counter("master_mount_segment_total", "Segments mounted", counters_.mounts);
  counter("master_unmount_segment_total", "Segments unmounted", counters_.unmounts);
  counter("master_deferred_frees_total", "Replicas whose space waited for a lease to lapse",
          counters_.deferred_frees);
  counter("master_refused_requests_total", "Requests refused as a whole (over a bound)",
          counters_.refused_requests);
  out << TenantMetricsLocked();
  return out.str();
}

}  // namespace store
}  // namespace mooncake
