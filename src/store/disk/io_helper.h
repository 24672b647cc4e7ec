// IoHelper: a helper thread for disk I/O beside its owner's copies, one job at a time.
// ForThisThread's is kept between jobs, and stops once idle for a while: a bucket's chunk
// writes go to it while the next chunk is filled (a thread started per 8 MiB chunk cost
// 0.5-1.8 ms on a busy 2-core VM, up to a third of the write:
// bench/results/2026-12-06-disk-io-helper.md), and an idle thread keeps nothing. A request's
// record reads use one of their own (a thread per request: record_read.cc says why).
// Internal to the disk folder.
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

  // The calling thread's helper. Only that thread may call Post and Wait on it.
  static IoHelper* ForThisThread();

  explicit IoHelper(std::chrono::milliseconds idle_stop = kIdleStop) : idle_stop_(idle_stop) {}
  ~IoHelper();  // waits for a posted job, then stops the thread
  IoHelper(const IoHelper&) = delete;
  IoHelper& operator=(const IoHelper&) = delete;

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
  std::thread thread_;  // the owner's only: started and joined by Post and the destructor
};

}  // namespace disk
}  // namespace store
}  // namespace mooncake
