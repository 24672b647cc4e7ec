// The client's sessions: get sessions (upstream's batch_get_session_*: a key looked up once,
// its lease held, ranges read with no master round trip) and put sessions (upstream's
// batch_put_session_*: an object PutStart'ed at the start, its bytes written in ranges,
// PutEnd'ed or revoked at the end).
//
// Locks: GetSessions::mu_ is taken before ReadTracker's (a session is a read in flight
// of its key until it ends); PutSessions::mu_ is a leaf. No RPC or copy runs under either.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/thread_annotations.h"
#include "master.pb.h"
#include "store/client/read_marks.h"

namespace mooncake {
namespace store {

// What one GetReplicaList said of a key, for reading ranges of it.
struct KeyPlan {
  uint64_t size = 0;
  std::vector<rpc::Replica> replicas;  // this client's own first
  std::chrono::steady_clock::time_point deadline;  // a read ending later is not trusted
  int code = 0;  // non-zero: every range of the key fails with it
};

class GetSessions {
 public:
  explicit GetSessions(ReadTracker* reads) : reads_(reads) {}
  ~GetSessions();  // ends the sessions left open (their marks)

  // The keys' lookups (`plans`, `lease_ids`: one GetReplicaList sent after `marks`, one per
  // key, were begun) become their sessions: a key with a session already has it renewed
  // (its new mark ends), a key whose lookup failed ends its old session. *plans is taken.
  void Start(const std::vector<std::string>& keys, std::vector<KeyPlan>* plans,
             const std::vector<uint64_t>& lease_ids, const std::vector<ReadTracker::Mark*>& marks)
      MC_EXCLUDES(mu_);
  // The sessions' plans; INVALID_PARAMS (logged) for a key without one.
  std::vector<KeyPlan> Find(const std::vector<std::string>& keys) MC_EXCLUDES(mu_);
  // Ends the sessions of the keys where end[i] (a lapsed lease); their reads did not complete.
  void EndWhere(const std::vector<std::string>& keys, const std::vector<char>& end)
      MC_EXCLUDES(mu_);
  // batch_get_session_end: their reads completed (a forced remove may free at once).
  void End(const std::vector<std::string>& keys) MC_EXCLUDES(mu_);

 private:
  struct Session {
    KeyPlan plan;
    uint64_t lease_id = 0;
    ReadTracker::Mark* mark = nullptr;
    uint64_t hash = 0;  // ReadTracker::Hash of the key
  };
  using Map = std::unordered_map<std::string, Session>;
  void EndLocked(Map::iterator it, uint64_t lease_id) MC_REQUIRES(mu_);

  ReadTracker* const reads_;
  Mutex mu_;  // before the ReadTracker's
  Map sessions_ MC_GUARDED_BY(mu_);
};

class PutSessions {
 public:
  struct Session {
    uint64_t size = 0;
    std::vector<rpc::Replica> replicas;
    int writing = 0;  // BeginWrite calls not yet ended; Close waits for them
  };

  // The indices of the keys without an open session (the others logged).
  std::vector<size_t> Absent(const std::vector<std::string>& keys) MC_EXCLUDES(mu_);
  void Open(const std::string& key, uint64_t size, std::vector<rpc::Replica> replicas)
      MC_EXCLUDES(mu_);
  // Per key its session, counted as written to until EndWrites (null: none; logged).
  std::vector<Session*> BeginWrites(const std::vector<std::string>& keys) MC_EXCLUDES(mu_);
  void EndWrites(const std::vector<Session*>& sessions) MC_EXCLUDES(mu_);
  // Ends the key's session once its writes in flight have ended (the engine bounds them);
  // false when it had none.
  bool Close(const std::string& key) MC_EXCLUDES(mu_);

 private:
  Mutex mu_;
  CondVar written_;
  std::unordered_map<std::string, Session> sessions_ MC_GUARDED_BY(mu_);
};

}  // namespace store
}  // namespace mooncake
