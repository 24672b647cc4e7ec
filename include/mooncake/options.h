// EngineOptions: every tunable of the engine, with its default and the environment variable
// (upstream's name where one exists) that overrides it. The environment is read only by
// EngineOptions::FromEnvironment(); nothing else in the library calls getenv for these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mooncake {

struct EngineOptions {
  // Port used when a server name has no ":port" (non-P2P modes). MC_HANDSHAKE_PORT, 12001.
  uint16_t handshake_port = 12001;
  // Range for the random RPC (handshake) port and TCP data port. MC_MIN_RPC_PORT /
  // MC_MAX_RPC_PORT (also the misspelt MC_MIN_PRC_PORT / MC_MAX_PRC_PORT), 15000..17000.
  uint16_t min_rpc_port = 15000;
  uint16_t max_rpc_port = 17000;
  // Handshake client connect timeout. MC_HANDSHAKE_CONNECT_TIMEOUT (seconds), 5 s.
  int handshake_connect_timeout_ms = 5000;
  // Handshake read/write timeout on both ends, per frame. 10 s.
  int handshake_io_timeout_ms = 10000;
  // Largest handshake frame accepted. MC_HANDSHAKE_MAX_LENGTH, 1 MiB (1 B .. 128 MiB).
  size_t handshake_max_length = 1 << 20;
  // listen() backlog of the handshake server. MC_HANDSHAKE_LISTEN_BACKLOG, 128.
  int handshake_backlog = 128;
  // Connections are served one thread each. A connection to any server (handshake, TCP
  // data, same-host) that has not authenticated and sent its first complete frame within
  // this time is closed; so is the oldest such one when a cap below is reached.
  // MC_FIRST_FRAME_TIMEOUT_MS, 3000 ms (100 .. 600000).
  int first_frame_timeout_ms = 3000;
  // Handshake connections served at once, and from one remote address.
  // MC_HANDSHAKE_MAX_CONNECTIONS (1 .. 65536), 512; MC_HANDSHAKE_MAX_PER_ADDRESS, 128.
  size_t handshake_max_connections = 512;
  size_t handshake_max_per_address = 128;
  // TCP data connections open at once, and from one remote address. Established connections
  // are never closed for idling; past a cap new ones are refused.
  // MC_DATA_MAX_CONNECTIONS (1 .. 65536), 4096; MC_DATA_MAX_PER_ADDRESS, 1024.
  size_t data_max_connections = 4096;
  size_t data_max_per_address = 1024;

