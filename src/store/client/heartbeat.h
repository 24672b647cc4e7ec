// Heartbeat: a thread that calls `beat` every `interval` until Stop (the client's ping of
// the master, which remounts its segment when the master no longer knows it).
//
// Lock: mu_, a leaf (beat runs without it).
#pragma once

#include <chrono>
#include <functional>
#include <thread>

#include "common/thread_annotations.h"

namespace mooncake {
namespace store {

class Heartbeat {
 public:
  Heartbeat(std::chrono::milliseconds interval, std::function<void()> beat)
      : interval_(interval), beat_(std::move(beat)) {}
  ~Heartbeat() { Stop(); }
  void Start();
  // Wakes the thread and joins it (a beat in progress ends first). Idempotent.
  void Stop() MC_EXCLUDES(mu_);

 private:
  void Loop() MC_EXCLUDES(mu_);

  const std::chrono::milliseconds interval_;
  const std::function<void()> beat_;
  Mutex mu_;
  CondVar wake_;
  bool stopping_ MC_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace store
}  // namespace mooncake
