// The HA cluster's view in etcd, as upstream's masters write it and its clients read it
// (docs/upstream-store-ha-ssd.md §1.3, §1.7): the leader holds the key
// "mooncake-store/<cluster_id>/master_view" under its lease, its value the leader's RPC
// address as plain text "ip:port"; the key's create_revision is the view version (it grows
// with each new leader; a rewrite of the value keeps it). Header-only: the master's side and
// the client's (store/client/leader_stub.h) share it.
#pragma once

#include <cstdint>
#include <string>

#include "common/net.h"
#include "mooncake/status.h"

namespace mooncake {
namespace store {

// Upstream's default cluster (MC_STORE_CLUSTER_ID on clients, --cluster_id on masters).
inline constexpr char kDefaultStoreClusterId[] = "mooncake_cluster";
inline constexpr size_t kMaxStoreClusterIdBytes = 128;

// InvalidArgument, naming the id, unless it is 1..128 bytes of [0-9A-Za-z_.-].
inline Status CheckStoreClusterId(const std::string& id) {
  bool ok = !id.empty() && id.size() <= kMaxStoreClusterIdBytes;
  for (char c : id) {
    ok = ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                c == '_' || c == '.' || c == '-');
  }
  if (ok) return Status::OK();
  return Status::InvalidArgument("store cluster id '" + id.substr(0, kMaxStoreClusterIdBytes) +
                                 "' is not 1.." + std::to_string(kMaxStoreClusterIdBytes) +
                                 " characters of [0-9A-Za-z_.-]");
}

inline std::string MasterViewKey(const std::string& cluster_id) {
  return "mooncake-store/" + cluster_id + "/master_view";
}

// The leader's address in a master_view value, or NotFound when the value names no leader
// yet: upstream's newer masters write "__mooncake_service_warming__:<lease>" while they
// restore, and publish the address once they serve; anything but host:port is read so.
inline constexpr char kMasterViewWarmingPrefix[] = "__mooncake_service_warming__";
inline Result<HostPort> ParseMasterViewValue(const std::string& value) {
  auto hp = ParseHostPort(value);
  if (value.rfind(kMasterViewWarmingPrefix, 0) == 0 || !hp.ok() || !hp->has_port ||
      hp->port == 0) {
    return Status::NotFound("master_view holds '" + value.substr(0, 256) +
                            "', not a leader's ip:port (a leader still warming up?)");
  }
  return hp;
}

}  // namespace store
}  // namespace mooncake
