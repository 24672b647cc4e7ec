#include "store/client/heartbeat.h"

namespace mooncake {
namespace store {

void Heartbeat::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Heartbeat::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void Heartbeat::Loop() {
  while (true) {
    {
      MutexLock lock(&mu_);
      const auto due = std::chrono::steady_clock::now() + interval_;
      while (!stopping_ && wake_.WaitUntil(&mu_, due)) {
      }
      if (stopping_) return;
    }
    beat_();
  }
}

void Worker::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Worker::Poke() {
  {
    MutexLock lock(&mu_);
    poked_ = true;
  }
  wake_.SignalAll();
}

void Worker::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void Worker::Loop() {
  while (true) {
    {
      MutexLock lock(&mu_);
      if (idle_.count() > 0) {
        const auto due = std::chrono::steady_clock::now() + idle_;
        while (!stopping_ && !poked_ && wake_.WaitUntil(&mu_, due)) {
        }
      } else {
        while (!stopping_ && !poked_) wake_.Wait(&mu_);
      }
      if (stopping_) return;
      poked_ = false;
    }
    work_();
  }
}

}  // namespace store
}  // namespace mooncake
