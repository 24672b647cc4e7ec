// IoHelper: a helper thread for disk I/O beside its owner's copies, one job at a time, kept
// between jobs and stopped once idle for a while. The offload worker keeps one for its bucket
// writes (DiskStore::Write's `helper`): each 8 MiB chunk is written on it while the next is
// filled; a thread started per chunk cost 0.5-1.8 ms on a busy 2-core VM, up to a third of the
// write (bench/results/2026-12-06-disk-io-helper.md). Owned by an object, never per thread
// (thread_local): a process forked while such a thread ran could not end a thread-local one.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

#include "common/thread_annotations.h"

namespace mooncake {
namespace store {
namespace disk {

class IoHelper {
 public:
  static constexpr std::chrono::milliseconds kIdleStop{2000};

  explicit IoHelper(std::chrono::milliseconds idle_stop = kIdleStop) : idle_stop_(idle_stop) {}
  ~IoHelper();  // waits for a posted job, then stops the thread
  IoHelper(const IoHelper&) = delete;
  IoHelper& operator=(const IoHelper&) = delete;

  // Post and Wait: called by one thread at a time (another may follow once the first is done,
  // as Close's final flush follows the stopped offload worker).
  // Runs `job` on the helper thread, started if it is not running; false (and `job` is not
  // run) when no thread can be started. One job at a time: a Post waits for the previous job
  // to end first.
  [[nodiscard]] bool Post(std::function<void()> job) MC_EXCLUDES(mu_);
  // Returns once the posted job (if any) has ended; what it wrote is then visible here.
  void Wait() MC_EXCLUDES(mu_);
  // Whether the helper thread runs now (it stops after idle_stop without a job).
  bool running() MC_EXCLUDES(mu_);

 private:
  void Run() MC_EXCLUDES(mu_);

  const std::chrono::milliseconds idle_stop_;
  Mutex mu_;
  CondVar cv_;
  std::function<void()> job_ MC_GUARDED_BY(mu_);
  bool busy_ MC_GUARDED_BY(mu_) = false;     // a job posted and not ended
  bool running_ MC_GUARDED_BY(mu_) = false;  // a thread runs Run (or is about to)
  bool stop_ MC_GUARDED_BY(mu_) = false;
  std::thread thread_;  // the owner's: started and joined by Post and the destructor
};

}  // namespace disk
}  // namespace store
}  // namespace mooncake
