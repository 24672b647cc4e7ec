// The master's counters for /metrics (master_metrics.cc writes them out under upstream's
// names where upstream's master has the same thing: its Grafana dashboard reads them).
// Counted under the master's lock.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace mooncake {
namespace store {

// One RPC kind, counted as upstream's master counts its single-key and batch calls: a
// request of one item is a single call (requests, failures: the item failed), a request of
// more is a batch call (batch_requests + 1, batch_items + n; batch_failures + 1 when every
// item failed, else batch_partial + 1 when some did; batch_failed_items + those).
struct CallCounters {
  uint64_t requests = 0, failures = 0;
  uint64_t batch_requests = 0, batch_items = 0, batch_failures = 0, batch_partial = 0,
           batch_failed_items = 0;
  void Count(size_t n, size_t failed) {
    if (n == 0) return;  // an empty request: no call of upstream's kinds
    if (n == 1) {
      ++requests;
      failures += failed;
      return;
    }
    ++batch_requests;
    batch_items += n;
    batch_failed_items += failed;
    if (failed == n) {
      ++batch_failures;
    } else if (failed > 0) {
      ++batch_partial;
    }
  }
};

// A histogram with fixed upper bounds (upstream's for object sizes: 4 KiB .. 64 MiB).
struct SizeHistogram {
  static constexpr std::array<uint64_t, 7> kBounds = {4096,    65536,    262144,  1048576,
                                                      4194304, 16777216, 67108864};
  std::array<uint64_t, kBounds.size() + 1> buckets{};  // the last: above every bound
  uint64_t sum = 0, count = 0;
  void Observe(uint64_t v) {
    size_t i = 0;
    while (i < kBounds.size() && v > kBounds[i]) ++i;
    ++buckets[i];
    sum += v;
    ++count;
  }
};

// Calls of a kind and those that failed (upstream's *_requests_total / *_failures_total).
struct RequestCounters {
  uint64_t requests = 0, failures = 0;
  void Count(bool failed) {
    ++requests;
    failures += failed;
  }
};

// Replica tasks, as upstream's master counts them: its Copy/Move Start, End and Revoke are
// here a task's start (in FetchTasks) and its executor's report (FinishTask, ok or not);
// update_task is every report (upstream's MarkTaskToComplete).
struct TaskCounters {
  RequestCounters create_copy, create_move, query, fetch, update;
  RequestCounters copy_start, copy_end, copy_revoke, move_start, move_end, move_revoke;
};

// The disk tier (master_disk.cc).
struct DiskCounters {
  uint64_t mounts = 0, mount_failures = 0;
  uint64_t queued = 0, queue_full = 0;   // objects queued for offload; not queued: full
  uint64_t fetched = 0;                  // handed to their disk's client to write
  uint64_t recorded = 0, refused = 0;    // OffloadDone items recorded / refused
  uint64_t registered = 0;               // of which found on a disk at its client's start
  uint64_t disk_gets = 0, disk_get_bytes = 0;  // GetReplicaList items answered from disk
  uint64_t removals = 0, evicted = 0;    // disk replicas dropped: told to the disk / by it
  uint64_t held_for_offload = 0;         // --offload_on_evict: victims kept until offloaded
  uint64_t evict_requests = 0, evict_failures = 0;  // EvictDisk calls (refused: failures)
  uint64_t promotions_queued = 0, promotions_started = 0, promotions_done = 0;
};

struct MasterCounters {
  CallCounters put_start, put_end, put_revoke, get_replica_list, exist_key, replica_clear;
  uint64_t put_start_alloc_failures = 0;  // items without space (after eviction)
  uint64_t remove = 0, remove_failures = 0;  // per key, as upstream counts BatchRemove
  uint64_t remove_by_regex = 0, remove_by_regex_failures = 0, remove_all = 0, ping = 0;
  uint64_t mounts = 0, mount_failures = 0, remounts = 0, remount_failures = 0;
  uint64_t unmounts = 0, unmount_failures = 0;  // UnmountSegment calls
  uint64_t total_gets = 0, valid_gets = 0, hit_bytes = 0;  // GetReplicaList items
  uint64_t eviction_runs = 0, eviction_successes = 0, evicted_objects = 0, evicted_bytes = 0;
  uint64_t expired_clients = 0, discarded_puts = 0;
  uint64_t deferred_frees = 0, refused_requests = 0;
  SizeHistogram value_sizes;  // per object placed (PutStart, upsert)
  TaskCounters tasks;
  DiskCounters disk;
};

}  // namespace store
}  // namespace mooncake
