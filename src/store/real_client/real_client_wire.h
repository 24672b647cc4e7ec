// What a real client (mooncake_client) and its dummy clients say to each other on the real
// client's --port (default 50052). Text over TCP, all of it bounded:
//
//   dummy -> real   "MOONCAKE-DUMMY 1\n"                       within kHelloDeadline
//   real  -> dummy  one JSON object on one line (RealClientConfig), at most kMaxConfigBytes
//   real  -> dummy  "\n" every kHeartbeatInterval while the real client lives
//
// A dummy that hears nothing for kLostAfter (or sees the connection close) treats the real
// client as gone. Anything a dummy sends after its hello is read and dropped. A connection
// whose first line is not the hello (or that sends none in time) is closed.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "mooncake/status.h"

namespace mooncake {
namespace store {

inline constexpr char kDummyHello[] = "MOONCAKE-DUMMY 1\n";
inline constexpr size_t kMaxHelloBytes = 64;
inline constexpr size_t kMaxConfigBytes = 4096;
inline constexpr std::chrono::milliseconds kHelloDeadline{2000};
inline constexpr std::chrono::milliseconds kHeartbeatInterval{500};
inline constexpr std::chrono::milliseconds kLostAfter{3000};

// What a dummy needs to run a store client of its own beside the real client.
struct RealClientConfig {
  std::string master_server_address;
  std::string metadata_server;
  std::string protocol;
  std::string device_names;
  std::string host;          // the host part of the real client's segment name
  std::string segment_name;  // the real client's segment (where dummies' objects go)
  // The HA cluster a master_server_address "etcd://..." names (the real client's
  // MC_STORE_CLUSTER_ID), so that its dummies follow the same leader whatever their own
  // environment says. Optional on the wire ("store_cluster_id"): absent from an older real
  // client, it is "" (the dummy's own MC_STORE_CLUSTER_ID).
  std::string store_cluster_id;
  // The real client's tenant (mooncake_client --tenant_id), which its dummies' calls carry.
  // Optional on the wire ("tenant_id"): absent (an older real client, or "default"), it is
  // "default".
  std::string tenant_id = "default";
};

// Same master and metadata server: a restarted real client the dummy's own client still fits.
inline bool SameCluster(const RealClientConfig& a, const RealClientConfig& b) {
  return a.master_server_address == b.master_server_address &&
         a.metadata_server == b.metadata_server && a.store_cluster_id == b.store_cluster_id &&
         a.tenant_id == b.tenant_id;
}

// One line, '\n' included. Never throws: bytes of a field that are not UTF-8 are each
// replaced by U+FFFD (so such a field does not survive DecodeConfig unchanged).
std::string EncodeConfig(const RealClientConfig& c);
// Errors: DataLoss (not a JSON object of strings with the fields above, store_cluster_id
// optional, or too long). The master address is carried as given (host:port or etcd://...).
Result<RealClientConfig> DecodeConfig(const std::string& line);

}  // namespace store
}  // namespace mooncake
