// MasterService: strict multi-tenant mode (src/store/tenants/tenant_id.h). Keys are scoped at
// the RPC boundary (ScopeRequest), so the tables hold each tenant's objects under their own
// keys and every rule of the master applies per tenant as it is; what needs the tenant is
// here: admission against the quota (with eviction of the tenant's own objects to make room),
// the charges, the policies, and the tenants' metrics.
#include <glog/logging.h>

#include <sstream>

#include "store/common/metrics_text.h"
#include "store/master/master_service.h"
#include "store/master/master_service_internal.h"
#include "store/tenants/tenant_id.h"

namespace mooncake {
namespace store {

namespace {

// The request's tenant ("" is the default one, as an older client sends), or why not.
std::string RequestTenant(const std::string& sent, std::string* tenant) {
  *tenant = sent.empty() ? std::string(kDefaultTenant) : sent;
  const std::string problem = TenantIdProblem(*tenant);
  return problem.empty() ? "" : problem + " (tenant_id is set by the client's setup)";
}

// Objects the quota eviction looks at per admission: a tenant over its quota with few
// evictable objects among many others' costs a bounded walk.
constexpr size_t kMaxTenantEvictScan = 1 << 16;


}  // namespace

namespace {

// Strict mode: `req`'s tenant (an empty one is the default) checked and set on it, and each
// key for_each_key names made that tenant's scoped key; else why the tenant is refused.
template <class Req, class ForEachKey>
std::string ScopeWith(Req* req, ForEachKey&& for_each_key) {
  std::string t;
  const std::string problem = RequestTenant(req->tenant_id(), &t);
  if (!problem.empty()) return problem;
  for_each_key([&t](std::string* key) { *key = ScopedKey(t, *key); });
  req->set_tenant_id(t);
  return "";
}

}  // namespace

std::string MasterService::ScopeRequest(rpc::PutStartRequest* req) {
  if (!config_.enable_multi_tenants) return "";
  return CountIfRefused(ScopeWith(req, [req](auto&& scope) {
    for (auto& item : *req->mutable_items()) scope(item.mutable_key());
  }));
}

std::string MasterService::ScopeRequest(rpc::KeysRequest* req) {
  if (!config_.enable_multi_tenants) return "";
  return CountIfRefused(ScopeWith(req, [req](auto&& scope) {
    for (std::string& key : *req->mutable_keys()) scope(&key);
  }));
}

std::string MasterService::ScopeRequest(rpc::RemoveByRegexRequest* req) {
  if (!config_.enable_multi_tenants) return "";
  return CountIfRefused(ScopeWith(req, [](auto&&) {}));  // no keys: the tenant says whose objects
}

std::string MasterService::ScopeRequest(rpc::ReplicaClearRequest* req) {
  if (!config_.enable_multi_tenants) return "";
  return CountIfRefused(ScopeWith(req, [req](auto&& scope) {
    for (std::string& key : *req->mutable_keys()) scope(&key);
  }));
}

std::string MasterService::ScopeRequest(rpc::ReplicaTaskRequest* req) {
  if (!config_.enable_multi_tenants) return "";
  return CountIfRefused(ScopeWith(req, [req](auto&& scope) { scope(req->mutable_key()); }));
}

std::string MasterService::ScopeRequest(rpc::QueryTaskRequest* req) {
  if (!config_.enable_multi_tenants) return "";
  return CountIfRefused(ScopeWith(req, [](auto&&) {}));  // no key: the tenant whose task it is
}

std::string MasterService::CountIfRefused(std::string problem) {
  if (!problem.empty()) {
    MutexLock lock(&mu_);
    ++counters_.refused_requests;
  }
  return problem;
}

void MasterService::UnscopeReply(rpc::ReplicaClearResponse* resp) const {
  if (!config_.enable_multi_tenants) return;
  for (std::string& key : *resp->mutable_cleared_keys()) key = std::string(LocalKey(key));
}

std::string MasterService::StoredKeyProblem(const std::string& key) const {
  return config_.enable_multi_tenants ? ScopedKeyProblem(key) : KeyProblem(key);
}

void MasterService::ChargeLocked(const std::string& key, uint64_t bytes) {
  if (config_.enable_multi_tenants && !standby_) tenants_.Charge(TenantOf(key), bytes);
}

void MasterService::UnchargeLocked(const std::string& key, uint64_t bytes) {
  if (config_.enable_multi_tenants && !standby_) tenants_.Release(TenantOf(key), bytes);
}

bool MasterService::AdmitLocked(const std::string& key, uint64_t bytes,
                                rpc::PutStartResult* result, Clock::time_point now) {
  if (!config_.enable_multi_tenants) return true;
  const std::string_view tenant = TenantOf(key);
  uint64_t deficit = 0;
  ErrorCode code = tenants_.Admit(tenant, bytes, admit_capacity_, &deficit);
  // Evicting helps only when the put fits the quota at all (deficit <= charged), and is
  // tried once per request: a batch of an over-quota tenant whose objects are all leased
  // must not walk the lists once per key.
  const bool fits = deficit <= tenants_.Charged(tenant);
  if (code == ErrorCode::TENANT_QUOTA_EXCEEDED && fits && !quota_evict_failed_) {
    if (EvictTenantLocked(tenant, deficit, now) == 0) quota_evict_failed_ = true;
    code = tenants_.Admit(tenant, bytes, admit_capacity_, &deficit);
  }
  if (code == ErrorCode::OK) return true;
  result->set_code(Code(code));
  if (code == ErrorCode::TENANT_NOT_REGISTERED) {
    ++unregistered_rejects_;
    result->set_message("tenant '" + std::string(tenant) +
                        "' has no quota policy on this master (strict multi-tenant mode): add "
                        "it to the policy, or PUT /api/v1/tenant_quotas?tenant_id=" +
                        std::string(tenant));
  } else {
    ++tenant_counters_[std::string(tenant)].quota_rejects;
    TenantSnapshot s;
    if (auto snap = tenants_.Snapshot(tenant, CapacityLocked())) s = *snap;
    result->set_message("tenant '" + std::string(tenant) + "' holds " +
                        std::to_string(s.charged_bytes) + " bytes of its quota of " +
                        std::to_string(s.effective_quota_bytes) + " and this put needs " +
                        std::to_string(bytes) +
                        (fits ? " more; not enough of its objects could be evicted for it "
                                "(leased, pinned or being written): remove some, or raise its "
                                "quota"
                              : " more, over its whole quota: raise the quota"));
  }
  return false;
}

uint64_t MasterService::EvictTenantLocked(std::string_view tenant, uint64_t needed,
                                          Clock::time_point now) {
  if (lease_floor_ > now) return 0;  // just promoted: nothing freed would be reusable
  // The victims first, erased only when they free enough: a put that cannot be admitted
  // anyway takes nothing of the tenant's cache with it.
  uint64_t freed = 0;
  size_t looked = 0;
  std::vector<ObjectEntry*> victims;
  for (RecordList<ObjectEntry>* list : {&lru_, &pinned_lru_}) {
    for (ObjectEntry* e = list->front(); e != nullptr && freed < needed &&
                                         looked < kMaxTenantEvictScan;
         e = list->next(e)) {
      ++looked;
      const Object& obj = e->second;
      if (TenantOf(e->first) != tenant || Leased(obj, now) || CopyingLocked(e->first)) continue;
      if (list == &pinned_lru_ && obj.last_access + obj.soft_pin_ttl > now) continue;
      freed += obj.size * obj.replicas.size();
      victims.push_back(e);
    }
  }
  if (freed < needed) return 0;
  for (ObjectEntry* victim : victims) EraseObjectLocked(objects_.find(victim->first), now);
  if (freed > 0) {  // upstream counts these apart from the pool's evictions, as here
    tenant_counters_[std::string(tenant)].evicted_bytes += freed;
    VLOG(1) << "tenant " << tenant << ": evicted " << freed << " bytes within its quota";
  }
  return freed;
}

void MasterService::RechargeLocked() {
  if (!config_.enable_multi_tenants) return;
  tenants_.ClearCharges();
  for (const auto& [key, obj] : objects_) tenants_.Charge(TenantOf(key), InFlightBytes(obj));
  for (const auto& [key, obj] : upserts_) tenants_.Charge(TenantOf(key), InFlightBytes(obj));
  for (const auto& [key, obj] : copies_) tenants_.Charge(TenantOf(key), InFlightBytes(obj));
}

void MasterService::SetTenantPolicies(const TenantPolicies& policies) {
  MutexLock lock(&mu_);
  tenants_.SetPolicies(policies);
}

TenantPolicies MasterService::GetTenantPolicies() const {
  MutexLock lock(&mu_);
  return tenants_.Policies();
}

ErrorCode MasterService::UpsertTenantPolicy(const std::string& tenant, uint64_t bytes,
                                            TenantSnapshot* now) {
  if (!config_.enable_multi_tenants) return ErrorCode::UNAVAILABLE_IN_CURRENT_MODE;
  if (!TenantIdProblem(tenant).empty()) return ErrorCode::INVALID_PARAMS;
  MutexLock lock(&mu_);
  const ErrorCode code = tenants_.Upsert(tenant, bytes);
  if (code == ErrorCode::OK && now != nullptr) *now = *tenants_.Snapshot(tenant, CapacityLocked());
  return code;
}

ErrorCode MasterService::DeleteTenantPolicy(const std::string& tenant, TenantSnapshot* last) {
  if (!config_.enable_multi_tenants) return ErrorCode::UNAVAILABLE_IN_CURRENT_MODE;
  if (!TenantIdProblem(tenant).empty()) return ErrorCode::INVALID_PARAMS;
  MutexLock lock(&mu_);
  return tenants_.RemoveIfEmpty(tenant, last);
}

std::vector<TenantSnapshot> MasterService::TenantSnapshots() const {
  MutexLock lock(&mu_);
  return tenants_.Snapshots(CapacityLocked());
}

ErrorCode MasterService::TenantSnapshotOf(const std::string& tenant, TenantSnapshot* out) const {
  if (!config_.enable_multi_tenants) return ErrorCode::UNAVAILABLE_IN_CURRENT_MODE;
  if (!TenantIdProblem(tenant).empty()) return ErrorCode::INVALID_PARAMS;
  MutexLock lock(&mu_);
  auto snap = tenants_.Snapshot(tenant, CapacityLocked());
  if (!snap) return ErrorCode::TENANT_NOT_REGISTERED;
  *out = *snap;
  return ErrorCode::OK;
}

std::string MasterService::TenantMetricsLocked() {
  if (!config_.enable_multi_tenants) return "";
  std::ostringstream out;
  const auto snaps = tenants_.Snapshots(CapacityLocked());
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
    for (const TenantSnapshot& s : snaps) {
      out << name << "{tenant_id=\"" << PromLabelValue(s.tenant_id) << "\"} " << value(s) << "\n";
    }
  };
  family("mooncake_tenant_quota_requested_bytes", "gauge", "Requested tenant quota in bytes",
         [](const TenantSnapshot& s) { return s.requested_quota_bytes; });
  family("mooncake_tenant_quota_effective_bytes", "gauge",
         "Effective tenant quota in bytes (the pool shared in proportion when overbooked)",
         [](const TenantSnapshot& s) { return s.effective_quota_bytes; });
  family("mooncake_tenant_quota_charged_bytes", "gauge",
         "Memory replica bytes charged to the tenant (complete and in flight)",
         [](const TenantSnapshot& s) { return s.charged_bytes; });
  family("mooncake_tenant_quota_admission_closed", "gauge",
         "1 when the tenant's writes are refused (no policy)",
         [](const TenantSnapshot& s) { return s.admission_closed ? 1 : 0; });
  family("mooncake_tenant_quota_over_quota", "gauge", "1 when the tenant holds more than its quota",
         [](const TenantSnapshot& s) { return s.over_quota ? 1 : 0; });
  out << "# HELP mooncake_tenant_quota_reject_total Total number of tenant quota admission rejects\n"
      << "# TYPE mooncake_tenant_quota_reject_total counter\n";
  for (const auto& [t, c] : tenant_counters_) {
    out << "mooncake_tenant_quota_reject_total{tenant_id=\"" << PromLabelValue(t)
        << "\",reason=\"quota_exceeded\"} " << c.quota_rejects << "\n";
  }
  out << "mooncake_tenant_quota_reject_total{tenant_id=\"_unregistered\",reason=\"not_registered\"} "
      << unregistered_rejects_ << "\n";
  out << "# HELP mooncake_tenant_evict_bytes_total Total bytes evicted by tenant-scoped quota eviction\n"
      << "# TYPE mooncake_tenant_evict_bytes_total counter\n";
  for (const auto& [t, c] : tenant_counters_) {
    out << "mooncake_tenant_evict_bytes_total{tenant_id=\"" << PromLabelValue(t) << "\"} " << c.evicted_bytes
        << "\n";
  }
  return out.str();
}

}  // namespace store
}  // namespace mooncake
