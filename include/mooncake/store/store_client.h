// StoreClient: one process's handle on the Mooncake Store (a distributed KV-cache pool).
//
// It contributes a global segment of its memory to the pool (allocated shareable and
// registered with its transfer engine, then mounted at the master), keeps a local buffer for
// staging, and stores / fetches objects by key: the master says where the replicas lie, the
// engine moves the bytes (a memcpy when the replica is in this process's own segment).
//
// Results are upstream Mooncake's codes: 0 (or a count / size) on success, a negative
// ErrorCode (mooncake/store/error_code.h) on failure; every failure logs one line saying why.
//
// Memory handed to Put*/Get* may be any host memory. Ranges inside memory this client knows
// as registered (its segment, its local buffer, RegisterBuffer) move with no extra copy;
// others are staged through the local buffer in chunks.
//
// Thread safety: every method may be called from any thread at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mooncake {
class TransferEngine;

namespace store {

class ClientMetrics;
class MasterStub;

struct ReplicateConfig {
  size_t replica_num = 1;
  bool with_soft_pin = false;
  uint64_t soft_pin_ttl_ms = 0;  // 0: the master's --default_kv_soft_pin_ttl
  bool with_hard_pin = false;
  std::vector<std::string> preferred_segments;  // transfer-engine segment names, tried first
  bool prefer_alloc_in_same_node = false;
  // Upsert without with_soft_pin: keep the replaced value's soft pin (SoftPinAction.PRESERVE).
  bool keep_soft_pin = false;
};

class DiskStore;  // src/store/disk/disk_store.h

struct StoreClientOptions {
  // The engine's server name (host or host:port). Under a metadata server a host without
  // ":port" becomes host:<free port> (client_port.h; segment_name() says which).
  std::string local_hostname;
  std::string metadata_server = "P2PHANDSHAKE";  // as TransferEngine::Init
  uint64_t global_segment_size = 0;              // bytes contributed to the pool (0: none)
  uint64_t local_buffer_size = 16 << 20;  // staging buffer; 0: none (only registered memory moves)
  std::string protocol = "tcp";
  // The master: "host:port" (or "[v6]:port"), or "etcd://h1:2379;h2:2379" (',' also) to
  // follow the leader of an HA cluster through etcd (src/store/client/leader_stub.h: its
  // resends and bound). Other schemes (upstream's redis://, k8s://) are INVALID_PARAMS; no
  // leader named in etcd within failover_timeout makes setup UNAVAILABLE_IN_CURRENT_STATUS.
  std::string master_server_addr = "127.0.0.1:50051";
  // The HA cluster followed through etcd ("": MC_STORE_CLUSTER_ID, else "mooncake_cluster");
  // 1..128 characters of [0-9A-Za-z_.-]; must match the masters' --cluster_id.
  std::string cluster_id;
  // Who this client is to a master in strict multi-tenant mode (--enable_multi_tenants): its
  // keys are this tenant's, and its puts count against this tenant's quota. Not
  // authentication: a client names its own tenant. Upstream's rules (src/store/tenants/
  // tenant_id.h): 1..128 bytes, no leading '_', no control characters; else setup fails
  // with INVALID_PARAMS. A master without strict mode puts every tenant in one key space.
  std::string tenant_id = "default";
  // etcd:// only: how long after its start a call that finds the leader gone may wait for the
  // next one and be sent to it (and how long setup waits for a leader to be named).
  std::chrono::milliseconds failover_timeout{10000};
  // The client_mode label of its metrics (client_metrics.h): "real", or "dummy" for the store
  // client of a dummy (upstream's values).
  std::string client_mode = "real";
  // A running engine to share (the Python `engine=` argument); null: the client makes its own.
  std::shared_ptr<TransferEngine> engine;
  // The master to call in place of master_server_addr's (tests: an in-process master,
  // src/store/testing/in_process_master.h); null: the RPC client of master_server_addr.
  std::shared_ptr<MasterStub> master;
  std::chrono::milliseconds rpc_timeout{10000};
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds transfer_timeout{30000};  // plus 1 ms per MiB moved
  // The disk tier (src/store/disk/README.md; setup's enable_ssd_offload / ssd_offload_path):
  // objects in this client's segment are written to its local disk (the master decides when)
  // and read from there by any client once no memory replica is left. The directories:
  // offload_path ("" : MOONCAKE_OFFLOAD_FILE_STORAGE_PATH), several separated by ':'; the
  // other settings from the MOONCAKE_OFFLOAD_* variables. Setup fails naming a bad
  // directory or variable, and with UNABLE_OFFLOAD when the master runs without
  // --enable_offload.
  bool enable_offload = false;
  std::string offload_path;
};

// One piece of local memory.
struct Span {
  void* ptr;
  size_t size;
};

class StoreClient {
 public:
  // Connects to the master (a Ping within rpc_timeout), starts or adopts the engine, mounts the
  // segment. Returns null and sets *code (and *message) on failure.
  static std::unique_ptr<StoreClient> Create(StoreClientOptions options, int* code,
                                             std::string* message);
  ~StoreClient();  // Close()
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // Unmounts the segment (its objects leave the pool), stops the heartbeat; idempotent.
  int Close();

