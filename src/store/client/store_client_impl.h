// StoreClient::Impl, shared by the client's files: store_client.cc (setup, heartbeat,
// teardown, the calls that are one master RPC), store_client_data.cc (puts, the copies,
// staging), store_client_get.cc (gets), store_client_ranges.cc (ranged reads, get sessions,
// replica clear) and store_client_put_session.cc (put sessions).
#pragma once

#include <glog/logging.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <google/protobuf/arena.h>

#include "master.pb.h"
#include "store/rpc/rpc_client.h"
#include "mooncake/store/store_client.h"
#include "mooncake/transfer_engine.h"
#include "store/client/client_port.h"
#include "mooncake/store/error_code.h"
#include "store/common/limits.h"
#include "store/common/offset_allocator.h"

namespace mooncake {
namespace store {

// One copy between local memory and a replica; `owner` says which key it belongs to.
struct Job {
  TransferRequest::OpCode op;
  char* local;
  size_t len;
  const std::string* segment;
  uint64_t remote;
  size_t owner;
};

std::string RandomClientId();
rpc::ReplicateConfig ConfigToProto(const ReplicateConfig& c);
// The bytes of `parts`.
size_t Total(const std::vector<Span>& parts);
// Lays `parts` (the object, in order) over one replica at `remote` as copy jobs of `owner`.
void AddJobs(TransferRequest::OpCode op, const std::vector<Span>& parts,
             const std::string* segment, uint64_t remote, size_t owner, std::vector<Job>* jobs);
// Arena blocks sized for a batch RPC of `items` keys.
google::protobuf::ArenaOptions ArenaOptionsFor(size_t items);

class StoreClient::Impl {
 public:
  explicit Impl(StoreClientOptions o) : opt(std::move(o)), client_id(RandomClientId()) {}
  ~Impl() { Close(); }

  int Start(std::string* message);
  int Close();
  int Mount();
  void HeartbeatLoop();

  // One master RPC: 0, or RPC_FAIL after a log line saying why.
  int Call(const char* what, MasterMethod method, const google::protobuf::MessageLite& req,
           google::protobuf::MessageLite* resp) {
    Status s = master->Call(method, req, resp, opt.rpc_timeout);
    if (!s.ok()) {
      LOG(ERROR) << what << ": " << s.message();
      return ToInt(ErrorCode::RPC_FAIL);
    }
    return 0;
  }

  bool IsRegistered(const void* p, size_t n);
  // As IsRegistered, also giving the registered range that holds [p, p + n).
  bool RegisteredRange(const void* p, size_t n, uint64_t* lo, uint64_t* len);
  // False (after a log line) when `parts` need staging and there is no local buffer.
  bool Stageable(const char* what, const std::string& key, const std::vector<Span>& parts);
  Result<SegmentID> Open(const std::string& name);
  // Runs the copies; sets failed[owner] for every job that did not complete.
  void RunJobs(const std::vector<Job>& jobs, std::vector<char>* failed);
  void* AllocStaging(size_t size, bool wait);
  void FreeStaging(void* p);

  // upsert: replace existing values (PutStartRequest.upsert); keys another writer is putting
  // (OBJECT_REPLICA_BUSY) are retried until rpc_timeout has passed.
  std::vector<int> PutMany(const std::vector<std::string>& keys,
                           const std::vector<std::vector<Span>>& parts,
                           const ReplicateConfig& config, bool upsert = false);
  std::vector<int> PutSplit(const std::vector<std::string>& keys,
                            const std::vector<std::vector<Span>>& parts,
                            const ReplicateConfig& config, bool upsert);
  // Splits at kMaxBatchItems; a read that ended after its lease (GetRound's `lapsed`) is
  // tried once more, then reported as LEASE_EXPIRED.
  std::vector<int64_t> GetMany(const std::vector<std::string>& keys,
                               const StoreClient::PartsFor& parts_for);
  // One GetReplicaList and the reads. lapsed[i] = 1 where key i's read ended later than its
  // lease allows (the bytes may be another object's: the master may have reused the space).
  std::vector<int64_t> GetRound(const std::vector<std::string>& keys,
                                const StoreClient::PartsFor& parts_for, std::vector<char>* lapsed);
  // GetRound in two steps, so that GetMany sends the next round's GetReplicaList before it
  // reads this round's objects (the master looks up the next keys while this client copies):
  // BeginGet registers the reads and sends the request; FinishGet (own_calls: this caller's
  // RPCs in flight, this one included) waits for the reply and reads. `keys` must outlive
  // the state.
  struct GetRoundState;
  std::unique_ptr<GetRoundState> BeginGet(const std::vector<std::string>& keys);
  std::vector<int64_t> FinishGet(GetRoundState* st, const StoreClient::PartsFor& parts_for,
                                 std::vector<char>* lapsed, int own_calls);
  std::vector<int> PutRound(const std::vector<std::string>& keys,
                            const std::vector<std::vector<Span>>& parts,
                            const ReplicateConfig& config, bool upsert);

  StoreClientOptions opt;
  const std::string client_id;
  std::shared_ptr<TransferEngine> engine;
  std::unique_ptr<PortHold> port_hold;  // the port of seg_name, when client_port.h added one
  std::string seg_name;
  void* segment = nullptr;
  void* local_buf = nullptr;  // staging: registered local only (never in the descriptor)
  bool mounted_once = false;  // later mounts are remounts (MountSegmentRequest.remount)
  std::unique_ptr<RpcClient> master;

