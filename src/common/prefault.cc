#include "common/prefault.h"

#include <glog/logging.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack the name
#endif

namespace mooncake {

class PrefaultJob {
 public:
  PrefaultJob(char* p, size_t len, std::string what, Prefaulter::Mode mode)
      : p_(p), len_(len), what_(std::move(what)), mode_(mode) {}
  char* const p_;
  const size_t len_;
  const std::string what_;
  const Prefaulter::Mode mode_;
  // Under the worker's mutex (which this class cannot name for the lock analysis).
  size_t done_ = 0;
  bool busy_ = false;    // a chunk is being populated (the range must stay mapped)
  bool ended_ = false;   // done, cancelled or failed: nothing more will touch the range
  bool cancelled_ = false;
  bool missed_ = false;  // kResidentOnly: this pass met pages the owner does not have yet
  int passes_left_ = 1;  // kResidentOnly: passes after this one
  std::chrono::steady_clock::time_point not_before_{};
};

namespace {

// One chunk at a time: a cancel waits at most for one (a few ms for 4 MiB of new pages).
constexpr size_t kChunk = 4u << 20;
// Memory is allocated only while the machine keeps max(1 GiB, an eighth of its memory)
// available (checked every 64 MiB): a segment larger than what is free is not made resident.
constexpr size_t kCheckEvery = 64u << 20;
// kResidentOnly walks at most the first 256 GiB of a range.
constexpr size_t kMaxResidentOnly = size_t{256} << 30;

// /proc/meminfo's MemAvailable below max(1 GiB, MemTotal / 8); false when unreadable.
bool LowOnMemory() {
  FILE* f = std::fopen("/proc/meminfo", "re");
  if (f == nullptr) return false;
  unsigned long long total = 0, avail = 0, v = 0;
  char line[256];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "MemTotal: %llu kB", &v) == 1) total = v;
    if (std::sscanf(line, "MemAvailable: %llu kB", &v) == 1) avail = v;
  }
  std::fclose(f);
  if (total == 0 || avail == 0) return false;
  const unsigned long long floor_kb = std::max(total / 8, 1ull << 20);
  return avail < floor_kb;
}

class Worker {
 public:
  static Worker* Get() {
    static Worker* w = [] {
      auto* made = new Worker();  // never destroyed: its thread may outlive main's statics
      // A fork while the thread holds mu_ must not leave the child a mutex no one will
      // release: the fork waits for it, and both sides release it.
      ::pthread_atfork(&Worker::ForkPrepare, &Worker::ForkRelease, &Worker::ForkRelease);
      return made;
    }();
    return w;
  }

  static void ForkPrepare() MC_NO_THREAD_SAFETY_ANALYSIS { Get()->mu_.Lock(); }
  static void ForkRelease() MC_NO_THREAD_SAFETY_ANALYSIS { Get()->mu_.Unlock(); }

  std::shared_ptr<PrefaultJob> Start(void* p, size_t len, std::string what, Prefaulter::Mode mode)
      MC_EXCLUDES(mu_) {
    auto job = std::make_shared<PrefaultJob>(static_cast<char*>(p), len, std::move(what), mode);
    MutexLock lock(&mu_);
    if (unsupported_) return nullptr;
    if (owner_pid_ == 0) {
      if (!KernelHasPopulateWrite()) {
        LOG(WARNING) << "prefault: this kernel has no MADV_POPULATE_WRITE (Linux 5.14+); "
                        "memory is faulted in on first use";
        unsupported_ = true;
        return nullptr;
      }
      owner_pid_ = ::getpid();
      std::thread([this] { Run(); }).detach();
    } else if (owner_pid_ != ::getpid()) {
      return nullptr;  // a forked child: the thread is the parent's
    }
    queue_.push_back(job);
    work_.Signal();
    return job;
  }

