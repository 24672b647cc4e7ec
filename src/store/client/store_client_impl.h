// StoreClient::Impl: the client, composed of its collaborators (each its own header, state
// and lock):
//   master_stub.h      the master's RPCs (over the wire, or an in-process master in tests)
//   leader_stub.h      ... or following the HA leader through etcd (master_server_addr etcd://)
//   registrations.h    which local memory the engine knows
//   staging.h          the local buffer that stages other memory
//   opened_segments.h  the engine handles of the segments copied to or from
//   copier.h           the copies (memcpy, engine batches, staged rounds)
//   read_marks.h       reads in flight and their leases (for forced removes)
//   sessions.h         get sessions and put sessions
//   heartbeat.h        the ping thread
//   hot_cache.h        copies of objects read from other clients (MC_STORE_LOCAL_HOT_*)
// Lock order: GetSessions before ReadTracker; every other lock is a leaf, and no lock is
// held across an RPC or a copy except ReadTracker's across a forced RemoveAll /
// RemoveByRegex (no read of ours begins before the master has answered).
//
// The files: store_client.cc (setup, heartbeat, teardown, the calls that are one RPC),
// store_client_put.cc (puts), store_client_get.cc (gets), store_client_ranges.cc (ranged
// reads, get sessions, replica clear), store_client_put_session.cc (put sessions).
#pragma once

#include <glog/logging.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/prefault.h"
#include "master.pb.h"
#include "mooncake/store/error_code.h"
#include "mooncake/store/store_client.h"
#include "mooncake/transfer_engine.h"
#include "store/client/client_port.h"
#include "store/client/client_metrics.h"
#include "store/client/copier.h"
#include "store/client/metered_master_stub.h"
#include "store/client/heartbeat.h"
#include "store/client/hot_cache.h"
#include "store/client/master_stub.h"
#include "store/client/leader_stub.h"
#include "store/client/opened_segments.h"
#include "store/client/read_marks.h"
#include "store/client/registrations.h"
#include "store/client/sessions.h"
#include "store/client/staging.h"
#include "store/client/offload_service.h"
#include "store/common/limits.h"
#include "store/disk/disk_store.h"
#include "store/disk/io_helper.h"
#include "store/rpc/rpc_client.h"

namespace google {
namespace protobuf {
struct ArenaOptions;
}  // namespace protobuf
}  // namespace google

