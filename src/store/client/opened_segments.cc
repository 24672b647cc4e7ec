#include "store/client/opened_segments.h"

#include "mooncake/transfer_engine.h"

namespace mooncake {
namespace store {

Result<SegmentID> OpenedSegments::Open(const std::string& name) {
  {
    MutexLock lock(&mu_);
    auto it = opened_.find(name);
    if (it != opened_.end()) return it->second;
  }
  MC_ASSIGN_OR_RETURN(SegmentID id, engine_->OpenSegment(name));
  MutexLock lock(&mu_);
  auto [it, inserted] = opened_.emplace(name, id);
  if (!inserted) (void)engine_->CloseSegment(id);  // another thread opened it meanwhile
  return it->second;
}

void OpenedSegments::CloseAll() {
  MutexLock lock(&mu_);
  for (const auto& [name, id] : opened_) (void)engine_->CloseSegment(id);
  opened_.clear();
}

}  // namespace store
}  // namespace mooncake
