// MasterService: the Store master's state and rules, without the RPC layer (master_rpc.cc
// serves it over the Store's RPC wire, rpc_wire.h; tests drive it directly with a fake clock).
//
// It holds placement and metadata only:
// - segments: memory ranges clients contribute (MountSegment), each with an OffsetAllocator;
// - objects: key -> size and replicas, each replica one contiguous range on a different
//   segment where there are enough segments;
// - clients: the last heartbeat (Ping) of each client that mounted a segment.
//
// Rules:
// - Put is PutStart (replicas allocated, PROCESSING, invisible to readers) -> the client
//   writes -> PutEnd (COMPLETE, visible) or PutRevoke (freed). A PutStart older than
//   put_start_discard_timeout without PutEnd is discarded by Tick().
// - Upsert (PutStartRequest.upsert) of an existing key writes the new value into new space
//   while readers keep seeing the old one; its PutEnd makes the new value the object and frees
//   the old space as a removal does (after the old value's leases). One put or upsert of a key
//   at a time: another gets OBJECT_REPLICA_BUSY.
// - GetReplicaList grants a lease of default_kv_lease_ttl: until it expires the object cannot
//   be removed (OBJECT_HAS_LEASE) or evicted, and its space is not reused: a forced removal
//   (or any other) of a leased object hides it at once but frees its space only once the
//   lease has lapsed (the graveyard, emptied by Tick and PutStart).
// - A segment mounted again (MountSegmentRequest.remount, or a segment name unmounted less
//   than one lease TTL ago) takes no new objects for one lease TTL, so that no reader holding
//   an address in it from before (a lease of a previous master, or of the dropped segment)
//   can see new bytes there.
// - Requests are bounded (store/limits.h): keys, names, batch sizes, replica counts, regex
//   patterns; RemoveByRegex / RemoveAll hold the lock for about kRemoveChunk keys at a time.
// - Eviction, approximately LRU by last access, when an allocation fails or the allocated share
//   passes eviction_high_watermark_ratio: frees complete, unleased, unpinned objects until
//   usage is eviction_ratio below the watermark (and the allocation fits); soft-pinned objects
//   go only when nothing else is left, hard-pinned and in-flight ones never.
// - A client silent for client_ttl (Tick) loses its segments; replicas on them are dropped and
//   objects left without replicas are removed. An unmount (or expiry) never frees a put's or
//   upsert's space on the *other* segments while its writer may still write it: the put in
//   flight keeps its other replicas (its PutEnd makes the object complete on those); only
//   the writer's PutEnd / PutRevoke or its discard (put_start_discard_timeout) free them, and
//   a segment mounted again under the dropped one's name takes no new objects until those
//   writers' puts would have been discarded (else one lease TTL).
// - Work under the lock is bounded per call: an unmount walks the object table in chunks
//   (kRemoveChunk keys a hold, the segment "draining" meanwhile: no placement there, its
//   replicas not handed out), as RemoveAll does; remove_by_regex matches outside the lock;
//   placement looks at the segments from a rotating cursor until it has its replicas.
// - Per-client caps: kMaxSegmentsPerClient mounted segments (kMaxSegments in all), puts in
//   flight up to max_client_inflight_ratio of the capacity.
//
// Thread safety: every method may be called from any thread (one mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/thread_annotations.h"
#include "master.pb.h"
#include "mooncake/status.h"
#include "oplog.pb.h"
#include "mooncake/store/error_code.h"
#include "store/master/master_counters.h"
#include "store/master/master_records.h"
#include "store/common/offset_allocator.h"
#include "store/master/object_table.h"
#include "store/master/replica_tasks.h"
#include "store/tenants/tenant_ledger.h"

