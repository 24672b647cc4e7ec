// mooncake_master's flags: every flag of the binary is defined in master_flags.cc, with
// upstream's names, defaults and help where upstream has them (docs/store_upstream.md,
// /work/shared/docs/upstream-store-ha-ssd.md §1.1), read through the functions below.
//
// Order in main(): InitBinary (gflags parsing) → ApplyConfigFile(FLAGS_config_path) →
// ResolveRpcFlags → MasterConfigFromFlags → ResolveHaSettings. Each returns a Status whose
// message names the flag (or the file and key) and says what to change; main() ends with it.
// Not thread-safe: called once, from main(), before any thread starts.
#pragma once

#include <gflags/gflags.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/net.h"
#include "mooncake/status.h"
#include "store/kv_events/kv_event_publisher.h"
#include "store/master/master_service.h"
#include "store/tenants/tenant_policy.h"

// The flags main() reads directly (the servers' addresses); the rest are read only here.
DECLARE_string(config_path);
DECLARE_string(rpc_address);
DECLARE_bool(enable_metric_reporting);
DECLARE_int32(metrics_port);
DECLARE_string(metrics_host);
DECLARE_bool(enable_http_metadata_server);
DECLARE_int32(http_metadata_server_port);
DECLARE_string(http_metadata_server_host);

namespace mooncake {
namespace store {

// Applies the config file at `path` ("" : nothing to do) to the flags not given on the
// command line (gflags' SET_FLAG_IF_DEFAULT: a flag given on the command line wins over the
// file, whatever its value). The format is chosen by the extension: .yaml / .yml (yaml-cpp)
// or .json; the document is one mapping whose keys are flag names (upstream's file alias
// client_live_ttl_sec is --client_ttl) and whose values are scalars (a YAML or JSON string,
// number or bool). InvalidArgument, naming the file and the key, for: an unreadable or
// malformed file, another extension, a top level that is not a mapping, an unknown key, a
// key given twice (an alias and its flag), a null / list / mapping value, a value that does
// not parse as the flag's type (even when the command line sets that flag), and the keys that
// would load other files (config_path, flagfile, fromenv, tryfromenv).
// REQUIRES: after gflags parsing, before any flag is read.
Status ApplyConfigFile(const std::string& path);

// The RPC port and event loops from --rpc_port / --port and --rpc_thread_num /
// --max_threads (upstream's deprecated aliases resolved as upstream does: --port when
// --rpc_port is 0; --max_threads, capped at the CPU count, when --rpc_thread_num is 0).
// InvalidArgument names the flag out of range; a deprecated alias logs a warning.
Status ResolveRpcFlags(int* rpc_port, int* rpc_threads);

// MasterService's configuration from the flags (leases, client ttl, eviction, discard
// timeout, in-flight ratio), with the HTTP ports checked. InvalidArgument names the flag.
Status MasterConfigFromFlags(MasterConfig* config);

// The master's high-availability settings (etcd leader election, operation log), resolved
// from the flags. Defaults are the flags' defaults.
struct HaSettings {
  bool enabled = false;       // --enable_ha
  std::string backend = "etcd";  // --ha_backend_type (this build: etcd only)
  // The etcd members: --ha_backend_connstring ("h1:2379;h2:2379", ',' also separates,
  // "http://" allowed, a missing port is 2379), else the legacy --etcd_endpoints.
  // Non-empty when enabled.
  std::vector<HostPort> endpoints;
  std::string cluster_id = "mooncake_cluster";  // --cluster_id, a trailing '/' stripped
  // The leader's address published in etcd for clients to dial: --rpc_address and the
  // resolved RPC port ("10.0.0.1:50051", "[fd00::1]:50051"). "" when not enabled.
  std::string advertise_address;
  bool oplog = false;                       // --enable_oplog (requires enabled, etcd)
  uint32_t oplog_poll_interval_ms = 1000;   // --oplog_poll_interval_ms, 1..60000
  uint32_t oplog_batch_max_entries = 1024;  // --oplog_batch_max_entries, 1..65536
  uint32_t batch_oplog_retry_timeout_sec = 180;  // --batch_oplog_retry_timeout_sec, >= 1
  uint32_t lease_ttl_sec = 5;               // --ha_lease_ttl_sec, 2..60
  // --oplog_ack_before_durable: true acks a put once its entry is queued (upstream's
  // "visible before durable"); false (default) acks after the batch holding it is in etcd.
  bool ack_before_durable = false;
  // --oplog_checkpoint_entries (>= 1): a checkpoint of the metadata is written when the log
  // since the last one passes this many entries.
  uint64_t checkpoint_entries = 100000;
};

// Resolves and checks the HA flags; `rpc_port` is the port ResolveRpcFlags chose. Every
// range is checked whether or not HA is on; the rest only matters with --enable_ha.
// InvalidArgument, saying what to change, for: an HA flag out of its range; an invalid
// --cluster_id (names the character); --enable_oplog without --enable_ha; --enable_oplog with
// a backend other than etcd; with --enable_ha, a backend this build lacks (redis, k8s) or an
// unknown one, no etcd endpoints or unparsable ones, and an --rpc_address other hosts cannot
// dial ("", 0.0.0.0, ::). A connection string set without --enable_ha only logs a warning,
// as upstream; so do --etcd_endpoints and --ha_backend_connstring set and different (the
// connection string wins).
Status ResolveHaSettings(int rpc_port, HaSettings* out);

// The KV event publisher's settings (master_flags_kv_events.cc): *enabled from
// --enable_kv_events; the endpoints, backend id and limits. A missing endpoint or backend id
// is not an error here: the publisher refuses to start and the master serves on without
// events (as upstream). InvalidArgument names a flag out of range.
Status KvEventSettingsFromFlags(bool* enabled, kv_events::PublisherOptions* out);

// Strict multi-tenant mode (master_flags_tenants.cc): config->enable_multi_tenants from
// --enable_multi_tenants and, when on, *source: where the quota policy lives
// (--tenant_quota_connector_type / _uri; etcd keys under `cluster_id`). Nothing is read
// yet. InvalidArgument for a connector type or URI that cannot be used.
// The disk tier's flags (--enable_offload, --offload_on_evict, ...; master_flags_offload.cc),
// called by MasterConfigFromFlags. InvalidArgument names the flag.
Status OffloadSettingsFromFlags(MasterConfig* config);

Status TenantSettingsFromFlags(const std::string& cluster_id, MasterConfig* config,
                               std::unique_ptr<TenantPolicySource>* source);

}  // namespace store
}  // namespace mooncake
