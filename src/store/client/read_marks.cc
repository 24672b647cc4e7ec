#include "store/client/read_marks.h"

namespace mooncake {
namespace store {

ReadTracker::Mark* ReadTracker::BeginLocked(uint64_t hash) {
  Mark* m = &slots_[hash & (kSlots - 1)];
  ++m->readers;
  return m;
}

void ReadTracker::EndLocked(Mark* m, uint64_t hash, uint64_t lease_id) {
  --m->readers;
  if (lease_id != 0) {
    m->done = lease_id;
    m->done_hash = hash;
    m->epoch = epoch_;
  }
}

void ReadTracker::Begin(const std::vector<uint64_t>& hashes, std::vector<Mark*>* marks) {
  marks->resize(hashes.size());
  MutexLock lock(&mu_);
  ++active_;
  for (size_t i = 0; i < hashes.size(); ++i) (*marks)[i] = BeginLocked(hashes[i]);
}

void ReadTracker::End(const std::vector<Mark*>& marks, const std::vector<uint64_t>& hashes,
                      const std::vector<uint64_t>& lease_ids) {
  MutexLock lock(&mu_);
  --active_;
  for (size_t i = 0; i < marks.size(); ++i) EndLocked(marks[i], hashes[i], lease_ids[i]);
}

ReadTracker::Mark* ReadTracker::BeginOne(uint64_t hash) {
  MutexLock lock(&mu_);
  ++active_;
  return BeginLocked(hash);
}

void ReadTracker::EndOne(Mark* mark, uint64_t hash, uint64_t lease_id) {
  MutexLock lock(&mu_);
  --active_;
  EndLocked(mark, hash, lease_id);
}

std::vector<uint64_t> ReadTracker::TakeIdle(const std::vector<std::string>& keys) {
  std::vector<uint64_t> ids;
  ids.reserve(keys.size());
  MutexLock lock(&mu_);
  for (const auto& k : keys) {
    const uint64_t h = Hash(k);
    Mark& m = slots_[h & (kSlots - 1)];
    if (m.readers != 0 || m.done_hash != h || m.epoch != epoch_) {
      ids.push_back(0);
      continue;
    }
    ids.push_back(m.done);
    m.done = 0;
  }
  return ids;
}

}  // namespace store
}  // namespace mooncake
