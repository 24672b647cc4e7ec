// Registrations: the memory a StoreClient may move without staging it (its segment, its
// local buffer, the caller's register_buffer ranges, allocate_shared_buffer's pools), and
// the ranges registered again inside a pool (upstream's dummies register slices of their
// pool, which is registered as a whole already). The engine registration itself is the
// caller's (StoreClient); this only remembers what is registered.
//
// Lock: mu_, a leaf (nothing is called while it is held).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "common/thread_annotations.h"

namespace mooncake {
namespace store {

class Registrations {
 public:
  void Add(const void* p, size_t n) MC_EXCLUDES(mu_);
  // A pool of allocate_shared_buffer: registered, and freed by the client's close.
  void AddPool(void* p, size_t n) MC_EXCLUDES(mu_);
  // register_buffer of a range inside a pool: remembered (counted) and true; false when
  // [p, p + n) is not inside one.
  bool AddInPool(const void* p, size_t n) MC_EXCLUDES(mu_);

  enum class Removed { kInPool, kPool, kNotRegistered, kRemoved };
  // unregister_buffer: kInPool (one AddInPool undone), kPool (refused: a pool goes with
  // close), kNotRegistered, or kRemoved (the caller unregisters it from the engine).
  Removed Remove(const void* p) MC_EXCLUDES(mu_);

  // Whether [p, p + n) lies in one registration; *lo, *len: that registration.
  bool Find(const void* p, size_t n, uint64_t* lo, uint64_t* len) MC_EXCLUDES(mu_);
  bool Contains(const void* p, size_t n) {
    uint64_t lo, len;
    return Find(p, n, &lo, &len);
  }
  // Bytes from p to the end of the registration holding it (a range registered inside a
  // pool bounds it by its own size); 0 when p is in none.
  uint64_t Room(const void* p) MC_EXCLUDES(mu_);

  // Close: forgets everything and returns the pools, for the caller to free.
  std::vector<void*> Clear() MC_EXCLUDES(mu_);

 private:
  struct InPool {
    size_t size = 0;  // the largest registered at this start
    int count = 0;    // AddInPool calls not undone
  };
  bool InAPoolLocked(uintptr_t a, size_t n) MC_REQUIRES(mu_);

  Mutex mu_;
  std::map<uintptr_t, size_t> registered_ MC_GUARDED_BY(mu_);  // start -> length
  std::vector<void*> pools_ MC_GUARDED_BY(mu_);
  std::map<uintptr_t, InPool> in_pool_ MC_GUARDED_BY(mu_);
};

}  // namespace store
}  // namespace mooncake
