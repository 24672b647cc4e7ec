// CreateMetadataStore: picks the store client from the connection string, as upstream does.
//   "etcd://h:p[,h2:p2]"  etcd; also a bare "h:p[,h2:p2]" (no "://"). Endpoints may be split by
//                         ',' or ';' and may carry "http://". A missing port means 2379.
//   "redis://h:p"         redis; a missing port means 6379.
//   "http://h:p/path"     upstream's HTTP metadata protocol (https too).
// Key helpers: upstream's key layout (upstream-compat.md §3.2).
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "common/net.h"
#include "metadata/metadata_store.h"
#include "metadata/stores/etcd_kv.h"
#include "metadata/stores/etcd_store.h"
#include "metadata/stores/http_store.h"
#include "metadata/stores/redis_store.h"

namespace mooncake {
namespace {

constexpr uint16_t kRedisDefaultPort = 6379;

Result<HostPort> ParseAddress(const std::string& s, uint16_t default_port,
                              const std::string& conn) {
  auto hp = ParseHostPort(s);
  if (!hp.ok()) return hp.status().WithContext("metadata connection string '" + conn + "'");
  if (!hp->has_port) {
    hp->port = default_port;
    hp->has_port = true;
  }
  return hp;
}

// etcd_kv.h's ParseEtcdEndpoints, naming the whole connection string on failure.
Result<std::vector<HostPort>> EtcdEndpointsOf(const std::string& list, const std::string& conn) {
  auto endpoints = ParseEtcdEndpoints(list);
  if (!endpoints.ok()) {
    return endpoints.status().WithContext("metadata connection string '" + conn + "'");
  }
  return endpoints;
}

}  // namespace

Result<std::unique_ptr<MetadataStore>> CreateMetadataStore(const std::string& conn,
                                                           const StoreOptions& options) {
  if (conn.empty()) return Status::InvalidArgument("empty metadata connection string");
  if (conn == "P2PHANDSHAKE") {
    return Status::InvalidArgument("P2PHANDSHAKE uses no metadata store");
  }
  const size_t sep = conn.find("://");
  if (sep == std::string::npos) {
    MC_ASSIGN_OR_RETURN(auto endpoints, EtcdEndpointsOf(conn, conn));
    return EtcdStore::Create(std::move(endpoints), options);
  }
  std::string scheme = conn.substr(0, sep);
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  const std::string rest = conn.substr(sep + 3);
  if (scheme == "etcd") {
    MC_ASSIGN_OR_RETURN(auto endpoints, EtcdEndpointsOf(rest, conn));
    return EtcdStore::Create(std::move(endpoints), options);
  }
  if (scheme == "redis") {
    std::string address = rest;
    while (!address.empty() && address.back() == '/') address.pop_back();
    if (address.empty()) {
      return Status::InvalidArgument("metadata connection string '" + conn + "': no host");
    }
    MC_ASSIGN_OR_RETURN(HostPort hp, ParseAddress(address, kRedisDefaultPort, conn));
    return RedisStore::Create(hp, options);
  }
  if (scheme == "http" || scheme == "https") {
    if (rest.empty() || rest[0] == '/' || rest[0] == '?') {
      return Status::InvalidArgument("metadata connection string '" + conn + "': no host");
    }
    return HttpStore::Create(scheme + "://" + rest, options);
  }
  return Status::InvalidArgument("metadata connection string '" + conn +
                                 "': unknown scheme '" + scheme +
                                 "' (expected etcd://, redis://, http:// or https://)");
}

std::string KeyPrefix(const std::string& cluster_id) {
  if (cluster_id.empty()) return "mooncake/";
  return "mooncake/" + cluster_id + (cluster_id.back() == '/' ? "" : "/");
}

std::string SegmentKey(const std::string& cluster_id, const std::string& name) {
  if (name.find('/') != std::string::npos) return KeyPrefix(cluster_id) + name;
  return KeyPrefix(cluster_id) + "ram/" + name;
}

std::string RpcMetaKey(const std::string& cluster_id, const std::string& name) {
  return KeyPrefix(cluster_id) + "rpc_meta/" + name;
}

}  // namespace mooncake
