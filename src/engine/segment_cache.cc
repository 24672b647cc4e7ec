#include "engine/segment_cache.h"

namespace mooncake {

SegmentCache::SegmentCache(Fetcher fetcher, ChangeListener on_change)
    : fetcher_(std::move(fetcher)), on_change_(std::move(on_change)) {}

Result<SegmentID> SegmentCache::Open(const std::string& name) {
  SegmentID stale_id = 0;  // known, but to refetch
  {
    ReaderLock lock(&mu_);
    auto it = by_name_.find(name);
    if (it != by_name_.end()) {
      const Entry& e = entries_[it->second - 1];
      if (e.desc && !e.stale) return it->second;
      if (e.stale) stale_id = it->second;
    }
  }
  if (stale_id != 0) {
    MC_RETURN_IF_ERROR(FetchAndStore(stale_id, name).status());
    return stale_id;
  }
  MC_ASSIGN_OR_RETURN(DescPtr desc, fetcher_(name));
  WriterLock lock(&mu_);
  auto it = by_name_.find(name);
  SegmentID id;
  if (it != by_name_.end()) {
    id = it->second;
  } else {
    entries_.push_back({name, nullptr});
    id = entries_.size();
    by_name_[name] = id;
  }
  if (!entries_[id - 1].desc) entries_[id - 1].desc = std::move(desc);
  return id;
}

Result<SegmentCache::DescPtr> SegmentCache::Get(SegmentID id) {
  std::string name;
  {
    ReaderLock lock(&mu_);
    if (id == 0 || id > entries_.size()) {
      return Status::NotFound("segment id " + std::to_string(id) +
                              " was not returned by OpenSegment");
    }
    if (entries_[id - 1].desc && !entries_[id - 1].stale) return entries_[id - 1].desc;
    name = entries_[id - 1].name;
  }
  return FetchAndStore(id, name);
}

Result<SegmentCache::DescPtr> SegmentCache::Refresh(SegmentID id) {
  MC_ASSIGN_OR_RETURN(std::string name, NameOf(id));
  return FetchAndStore(id, name);
}

Result<SegmentCache::DescPtr> SegmentCache::FetchAndStore(SegmentID id, const std::string& name) {
  MC_ASSIGN_OR_RETURN(DescPtr fresh, fetcher_(name));
  DescPtr old;
  {
    WriterLock lock(&mu_);
    old = entries_[id - 1].desc;
    entries_[id - 1].desc = fresh;
    entries_[id - 1].stale = false;
  }
  if (old && on_change_ && !old->SameContent(*fresh)) on_change_(*old, *fresh);
  return fresh;
}

Status SegmentCache::Invalidate(SegmentID id) {
  WriterLock lock(&mu_);
  if (id == 0 || id > entries_.size()) {
    return Status::NotFound("segment id " + std::to_string(id) + " is unknown");
  }
  entries_[id - 1].desc.reset();
  return Status::OK();
}

void SegmentCache::InvalidateByName(const std::string& name) {
  // Every entry that names this segment, or whose descriptor does: a peer opened under
  // several names (an alias address, a host name) is refetched under each.
  WriterLock lock(&mu_);
  for (Entry& e : entries_) {
    if (e.name == name || (e.desc && e.desc->name == name)) e.stale = true;
  }
}

Result<std::string> SegmentCache::NameOf(SegmentID id) const {
  ReaderLock lock(&mu_);
  if (id == 0 || id > entries_.size()) {
    return Status::NotFound("segment id " + std::to_string(id) + " is unknown");
  }
  return entries_[id - 1].name;
}

}  // namespace mooncake
