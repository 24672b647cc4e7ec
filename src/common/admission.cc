#include "common/admission.h"

#include <glog/logging.h>

namespace mooncake {

void Admission::Add(const std::string& address) {
  ++live_;
  if (limits_.max_per_address > 0) ++per_address_[address];
}

void Admission::Remove(const std::string& address) {
  --live_;
  if (limits_.max_per_address == 0) return;
  auto it = per_address_.find(address);
  if (it != per_address_.end() && --it->second == 0) per_address_.erase(it);
}

size_t Admission::live(const std::string& address) const {
  auto it = per_address_.find(address);
  return it == per_address_.end() ? 0 : it->second;
}

Admission::Cap Admission::Check(const std::string& address) const {
  if (limits_.max_per_address > 0 && live(address) >= limits_.max_per_address) {
    return Cap::kAddress;
  }
  return live_ >= limits_.max_connections ? Cap::kTotal : Cap::kNone;
}

void Admission::Note(uint64_t AdmissionCounters::*which, const std::string& why) {
  ++(counters_.*which);
  ++unlogged_;
  auto now = std::chrono::steady_clock::now();
  if (now - last_log_ < std::chrono::seconds(10)) return;
  LOG(WARNING) << name_ << ": turned away " << unlogged_
               << " connection(s) since the last report (last: " << why << "; totals: "
               << counters_.refused_full << " full, " << counters_.refused_address
               << " per-address cap, " << counters_.thread_failures << " without a thread, "
               << counters_.evicted << " closed to make room, " << counters_.deadline_closed
               << " past a deadline)";
  last_log_ = now;
  unlogged_ = 0;
}

}  // namespace mooncake
