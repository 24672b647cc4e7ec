// mooncake_master's tenant flags (upstream's names): strict multi-tenant mode and where its
// quota policy lives (src/store/tenants/tenant_policy.h).
#include <glog/logging.h>

#include "store/master/master_flags.h"

DEFINE_bool(enable_multi_tenants, false,
            "Strict multi-tenant mode: each client's keys are its tenant's (setup's tenant_id), "
            "only tenants in the quota policy may write, within their quota");
DEFINE_string(tenant_quota_connector_type, "file",
              "Where the tenant quota policy lives: file (a YAML file) or etcd");
DEFINE_string(tenant_quota_connector_uri, "",
              "The policy file's path (type file), or the etcd members h1:2379,h2:2379 (type "
              "etcd: key mooncake-store/<cluster_id>/tenant_quota_policy)");

namespace mooncake {
namespace store {

Status TenantSettingsFromFlags(const std::string& cluster_id, MasterConfig* config,
                               std::unique_ptr<TenantPolicySource>* source) {
  config->enable_multi_tenants = FLAGS_enable_multi_tenants;
  source->reset();
  if (!FLAGS_enable_multi_tenants) {
    if (!FLAGS_tenant_quota_connector_uri.empty()) {
      LOG(WARNING) << "--tenant_quota_connector_uri is ignored without --enable_multi_tenants "
                      "(every tenant shares one key space and no quota applies)";
    }
    return Status::OK();
  }
  auto made = MakeTenantPolicySource(FLAGS_tenant_quota_connector_type,
                                     FLAGS_tenant_quota_connector_uri, cluster_id);
  if (!made.ok()) return Status::InvalidArgument("--enable_multi_tenants: " + made.status().message());
  *source = std::move(made).value();
  return Status::OK();
}

}  // namespace store
}  // namespace mooncake
