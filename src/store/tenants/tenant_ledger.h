// TenantLedger: the strict mode's per-tenant quotas (upstream's tenant quota table, our code).
//
// A tenant is registered when it has a policy (a requested quota, from the policy file or
// etcd, or the admin API); only registered tenants may write. Its charge is the bytes of its
// memory replicas: complete objects and puts / upserts in flight (size x replicas placed).
// The effective quota is the requested one while the requests add up to at most the pool's
// capacity; past that, the capacity is shared in proportion to the requests (largest
// remainders get the leftover bytes, ties by tenant id), as upstream's.
// Not thread safe: the master uses it under its lock.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake/store/error_code.h"

namespace mooncake {
namespace store {

struct TenantSnapshot {
  std::string tenant_id;
  uint64_t requested_quota_bytes = 0;
  uint64_t effective_quota_bytes = 0;
  uint64_t charged_bytes = 0;
  bool admission_closed = true;  // no policy: writes are refused
  bool over_quota = false;       // charged above the effective quota (the pool shrank)
  bool has_explicit_policy = false;
};

// tenant -> requested quota in bytes.
using TenantPolicies = std::map<std::string, uint64_t, std::less<>>;

class TenantLedger {
 public:
  TenantLedger() = default;
  TenantLedger(const TenantLedger&) = delete;  // remembers an iterator into itself
  TenantLedger& operator=(const TenantLedger&) = delete;
  // A requested quota must be in [1, kMaxQuotaBytes] (upstream's bound, 2^63 - 1).
  static constexpr uint64_t kMaxQuotaBytes = (uint64_t{1} << 63) - 1;

  // Replaces every policy (charges stay).
  void SetPolicies(const TenantPolicies& policies);
  TenantPolicies Policies() const;
  // INVALID_PARAMS for a quota outside [1, kMaxQuotaBytes].
  ErrorCode Upsert(const std::string& tenant, uint64_t requested_bytes);
  // OBJECT_NOT_FOUND: no policy; TENANT_NOT_EMPTY: the tenant holds memory. Else the policy
  // is gone (writes refused) and *last is the tenant's state just before.
  ErrorCode RemoveIfEmpty(const std::string& tenant, TenantSnapshot* last);

  bool Registered(std::string_view tenant) const;
  // Whether `bytes` more fit the tenant's quota at `capacity` (the pool's mounted bytes):
  // OK, TENANT_NOT_REGISTERED, or TENANT_QUOTA_EXCEEDED with *deficit the bytes over.
  ErrorCode Admit(std::string_view tenant, uint64_t bytes, uint64_t capacity, uint64_t* deficit);
  void Charge(std::string_view tenant, uint64_t bytes);
  void Release(std::string_view tenant, uint64_t bytes);
  void ClearCharges();
  uint64_t Charged(std::string_view tenant) const;

  std::optional<TenantSnapshot> Snapshot(std::string_view tenant, uint64_t capacity);
  // Tenants with a policy or a charge, by id.
  std::vector<TenantSnapshot> Snapshots(uint64_t capacity);

 private:
  struct Account {
    uint64_t requested = 0;  // 0: no policy
    uint64_t effective = 0;
    uint64_t charged = 0;
  };
  using Accounts = std::map<std::string, Account, std::less<>>;
  void Recompute(uint64_t capacity);
  void DropIfUnused(Accounts::iterator it);
  TenantSnapshot SnapshotOf(const std::string& id, const Account& a) const;
  // accounts_.find, with the last tenant found remembered: a batch of puts looks up its one
  // tenant once per item twice (admission, charge).
  Accounts::iterator Find(std::string_view tenant) const;

  mutable Accounts accounts_;
  mutable Accounts::iterator last_ = accounts_.end();  // end(): none remembered
  uint64_t capacity_ = 0;
  bool stale_ = true;  // policies changed since the effective quotas were computed
};

}  // namespace store
}  // namespace mooncake