  // The engine's segment name (host:port with P2PHANDSHAKE).
  std::string segment_name() const;
  TransferEngine* engine() const;
  // Where the staging buffer lies (diagnostics: tests check that peers cannot reach it; it is
  // registered for local use only and never published in the segment's descriptor).
  Span local_buffer() const;
  // 0 when the master answers, RPC_FAIL otherwise.
  int HealthCheck();
  // Its metrics (src/store/client/client_metrics.h: upstream's client metrics and summary);
  // null when MC_STORE_CLIENT_METRIC turned them off.
  ClientMetrics* metrics() const;
  // False once the heartbeat's last ping of the master failed (or after Close); no call is
  // made (the client HTTP server's /health).
  bool master_reachable() const;

  // The object is the concatenation of `parts`. 0, OBJECT_ALREADY_EXISTS, NO_AVAILABLE_HANDLE...
  int Put(const std::string& key, const std::vector<Span>& parts, const ReplicateConfig& config);
  std::vector<int> BatchPut(const std::vector<std::string>& keys,
                            const std::vector<std::vector<Span>>& parts,
                            const ReplicateConfig& config);
  // As Put, but an existing value is replaced (upstream's upsert): the new value is written
  // into new space while readers keep getting the old one, then becomes the object at once;
  // the old space is reused only after the leases of its readers. While another put or upsert
  // of the key is in flight this waits for it (up to rpc_timeout, then OBJECT_REPLICA_BUSY).
  int Upsert(const std::string& key, const std::vector<Span>& parts, const ReplicateConfig& config);
  std::vector<int> BatchUpsert(const std::vector<std::string>& keys,
                               const std::vector<std::vector<Span>>& parts,
                               const ReplicateConfig& config);
  // Reads the object into `parts` (filled in order). Returns its size, or a negative code
  // (OBJECT_NOT_FOUND, INVALID_PARAMS when the parts are smaller than the object, ...).
  int64_t Get(const std::string& key, const std::vector<Span>& parts);
  std::vector<int64_t> BatchGet(const std::vector<std::string>& keys,
                                const std::vector<std::vector<Span>>& parts);
  // As BatchGet, with the destination chosen once the size is known (one round trip to the
  // master): parts_for(i, size) returns where key i's `size` bytes go (empty: skip the key,
  // which then reports INVALID_PARAMS).
  using PartsFor = std::function<std::vector<Span>(size_t index, uint64_t size)>;
  std::vector<int64_t> BatchGetWith(const std::vector<std::string>& keys,
                                    const PartsFor& parts_for);
  // One byte range of object `key` (an index into the keys passed with it), from `offset`
  // in the object into `dst`.
  struct RangeRead {
    size_t key;
    uint64_t offset;
    Span dst;
  };
  // Reads each range: one master round trip for all the keys, one engine batch for all the
  // ranges. Per range, its size or a negative code: the key's (OBJECT_NOT_FOUND, ...),
  // INVALID_PARAMS for a range past the object's end, TRANSFER_FAIL, LEASE_EXPIRED.
  std::vector<int64_t> GetRanges(const std::vector<std::string>& keys,
                                 const std::vector<RangeRead>& ranges);
  // Get sessions (upstream's batch_get_session_*, used by SGLang's unified cache):
  // GetSessionStart looks each key up once and holds its lease (0 or the key's code, e.g.
  // OBJECT_NOT_FOUND); GetSessionRanges reads ranges of session keys with no master round trip
  // (per key: the bytes read, INVALID_PARAMS for a key without a session or a range past the
  // end, LEASE_EXPIRED once the lease has lapsed, which also ends the session);
  // GetSessionEnd forgets the keys (0).
  std::vector<int> GetSessionStart(const std::vector<std::string>& keys);
  std::vector<int64_t> GetSessionRanges(const std::vector<std::string>& keys,
                                        const std::vector<RangeRead>& ranges);
  int GetSessionEnd(const std::vector<std::string>& keys);
  // Put sessions (upstream's batch_put_session_*): PutSessionStart reserves each object
  // (PutStart; invisible to readers) and returns 0 or the key's code; PutSessionRanges writes
  // ranges (RangeRead.offset: where in the object; dst: the source bytes) into every replica,
  // per key the bytes written or a negative code (INVALID_PARAMS for a key without a session
  // or a range past the object's end); PutSessionEnd makes the objects readable (PutEnd's
  // codes), PutSessionRevoke drops them; both wait for ranges in flight and end the sessions.
  // A session not ended within the master's put_start_discard_timeout is discarded.
  std::vector<int> PutSessionStart(const std::vector<std::string>& keys,
                                   const std::vector<uint64_t>& sizes, const ReplicateConfig& config);
  std::vector<int64_t> PutSessionRanges(const std::vector<std::string>& keys,
                                        const std::vector<RangeRead>& ranges);
  std::vector<int> PutSessionEnd(const std::vector<std::string>& keys);
  std::vector<int> PutSessionRevoke(const std::vector<std::string>& keys);
  // Bytes of registered memory (its segment, its local buffer, RegisterBuffer) from `p` to
  // the end of the registration holding it; 0 when `p` is not in one.
  uint64_t RegisteredRoom(const void* p);
  // upstream's batch_replica_clear: of the keys this client put that are complete and not
  // leased, drops the replicas on `segment_name` ("" : the whole object). The keys cleared.
  std::vector<std::string> BatchReplicaClear(const std::vector<std::string>& keys,
                                             const std::string& segment_name);
  // Size of a complete object, or a negative code.
  int64_t GetSize(const std::string& key);
  std::vector<int64_t> BatchGetSize(const std::vector<std::string>& keys);
  // 1 exists, 0 does not, negative on error.
  std::vector<int> BatchIsExist(const std::vector<std::string>& keys);