namespace mooncake {
namespace store {

struct MasterConfig {
  uint64_t default_kv_lease_ttl_ms = 10000;
  uint64_t default_kv_soft_pin_ttl_ms = 30 * 60 * 1000;
  uint64_t client_ttl_s = 10;
  double eviction_ratio = 0.05;
  double eviction_high_watermark_ratio = 0.9;
  uint64_t put_start_discard_timeout_s = 30;
  // One client's puts and upserts in flight (started, not ended) may hold at most this share
  // of the mounted capacity (replica bytes); PutStart items past it get NO_AVAILABLE_HANDLE.
  // A client with nothing in flight may always start one object. Clients name themselves, so
  // this bounds a buggy or greedy client, not one that takes many ids.
  double max_client_inflight_ratio = 0.5;
  // An HA standby (src/store/ha): the state is only what Apply() is given, serving calls are
  // not made on it (the HA layer answers them), Tick() changes nothing, and Promote() makes
  // it a serving master.
  bool standby = false;
  // Strict multi-tenant mode (--enable_multi_tenants; src/store/tenants/tenant_id.h): keys
  // are scoped per tenant, only tenants with a quota policy write, and within their quota.
  bool enable_multi_tenants = false;
  // Replica tasks (replica_tasks.h): upstream's --max_total_{pending,processing,finished}_tasks
  // and --{pending,processing}_task_timeout_sec. A running task's space is discarded (and the
  // task failed) after put_start_discard_timeout_s too, as a put's: its writer may write it
  // no longer than a put's writer.
  ReplicaTasks::Limits task_limits;
  // The disk tier (master_disk.cc; upstream's flags of the same names).
  struct Offload {
    bool enable = false;        // --enable_offload: clients may mount their local disks
    bool on_evict = false;      // --offload_on_evict: offload what eviction picks, not every put
    bool force_evict = false;   // --offload_force_evict: evict what cannot be offloaded now
    uint64_t queue_limit = 50000;  // --offloading_queue_limit: objects waiting per disk
    double cap_ratio = 0.5;     // --offload_cap_ratio: of queue_limit, queued per eviction pass
    bool promotion_on_hit = false;          // --promotion_on_hit
    uint32_t promotion_threshold = 2;       // --promotion_admission_threshold: disk reads
    uint64_t promotion_queue_limit = 50000;  // --promotion_queue_limit: per disk
    uint32_t promotion_per_fetch = 1;       // --promotion_max_per_heartbeat
  } offload;
};

// Where a serving master's changes go: an HA leader's operation log (src/store/ha). Called
// with the master's lock held, in the order of the changes, so it must be quick (queue the
// entry); returns the entry's sequence number (> 0, growing).
class ChangeSink {
 public:
  virtual ~ChangeSink() = default;
  virtual uint64_t Append(oplog::Entry&& entry) = 0;
};

// Where a serving master reports objects that become readable (stored) and that stop being
// readable (removed: remove, eviction, expiry, a replica clear, an upsert replacing them): the
// KV event publisher (src/store/kv_events). Called with the master's lock held, in the order
// of the changes, so it must only queue.
class ObjectEventSink {
 public:
  virtual ~ObjectEventSink() = default;
  virtual void ObjectStored(const std::string& key) = 0;
  virtual void ObjectRemoved(const std::string& key) = 0;
};

class MasterService {
 public:
  using Clock = std::chrono::steady_clock;
  using NowFn = std::function<Clock::time_point()>;

  explicit MasterService(MasterConfig config, NowFn now = &Clock::now);
  ~MasterService();

  rpc::MountSegmentResponse MountSegment(const rpc::MountSegmentRequest& req);
  rpc::UnmountSegmentResponse UnmountSegment(const rpc::UnmountSegmentRequest& req);
  rpc::PingResponse Ping(const rpc::PingRequest& req);
  rpc::PutStartResponse PutStart(const rpc::PutStartRequest& req);
  // The same into *out, which may live on an arena (the RPC layer's: no malloc per result).
  void PutStartInto(const rpc::PutStartRequest& req, rpc::PutStartResponse* out);
  rpc::CodesResponse PutEnd(const rpc::KeysRequest& req);
  rpc::CodesResponse PutRevoke(const rpc::KeysRequest& req);
  rpc::GetReplicaListResponse GetReplicaList(const rpc::KeysRequest& req);
  void GetReplicaListInto(const rpc::KeysRequest& req, rpc::GetReplicaListResponse* out);
  rpc::ExistResponse ExistKey(const rpc::KeysRequest& req);
  rpc::CodesResponse Remove(const rpc::KeysRequest& req);
  rpc::CountResponse RemoveByRegex(const rpc::RemoveByRegexRequest& req);
  rpc::CountResponse RemoveAll(const rpc::KeysRequest& req);
  rpc::ReplicaClearResponse ReplicaClear(const rpc::ReplicaClearRequest& req);
  rpc::StatsResponse GetStats();

  // --- Replica tasks (master_tasks.cc; replica_tasks.h) ---
  // create_copy_task / create_move_task (upstream's checks and codes: -600 for empty or
  // unmounted targets, a move's source == target or not holding a replica; -704 for a missing
  // key; -1010 for a target taking no objects now; -1401 with max_pending tasks waiting).
  // The task goes to the client owning the source replica's segment.
  rpc::ReplicaTaskResponse CreateReplicaTask(const rpc::ReplicaTaskRequest& req);
  // TASK_NOT_FOUND for an unknown (or pruned, or another tenant's) task.
  rpc::QueryTaskResponse QueryTask(const rpc::QueryTaskRequest& req);
  // Starts the caller's pending tasks: allocates each target's space (not readable), and
  // says where to copy from and to. A task whose key has another task running waits; one
  // finding no space on a target waits too, at most 10 tries (upstream's retries).
  rpc::FetchTasksResponse FetchTasks(const rpc::FetchTasksRequest& req);
  // The executor's report: ok makes the new replicas part of the object (a move drops its
  // source, freed after its readers' leases) if the object and the source replica are still
  // those it copied from; else the space is freed and the task fails, saying why.
  rpc::FinishTaskResponse FinishTask(const rpc::FinishTaskRequest& req);

