// MasterService: the read-only views behind the master's HTTP endpoints (master_http.h).
#include <algorithm>

#include "store/common/limits.h"
#include "store/master/master_service.h"
#include "store/master/master_service_internal.h"
#include "store/tenants/tenant_id.h"

namespace mooncake {
namespace store {

ErrorCode MasterService::QueryKey(const std::string& key, std::vector<ReplicaView>* replicas,
                                  const std::string& tenant) const {
  replicas->clear();
  if (key.empty() || key.size() > kMaxKeyBytes) return ErrorCode::INVALID_KEY;
  if (multi_tenants() && !TenantIdProblem(tenant).empty()) return ErrorCode::INVALID_PARAMS;
  const std::string stored = multi_tenants() ? ScopedKey(tenant, key) : key;
  MutexLock lock(&mu_);
  auto it = objects_.find(stored);
  if (it == objects_.end() || !it->second.complete) return ErrorCode::OBJECT_NOT_FOUND;
  for (const auto& p : it->second.replicas) {
    auto found = segments_.find(p.segment_id);
    if (found == segments_.end() || found->second->draining) continue;  // being unmounted
    const Segment& seg = *found->second;
    replicas->push_back(ReplicaView{seg.name, seg.base + p.offset, it->second.size});
  }
  return replicas->empty() ? ErrorCode::OBJECT_NOT_FOUND : ErrorCode::OK;
}

std::vector<std::string> MasterService::ListKeys(size_t max_keys, size_t max_bytes,
                                                 size_t* total, const std::string& tenant) const {
  std::vector<std::string> keys;
  size_t bytes = 0;
  *total = 0;
  MutexLock lock(&mu_);
  if (multi_tenants()) {  // the tenant's keys, as it sent them; the total needs the whole walk
    for (const auto& [key, obj] : objects_) {
      if (!obj.complete || TenantOf(key) != tenant) continue;
      ++*total;
      const std::string_view local = LocalKey(key);
      if (keys.size() >= max_keys || bytes + local.size() > max_bytes) continue;
      keys.emplace_back(local);
      bytes += local.size();
    }
    return keys;
  }
  // Complete objects are all objects but the ones in flight.
  *total = objects_.size() - std::min(objects_.size(), in_flight_.size());
  for (const auto& [key, obj] : objects_) {
    if (keys.size() >= max_keys || bytes + key.size() > max_bytes) break;
    if (!obj.complete) continue;
    keys.push_back(key);
    bytes += key.size();
  }
  return keys;
}

std::vector<MasterService::SegmentView> MasterService::ListSegments(size_t max_segments,
                                                                    size_t* total) const {
  std::vector<SegmentView> out;
  MutexLock lock(&mu_);
  *total = placeable_.size();
  for (const auto& [id, seg] : placeable_) {  // in mount order
    if (out.size() >= max_segments) break;
    out.push_back(SegmentView{seg->name, seg->client_id, seg->base, seg->size,
                              seg->alloc.allocated()});
  }
  return out;
}

MasterService::Summary MasterService::GetSummary() const {
  Summary s;
  MutexLock lock(&mu_);
  s.capacity = CapacityLocked();
  s.allocated = AllocatedLocked();
  s.keys = objects_.size();
  s.segments = placeable_.size();
  s.clients = clients_.size();
  const auto now = now_();
  for (const auto& [key, obj] : objects_) {
    if (obj.soft_pin && obj.last_access + obj.soft_pin_ttl > now) ++s.soft_pinned_keys;
  }
  return s;
}

}  // namespace store
}  // namespace mooncake
