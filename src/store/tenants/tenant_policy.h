// Where strict mode's tenant quota policy lives (--tenant_quota_connector_type / _uri), in
// upstream's YAML:
//   version: 1
//   tenants:
//     - name: tenant-a
//       quota: 200GB        # an integer with B, KB, MB, GB or TB (powers of 1024) or none
// - file: the YAML file at the URI. It must exist when the master starts (a mistyped path
//   would otherwise start a master that refuses every write); the admin API rewrites it
//   (a temporary file beside it, fsync, rename, fsync of the directory: a crash leaves the
//   old policy or the new one, never a torn file).
// - etcd: the YAML under mooncake-store/<cluster_id>/tenant_quota_policy on the etcd members
//   at the URI ("h1:2379,h2:2379"); no key yet is the empty policy (the admin API creates it).
// An HA cluster's masters must share it (etcd, or one file on shared storage): a new leader
// loads it before it serves, and rebuilds each tenant's charge from the objects it holds.
#pragma once

#include <memory>
#include <string>

#include "mooncake/status.h"
#include "store/tenants/tenant_ledger.h"

namespace mooncake {
namespace store {

// "200GB" -> bytes. InvalidArgument saying why for anything else (no digits, zero, another
// unit, over TenantLedger::kMaxQuotaBytes).
Result<uint64_t> ParseQuotaBytes(const std::string& text);
// The policy in `yaml` (version 1, names valid and unique, quotas as above).
Result<TenantPolicies> ParseTenantPolicyYaml(const std::string& yaml);
// `policies` in that YAML (quotas in bytes).
std::string TenantPolicyYaml(const TenantPolicies& policies);

class TenantPolicySource {
 public:
  virtual ~TenantPolicySource() = default;
  virtual Result<TenantPolicies> Load() = 0;
  virtual Status Save(const TenantPolicies& policies) = 0;
  // "file /etc/mooncake/quotas.yaml", "etcd 10.0.0.1:2379 key mooncake-store/c/..." for messages.
  virtual std::string Describe() const = 0;
};

// type "file" or "etcd" (InvalidArgument otherwise, or for an empty uri); contacts nothing.
Result<std::unique_ptr<TenantPolicySource>> MakeTenantPolicySource(const std::string& type,
                                                                   const std::string& uri,
                                                                   const std::string& cluster_id);

}  // namespace store
}  // namespace mooncake