  // --- The disk tier (master_disk.cc; src/store/disk/README.md) ---
  // UNABLE_OFFLOAD without --enable_offload. A store id mounted by another client (a
  // restart, within its TTL or not) passes to the caller with its disk replicas.
  rpc::MountLocalDiskResponse MountLocalDisk(const rpc::MountLocalDiskRequest& req);
  // Objects for the caller to write to its disk (each leased, its memory replica in the
  // caller's own segments) and removals for it to apply; disk_unknown: mount again.
  rpc::OffloadFetchResponse OffloadFetch(const rpc::OffloadFetchRequest& req);
  // Records the disk replicas written (or found at start), each only while the object is
  // of that version (a registration: also while the key is absent and not removed since).
  rpc::OffloadDoneResponse OffloadDone(const rpc::OffloadDoneRequest& req);
  rpc::EvictDiskResponse EvictDisk(const rpc::EvictDiskRequest& req);
 private:
  rpc::ReplicaTaskResponse CreateReplicaTaskUncounted(const rpc::ReplicaTaskRequest& req);

 public:

  // Housekeeping, called about once a second: expires silent clients, discards stale puts,
  // evicts above the high watermark.
  void Tick();

  // The Prometheus text exposition of the counters and gauges.
  std::string MetricsText();

  // Read-only views for the master's HTTP endpoints (master_query.cc, master_http.h): none
  // grants a lease, counts as an access, or changes any state.
  struct ReplicaView {
    std::string segment_name;
    uint64_t addr = 0;
    uint64_t size = 0;
  };
  // OK with the complete object's replicas; INVALID_KEY; OBJECT_NOT_FOUND (absent, or still
  // being written).
  // In strict mode, `tenant`'s key (another mode: every key is the default tenant's).
  ErrorCode QueryKey(const std::string& key, std::vector<ReplicaView>* replicas,
                     const std::string& tenant = "default") const;
  // Keys of complete objects, in no particular order, until `max_keys` keys or `max_bytes`
  // bytes of keys; *total: how many complete objects there are. In strict mode only
  // `tenant`'s, as it sent them.
  std::vector<std::string> ListKeys(size_t max_keys, size_t max_bytes, size_t* total,
                                    const std::string& tenant = "default") const;
  struct SegmentView {
    std::string name;
    std::string client_id;
    uint64_t base = 0;
    uint64_t size = 0;
    uint64_t allocated = 0;
  };
  // Mounted segments in mount order, at most `max_segments`; *total: how many are mounted.
  std::vector<SegmentView> ListSegments(size_t max_segments, size_t* total) const;
  struct Summary {
    uint64_t capacity = 0, allocated = 0, keys = 0, soft_pinned_keys = 0;
    uint64_t segments = 0, clients = 0;
  };
  Summary GetSummary() const;

  // --- Tenants (master_tenants.cc; src/store/tenants/) ---
  // The RPC layer (master_rpc.cc) hands each request to ScopeRequest before the call: in
  // strict mode its keys become the sending tenant's scoped keys (tenant_id.h; an empty
  // tenant_id is the default tenant) and "" is returned, or why the tenant_id is refused.
  // Without strict mode the request is left as it is. UnscopeReply gives the keys a reply
  // names back as the tenant sent them.
  // A refused request counts in master_refused_requests_total.
  std::string ScopeRequest(rpc::PutStartRequest* req);
  std::string ScopeRequest(rpc::KeysRequest* req);
  std::string ScopeRequest(rpc::RemoveByRegexRequest* req);
  std::string ScopeRequest(rpc::ReplicaClearRequest* req);
  std::string ScopeRequest(rpc::ReplicaTaskRequest* req);
  std::string ScopeRequest(rpc::QueryTaskRequest* req);
  void UnscopeReply(rpc::ReplicaClearResponse* resp) const;
  bool multi_tenants() const { return config_.enable_multi_tenants; }
  // The admin API's (GET|PUT|DELETE /api/v1/tenant_quotas) and a new leader's: every policy
  // replaced (the charges stay), the policies in force, one set (INVALID_PARAMS outside
  // [1, 2^63 - 1]), one removed (OBJECT_NOT_FOUND: none; TENANT_NOT_EMPTY: its tenant holds
  // memory), the tenants' states. UNAVAILABLE_IN_CURRENT_MODE without strict mode.
  void SetTenantPolicies(const TenantPolicies& policies);
  TenantPolicies GetTenantPolicies() const;
  ErrorCode UpsertTenantPolicy(const std::string& tenant, uint64_t bytes, TenantSnapshot* now);
  ErrorCode DeleteTenantPolicy(const std::string& tenant, TenantSnapshot* last);
  std::vector<TenantSnapshot> TenantSnapshots() const;
  ErrorCode TenantSnapshotOf(const std::string& tenant, TenantSnapshot* out) const;