  // OBJECT_HAS_LEASE while a reader's lease lasts, unless `force`.
  int Remove(const std::string& key, bool force = false);
  std::vector<int> BatchRemove(const std::vector<std::string>& keys, bool force = false);
  int64_t RemoveByRegex(const std::string& regex, bool force = false);  // count, or negative
  int64_t RemoveAll(bool force = false);                                // count, or negative

  // Replica tasks (upstream's create_copy_task / create_move_task / query_task): the master
  // hands the task to the client owning the source replica's segment, whose engine copies
  // the bytes (this client runs the tasks given to it, in the background); a new replica is
  // readable once the task succeeds, a move's source is dropped only then. Ids are upstream's
  // (u64, u64). 0 with the id, or a negative code (the master's checks: INVALID_PARAMS,
  // OBJECT_NOT_FOUND, UNAVAILABLE_IN_CURRENT_STATUS, TASK_PENDING_LIMIT_EXCEEDED).
  struct TaskId {
    uint64_t hi = 0;
    uint64_t lo = 0;
  };
  struct TaskInfo {
    TaskId id;
    uint32_t type = 0;    // 0 copy, 1 move
    uint32_t status = 0;  // 0 pending, 1 processing, 2 failed, 3 success
    int64_t created_at_ms = 0;
    int64_t last_updated_at_ms = 0;
    std::string assigned_client;  // the executor's client id
    std::string message;          // "Task completed successfully", or why it failed
  };
  int CreateCopyTask(const std::string& key, const std::vector<std::string>& targets,
                     TaskId* id);
  int CreateMoveTask(const std::string& key, const std::string& source, const std::string& target,
                     TaskId* id);
  // TASK_NOT_FOUND for an unknown id (or one pruned, or of another master).
  int QueryTask(const TaskId& id, TaskInfo* info);
  // The replica tasks this client ran to the end (any outcome) since it started.
  uint64_t tasks_run() const;
  // The disk tier: objects this client read from a disk replica (upstream's
  // get_offload_rpc_read_count); 0 without reads from disk.
  uint64_t offload_rpc_reads() const;
  // Objects this client wrote to its disk, and its disk's state (null: no disk tier).
  uint64_t offloaded() const;
  const DiskStore* disk_store() const;
  // upstream's unmount_local_disk_segment: nothing more is written to the disk at once, and
  // after grace_s seconds (0: now) the master stops sending readers to it. INVALID_PARAMS
  // without a disk tier.
  int UnmountDisk(int64_t grace_s);
  // upstream's get_replica_desc / batch_get_replica_desc: where the complete replicas of each
  // key lie (a GetReplicaList: it grants a read lease, as upstream's query does). Per key
  // code 0 with its size and replicas, or a negative code (OBJECT_NOT_FOUND, ...).
  struct ReplicaLocation {
    std::string segment_name;  // the holder's segment (upstream's transport_endpoint); a
                               // disk replica: its owner's offload service, host:port
    uint64_t addr = 0;
    uint64_t size = 0;
    bool disk = false;  // a copy on its owner's local disk (the disk tier)
  };
  struct KeyReplicas {
    int code = 0;
    uint64_t size = 0;
    std::vector<ReplicaLocation> replicas;
  };
  std::vector<KeyReplicas> BatchQueryReplicas(const std::vector<std::string>& keys);

