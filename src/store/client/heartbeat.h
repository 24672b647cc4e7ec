// Heartbeat: a thread that calls `beat` every `interval` until Stop (the client's ping of
// the master, which remounts its segment when the master no longer knows it).
// Worker: a thread that calls `work` after each Poke (pokes while it works coalesce into one
// more call), and every `idle` without one if `idle` is not zero, until Stop (the replica
// tasks the heartbeat hears of; the disk tier's offload).
//
// Locks: mu_ of each, a leaf (beat / work run without it).
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

class Worker {
 public:
  explicit Worker(std::function<void()> work,
                  std::chrono::milliseconds idle = std::chrono::milliseconds(0))
      : work_(std::move(work)), idle_(idle) {}
  ~Worker() { Stop(); }
  void Start();
  void Poke() MC_EXCLUDES(mu_);
  // Wakes the thread and joins it (a call of work in progress ends first). Idempotent.
  void Stop() MC_EXCLUDES(mu_);

 private:
  void Loop() MC_EXCLUDES(mu_);

  const std::function<void()> work_;
  const std::chrono::milliseconds idle_;
  Mutex mu_;
  CondVar wake_;
  bool poked_ MC_GUARDED_BY(mu_) = false;
  bool stopping_ MC_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace store
}  // namespace mooncake