  // --- HA (master_replica.cc; the design in src/store/ha/README.md) ---
  // Every change from now on goes to `sink` as an entry (null: none). Set before serving.
  void SetChangeSink(ChangeSink* sink);
  // Object events from now on go to `events` (null: none); a standby reports none (Apply
  // makes no events), so the HA layer sets it on the master it promotes.
  void SetEventSink(ObjectEventSink* events);
  // Called (under the master's lock: it must not call the master) with a client's id when
  // its disk gets work where it had none (objects to write, removals, promotions), so that
  // an OffloadFetch waiting for it (RpcServer::WakeWaiting) is answered at once. Null: none.
  void SetDiskWorkWaker(std::function<void(const std::string& client_id)> waker);
  // Whether an OffloadFetch of `client_id` with nothing to send may wait for work: a waker is
  // set, and the client has not ended its waits (EndDiskWait: one fetch after it answers now).
  bool MayWaitForDiskWork(const std::string& client_id);
  // OffloadFetchRequest.end_wait: the client's waiting fetch is woken and answered now.
  void EndDiskWait(const std::string& client_id);
  // Calls fn(key) for every complete object, under the lock (fn must not call the master).
  void ForEachCompleteKey(const std::function<void(const std::string&)>& fn) const;
  // The sequence number of the last entry this thread's calls appended since the last take
  // (0: none), and resets it: what an RPC's reply waits on to be durable.
  static uint64_t TakeLogPosition();
  // A standby applies the log, entry by entry, in order (and a checkpoint's entries into a
  // fresh standby). An entry that does not fit the state (an unknown segment, a kind it does
  // not know) is FailedPrecondition, naming it: the log and this state have diverged.
  Status Apply(const oplog::Entry& entry);
  // The state as entries that Apply() on a fresh standby turns back into it (a checkpoint):
  // segments, then objects, then upserts in flight; under the lock throughout.
  void ExportState(const std::function<void(oplog::Entry&&)>& emit) const;
  // This standby's state came from a checkpoint just now (not from the whole log): space
  // free in it may have been freed by the old leader less than a lease TTL ago.
  void MarkLoadedFromCheckpoint();
  // Standby to serving: rebuilds every segment's allocator from the placements, keeps the
  // space freed less than a lease TTL ago (held) out of use until then, treats every object
  // as leased by the previous leader's readers for one lease TTL (its space is not reused
  // before, though it may be removed), and gives every client a fresh heartbeat.
  // FailedPrecondition (and the master stays a standby) when placements overlap.
  Status Promote();
  bool standby() const;

  const MasterConfig& config() const { return config_; }
  // Objects one eviction pass takes beyond what the allocation at hand needs: above the high
  // watermark the master evicts toward the low one in passes of this many objects, one per
  // PutStart or Tick, so that no call holds the lock for millions of objects.
  static constexpr size_t kEvictChunk = 4096;

 private:
  struct Segment;
  struct Object;
  struct Client;
  // Space of an object removed while leased: freed once free_at has passed.
  struct Grave {
    uint64_t segment_id;
    OffsetAllocation space;
    uint64_t size;
    Clock::time_point free_at;
  };

