// MasterService: housekeeping (Tick: expired clients, stale puts, the graveyard, eviction
// above the watermark) and GetStats. The Prometheus text of /metrics: master_metrics.cc.
#include <glog/logging.h>

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
    tasks_.FailPendingOf(it->first, "CLIENT_NOT_FOUND: its executor " + it->first +
                                        " sent no heartbeat for " +
                                        std::to_string(config_.client_ttl_s) + " s", now);
    DetachDiskOfLocked(it->first);  // its disk replicas are no longer served
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
  ExpireTasksLocked(now);
  ReapGraveyardLocked(now);
  for (auto it = dropped_names_.begin(); it != dropped_names_.end();) {
    it = it->second <= now ? dropped_names_.erase(it) : std::next(it);
  }
  EvictIfFullLocked(now);
}

}  // namespace store
}  // namespace mooncake