namespace mooncake {
namespace store {

// A random, non-zero PutStartRequest.put_nonce: a PutStart sent again (after the master that
// took it stepped down) is granted the space of its first sending rather than refused.
inline uint64_t NewPutNonce() {
  thread_local std::mt19937_64 gen{(static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                   std::random_device{}()};
  return gen() | 1;
}

rpc::ReplicateConfig ConfigToProto(const ReplicateConfig& c);
// The bytes of `parts`.
size_t Total(const std::vector<Span>& parts);
// Arena blocks sized for a batch RPC of `items` keys.
google::protobuf::ArenaOptions ArenaOptionsFor(size_t items);
// The lease deadline of a read whose lookup was sent at `sent` and granted `ttl_ms` (0:
// none known, no bound): sent + lease, less a margin for clock rates (a tenth, at most
// 500 ms). The lease starts when the master answers, later than `sent`.
std::chrono::steady_clock::time_point LeaseDeadline(std::chrono::steady_clock::time_point sent,
                                                    uint64_t ttl_ms);

class StoreClient::Impl {
 public:
  explicit Impl(StoreClientOptions o);
  ~Impl() { Close(); }

  int Start(std::string* message);
  int Close();

  // 0 for an RPC that completed; UNAVAILABLE_IN_CURRENT_STATUS for a master that is not the
  // HA leader (IsNotLeader); else RPC_FAIL; after a log line saying why.
  static int Checked(const char* what, const Status& s) {
    if (s.ok()) return 0;
    if (IsNotLeader(s)) {
      LOG(ERROR) << what << ": " << s.message() << kNotLeaderHint;
      return ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
    }
    LOG(ERROR) << what << ": " << s.message();
    return ToInt(ErrorCode::RPC_FAIL);
  }
  static constexpr char kNotLeaderHint[] =
      " (this client was given the host:port of a master that is not the HA leader, a "
      "standby: set master_server_addr to etcd://<etcd endpoints> to follow the leader, or "
      "to the leader's address, which the master's message names when it knows it)";

  // False (after a log line) when `parts` need staging and there is no local buffer.
  bool Stageable(const char* what, const std::string& key, const std::vector<Span>& parts);

  // Puts (store_client_put.cc). upsert: replace existing values; keys another writer is
  // putting (OBJECT_REPLICA_BUSY) are retried until rpc_timeout has passed.
  std::vector<int> PutMany(const std::vector<std::string>& keys,
                           const std::vector<std::vector<Span>>& parts,
                           const ReplicateConfig& config, bool upsert = false);

  // Gets (store_client_get.cc): rounds of at most kMaxBatchItems keys; a read that ended
  // after its lease is tried once more, then reported as LEASE_EXPIRED.
  std::vector<int64_t> GetMany(const std::vector<std::string>& keys,
                               const StoreClient::PartsFor& parts_for);

  // Ranged reads (store_client_ranges.cc). Plan: one GetReplicaList for `keys`;
  // ReadRanges: the ranges of keys so planned, per range its size or a negative code.
  std::vector<KeyPlan> Plan(const std::vector<std::string>& keys, std::vector<uint64_t>* lease_ids);
  std::vector<int64_t> ReadRanges(const std::vector<std::string>& keys,
                                  const std::vector<KeyPlan>& plans,
                                  const std::vector<StoreClient::RangeRead>& ranges);

  bool master_lost() const { return master_lost_.load(); }
  // The histogram `which` of the metrics; null when they are off.
  LatencyHistogram* Latency(LatencyHistogram ClientMetrics::*which) const;

  // Every member below is set by Start and constant until Close, but for those that lock
  // themselves.
  // Huge pages for the segment and the local buffer (huge_pages.h; 0: off), read at
  // construction, before `opt`, whose sizes it rounds up to whole pages.
  const size_t huge_page_size;
  const StoreClientOptions opt;
  const std::string client_id;
  // Null when MC_STORE_CLIENT_METRIC turns them off. Before `master`, which counts into it
  // (a MeteredMasterStub) and so must go first.
  std::unique_ptr<ClientMetrics> metrics;
  std::shared_ptr<MasterStub> master;
  std::shared_ptr<TransferEngine> engine;
  std::unique_ptr<PortHold> port_hold;  // the port of seg_name, when client_port.h added one
  std::string seg_name;
  void* segment = nullptr;              // the global segment (null: none lent)
  std::shared_ptr<PrefaultJob> segment_prefault;  // its pages faulted in, in the background
  std::unique_ptr<Staging> staging;     // null: local_buffer_size 0
  Registrations registrations;
  std::unique_ptr<OpenedSegments> segments;
  std::unique_ptr<Copier> copier;
  ReadTracker reads;
  std::unique_ptr<HotCache> hot_cache;  // null: MC_STORE_LOCAL_HOT_CACHE_SIZE unset (or bad)
  GetSessions get_sessions{&reads};
  PutSessions put_sessions;
  std::atomic<bool> closed{false};

  // Run-time segments (store_client_segments.cc).
  struct RuntimeSegment {
    void* base = nullptr;
    uint64_t size = 0;
    bool allocated = false;  // AllocateSegment's shared memory; else a file mapping
    bool due = false;        // a grace period is running, until unmount_at
    std::chrono::steady_clock::time_point unmount_at;
  };
  Mutex runtime_mu;  // a leaf, but for the RPCs made with it released
  std::map<std::string, RuntimeSegment> runtime_segments MC_GUARDED_BY(runtime_mu);
  // Address ranges of unmounted file mappings, kept reserved (PROT_NONE) until Close.
  std::vector<std::pair<void*, uint64_t>> reservations MC_GUARDED_BY(runtime_mu);
  // Held shared by every copy (Copier::Run), exclusively while a run-time segment's memory
  // leaves: a copy never touches memory being unmapped.
  SegmentLayout layout_mu;
  int MountRange(void* base, uint64_t size, bool remount);
  int UnmountRange(void* base);
  // Master unmount, then engine and memory; the record is gone already. The master's code.
  int DropRuntime(const RuntimeSegment& seg);
  // The heartbeat's: remounts after the master forgot us; unmounts whose grace has passed.
  void RemountRuntime();
  void UnmountDueRuntime();
  void CloseRuntime();

  // [addr, addr + size) lies in memory this client lends (its global segment or a run-time
  // segment). Callers hold the layout (so that it stays lent while they use it).
  bool InLentMemory(uint64_t addr, uint64_t size) MC_EXCLUDES(runtime_mu);

  // Replica tasks given to this client (store_client_tasks.cc): the heartbeat pokes the
  // worker when the master says some wait; it fetches and runs them until none is left.
  void RunTasks();
  // One task: copies the source (which must lie in this client's own lent memory) to the
  // targets; "" or why not.
  std::string RunTask(const rpc::TaskAssignment& task);
  std::unique_ptr<Worker> task_worker;
  std::atomic<uint64_t> tasks_run{0};

  // The disk tier (store_client_disk.cc; src/store/disk/README.md). StartDisk opens the
  // disk, serves it (OffloadService), mounts it at the master and registers what it holds;
  // the offload worker (poked by the heartbeat, and asking every 200 ms) writes what the
  // master sends, applies its removals and keeps the disk under its watermarks. Gets of
  // disk replicas go through ReadFromDisks.
  int StartDisk(std::string* message);
  int MountDisk();
  // final: Close's last run (ends with the queue, or after rpc_timeout).
  void RunOffload(bool final = false);
  // --promotion_on_hit: a promotion the master handed this disk's owner, the disk's value
  // of `key` back into memory (a put of that version). False when the master found no room for it (the pool full of objects waiting for
  // this disk, say): RunOffload keeps it (KeepRefusedPromotion) and tries again
  // (RetryPromotions).
  bool Promote(const std::string& key, uint64_t version, uint64_t size);
  void KeepRefusedPromotion(const std::string& key, uint64_t version, uint64_t size);
  void RetryPromotions(bool after_write);
  // Reads keys[i] (i in `which`, each with a disk replica in its result) from their owners'
  // disks into parts[i]: out[i] the size or a negative code (store_client_disk_read.cc).
  void ReadFromDisks(const std::vector<std::string>& keys, const std::vector<size_t>& which,
                     const rpc::GetReplicaListResponse& resp,
                     const std::vector<std::vector<Span>>& parts, std::vector<int64_t>* out);
  // ReadFromDisks of keys[i], i in `idx`, from this client's own disk (stored_key(i): the
  // key its disk holds it under).
  void ReadOwnDisk(const std::vector<std::string>& keys, const std::vector<size_t>& idx,
                   const rpc::GetReplicaListResponse& resp,
                   const std::vector<std::vector<Span>>& parts,
                   const std::function<const std::string&(size_t)>& stored_key,
                   std::vector<int64_t>* out);
  void CloseDisk();
  std::unique_ptr<DiskStore> disk;
  std::unique_ptr<OffloadService> offload_service;
  disk::IoHelper offload_io;  // RunOffload's bucket writes (the worker's, then Close's)
  std::unique_ptr<Worker> offload_worker;
  // The master has held an offload fetch waiting (a long poll): Close ends its wait
  // (OffloadFetchRequest.end_wait) before it stops the worker.
  std::atomic<bool> offload_master_waits{false};
  std::atomic<uint64_t> offload_rpc_reads{0};
  std::atomic<uint64_t> offloaded{0};
  std::atomic<bool> disk_mounted{false};
  std::atomic<bool> disk_unmounted{false};  // unmount_local_disk_segment: for good
  std::atomic<int64_t> disk_unmount_at_ns{0};  // its grace's end (steady clock; 0: none)
  int SendDiskMount(bool offloading, bool unmount);
  uint64_t removals_done = 0;  // the offload worker's
  // Promotions refused for room, tried again after each bucket write reported (room freed)
  // and at most every kPromotionRetry otherwise, for kPromotionKeep; the offload worker's.
  struct RefusedPromotion {
    std::string key;
    uint64_t version, size;
    std::chrono::steady_clock::time_point since;
  };
  std::deque<RefusedPromotion> refused_promotions;
  std::chrono::steady_clock::time_point promotions_tried;
  std::chrono::steady_clock::time_point last_disk_check;  // the heartbeat's
  // When RunOffload last logged a failed OffloadFetch (the offload worker's; Close's last
  // run comes after the worker stopped).
  std::chrono::steady_clock::time_point offload_fetch_logged;
  Mutex offload_peers_mu;  // a leaf
  std::map<std::string, std::unique_ptr<RpcClient>> offload_peers MC_GUARDED_BY(offload_peers_mu);

 private:
  struct PutBatch;
  struct GetRoundState;
  int StartEngine(std::string* message);
  int StartMemory(std::string* message);
  // MountSegment of the global segment; the heartbeat's remount after the master forgot us.
  int Mount();
  void Beat();
  std::vector<int> PutSplit(const std::vector<std::string>& keys,
                            const std::vector<std::vector<Span>>& parts,
                            const ReplicateConfig& config, bool upsert);
  std::vector<int> PutRound(const std::vector<std::string>& keys,
                            const std::vector<std::vector<Span>>& parts,
                            const ReplicateConfig& config, bool upsert);
  void WriteHalf(PutBatch* b, size_t h);
  void EndPuts(PutBatch* b);
  // A get round in two steps, so that GetMany sends the next round's GetReplicaList before
  // it reads this round's objects: BeginGet marks the reads and sends the request;
  // FinishGet (own_calls: this caller's RPCs in flight, this one included) waits for the
  // reply and reads. lapsed[i] = 1 where key i's read ended later than its lease allows.
  std::unique_ptr<GetRoundState> BeginGet(const std::vector<std::string>& keys);
  std::vector<int64_t> FinishGet(GetRoundState* st, const StoreClient::PartsFor& parts_for,
                                 std::vector<char>* lapsed, int own_calls);
  std::vector<int64_t> GetRound(const std::vector<std::string>& keys,
                                const StoreClient::PartsFor& parts_for, std::vector<char>* lapsed);
  // FinishGet's reads: each key from its replicas in turn until one read completes.
  void ReadReplicas(GetRoundState* st, const std::vector<std::vector<Span>>& parts,
                    std::vector<int64_t>* out, std::vector<char>* lapsed);

  // Start's thread, then the heartbeat's only.
  bool mounted_once_ = false;  // later mounts are remounts (MountSegmentRequest.remount)
  // The last heartbeat's ping failed (logged once); read by master_reachable() from any thread.
  std::atomic<bool> master_lost_{false};
  std::unique_ptr<Heartbeat> heartbeat_;
};

}  // namespace store
}  // namespace mooncake