  // Before a batch handler's loop: the hash of each of its n keys (key_at(i)) into
  // hashes_, for objects_.find(key, hashes_[i]); for batches of several keys also the
  // table's cache misses issued together (slots, then records, then key bytes and list
  // neighbours: object_table.h), so that the loop finds them in cache.
  template <class KeyAt>
  void PrefetchLocked(size_t n, KeyAt&& key_at) MC_REQUIRES(mu_);
  rpc::MountSegmentResponse MountSegmentUncounted(const rpc::MountSegmentRequest& req);
  rpc::CountResponse RemoveByRegexUncounted(const rpc::RemoveByRegexRequest& req);
  rpc::UnmountSegmentResponse UnmountSegmentUncounted(const rpc::UnmountSegmentRequest& req);
  bool PlaceLocked(const std::string& key, uint64_t size, const rpc::ReplicateConfig& config,
                   Object* obj, Clock::time_point now) MC_REQUIRES(mu_);
  // Open addressing in shards, records that never move (object_table.h).
  using ObjectMap = ObjectTable<Object>;
  using ObjectEntry = ObjectMap::Entry;  // std::pair<const std::string, Object>
  // Frees the object's replicas and forgets it; returns the next iterator.
  ObjectMap::iterator EraseObjectLocked(ObjectMap::iterator it, Clock::time_point now) MC_REQUIRES(mu_);
  // Puts an entry of objects_ at the back of the list its state calls for (in flight, least
  // recently used, soft-pinned least recently used), or in none (hard-pinned); after a
  // change of state or an access.
  void ListLocked(ObjectEntry* e) MC_REQUIRES(mu_);
  void UnlistLocked(ObjectEntry* e) MC_REQUIRES(mu_);
  // PutStart of one item with req.upsert(): OK (result filled), or why not.
  void UpsertStartLocked(const rpc::PutStartRequest& req, const rpc::PutStartItem& item,
                         const ClientName& owner, Clock::time_point now,
                         rpc::PutStartResult* result) MC_REQUIRES(mu_);
  // PutEnd / PutRevoke of an upsert in flight: true when `key` was one of `client`'s.
  bool UpsertEndLocked(const std::string& key, const std::string& client, bool commit,
                       Clock::time_point now) MC_REQUIRES(mu_);
  // Builds the record of a new object (not placed yet) of `owner` (req's client).
  Object NewObjectLocked(const rpc::PutStartRequest& req, uint64_t size, const ClientName& owner,
                         Clock::time_point now) MC_REQUIRES(mu_);
  // Places `obj` (evicting if needed); false after filling `result` with the failure.
  bool PlaceOrFailLocked(const std::string& key, uint64_t size, const rpc::ReplicateConfig& config,
                         Object* obj, rpc::PutStartResult* result, Clock::time_point now) MC_REQUIRES(mu_);
  // The object `client` is putting under `key` (OK), or why PutEnd / PutRevoke cannot apply.
  ErrorCode FindInFlightLocked(const std::string& key, uint64_t hash, const std::string& client,
                               ObjectMap::iterator* it) MC_REQUIRES(mu_);
  // Frees the replicas' space, or (while the object is leased) moves it to the graveyard.
  void FreeObjectLocked(const Object& obj, Clock::time_point now) MC_REQUIRES(mu_);
  void ReapGraveyardLocked(Clock::time_point now) MC_REQUIRES(mu_);
  uint64_t GraveyardBytesLocked() const MC_REQUIRES(mu_);
  // Removes the complete objects whose key matches (and that are not leased, unless `force`).
  // `done_client` (or ""): a client with no read in flight, whose own leases need not delay
  // the freeing.
  // tenant non-null (strict mode): only that tenant's objects, `match` given its keys.
  rpc::CountResponse RemoveWhere(bool force, const std::string& done_client, const std::string* tenant,
                                 const std::function<bool(const std::string&)>& match);
  // Ends the object's lease now when `client` holds it alone (latest grant theirs, every
  // other client's lapsed), so that its space is freed at once.
  void EndOwnLeaseLocked(Object* obj, const std::string& client, Clock::time_point now) MC_REQUIRES(mu_);
  // Evicts toward `needed` more bytes keeping usage at (watermark - ratio): at least `needed`
  // bytes where anything is evictable, but beyond that at most kEvictChunk objects, the rest
  // left to the next calls (evicting_); returns bytes freed.
  uint64_t EvictLocked(uint64_t needed, Clock::time_point now) MC_REQUIRES(mu_);
  // Above the high watermark, or still evicting toward the low one: evicts the next chunk.
  void EvictIfFullLocked(Clock::time_point now) MC_REQUIRES(mu_);
  // Unmount, in two steps so that the lock is not held for the whole table walk:
  // BeginUnmountLocked marks the segments draining (no placement, no replica handed out),
  // forgets them in their clients, sets their names' reuse times, and drops their replicas
  // from the puts and upserts in flight now, in one walk (they keep the others); FinishUnmount (without the lock) walks
  // the complete objects in chunks, dropping replicas on draining segments (an object left
  // with none is removed), then erases the segments.
  void BeginUnmountLocked(const std::vector<uint64_t>& segment_ids, Clock::time_point now) MC_REQUIRES(mu_);
  // Tick's work, which takes the lock; the segments of expired clients into *dropped.
  void HousekeepUnderLock(std::vector<uint64_t>* dropped) MC_EXCLUDES(mu_);
  void FinishUnmount(const std::vector<uint64_t>& segment_ids);
  // Drops e's replicas on draining segments; true when none is left.
  bool DropDrainingLocked(const std::string& key, Object* obj) MC_REQUIRES(mu_);
  bool OnDrainingLocked(const Object& obj) const MC_REQUIRES(mu_);
  // The client's bytes in flight (InFlightBytes of its puts and upserts).
  void ReserveLocked(const ClientName& owner, uint64_t bytes) MC_REQUIRES(mu_);
  void ReleaseLocked(const ClientName& owner, uint64_t bytes) MC_REQUIRES(mu_);
  static uint64_t InFlightBytes(const Object& obj);
  // Erases an upsert in flight, freeing its space (and its writer's reservation).
  std::unordered_map<std::string, Object>::iterator EraseUpsertLocked(
      std::unordered_map<std::string, Object>::iterator it, Clock::time_point now) MC_REQUIRES(mu_);
  static bool Leased(const Object& obj, Clock::time_point now);
  void FillReplicasLocked(const Object& obj, bool complete_only,
                          google::protobuf::RepeatedPtrField<rpc::Replica>* out) const MC_REQUIRES(mu_);
  uint64_t CapacityLocked() const MC_REQUIRES(mu_);
  // Strict mode (master_tenants.cc): KeyProblem of a stored key; the memory charged to the
  // tenant of `key` (placed) or returned (freed, dropped); whether `bytes` more may be placed
  // for it (else *result says why: TENANT_NOT_REGISTERED, or TENANT_QUOTA_EXCEEDED once
  // evicting its own objects did not make room); every charge rebuilt from the tables.
  std::string StoredKeyProblem(const std::string& key) const;
  std::string CountIfRefused(std::string problem) MC_EXCLUDES(mu_);
  void ChargeLocked(const std::string& key, uint64_t bytes) MC_REQUIRES(mu_);
  void UnchargeLocked(const std::string& key, uint64_t bytes) MC_REQUIRES(mu_);
  bool AdmitLocked(const std::string& key, uint64_t bytes, rpc::PutStartResult* result,
                   Clock::time_point now) MC_REQUIRES(mu_);
  uint64_t EvictTenantLocked(std::string_view tenant, uint64_t needed, Clock::time_point now)
      MC_REQUIRES(mu_);
  void RechargeLocked() MC_REQUIRES(mu_);
  std::string TenantMetricsLocked() MC_REQUIRES(mu_);
  uint64_t AllocatedLocked() const MC_REQUIRES(mu_);

