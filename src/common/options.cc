// The only place where MC_* tunables are read from the environment.
#include <glog/logging.h>

#include <cstdlib>
#include <string>

#include "common/device_env.h"
#include "mooncake/options.h"

namespace mooncake {
namespace {

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

// Parses an integer variable; returns false (and warns) when it is set but invalid.
bool EnvInt(const char* name, long lo, long hi, long* out) {
  const char* v = Env(name);
  if (!v) return false;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < lo || n > hi) {
    LOG(WARNING) << name << "=" << v << " is not an integer in [" << lo << ", " << hi
                 << "]; using the default";
    return false;
  }
  *out = n;
  return true;
}

bool EnvFlag(const char* name) {
  const char* v = Env(name);
  if (!v) return false;
  std::string s(v);
  return !(s == "0" || s == "false" || s == "no" || s == "off" || s == "FALSE");
}

}  // namespace

EngineOptions EngineOptions::FromEnvironment() {
  EngineOptions o;
  long n = 0;
  if (EnvInt("MC_HANDSHAKE_PORT", 1, 65535, &n)) o.handshake_port = static_cast<uint16_t>(n);

  long lo = o.min_rpc_port, hi = o.max_rpc_port;
  if (!EnvInt("MC_MIN_RPC_PORT", 1024, 65535, &lo)) EnvInt("MC_MIN_PRC_PORT", 1024, 65535, &lo);
  if (!EnvInt("MC_MAX_RPC_PORT", 1024, 65535, &hi)) EnvInt("MC_MAX_PRC_PORT", 1024, 65535, &hi);
  bool overlaps_ephemeral = !(hi < 32768 || lo > 60999);
  if (lo <= hi && !overlaps_ephemeral) {
    o.min_rpc_port = static_cast<uint16_t>(lo);
    o.max_rpc_port = static_cast<uint16_t>(hi);
  } else if (lo != o.min_rpc_port || hi != o.max_rpc_port) {
    LOG(WARNING) << "RPC port range [" << lo << ", " << hi
                 << "] is empty or overlaps the ephemeral range 32768-60999; using "
                 << o.min_rpc_port << "-" << o.max_rpc_port;
  }

  if (EnvInt("MC_HANDSHAKE_CONNECT_TIMEOUT", 1, 3599, &n)) {
    o.handshake_connect_timeout_ms = static_cast<int>(n * 1000);
    o.tcp_connect_timeout_ms = o.handshake_connect_timeout_ms;
  }
  if (EnvInt("MC_HANDSHAKE_MAX_LENGTH", 1, 128L << 20, &n)) o.handshake_max_length = n;
  if (EnvInt("MC_HANDSHAKE_LISTEN_BACKLOG", 1, 65535, &n)) o.handshake_backlog = int(n);
  if (EnvInt("MC_FIRST_FRAME_TIMEOUT_MS", 100, 600000, &n)) o.first_frame_timeout_ms = int(n);
  if (EnvInt("MC_HANDSHAKE_MAX_CONNECTIONS", 1, 65536, &n)) o.handshake_max_connections = n;
  if (EnvInt("MC_HANDSHAKE_MAX_PER_ADDRESS", 1, 65536, &n)) o.handshake_max_per_address = n;
  if (EnvInt("MC_DATA_MAX_CONNECTIONS", 1, 65536, &n)) o.data_max_connections = n;
  if (EnvInt("MC_DATA_MAX_PER_ADDRESS", 1, 65536, &n)) o.data_max_per_address = n;

  o.force_tcp = EnvFlag("MC_FORCE_TCP");
  if (EnvInt("MC_TCP_LANES_PER_PEER", 1, 16, &n) ||
      EnvInt("MC_TCP_MAX_CONNECTIONS_PER_PEER", 1, 16, &n)) {
    o.tcp_streams_per_peer = static_cast<int>(n);
  }
  if (EnvInt("MC_TCP_SPLIT_SIZE", 4096, 1L << 30, &n)) o.tcp_split_size = n;
  if (const char* v = Env("MC_TCP_PROTO")) o.tcp_force_v1 = std::string(v) == "1";
  if (EnvInt("MC_SLICE_TIMEOUT", 1, 86400, &n)) o.slice_timeout_ms = static_cast<int>(n * 1000);
  if (EnvFlag("MC_DISABLE_SHM")) o.enable_shm = false;
  if (const char* v = Env("MC_TCP_BIND_ADDRESS")) o.tcp_bind_address = v;
  o.legacy_rpc_port_binding = Env("MC_LEGACY_RPC_PORT_BINDING") != nullptr;
  if (const char* v = Env("MC_METADATA_CLUSTER_ID")) o.metadata_cluster_id = v;
  if (const char* v = Env("MC_STORE_CLUSTER_ID")) o.store_cluster_id = v;
  if (const char* v = Env("MC_AUTH_SECRET")) o.auth_secret = v;
  if (EnvInt("MC_SHM_SPLIT_SIZE", 4096, 1L << 30, &n)) o.shm_split_size = n;
  if (EnvInt("MC_SHM_STREAMS_PER_PEER", 1, 16, &n)) o.shm_streams_per_peer = static_cast<int>(n);
  if (EnvInt("MC_SHM_SPIN_US", 0, 10000, &n)) o.shm_spin_us = static_cast<int>(n);
  if (EnvInt("MC_TCP_SPIN_US", 0, 10000, &n)) o.tcp_spin_us = static_cast<int>(n);
  if (EnvInt("MC_SHM_MAX_MAP_PER_CONN_GB", 0, 1L << 17, &n)) o.shm_max_map_per_conn = uint64_t(n) << 30;
  if (EnvInt("MC_SHM_MAX_MAP_TOTAL_GB", 0, 1L << 17, &n)) o.shm_max_map_total = uint64_t(n) << 30;
  if (const char* v = Env("MC_SHM_MAP_PEERS")) o.shm_map_peers = std::string(v) != "0";
  if (const char* v = Env("MC_HOST_ID")) o.host_id_override = v;
  long slo = o.store_client_min_port, shi = o.store_client_max_port;
  const bool set_lo = EnvInt("MC_STORE_CLIENT_MIN_PORT", 1, 65535, &slo);
  const bool set_hi = EnvInt("MC_STORE_CLIENT_MAX_PORT", 1, 65535, &shi);
  if (slo <= shi) {
    o.store_client_min_port = static_cast<uint16_t>(slo);
    o.store_client_max_port = static_cast<uint16_t>(shi);
  } else if (set_lo || set_hi) {
    LOG(WARNING) << "MC_STORE_CLIENT_MIN_PORT..MC_STORE_CLIENT_MAX_PORT [" << slo << ", " << shi
                 << "] is empty; using " << o.store_client_min_port << "-"
                 << o.store_client_max_port;
  }
  if (EnvInt("MC_STORE_CLIENT_SETUP_RETRIES", 1, 1000, &n)) {
    o.store_client_setup_retries = static_cast<int>(n);
  }
  return o;
}

DeviceEnvironment ReadDeviceEnvironment() {
  DeviceEnvironment d;
  d.simulate = EnvFlag("MC_DEVICE_SIM");
  if (const char* v = Env("MC_DEVICE_SIM")) {
    d.sim_npu = std::string(v) == "npu" || std::string(v) == "ascend";
  }
  long n = 0;
  if (EnvInt("MC_DEVICE_SIM_DEVICES", 1, 16, &n)) d.sim_devices = static_cast<int>(n);
  if (EnvInt("MC_DEVICE_SIM_DELAY_US", 0, 1000000, &n)) d.sim_delay_us = static_cast<int>(n);
  return d;
}

}  // namespace mooncake
