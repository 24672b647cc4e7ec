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
#include "metadata/stores/etcd_store.h"
#include "metadata/stores/http_store.h"
#include "metadata/stores/redis_store.h"

namespace mooncake {
namespace {

constexpr uint16_t kEtcdDefaultPort = 2379;
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

Result<std::vector<HostPort>> ParseEtcdEndpoints(const std::string& list,
                                                 const std::string& conn) {
  std::vector<HostPort> endpoints;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find_first_of(",;", start);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(start, end - start);
    if (item.rfind("http://", 0) == 0) item = item.substr(7);
    while (!item.empty() && item.back() == '/') item.pop_back();
    if (item.empty()) {
      return Status::InvalidArgument("metadata connection string '" + conn +
                                     "': empty etcd endpoint");
    }
    MC_ASSIGN_OR_RETURN(HostPort hp, ParseAddress(item, kEtcdDefaultPort, conn));
    endpoints.push_back(hp);
    start = end + 1;
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
    MC_ASSIGN_OR_RETURN(auto endpoints, ParseEtcdEndpoints(conn, conn));
    return EtcdStore::Create(std::move(endpoints), options);
  }
  std::string scheme = conn.substr(0, sep);
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  const std::string rest = conn.substr(sep + 3);
  if (scheme == "etcd") {
    MC_ASSIGN_OR_RETURN(auto endpoints, ParseEtcdEndpoints(rest, conn));
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
