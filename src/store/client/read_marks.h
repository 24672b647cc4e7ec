// ReadTracker: this client's reads in flight, per key, and the lease of each key's last
// completed read. A forced remove passes that lease id when no read of the key is in flight,
// so that the master may free the space at once (KeysRequest.read_lease_ids); RemoveAll /
// RemoveByRegex with force tell the master whether any read of ours is in flight
// (own_reads_done). A read is marked before its GetReplicaList is sent (the lease the
// master grants is then always covered by the mark) and unmarked after its copies.
//
// The marks are a fixed table of slots, one per key hash modulo its size (no allocation,
// nothing to clean up): keys that share a slot share its reader count and its last id,
// which can only hide an id (a read of another key in flight, or its id written last: the
// free then waits for the lease), never vouch for a read in flight.
//
// Lock: mu_, taken after GetSessions' (see sessions.h), with nothing else taken under it
// but the call passed to WhileNoneBegins.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/thread_annotations.h"

namespace mooncake {
namespace store {

class ReadTracker {
 public:
  struct Mark {
    int readers = 0;
    uint64_t done = 0;  // lease id of the last completed read of key `done_hash`
    uint64_t done_hash = 0;
    uint64_t epoch = 0;  // `done` counts only while this is the tracker's epoch
  };
  static constexpr size_t kSlots = 1 << 16;
  static uint64_t Hash(const std::string& key) { return std::hash<std::string>()(key); }

  ReadTracker() : slots_(kSlots) {}

  // One read of the keys of `hashes` begins: marks[i] is key i's slot (a stable address).
  void Begin(const std::vector<uint64_t>& hashes, std::vector<Mark*>* marks) MC_EXCLUDES(mu_);
  // The read begun with Begin ended; lease_ids[i] (0: none) was key i's lease.
  void End(const std::vector<Mark*>& marks, const std::vector<uint64_t>& hashes,
           const std::vector<uint64_t>& lease_ids) MC_EXCLUDES(mu_);
  // The same for a read of one key (a get session).
  Mark* BeginOne(uint64_t hash) MC_EXCLUDES(mu_);
  void EndOne(Mark* mark, uint64_t hash, uint64_t lease_id) MC_EXCLUDES(mu_);

  // For a forced remove of `keys`: per key, the lease id of its last completed read when no
  // read of its slot is in flight (then forgotten), else 0.
  std::vector<uint64_t> TakeIdle(const std::vector<std::string>& keys) MC_EXCLUDES(mu_);

  // Calls call(idle) while no read may begin; idle: none of this client's reads is in
  // flight (every remembered id is then forgotten: the call removes everything it names).
  template <class F>
  auto WhileNoneBegins(F&& call) MC_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    const bool idle = active_ == 0;
    if (idle) ++epoch_;
    return call(idle);
  }

 private:
  Mark* BeginLocked(uint64_t hash) MC_REQUIRES(mu_);
  void EndLocked(Mark* m, uint64_t hash, uint64_t lease_id) MC_REQUIRES(mu_);

  Mutex mu_;
  std::vector<Mark> slots_ MC_GUARDED_BY(mu_);
  uint64_t epoch_ MC_GUARDED_BY(mu_) = 1;
  size_t active_ MC_GUARDED_BY(mu_) = 0;  // reads in flight (a Begin not yet Ended)
};

}  // namespace store
}  // namespace mooncake
