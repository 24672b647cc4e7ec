#include "store/disk/io_helper.h"

#include <system_error>

namespace mooncake {
namespace store {
namespace disk {

IoHelper::~IoHelper() {
  {
    MutexLock l(&mu_);
    while (busy_) cv_.Wait(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

bool IoHelper::Post(std::function<void()> job) {
  bool start = false;
  {
    MutexLock l(&mu_);
    while (busy_) cv_.Wait(&mu_);
    job_ = std::move(job);
    busy_ = true;
    start = !running_;
    running_ = true;
  }
  if (!start) {
    cv_.SignalAll();
    return true;
  }
  if (thread_.joinable()) thread_.join();  // the one that stopped idle has returned or soon will
  try {
    thread_ = std::thread([this] { Run(); });
    return true;
  } catch (const std::system_error&) {
  }
  MutexLock l(&mu_);  // no thread: nothing posted
  job_ = nullptr;
  busy_ = false;
  running_ = false;
  return false;
}

void IoHelper::Wait() {
  MutexLock l(&mu_);
  while (busy_) cv_.Wait(&mu_);
}

bool IoHelper::running() {
  MutexLock l(&mu_);
  return running_;
}

void IoHelper::Run() {
  for (;;) {
    std::function<void()> job;
    {
      MutexLock l(&mu_);
      const auto idle_until = std::chrono::steady_clock::now() + idle_stop_;
      while (!stop_ && !busy_ && cv_.WaitUntil(&mu_, idle_until)) {
      }
      if (!busy_) {  // stopping, or idle long enough
        running_ = false;
        return;
      }
      job = std::move(job_);
      job_ = nullptr;
    }
    job();
    job = nullptr;  // its captures go before the owner hears it ended
    {
      MutexLock l(&mu_);
      busy_ = false;
    }
    cv_.SignalAll();
  }
}

}  // namespace disk
}  // namespace store
}  // namespace mooncake
