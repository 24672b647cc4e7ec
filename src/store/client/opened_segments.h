// OpenedSegments: the engine handles of the segments this client has copied to or from,
// opened on first use and kept until close (a batch's jobs mostly name a few segments).
//
// Lock: mu_, a leaf (the engine's OpenSegment runs outside it).
#pragma once

#include <string>
#include <unordered_map>

#include "common/thread_annotations.h"
#include "mooncake/status.h"
#include "mooncake/types.h"

namespace mooncake {
class TransferEngine;

namespace store {

class OpenedSegments {
 public:
  explicit OpenedSegments(TransferEngine* engine) : engine_(engine) {}
  ~OpenedSegments() { CloseAll(); }
  Result<SegmentID> Open(const std::string& name) MC_EXCLUDES(mu_);
  void CloseAll() MC_EXCLUDES(mu_);

 private:
  TransferEngine* const engine_;
  Mutex mu_;
  std::unordered_map<std::string, SegmentID> opened_ MC_GUARDED_BY(mu_);
};

}  // namespace store
}  // namespace mooncake