  // Replica tasks (master_tasks.cc). A running task's space: copies_, keyed by the object's key.
  using Copies = std::unordered_map<std::string, Object>;
  bool CopyingLocked(const std::string& key) const MC_REQUIRES(mu_);  // a task's space in flight
  // Starts task `t` (pending) into *out: true when started; false when it waits or ended.
  bool StartTaskLocked(ReplicaTask* t, rpc::TaskAssignment* out, Clock::time_point now)
      MC_REQUIRES(mu_);
  // Makes the running task's space part of its object: "" or why not (the space freed).
  std::string CommitCopyLocked(const ReplicaTask& t, Clock::time_point now) MC_REQUIRES(mu_);
  // Removes replica *p (one of obj's) from the object, freeing it as a removal frees (after
  // its readers' leases) and returning its charge.
  void DropReplicaLocked(const std::string& key, Object* obj, const Placement* p,
                         Clock::time_point now) MC_REQUIRES(mu_);
  Copies::iterator EraseCopyLocked(Copies::iterator it, Clock::time_point now) MC_REQUIRES(mu_);
  // Tick's part: tasks past their timeouts fail, running ones past the discard time too.
  void ExpireTasksLocked(Clock::time_point now) MC_REQUIRES(mu_);
  // The segments named `name` (mounted; draining ones too), with their ids.
  std::vector<std::pair<uint64_t, Segment*>> SegmentsNamedLocked(const std::string& name) MC_REQUIRES(mu_);

