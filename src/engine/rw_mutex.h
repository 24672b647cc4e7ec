// RwMutex: a std::shared_mutex the thread-safety analysis knows (common/thread_annotations.h
// has only the exclusive Mutex). Readers hold it with ReaderLock, writers with WriterLock; a
// member `T x MC_GUARDED_BY(mu_)` may then be read under either and written only under
// WriterLock. Functions that need it held say MC_REQUIRES(mu_) (exclusive) or
// MC_REQUIRES_SHARED(mu_) (either).
#pragma once

#include <shared_mutex>

#include "common/thread_annotations.h"

#define MC_ACQUIRE_SHARED(...) MC_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define MC_RELEASE_SHARED(...) MC_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define MC_RELEASE_GENERIC(...) MC_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define MC_REQUIRES_SHARED(...) MC_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))

namespace mooncake {

class MC_CAPABILITY("mutex") RwMutex {
 public:
  RwMutex() = default;
  RwMutex(const RwMutex&) = delete;
  RwMutex& operator=(const RwMutex&) = delete;

  void Lock() MC_ACQUIRE() { mu_.lock(); }
  void Unlock() MC_RELEASE() { mu_.unlock(); }
  void ReaderLock() MC_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void ReaderUnlock() MC_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds `mu` exclusively for its scope.
class MC_SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(RwMutex* mu) MC_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterLock() MC_RELEASE() { mu_->Unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  RwMutex* const mu_;
};

// Holds `mu` shared for its scope.
class MC_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(RwMutex* mu) MC_ACQUIRE_SHARED(mu) : mu_(mu) { mu_->ReaderLock(); }
  ~ReaderLock() MC_RELEASE_GENERIC() { mu_->ReaderUnlock(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  RwMutex* const mu_;
};

}  // namespace mooncake