  std::mutex staging_mu;
  std::condition_variable staging_cv;
  std::unique_ptr<AddressedAllocator> staging;

  std::mutex reg_mu;
  std::map<uintptr_t, size_t> registered;  // start -> length
  std::vector<void*> shared_bufs;          // AllocateSharedBuffer's, freed by Close
  // RegisterBuffer calls for ranges inside a shared buffer (a dummy's pool, registered as a
  // whole already): start -> the largest size registered there and the count of such calls
  // not yet undone by UnregisterBuffer. Ranged reads bound their destinations by these.
  struct NestedRange {
    size_t size = 0;
    int count = 0;
  };
  std::map<uintptr_t, NestedRange> nested;
  bool InSharedBuf(uintptr_t a, size_t n);  // REQUIRES: reg_mu held
  // Per key (by a 64-bit hash of it): this client's reads of it in flight, and the lease of
  // its last completed read. A forced remove passes that lease id when no read of the key is
  // in flight, so that the master may free the space at once (KeysRequest.read_lease_ids).
  // A fixed table of slots, one per hash modulo its size (no allocation, nothing to clean
  // up): keys that share a slot share its reader count and its last id, which can only hide
  // an id (a read of another key in flight, or its id written last: the free then waits for
  // the lease), never vouch for a read in flight. REQUIRES: reads_mu held for every call.
  struct ReadMark {
    int readers = 0;
    uint64_t done = 0;       // lease id of the last completed read of key `done_hash`
    uint64_t done_hash = 0;
    uint64_t epoch = 0;      // `done` counts only while this is ReadMarks::epoch
  };
  class ReadMarks {
   public:
    static constexpr size_t kSlots = 1 << 16;
    ReadMarks() : slots_(kSlots) {}
    // The slot of key hash `h`, counted as read by one more reader (stable address).
    ReadMark* Begin(uint64_t h) {
      ReadMark* m = &slots_[h & (kSlots - 1)];
      ++m->readers;
      return m;
    }
    // A read begun with Begin(h) ended; `lease_id` (0: none) was its lease.
    void End(ReadMark* m, uint64_t h, uint64_t lease_id) {
      --m->readers;
      if (lease_id != 0) {
        m->done = lease_id;
        m->done_hash = h;
        m->epoch = epoch_;
      }
    }
    // For a forced remove of key hash `h`: the lease id of its last completed read when no
    // read of its slot is in flight (then forgotten), else 0.
    uint64_t TakeIdle(uint64_t h) {
      ReadMark& m = slots_[h & (kSlots - 1)];
      if (m.readers != 0 || m.done_hash != h || m.epoch != epoch_) return 0;
      const uint64_t id = m.done;
      m.done = 0;
      return id;
    }
    // Forgets every id (a RemoveAll / RemoveByRegex with no read in flight).
    void ForgetAll() { ++epoch_; }

   private:
    std::vector<ReadMark> slots_;
    uint64_t epoch_ = 1;
  };
  std::mutex reads_mu;
  ReadMarks reads;
  // Whether the last RunJobs' transfers had all ended when their Submit returned (see
  // GetMany: rounds are pipelined then).
  std::atomic<bool> copies_inline{false};
  size_t active_reads = 0;                       // GetRound calls in flight
  static uint64_t KeyHash(const std::string& k) { return std::hash<std::string>()(k); }
  // Get sessions (store_client_ranges.cc): key -> what GetSessionStart found. A session
  // counts as a reader of its key (ReadMark) until it ends.
  struct Session {
    uint64_t size = 0;
    std::vector<rpc::Replica> replicas;  // ours first
    std::chrono::steady_clock::time_point deadline;
    uint64_t lease_id = 0;
    ReadMark* mark = nullptr;
    uint64_t hash = 0;  // KeyHash of the key
  };
  std::mutex session_mu;  // before reads_mu
  std::unordered_map<std::string, Session> sessions;
  // Put sessions: key -> its PutStart's replicas (PROCESSING at the master until the end).
  struct PutSession {
    uint64_t size = 0;
    std::vector<rpc::Replica> replicas;
    int writing = 0;  // PutSessionRanges calls in flight; end / revoke wait for them
  };
  std::unordered_map<std::string, PutSession> put_sessions;  // GUARDED_BY(session_mu)
  std::condition_variable put_session_cv;
  // Reads `ranges` of keys whose replicas and deadlines are known; per range its size or a
  // negative code.
  struct KeyPlan {
    uint64_t size = 0;
    std::vector<rpc::Replica> replicas;
    std::chrono::steady_clock::time_point deadline;
    int code = 0;  // non-zero: every range of the key fails with it
  };
  std::vector<int64_t> ReadRanges(const std::vector<std::string>& keys,
                                  const std::vector<KeyPlan>& plans,
                                  const std::vector<StoreClient::RangeRead>& ranges);
  // GetReplicaList for `keys` with the lease deadline of each (sent + ttl - margin).
  std::vector<KeyPlan> Plan(const std::vector<std::string>& keys, std::vector<uint64_t>* lease_ids);
  std::mutex open_mu;
  std::unordered_map<std::string, SegmentID> opened;

  std::mutex hb_mu;
  std::condition_variable hb_cv;
  bool stopping = false;
  bool closed = false;
  std::thread heartbeat;
};

}  // namespace store
}  // namespace mooncake