  // The disk tier (master_disk.cc). A key's disk replica: which disk, its size and version
  // (the value it holds), and how often it was read since.
  struct Disk;
  struct DiskEntry {
    uint32_t disk = 0;
    uint32_t reads = 0;
    uint64_t size = 0;
    uint64_t version = 0;
  };
  // The key's disk replica goes (a removal of the key, a newer value): its disk is told.
  void DiskForgetLocked(const std::string& key) MC_REQUIRES(mu_);
  // A value became complete: an older disk replica goes; eager offload queues this one.
  // A promotion's value (its disk's version) is leased for one TTL, as if its writer had read
  // it, so that eviction does not take it back at once.
  void DiskOnCompleteLocked(const std::string& key, Object* obj) MC_REQUIRES(mu_);
  // Queues the object for the disk of the client holding one of its replicas: false when
  // no such disk takes it now (none, not offloading, or its queue full).
  bool QueueOffloadLocked(const std::string& key, const Object& obj) MC_REQUIRES(mu_);
  // Eviction's victim is kept while it waits for its disk (eager: queued; --offload_on_evict:
  // queued now) unless --offload_force_evict, so that the tier loses nothing it can hold.
  bool HeldForOffloadLocked(const ObjectEntry* e, size_t* queued, Clock::time_point now)
      MC_REQUIRES(mu_);
  // Queued for the disk of a client holding one of its replicas, or handed to that client
  // and not yet reported (OffloadFetch to OffloadDone, at most kOffloadWriteHold).
  bool WaitingForDiskLocked(const std::string& key, const Object& obj, Clock::time_point now) const
      MC_REQUIRES(mu_);
  bool OnDiskLocked(const std::string& key, uint64_t version) const MC_REQUIRES(mu_);
  // The key has a disk replica readers are sent to (its disk's client is alive).
  bool DiskServedLocked(const std::string& key) const MC_REQUIRES(mu_);
  // GetReplicaList of a key with no memory replica readable: its disk replica, if any.
  bool FillDiskLocked(const std::string& key, bool count_read,
                      google::protobuf::RepeatedPtrField<rpc::Replica>* out, uint64_t* size,
                      uint64_t* version) MC_REQUIRES(mu_);
  // A client expired: its disk's replicas are no longer served (its removals are kept
  // for when a client mounts that store again).
  void DetachDiskOfLocked(const std::string& client) MC_REQUIRES(mu_);
  uint32_t OffloadWaitingLocked(const std::string& client) const MC_REQUIRES(mu_);
  std::string DiskMetricsLocked() const MC_REQUIRES(mu_);

  // The HA log's entries (no-ops without a sink): an object's state, a key's end.
  void LogObjectLocked(oplog::Entry::Kind kind, const std::string& key, const Object& obj)
      MC_REQUIRES(mu_);
  void LogKeyLocked(oplog::Entry::Kind kind, const std::string& key) MC_REQUIRES(mu_);
  void LogLocked(oplog::Entry&& entry) MC_REQUIRES(mu_);
  // Standby: the placements of `old` that `now_in` (may be null) no longer has, held out of
  // use for one lease TTL (the old leader's readers may still read them).
  void HoldLocked(const Object& old, const Object* now_in, Clock::time_point now) MC_REQUIRES(mu_);
  Status ApplyLocked(const oplog::Entry& e, Clock::time_point now) MC_REQUIRES(mu_);
  void SetStateLocked(const oplog::ObjectState& st, Object* obj, Clock::time_point now)
      MC_REQUIRES(mu_);