  // Run-time segments (upstream's mount_segment / allocate_and_mount_segment): more memory
  // lent to the pool beside the global segment, under this client's segment name, each named
  // by an id ("<u64>-<u64>", as upstream's). MountFileSegment maps `size` bytes of the file at
  // `path` (a /dev/shm object, a hugetlbfs or regular file) from `offset` (a multiple of the
  // page size; the range must lie inside the file); AllocateSegment allocates `size` bytes
  // rounded up to 16 MiB (*allocated: the rounded size). `location` is the engine's memory
  // location ("" : "*", the engine asks). 0, or INVALID_PARAMS for a bad path or range (logged,
  // naming it), or the master's code (nothing is left mapped or registered).
  int MountFileSegment(const std::string& path, uint64_t offset, uint64_t size,
                       const std::string& location, std::string* id);
  int AllocateSegment(uint64_t size, const std::string& location, std::string* id,
                      uint64_t* allocated);
  // Unmounts a segment of MountFileSegment (`allocated` false) or AllocateSegment (true): the
  // master drops its replicas (an object left with none is removed), then the memory leaves
  // the engine and is unmapped (a file mapping's address range stays reserved until Close, so
  // a peer's late read of it fails rather than read other memory). With grace_s > 0 this
  // happens grace_s seconds later (by the heartbeat; the segment serves reads and may take
  // objects until then). INVALID_PARAMS for an id that is not one of that kind.
  int UnmountSegment(const std::string& id, bool allocated, int64_t grace_s = 0);

  // Registers memory with the engine so Put/Get move it without staging.
  // remote_accessible = false: local-only memory (not published to peers, their requests for
  // it refused), as the staging buffer; enough for the client's own puts and gets.
  int RegisterBuffer(void* ptr, size_t size, bool remote_accessible = true);
  int UnregisterBuffer(void* ptr);
  // Allocates `size` bytes of shareable memory (TransferEngine::AllocateSharedMemory: a
  // same-host peer maps it and copies with memcpy), registered as RegisterBuffer does. Freed
  // by Close(). Null (and a log line) on failure. A dummy client's memory pool. RegisterBuffer
  // of a range inside it succeeds without registering anything (it is registered as a whole);
  // UnregisterBuffer of that range undoes it. On huge pages under MC_STORE_USE_HUGEPAGE, as
  // the segment.
  void* AllocateSharedBuffer(size_t size);

  // The local hot cache's counters (MC_STORE_LOCAL_HOT_CACHE_SIZE; all 0 when it is off):
  // gets served from it, gets it could not serve, values kept, values dropped for room.
  struct HotCacheStats {
    bool enabled = false;
    uint64_t hits = 0, misses = 0, fills = 0, evictions = 0, entries = 0, bytes = 0;
  };
  HotCacheStats GetHotCacheStats() const;

  class Impl;

 private:
  explicit StoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace store
}  // namespace mooncake