  void Cancel(PrefaultJob* job) MC_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    job->cancelled_ = true;
    work_.SignalAll();  // a worker waiting for this job's next pass ends it now
    if (owner_pid_ != ::getpid()) return;  // a forked child: no worker touches its memory
    while (job->busy_) changed_.Wait(&mu_);
  }

  bool WaitDone(PrefaultJob* job, int timeout_ms) MC_EXCLUDES(mu_) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    MutexLock lock(&mu_);
    while (!job->ended_) {
      if (owner_pid_ != ::getpid() || !changed_.WaitUntil(&mu_, deadline)) return job->ended_;
    }
    return true;
  }

  uint64_t Populated(PrefaultJob* job) MC_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return job->done_;
  }

 private:
  void Run() MC_EXCLUDES(mu_) {
    mu_.Lock();  // held but around each madvise, for the thread's life
    for (;;) {
      while (queue_.empty()) work_.Wait(&mu_);
      std::shared_ptr<PrefaultJob> job = queue_.front();
      if (!job->cancelled_ && job->done_ >= job->len_ && job->missed_ && job->passes_left_ > 0) {
        // Another pass over what the owner did not have, later, behind the other jobs.
        --job->passes_left_;
        job->done_ = 0;
        job->missed_ = false;
        job->not_before_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        queue_.pop_front();
        queue_.push_back(job);
        continue;
      }
      if (job->cancelled_ || job->done_ >= job->len_) {
        queue_.pop_front();
        job->ended_ = true;
        changed_.SignalAll();
        continue;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now < job->not_before_) {
        // A job that may run now goes first; else wait (a cancel or a new job wakes it).
        auto ready = std::find_if(queue_.begin(), queue_.end(), [&](const auto& j) {
          return j->cancelled_ || now >= j->not_before_;
        });
        if (ready != queue_.end()) {
          std::shared_ptr<PrefaultJob> r = *ready;
          queue_.erase(ready);
          queue_.push_front(std::move(r));
        } else {
          (void)work_.WaitUntil(&mu_, job->not_before_);
        }
        continue;
      }
      if (job->mode_ == Prefaulter::Mode::kAll && job->done_ % kCheckEvery == 0 && LowOnMemory()) {
        LOG(WARNING) << "prefault of " << job->what_ << " stopped after " << job->done_ << " of "
                     << job->len_ << " bytes: the machine has less than an eighth of its memory "
                     << "(at least 1 GiB) available; the rest is faulted in on use";
        job->cancelled_ = true;
        continue;
      }
      const size_t n = std::min(kChunk, job->len_ - job->done_);
      char* at = job->p_ + job->done_;
      const Prefaulter::Mode mode = job->mode_;
      job->busy_ = true;
      mu_.Unlock();
      bool missed = false;
      const int rc = mode == Prefaulter::Mode::kAll ? ::madvise(at, n, MADV_POPULATE_WRITE)
                                                    : PopulateResident(at, n, &missed);
      const int err = rc == 0 ? 0 : errno;
      mu_.Lock();
      job->missed_ |= missed;
      job->busy_ = false;
      if (rc == 0 || err == EINTR || err == EAGAIN) {
        if (rc == 0) job->done_ += n;
      } else {
        // ENOMEM (out of memory, or no longer mapped), EFAULT, EINVAL (a mapping that cannot
        // be populated: no access, device memory), EHWPOISON: the job ends; the pages left
        // are faulted in on use, as without a prefault.
        LOG(WARNING) << "prefault of " << job->what_ << " stopped after " << job->done_ << " of "
                     << job->len_ << " bytes: " << std::strerror(err);
        job->cancelled_ = true;
      }
      changed_.SignalAll();
    }
  }

  // Whether madvise knows MADV_POPULATE_WRITE (Linux 5.14+), tried on one private page.
  static bool KernelHasPopulateWrite() {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    void* p = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return true;  // cannot tell: the jobs will say
    const bool ok = ::madvise(p, page, MADV_POPULATE_WRITE) == 0;
    ::munmap(p, page);
    return ok;
  }

  // Populates the runs of [at, at + n) whose pages are in memory (mincore); *missed: some
  // were not. 0 or -1 with errno, as madvise.
  static int PopulateResident(char* at, size_t n, bool* missed) {
    static const size_t kPage = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> in((n + kPage - 1) / kPage);
    if (::mincore(at, n, in.data()) != 0) return -1;
    for (size_t i = 0; i < in.size();) {
      if (!(in[i] & 1)) {
        *missed = true;
        ++i;
        continue;
      }
      size_t j = i;
      while (j < in.size() && (in[j] & 1)) ++j;
      if (::madvise(at + i * kPage, std::min(n, j * kPage) - i * kPage, MADV_POPULATE_WRITE) != 0) {
        return -1;
      }
      i = j;
    }
    return 0;
  }

  Mutex mu_;
  CondVar work_, changed_;
  std::deque<std::shared_ptr<PrefaultJob>> queue_ MC_GUARDED_BY(mu_);
  pid_t owner_pid_ MC_GUARDED_BY(mu_) = 0;
  bool unsupported_ MC_GUARDED_BY(mu_) = false;  // probed at the first Start: no job ever runs
};

}  // namespace

bool Prefaulter::Enabled() {
  const char* v = std::getenv("MC_PREFAULT");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

std::shared_ptr<PrefaultJob> Prefaulter::Start(void* p, size_t len, std::string what, Mode mode) {
  if (p == nullptr || len == 0 || !Enabled()) return nullptr;
  // A peer's range is walked (mincore) page by page: a peer lending a huge sparse range must
  // not keep this thread busy for long (4 TiB is ~20 s of walking).
  if (mode == Mode::kResidentOnly) len = std::min(len, kMaxResidentOnly);
  return Worker::Get()->Start(p, len, std::move(what), mode);
}

void Prefaulter::Cancel(const std::shared_ptr<PrefaultJob>& job) {
  if (job) Worker::Get()->Cancel(job.get());
}

bool Prefaulter::WaitDone(const std::shared_ptr<PrefaultJob>& job, int timeout_ms) {
  return !job || Worker::Get()->WaitDone(job.get(), timeout_ms);
}

uint64_t Prefaulter::Populated(const std::shared_ptr<PrefaultJob>& job) {
  return job ? Worker::Get()->Populated(job.get()) : 0;
}

}  // namespace mooncake