  const MasterConfig config_;
  const NowFn now_;
  mutable Mutex mu_;  // every member below
  ChangeSink* sink_ MC_GUARDED_BY(mu_) = nullptr;
  ObjectEventSink* events_ MC_GUARDED_BY(mu_) = nullptr;
  std::function<void(const std::string&)> disk_waker_ MC_GUARDED_BY(mu_);
  uint64_t next_version_ MC_GUARDED_BY(mu_) = 1;  // above every version given or applied
                                                  // (the constructor says where it starts)
  bool standby_ MC_GUARDED_BY(mu_) = false;
  // Standby: space the log freed, not yet reusable (one lease TTL after it was applied).
  struct Held {
    uint32_t segment_id;
    uint64_t offset;
    uint64_t size;
    Clock::time_point free_at;
  };
  std::deque<Held> held_ MC_GUARDED_BY(mu_);
  // After a promotion: until then, space freed (removals, eviction) is not reused, since
  // the previous leader's readers may hold leases this master does not know of.
  Clock::time_point lease_floor_ MC_GUARDED_BY(mu_){};
  // When Promote ran: objects stamped at or before it may have readers of the old leader.
  Clock::time_point promoted_at_ MC_GUARDED_BY(mu_){};
  // MarkLoadedFromCheckpoint's time (zero: the state came from the whole log).
  Clock::time_point checkpoint_loaded_at_ MC_GUARDED_BY(mu_){};
  uint64_t next_segment_id_ MC_GUARDED_BY(mu_) = 1;
  uint64_t view_version_ MC_GUARDED_BY(mu_) = 1;
  size_t placement_cursor_ MC_GUARDED_BY(mu_) = 0;
  // PlaceLocked's scratch.
  std::vector<std::pair<uint64_t, Segment*>> place_order_ MC_GUARDED_BY(mu_);
  // The segments that take objects (mounted, not draining), in mount order: placement walks
  // it from a rotating cursor.
  std::vector<std::pair<uint64_t, Segment*>> placeable_ MC_GUARDED_BY(mu_);
  std::unordered_set<uint64_t> draining_ MC_GUARDED_BY(mu_);  // ids of segments being unmounted
  std::vector<uint64_t> hashes_ MC_GUARDED_BY(mu_);               // PrefetchLocked's
  uint64_t admit_capacity_ MC_GUARDED_BY(mu_) = 0;  // PutStartInto's CapacityLocked(), for AdmitLocked
  bool quota_evict_failed_ MC_GUARDED_BY(mu_) = false;  // this PutStart's quota eviction found no room
  std::vector<const ObjectEntry*> prefetched_ MC_GUARDED_BY(mu_);  // PrefetchLocked's scratch
  std::map<uint64_t, std::unique_ptr<Segment>> segments_ MC_GUARDED_BY(mu_);
  std::unordered_map<std::string, Client> clients_ MC_GUARDED_BY(mu_);
  // Replica bytes of each writer's puts and upserts in flight (absent: none).
  std::unordered_map<std::string, uint64_t> inflight_bytes_ MC_GUARDED_BY(mu_);
  // The client ids that objects name (their writer, their latest lease holder): declared
  // before the tables whose records refer to it, so it outlives them.
  ClientNames client_names_ MC_GUARDED_BY(mu_);
  ObjectMap objects_ MC_GUARDED_BY(mu_);
  // Upserts in flight of keys whose current value (in objects_) stays visible until their
  // PutEnd replaces it (master_upsert.cc).
  std::unordered_map<std::string, Object> upserts_ MC_GUARDED_BY(mu_);
  // The space of replica tasks running (their executor writes it; not readable), by key: its
  // replicas the new placements, owner the executor, version the copied value's.
  Copies copies_ MC_GUARDED_BY(mu_);
  ReplicaTasks tasks_ MC_GUARDED_BY(mu_);
  // The disk tier: mounted (and detached) disks by id, by client and by store id; the
  // disk replicas by key (only while their disk is attached).
  std::map<uint32_t, std::unique_ptr<Disk>> disks_ MC_GUARDED_BY(mu_);
  std::unordered_map<std::string, uint32_t> disk_of_client_ MC_GUARDED_BY(mu_);
  std::unordered_map<std::string, uint32_t> disk_of_store_ MC_GUARDED_BY(mu_);
  std::unordered_map<std::string, DiskEntry> disk_objects_ MC_GUARDED_BY(mu_);
  uint32_t next_disk_id_ MC_GUARDED_BY(mu_) = 1;
  // Entries of objects_ still being written, in PutStart order; complete ones that eviction
  // may take, least recently used first (plain, then soft-pinned): see ListLocked.
  RecordList<ObjectEntry> in_flight_ MC_GUARDED_BY(mu_){1};
  RecordList<ObjectEntry> lru_ MC_GUARDED_BY(mu_){2};
  RecordList<ObjectEntry> pinned_lru_ MC_GUARDED_BY(mu_){3};
  // The shortest soft pin TTL of any object so far: no soft pin has lapsed whose object was
  // accessed more recently than that (bounds EvictLocked's walk of pinned_lru_).
  Clock::duration min_soft_pin_ttl_ MC_GUARDED_BY(mu_) = Clock::duration::max();
  // An eviction toward the low watermark is under way.
  bool evicting_ MC_GUARDED_BY(mu_) = false;
  // Soonest free_at on top: a reap costs only the graves it frees. Graves of a segment
  // unmounted since are dropped when they come up (segment ids are never reused).
  struct FreesLater {
    bool operator()(const Grave& a, const Grave& b) const { return a.free_at > b.free_at; }
  };
  std::priority_queue<Grave, std::vector<Grave>, FreesLater> graveyard_ MC_GUARDED_BY(mu_);
  uint64_t graveyard_bytes_ MC_GUARDED_BY(mu_) = 0;
  // Segment names unmounted lately -> until when a segment mounted under that name again
  // takes no new objects (the unmount time plus one lease TTL).
  std::unordered_map<std::string, Clock::time_point> dropped_names_ MC_GUARDED_BY(mu_);
  MasterCounters counters_ MC_GUARDED_BY(mu_);
  // Strict mode: the tenants' policies and charges (a standby's are rebuilt by Promote).
  mutable TenantLedger tenants_ MC_GUARDED_BY(mu_);  // mutable: snapshots cache the shares
  struct TenantCounters {
    uint64_t quota_rejects = 0;  // TENANT_QUOTA_EXCEEDED items
    uint64_t evicted_bytes = 0;  // taken from the tenant to make room within its quota
  };
  // Registered tenants only (a client cannot grow it by naming tenants); the refusals of
  // unregistered tenants are counted together.
  std::map<std::string, TenantCounters, std::less<>> tenant_counters_ MC_GUARDED_BY(mu_);
  uint64_t unregistered_rejects_ MC_GUARDED_BY(mu_) = 0;
  std::mt19937_64 lease_ids_ MC_GUARDED_BY(mu_);  // seeded from std::random_device
};

}  // namespace store
}  // namespace mooncake
