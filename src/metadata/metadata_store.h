// MetadataStore: a key-value store where engines publish their segment descriptors and RPC
// addresses so that peers find each other by name (etcd, redis, http). Kept apart from the
// P2P handshake, which needs no store.
//
// Keys and values follow upstream Mooncake (docs/wire_protocol.md, upstream-compat.md §3.2):
//   mooncake/[<MC_METADATA_CLUSTER_ID>/]ram/<segment name>      segment descriptor JSON
//   mooncake/[<MC_METADATA_CLUSTER_ID>/]<segment name>          when the name contains '/'
//   mooncake/[<MC_METADATA_CLUSTER_ID>/]rpc_meta/<server name>  {"ip_or_host_name","rpc_port"}
// so that an upstream engine and ours can share one store.
//
// Implementations are thread-safe. Calls are bounded in time (StoreOptions timeouts); a store
// that cannot be reached gives Unavailable naming the store ("etcd 127.0.0.1:2379: ...").
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "mooncake/status.h"

namespace mooncake {

struct StoreOptions {
  int connect_timeout_ms = 1500;
  int request_timeout_ms = 3000;
  // etcd: keys written with Put() are attached to a lease of this TTL, kept alive by a
  // background thread while the store object lives, so a crashed engine's keys expire.
  int lease_ttl_s = 10;
  // redis: MC_REDIS_USERNAME / MC_REDIS_PASSWORD (AUTH), MC_REDIS_DB_INDEX (SELECT 0..255).
  std::string redis_username;
  std::string redis_password;
  int redis_db_index = 0;
};

class MetadataStore {
 public:
  virtual ~MetadataStore() = default;
  // NotFound when the key does not exist.
  virtual Result<std::string> Get(const std::string& key) = 0;
  // Creates or replaces. etcd: under the store's lease.
  virtual Status Put(const std::string& key, const std::string& value) = 0;
  // OK also when the key did not exist.
  virtual Status Remove(const std::string& key) = 0;
  // "etcd://h:p,h2:p2", "redis://h:p", "http://h:p/path": for messages.
  virtual std::string Describe() const = 0;
};

// Parses a connection string as upstream does: "etcd://h:p[,h2:p2]" or a bare "h:p[,...]"
// (etcd), "redis://h:p", "http://h:p/path" (or https). InvalidArgument for an unknown scheme
// or malformed address; Unavailable when the store cannot be reached at creation.
Result<std::unique_ptr<MetadataStore>> CreateMetadataStore(const std::string& conn,
                                                           const StoreOptions& options);

// Key helpers. `cluster_id` is MC_METADATA_CLUSTER_ID ("" for none).
std::string KeyPrefix(const std::string& cluster_id);
std::string SegmentKey(const std::string& cluster_id, const std::string& segment_name);
std::string RpcMetaKey(const std::string& cluster_id, const std::string& server_name);

}  // namespace mooncake
