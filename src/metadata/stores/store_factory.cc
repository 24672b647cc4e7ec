// Placeholder until the store clients land: every scheme is Unimplemented.
#include "metadata/metadata_store.h"

namespace mooncake {

Result<std::unique_ptr<MetadataStore>> CreateMetadataStore(const std::string& conn,
                                                           const StoreOptions&) {
  return Status::Unimplemented("metadata store '" + conn + "' is not built yet");
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
