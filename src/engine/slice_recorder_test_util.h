// SliceRecorder: a SliceHook for transport tests, recording each slice's result (and the
// first failure message) so a test can submit slices straight to a Transport and wait.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "engine/transport.h"

namespace mooncake::testing_util {

class SliceRecorder : public SliceHook {
 public:
  void OnSliceDone(const Slice&, TransferStatusEnum result, uint64_t bytes,
                   const char* message) override {
    std::lock_guard lock(mu_);
    results_.push_back(result);
    bytes_ += bytes;
    if (message != nullptr && message_.empty()) message_ = message;
    cv_.notify_all();
  }
  // Waits for `n` reports (10 s at most).
  bool Wait(size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return results_.size() >= n; });
  }
  std::vector<TransferStatusEnum> results() {
    std::lock_guard lock(mu_);
    return results_;
  }
  std::string message() {
    std::lock_guard lock(mu_);
    return message_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<TransferStatusEnum> results_;
  uint64_t bytes_ = 0;
  std::string message_;
};

}  // namespace mooncake::testing_util