  // Only TCP is offered, even when a faster transport exists. MC_FORCE_TCP, off.
  bool force_tcp = false;
  // Persistent TCP connections ("streams") per peer. MC_TCP_LANES_PER_PEER (1..16), 2.
  int tcp_streams_per_peer = 2;
  // Requests longer than this are cut into slices of this size, each its own wire request,
  // spread over the streams. MC_TCP_SPLIT_SIZE, 1 MiB (4 KiB .. 1 GiB).
  size_t tcp_split_size = 1 << 20;
  // Speak protocol v1 (no status frames) even to v2 peers. MC_TCP_PROTO=1, off.
  bool tcp_force_v1 = false;
  // A connection with requests outstanding that makes no progress (no byte sent or received)
  // for this long fails those requests with TIMEOUT and is closed. Upstream has no such
  // bound by default. MC_SLICE_TIMEOUT (seconds), 30 s.
  int slice_timeout_ms = 30000;
  // Same-host transport (process_vm_readv/writev by the target) when both ends share a
  // kernel and pid namespace. MC_DISABLE_SHM=1 (or MC_FORCE_TCP) turns it off. On.
  bool enable_shm = true;
  // Requests longer than this are cut into slices for the same-host transport. 1 MiB.
  size_t shm_split_size = 1 << 20;
  // Same-host connections per peer. MC_SHM_STREAMS_PER_PEER (1..16), 2.
  int shm_streams_per_peer = 2;
  // Same-host initiator: a request of up to 1 MiB on an idle connection is sent by the
  // submitting thread, which then looks for the target's reply awake for up to this long and
  // completes it itself (no thread of ours sleeps and is woken in between: a wake-up costs
  // tens of microseconds on a VM); a reply not there by then is left to the connection's
  // thread. So a small Submit can take up to this long. 0: never (every request goes
  // through the connection's thread). MC_SHM_SPIN_US (0..10000), 100.
  int shm_spin_us = 100;
  // TCP initiator, the same for a submit of less than 1 MiB on an idle connection: the
  // submitting thread sends it and drives the connection itself (its replies, or the
  // payload of its reads) for up to this long; what is left then goes to the connection's
  // thread. 0: never. MC_TCP_SPIN_US (0..10000), 100.
  int tcp_spin_us = 100;
  // Same-host target: the most bytes of a peer's shareable memory (memfds) it maps, per
  // connection and in total over all connections; an announcement over either is refused
  // (those copies use process_vm_readv/writev). MC_SHM_MAX_MAP_PER_CONN_GB (4096 = 4 TiB) /
  // MC_SHM_MAX_MAP_TOTAL_GB (32768 = 32 TiB).
  uint64_t shm_max_map_per_conn = uint64_t{4} << 40;
  uint64_t shm_max_map_total = uint64_t{32} << 40;
  // Same-host initiator: map the memory a target lends (its memfd-backed registrations,
  // such as a Store segment) and copy to and from it with memcpy here, with no message to the
  // target; the caps above bound what is mapped. MC_SHM_MAP_PEERS=0 leaves every copy to
  // the target. On.
  bool shm_map_peers = true;
  // Overrides the host identity (tests: simulate another host). MC_HOST_ID, unset.
  std::string host_id_override;
  // Metadata-store modes (etcd/redis/http). The RPC address published under rpc_meta is
  // MC_TCP_BIND_ADDRESS, else the host of local_server_name when it is an IP address, else
  // the first non-loopback IPv4 interface. MC_LEGACY_RPC_PORT_BINDING binds the RPC server
  // to local_server_name's host:port instead of a random port.
  std::string tcp_bind_address;
  bool legacy_rpc_port_binding = false;
  // Store clients (StoreClient::Create) given a local_hostname without ":port" under a
  // metadata server (not P2PHANDSHAKE) name their segment host:port with a free port picked at
  // random in MC_STORE_CLIENT_MIN_PORT..MC_STORE_CLIENT_MAX_PORT (12300..14300; an invalid
  // range falls back to it), trying again when the name is taken, up to
  // MC_STORE_CLIENT_SETUP_RETRIES (20) times, as upstream.
  uint16_t store_client_min_port = 12300;
  uint16_t store_client_max_port = 14300;
  int store_client_setup_retries = 20;
  // The Store HA cluster a client given master_server_addr "etcd://..." follows (the etcd key
  // mooncake-store/<id>/master_view). MC_STORE_CLUSTER_ID, "mooncake_cluster" (checked at
  // store setup: 1..128 characters of [0-9A-Za-z_.-]).
  std::string store_cluster_id = "mooncake_cluster";
  // Key prefix mooncake/<id>/ instead of mooncake/. MC_METADATA_CLUSTER_ID, unset.
  std::string metadata_cluster_id;
  // Shared secret: when set, every connection (handshake, data, same-host) runs the mutual
  // MCAUTHv2 exchange, bound to the segment name the client means to reach, before anything
  // is read (docs/wire_protocol.md §5). Peers without it, upstream engines included, are
  // refused. Not encryption. MC_AUTH_SECRET, unset (off).
  std::string auth_secret;
  // Connect timeout of TCP data connections. MC_HANDSHAKE_CONNECT_TIMEOUT, 5 s.
  int tcp_connect_timeout_ms = 5000;

  // Defaults overridden by the MC_* environment variables above. Values out of range are
  // ignored with a warning.
  static EngineOptions FromEnvironment();
};

}  // namespace mooncake
