// MasterService::MetricsText: the master's Prometheus exposition (text format 0.0.4).
//
// Under upstream's names, types and meanings wherever upstream's master has the same thing
// (its Grafana dashboard, monitoring/grafana/dashboards/mooncake.json upstream, queries them;
// tests/python/test_monitoring.py checks the names it uses against a live master):
// - a call of one item counts as upstream's single call (master_put_start_requests_total ...),
//   a call of more as its batch call (master_batch_put_start_requests_total + 1,
//   master_batch_put_start_items_total + n, and the batch failure counters);
// - failures are items answered with an error, misses included (as upstream: a get of an
//   absent key is a master_get_replica_list_failures_total); ExistKey counts only real errors;
// - master_remove_requests_total counts keys (upstream's BatchRemove adds one per key);
// - names upstream spells without _total (master_evicted_key_count, master_put_start_
//   discard_cnt, mem_cache_hit_nums_, ...) are spelled so here: promtool's lint warns about
//   them and the dashboard needs them as they are.
// Upstream metrics of features this master does not have (NoF SSD, file storage, copy and
// move tasks, promotion, snapshots, GetReplicaListByRegex, BatchQueryIp) are not exported.
// Ours, beyond upstream's: master_mounted_segments, master_deferred_free_bytes,
// master_deferred_frees_total, master_expired_clients_total, master_refused_requests_total,
// the HA metrics master_http.cc adds, the tenants' (master_tenants.cc).
#include <sstream>

#include "store/master/master_service.h"
#include "store/master/master_service_internal.h"

namespace mooncake {
namespace store {

std::string MasterService::MetricsText() {
  MutexLock lock(&mu_);
  std::ostringstream out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  };
  auto gauge = [&](const char* name, const char* help, uint64_t v) {
    family(name, "gauge", help);
    out << name << " " << v << "\n";
  };
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    family(name, "counter", help);
    out << name << " " << v << "\n";
  };
  // One RPC kind: upstream's single-call counters and, when `batch` names them, its batch ones.
  auto calls = [&](const std::string& single, const std::string& batch, const char* what,
                   const CallCounters& c, bool failures = true) {
    const std::string req = single + "_requests_total", fail = single + "_failures_total";
    counter(req.c_str(), (std::string(what) + " calls of one item").c_str(), c.requests);
    if (failures) {
      counter(fail.c_str(), (std::string(what) + " calls of one item that failed").c_str(),
              c.failures);
    }
    if (batch.empty()) return;
    const std::string b = "master_batch_" + batch;
    counter((b + "_requests_total").c_str(),
            (std::string(what) + " calls of several items").c_str(), c.batch_requests);
    counter((b + "_items_total").c_str(),
            (std::string("Items of ") + what + " calls of several items").c_str(), c.batch_items);
    counter((b + "_failures_total").c_str(),
            (std::string(what) + " calls of several items that failed in every item").c_str(),
            c.batch_failures);
    counter((b + "_partial_successes_total").c_str(),
            (std::string(what) + " calls of several items that failed in some").c_str(),
            c.batch_partial);
    counter((b + "_failed_items_total").c_str(),
            (std::string("Failed items of ") + what + " calls of several items").c_str(),
            c.batch_failed_items);
  };

  gauge("master_total_capacity_bytes", "Bytes of all mounted segments", CapacityLocked());
  gauge("master_allocated_bytes", "Bytes allocated to replicas (deferred frees included)",
        AllocatedLocked());
  gauge("master_key_count", "Objects (complete or being written)", objects_.size());
  gauge("master_soft_pin_key_count", "Complete objects written with a soft pin",
        pinned_lru_.size());
  gauge("master_active_clients", "Clients with a live heartbeat", clients_.size());
  gauge("mem_cache_nums_", "Complete objects (each has memory replicas)",
        objects_.size() - std::min(objects_.size(), in_flight_.size()));
  gauge("master_put_start_discarded_staging_size",
        "Bytes of discarded puts not yet freed (always 0: a discarded put's space is freed at "
        "once)",
        0);
  gauge("master_mounted_segments", "Mounted segments", placeable_.size());
  gauge("master_deferred_free_bytes",
        "Bytes of objects removed while leased, freed once the lease lapses (a segment "
        "unmounted meanwhile counts until then)",
        GraveyardBytesLocked());

