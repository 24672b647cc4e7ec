// SegmentCache: peer segment names -> checked ids -> last fetched descriptors.
//
// Ids are handed out from 1 upward, one per distinct name, and never reused. A descriptor is
// fetched on first open, again on Refresh (e.g. a remote range not found in the cached copy,
// or a failed transfer), and after Invalidate on next use. Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/thread_annotations.h"
#include "metadata/segment_desc.h"
#include "mooncake/status.h"
#include "mooncake/types.h"

namespace mooncake {

class SegmentCache {
 public:
  using DescPtr = std::shared_ptr<const SegmentDesc>;
  // Fetches a descriptor by segment name (handshake or store). Called without locks held.
  using Fetcher = std::function<Result<DescPtr>(const std::string& name)>;
  // Called when a refresh finds a changed descriptor (old, new).
  using ChangeListener = std::function<void(const SegmentDesc& old_desc, const SegmentDesc&)>;

  SegmentCache(Fetcher fetcher, ChangeListener on_change);

  // Returns the id of `name`, fetching its descriptor if it has none cached.
  Result<SegmentID> Open(const std::string& name) MC_EXCLUDES(mu_);
  // The cached descriptor of `id`, fetched if invalidated. NotFound for an unknown id.
  Result<DescPtr> Get(SegmentID id) MC_EXCLUDES(mu_);
  // Fetches anew; returns the new descriptor.
  Result<DescPtr> Refresh(SegmentID id) MC_EXCLUDES(mu_);
  Status Invalidate(SegmentID id) MC_EXCLUDES(mu_);
  // Marks stale (refetched on next use) every entry opened as `name` or whose descriptor
  // names itself `name`; ids stay valid.
  void InvalidateByName(const std::string& name) MC_EXCLUDES(mu_);
  Result<std::string> NameOf(SegmentID id) const MC_EXCLUDES(mu_);

 private:
  struct Entry {
    std::string name;
    DescPtr desc;  // null when invalidated
    bool stale = false;  // InvalidateByName: refetch on next use, compare with `desc`
  };
  // Fetches without the lock (the fetcher may call out), then stores.
  Result<DescPtr> FetchAndStore(SegmentID id, const std::string& name) MC_EXCLUDES(mu_);

  Fetcher fetcher_;
  ChangeListener on_change_;
  mutable RwMutex mu_;
  std::vector<Entry> entries_ MC_GUARDED_BY(mu_);  // index id-1
  std::map<std::string, SegmentID> by_name_ MC_GUARDED_BY(mu_);
};

}  // namespace mooncake
