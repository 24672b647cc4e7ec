// Locks the compiler checks: clang's thread-safety analysis (-Wthread-safety; see
// scripts/check_thread_safety.sh, run by CI) reads these annotations; other compilers see
// nothing. A member written `T x MC_GUARDED_BY(mu_);` may only be touched with mu_ held, a
// function `void F() MC_REQUIRES(mu_);` only called with it held, and `MC_EXCLUDES(mu_)`
// only without it. Use Mutex / MutexLock / CondVar (std::mutex carries no annotations in
// libstdc++), and write condition waits as loops (`while (!ready_) cv_.Wait(&mu_);`): the
// analysis cannot see that a predicate lambda runs under the lock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define MC_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define MC_THREAD_ANNOTATION(x)
#endif

#define MC_CAPABILITY(x) MC_THREAD_ANNOTATION(capability(x))
#define MC_SCOPED_CAPABILITY MC_THREAD_ANNOTATION(scoped_lockable)
#define MC_GUARDED_BY(x) MC_THREAD_ANNOTATION(guarded_by(x))
#define MC_PT_GUARDED_BY(x) MC_THREAD_ANNOTATION(pt_guarded_by(x))
#define MC_ACQUIRED_BEFORE(...) MC_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define MC_ACQUIRED_AFTER(...) MC_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define MC_REQUIRES(...) MC_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define MC_ACQUIRE(...) MC_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define MC_RELEASE(...) MC_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define MC_TRY_ACQUIRE(...) MC_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define MC_EXCLUDES(...) MC_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define MC_ASSERT_CAPABILITY(x) MC_THREAD_ANNOTATION(assert_capability(x))
#define MC_RETURN_CAPABILITY(x) MC_THREAD_ANNOTATION(lock_returned(x))
// Shared (reader) holds of an RwMutex.
#define MC_ACQUIRE_SHARED(...) MC_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define MC_RELEASE_SHARED(...) MC_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define MC_RELEASE_GENERIC(...) MC_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define MC_REQUIRES_SHARED(...) MC_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
// For the few functions whose locking the analysis cannot follow; say why beside it.
#define MC_NO_THREAD_SAFETY_ANALYSIS MC_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace mooncake {

class CondVar;

// A std::mutex the analysis knows. Not recursive.
class MC_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() MC_ACQUIRE() { mu_.lock(); }
  void Unlock() MC_RELEASE() { mu_.unlock(); }
  bool TryLock() MC_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the caller holds it (where it cannot see why).
  void AssertHeld() const MC_ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope.
class MC_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) MC_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() MC_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable over a Mutex. Every wait needs the mutex held and holds it again when
// it returns; wake-ups may be spurious, so wait in a loop over the condition.
class CondVar {
 public:
  void Wait(Mutex* mu) MC_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // False once `deadline` has passed (the condition may still have changed: check it).
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline) MC_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  template <class Rep, class Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> d) MC_REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() +
                             std::chrono::duration_cast<std::chrono::steady_clock::duration>(d));
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// A std::shared_mutex the analysis knows.
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