  family("master_value_size_bytes", "histogram", "Sizes of the objects placed");
  const SizeHistogram& h = counters_.value_sizes;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < SizeHistogram::kBounds.size(); ++i) {
    cumulative += h.buckets[i];
    out << "master_value_size_bytes_bucket{le=\"" << SizeHistogram::kBounds[i] << "\"} "
        << cumulative << "\n";
  }
  out << "master_value_size_bytes_bucket{le=\"+Inf\"} " << h.count << "\n"
      << "master_value_size_bytes_sum " << h.sum << "\n"
      << "master_value_size_bytes_count " << h.count << "\n";

  calls("master_put_start", "put_start", "PutStart", counters_.put_start);
  counter("master_put_start_alloc_failures_total",
          "PutStart items without space for their replicas (after eviction)",
          counters_.put_start_alloc_failures);
  calls("master_put_end", "put_end", "PutEnd", counters_.put_end);
  calls("master_put_revoke", "put_revoke", "PutRevoke", counters_.put_revoke);
  calls("master_get_replica_list", "get_replica_list", "GetReplicaList",
        counters_.get_replica_list);
  calls("master_exist_key", "exist_key", "ExistKey", counters_.exist_key);
  {
    const CallCounters& c = counters_.replica_clear;
    counter("master_batch_replica_clear_requests_total", "ReplicaClear calls", c.batch_requests);
    counter("master_batch_replica_clear_items_total", "Keys of ReplicaClear calls",
            c.batch_items);
  }
  counter("master_remove_requests_total", "Keys asked to be removed", counters_.remove);
  counter("master_remove_failures_total", "Keys not removed (absent, leased, being written)",
          counters_.remove_failures);
  counter("master_remove_by_regex_requests_total", "RemoveByRegex calls",
          counters_.remove_by_regex);
  counter("master_remove_by_regex_failures_total", "RemoveByRegex calls refused",
          counters_.remove_by_regex_failures);
  counter("master_remove_all_requests_total", "RemoveAll calls", counters_.remove_all);
  counter("master_remove_all_failures_total", "RemoveAll calls that failed (none can)", 0);
  counter("master_ping_requests_total", "Heartbeats", counters_.ping);
  counter("master_ping_failures_total", "Heartbeats that failed (none can)", 0);
  counter("master_mount_segment_requests_total", "MountSegment calls (not remounts)",
          counters_.mounts);
  counter("master_mount_segment_failures_total", "MountSegment calls refused",
          counters_.mount_failures);
  counter("master_remount_segment_requests_total",
          "MountSegment calls of a segment mounted before (after a master restart or failover)",
          counters_.remounts);
  counter("master_remount_segment_failures_total", "Remounts refused",
          counters_.remount_failures);
  counter("master_unmount_segment_requests_total", "UnmountSegment calls", counters_.unmounts);
  counter("master_unmount_segment_failures_total", "UnmountSegment calls refused",
          counters_.unmount_failures);

  // Replica tasks (master_counters.h says how upstream's calls map onto ours).
  const struct {
    const char* name;
    const char* what;
    const RequestCounters& c;
  } task_calls[] = {
      {"create_copy_task", "create_copy_task calls", counters_.tasks.create_copy},
      {"create_move_task", "create_move_task calls", counters_.tasks.create_move},
      {"query_task", "QueryTask calls", counters_.tasks.query},
      {"fetch_tasks", "FetchTasks calls", counters_.tasks.fetch},
      {"update_task", "Executors' reports of tasks (upstream's MarkTaskToComplete)",
       counters_.tasks.update},
      {"copy_start", "Copy tasks started (their targets allocated)", counters_.tasks.copy_start},
      {"copy_end", "Copy tasks reported done (failed: the replicas could not join the object)",
       counters_.tasks.copy_end},
      {"copy_revoke", "Copy tasks reported failed by their executor", counters_.tasks.copy_revoke},
      {"move_start", "Move tasks started (their target allocated)", counters_.tasks.move_start},
      {"move_end", "Move tasks reported done (failed: the replica could not join the object)",
       counters_.tasks.move_end},
      {"move_revoke", "Move tasks reported failed by their executor", counters_.tasks.move_revoke},
  };
  for (const auto& t : task_calls) {
    counter(("master_" + std::string(t.name) + "_requests_total").c_str(), t.what, t.c.requests);
    counter(("master_" + std::string(t.name) + "_failures_total").c_str(),
            (std::string(t.what) + " that failed").c_str(), t.c.failures);
  }

  counter("total_get_nums_", "GetReplicaList items", counters_.total_gets);
  counter("valid_get_nums_", "GetReplicaList items answered with replicas", counters_.valid_gets);
  counter("mem_cache_hit_nums_", "GetReplicaList items served from memory",
          counters_.valid_gets - std::min(counters_.valid_gets, counters_.disk.disk_gets));
  counter("mem_cache_hit_bytes_total", "Bytes of the objects of GetReplicaList items served from memory",
          counters_.hit_bytes);

  // One eviction pass is an attempt; every pass here is of memory (the _mem twins).
  for (const char* tier : {"", "_mem"}) {
    const std::string t = tier;
    counter(("master_attempted_evictions" + std::string(*tier ? "_mem" : "_total")).c_str(),
            "Eviction passes", counters_.eviction_runs);
    counter(("master_successful_evictions" + std::string(*tier ? "_mem" : "_total")).c_str(),
            "Eviction passes that evicted something", counters_.eviction_successes);
    counter(("master_evicted_key_count" + t).c_str(), "Objects evicted", counters_.evicted_objects);
    counter(("master_evicted_size_bytes" + t).c_str(), "Replica bytes evicted",
            counters_.evicted_bytes);
  }
  counter("master_put_start_discard_cnt", "Puts discarded without PutEnd",
          counters_.discarded_puts);
  counter("master_put_start_release_cnt",
          "Discarded puts whose space was freed (at once here: equal to the discards)",
          counters_.discarded_puts);

  counter("master_expired_clients_total", "Clients dropped after client_ttl",
          counters_.expired_clients);
  counter("master_deferred_frees_total", "Replicas whose space waited for a lease to lapse",
          counters_.deferred_frees);
  counter("master_refused_requests_total", "Requests refused as a whole (over a bound)",
          counters_.refused_requests);
  out << TenantMetricsLocked();
  out << DiskMetricsLocked();
  return out.str();
}

}  // namespace store
}  // namespace mooncake
