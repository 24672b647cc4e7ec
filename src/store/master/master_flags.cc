#include "store/master/master_flags.h"

#include "metadata/stores/etcd_kv.h"

#include <glog/logging.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

// --- The RPC service (upstream's names and defaults) ---
DEFINE_int32(rpc_port, 0, "Port of the master's RPC service (0: the value of --port)");
DEFINE_int32(port, 50051, "Port of the master's RPC service (deprecated: use --rpc_port)");
DEFINE_string(rpc_address, "0.0.0.0",
              "Address the RPC service binds; with --enable_ha also the address published to "
              "clients as the leader's, so it must be one other hosts can dial");
DEFINE_int32(rpc_thread_num, 0,
             "RPC event loops (0: --max_threads, capped at the number of CPUs)");
DEFINE_int32(max_threads, 16, "RPC event loops (deprecated: use --rpc_thread_num)");
// --- MasterService ---
DEFINE_uint64(default_kv_lease_ttl, 10000,
              "Lease an object gets on each get (ms): it cannot be removed or evicted meanwhile");
DEFINE_uint64(default_kv_soft_pin_ttl, 30 * 60 * 1000,
              "How long a soft pin protects an object from eviction after its last access (ms)");
DEFINE_int64(client_ttl, 10,
             "Seconds without a heartbeat after which a client's segments are unmounted "
             "(config-file key: client_ttl or client_live_ttl_sec)");
DEFINE_double(eviction_ratio, 0.05, "Share of capacity freed below the watermark by eviction");
DEFINE_double(eviction_high_watermark_ratio, 0.9,
              "Allocated share of capacity above which objects are evicted");
DEFINE_uint64(put_start_discard_timeout_sec, 30,
              "Seconds after which a put that was started but not ended is discarded");
DEFINE_double(max_client_inflight_ratio, 0.5,
              "Share of the capacity one client's puts in flight (started, not ended) may hold "
              "(not an upstream flag)");
// --- Replica tasks (create_copy_task / create_move_task; master_tasks.cc) ---
DEFINE_uint32(max_total_pending_tasks, 10000,
              "Replica tasks waiting for their executor at most (more: -1401)");
DEFINE_uint32(max_total_processing_tasks, 10000, "Replica tasks running at once at most");
DEFINE_uint32(max_total_finished_tasks, 10000,
              "Ended replica tasks kept for query_task (the oldest dropped first)");
DEFINE_uint64(pending_task_timeout_sec, 300,
              "Seconds a replica task may wait for its executor before it fails");
DEFINE_uint64(processing_task_timeout_sec, 300,
              "Seconds a replica task may run before it fails (its space is freed after "
              "--put_start_discard_timeout_sec already, as a put's)");
// --- HTTP endpoints and the embedded metadata server ---
DEFINE_bool(enable_metric_reporting, true, "Serve Prometheus metrics and log them periodically");
DEFINE_int32(metrics_port, 9003,
             "Port of the HTTP endpoints (/metrics, /health, /get_all_segments, ...); in HA "
             "every master serves it, so masters on one host need distinct ports");
DEFINE_string(metrics_host, "",
              "Address the HTTP endpoints bind (\"\": the --rpc_address; \"::\" for IPv6)");
DEFINE_bool(enable_http_metadata_server, false,
            "Serve the transfer engine's HTTP metadata protocol (/metadata) in this process");
DEFINE_int32(http_metadata_server_port, 8080, "Port of the HTTP metadata server");
DEFINE_string(http_metadata_server_host, "0.0.0.0", "Address the HTTP metadata server binds");
// --- High availability (upstream's names and defaults, then ours) ---
DEFINE_bool(enable_ha, false,
            "Run as one of several masters: a leader elected through an etcd lease serves, "
            "the others stand by");
DEFINE_string(ha_backend_type, "etcd",
              "HA backend: etcd (upstream also has redis and k8s; this build supports etcd "
              "only)");
DEFINE_string(ha_backend_connstring, "",
              "The HA backend's members; etcd: \"h1:2379;h2:2379\" (',' also separates)");
DEFINE_string(etcd_endpoints, "",
              "etcd members (legacy: used when --ha_backend_type=etcd and "
              "--ha_backend_connstring is empty)");
DEFINE_string(cluster_id, "mooncake_cluster",
              "Namespace of every HA key in etcd: [0-9A-Za-z_.-], 1..128 characters (clients "
              "name it with MC_STORE_CLUSTER_ID)");
DEFINE_bool(enable_oplog, false,
            "Replicate the metadata to the standbys through an operation log in etcd "
            "(requires --enable_ha=true and --ha_backend_type=etcd)");
DEFINE_int32(oplog_poll_interval_ms, 1000,
             "How often a standby polls etcd for new log batches (ms; 1..60000)");
DEFINE_uint32(oplog_batch_max_entries, 1024,
              "Most log entries in one batch written to etcd (1..65536)");
DEFINE_uint32(batch_oplog_retry_timeout_sec, 180,
              "How long transient etcd errors of the log are retried before the master "
              "gives up its role (s)");
DEFINE_int32(ha_lease_ttl_sec, 5,
             "TTL of the leader's etcd lease (s; 2..60): a dead leader is replaced after it "
             "(not an upstream flag; upstream's is fixed at 5)");
DEFINE_bool(oplog_ack_before_durable, false,
            "Acknowledge a put once its log entry is queued, before etcd has it (upstream's "
            "\"visible before durable\": a failover may lose acknowledged puts, at most 8 "
            "batches of --oplog_batch_max_entries: a reply past that waits); off: after "
            "(not an upstream flag)");
DEFINE_uint64(oplog_checkpoint_entries, 100000,
              "A checkpoint of the metadata is written to etcd when the log since the last one "
              "passes this many entries (not an upstream flag)");
DEFINE_string(config_path, "",
              "A YAML (.yaml, .yml) or JSON (.json) file of flag values (keys: flag names); "
              "flags given on the command line win");

namespace mooncake {
namespace store {
namespace {

// ---- The config file ----

// Keys a file may not set: they would load other files or reparse the command line.
const std::set<std::string>& ForbiddenKeys() {
  static const std::set<std::string> keys = {"config_path", "flagfile", "fromenv",
                                             "tryfromenv"};
  return keys;
}

// Upstream's config-file spellings of flags with another name.
std::string FlagOfKey(const std::string& key) {
  if (key == "client_live_ttl_sec") return "client_ttl";
  return key;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// key -> value text, in file order.
using Entries = std::vector<std::pair<std::string, std::string>>;

Status ReadYaml(const std::string& path, const std::string& text, Entries* out) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument("config file " + path + ": not valid YAML: " + e.what());
  }
  if (root.IsNull()) return Status::OK();  // an empty file sets nothing
  if (!root.IsMap()) {
    return Status::InvalidArgument("config file " + path +
                                   ": the document must be a mapping of flag names to values");
  }
  for (const auto& item : root) {
    if (!item.first.IsScalar()) {
      return Status::InvalidArgument("config file " + path + ": a key is not a flag name");
    }
    const std::string key = item.first.Scalar();
    const YAML::Node& v = item.second;
    if (v.IsNull()) {
      return Status::InvalidArgument("config file " + path + ": key '" + key +
                                     "' has no value (write \"\" for an empty string)");
    }
    if (!v.IsScalar()) {
      return Status::InvalidArgument("config file " + path + ": key '" + key +
                                     "': the value must be a scalar, not a list or mapping");
    }
    out->emplace_back(key, v.Scalar());
  }
  return Status::OK();
}

Status ReadJson(const std::string& path, const std::string& text, Entries* out) {
  const auto root = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return Status::InvalidArgument("config file " + path + ": not valid JSON");
  }
  if (!root.is_object()) {
    return Status::InvalidArgument("config file " + path +
                                   ": the document must be an object of flag names to values");
  }
  for (const auto& [key, v] : root.items()) {
    std::string value;
    if (v.is_string()) {
      value = v.get<std::string>();
    } else if (v.is_boolean() || v.is_number()) {
      value = v.dump();
    } else {
      return Status::InvalidArgument("config file " + path + ": key '" + key +
                                     "': the value must be a string, number or bool");
    }
    out->emplace_back(key, std::move(value));
  }
  return Status::OK();
}

// Checks `value` parses as the flag's type, without changing any flag.
bool Parses(const std::string& flag, const std::string& value) {
  gflags::FlagSaver saver;  // restores every flag (and whether it was set) on return
  return !gflags::SetCommandLineOption(flag.c_str(), value.c_str()).empty();
}

// ---- HA settings ----

bool IsClusterIdChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
}

std::string Printable(char c) {
  if (std::isprint(static_cast<unsigned char>(c))) return std::string("'") + c + "'";
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%02x", static_cast<unsigned char>(c));
  return buf;
}

Status CheckClusterId(std::string* id) {
  if (!id->empty() && id->back() == '/') id->pop_back();
  if (id->empty()) {
    return Status::InvalidArgument(
        "--cluster_id is empty: give 1..128 characters of [0-9A-Za-z_.-]");
  }
  if (id->size() > 128) {
    return Status::InvalidArgument("--cluster_id is " + std::to_string(id->size()) +
                                   " characters long: shorten it to at most 128");
  }
  for (size_t i = 0; i < id->size(); ++i) {
    if (!IsClusterIdChar((*id)[i])) {
      return Status::InvalidArgument("--cluster_id='" + *id + "': character " +
                                     Printable((*id)[i]) + " at position " +
                                     std::to_string(i + 1) +
                                     " is not allowed: use only letters, digits, '_', '.' "
                                     "and '-'");
    }
  }
  return Status::OK();
}

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// The etcd members in `conn` (etcd_kv.h's ParseEtcdEndpoints), the flag named in an error.
Status ParseEndpoints(const std::string& flag, const std::string& conn,
                      std::vector<HostPort>* out) {
  auto parsed = ParseEtcdEndpoints(conn);
  if (!parsed.ok()) {
    return Status::InvalidArgument(flag + "='" + conn + "': " + parsed.status().message());
  }
  *out = std::move(*parsed);
  return Status::OK();
}

bool IsWildcard(const std::string& address) {
  return address.empty() || address == "0.0.0.0" || address == "::" || address == "[::]" ||
         address == "0:0:0:0:0:0:0:0";
}

Status CheckRanges() {
  if (FLAGS_ha_lease_ttl_sec < 2 || FLAGS_ha_lease_ttl_sec > 60) {
    return Status::InvalidArgument("--ha_lease_ttl_sec=" + std::to_string(FLAGS_ha_lease_ttl_sec) +
                                   " is out of range: give 2..60 seconds");
  }
  if (FLAGS_oplog_poll_interval_ms < 1 || FLAGS_oplog_poll_interval_ms > 60000) {
    return Status::InvalidArgument(
        "--oplog_poll_interval_ms=" + std::to_string(FLAGS_oplog_poll_interval_ms) +
        " is out of range: give 1..60000 ms");
  }
  if (FLAGS_oplog_batch_max_entries < 1 || FLAGS_oplog_batch_max_entries > 65536) {
    return Status::InvalidArgument(
        "--oplog_batch_max_entries=" + std::to_string(FLAGS_oplog_batch_max_entries) +
        " is out of range: give 1..65536");
  }
  if (FLAGS_batch_oplog_retry_timeout_sec < 1) {
    return Status::InvalidArgument("--batch_oplog_retry_timeout_sec must be >= 1 second");
  }
  if (FLAGS_oplog_checkpoint_entries < 1) {
    return Status::InvalidArgument("--oplog_checkpoint_entries must be >= 1");
  }
  return Status::OK();
}

// The backend named by --ha_backend_type, checked; `oplog` is --enable_oplog.
Status CheckBackend(const std::string& backend, bool oplog) {
  if (oplog && backend != "etcd") {
    return Status::InvalidArgument("--enable_oplog requires --ha_backend_type=etcd (the "
                                   "operation log lives in etcd), not '" + backend + "'");
  }
  if (backend == "etcd") return Status::OK();
  if (backend == "redis" || backend == "k8s") {
    return Status::InvalidArgument("--ha_backend_type=" + backend +
                                   ": this build supports etcd only: set "
                                   "--ha_backend_type=etcd and --ha_backend_connstring to the "
                                   "etcd members");
  }
  return Status::InvalidArgument("--ha_backend_type='" + backend +
                                 "' is not a backend (upstream's are etcd, redis and k8s; "
                                 "this build supports etcd only): set --ha_backend_type=etcd");
}

// The connection string in force: --ha_backend_connstring, else --etcd_endpoints.
std::string EffectiveConnstring() {
  const std::string& conn = FLAGS_ha_backend_connstring;
  const std::string& legacy = FLAGS_etcd_endpoints;
  if (conn.empty()) return legacy;
  if (!legacy.empty() && legacy != conn) {
    LOG(WARNING) << "--ha_backend_connstring='" << conn << "' and --etcd_endpoints='" << legacy
                 << "' differ: using --ha_backend_connstring";
  }
  return conn;
}

}  // namespace

Status ApplyConfigFile(const std::string& path) {
  if (path.empty()) return Status::OK();
  const std::string ext = Lower(path);
  const bool yaml = EndsWith(ext, ".yaml") || EndsWith(ext, ".yml");
  if (!yaml && !EndsWith(ext, ".json")) {
    return Status::InvalidArgument("config file " + path +
                                   ": unknown format: name it .yaml, .yml or .json");
  }
  std::error_code ec;
  std::ifstream in;
  if (std::filesystem::is_regular_file(path, ec)) in.open(path, std::ios::binary);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in.is_open() || in.bad()) {
    return Status::InvalidArgument("config file " + path +
                                   ": cannot be read (check --config_path and its "
                                   "permissions)");
  }
  Entries entries;
  MC_RETURN_IF_ERROR(yaml ? ReadYaml(path, text.str(), &entries)
                          : ReadJson(path, text.str(), &entries));
  std::set<std::string> seen;  // flags, aliases resolved
  for (const auto& [key, value] : entries) {
    const std::string flag = FlagOfKey(key);
    const std::string where = "config file " + path + ": key '" + key + "'";
    gflags::CommandLineFlagInfo info;
    if (ForbiddenKeys().count(flag)) {
      return Status::InvalidArgument(where + " cannot be set in a config file");
    }
    if (!gflags::GetCommandLineFlagInfo(flag.c_str(), &info)) {
      return Status::InvalidArgument(where + " is not a mooncake_master flag (see --help)");
    }
    if (!seen.insert(flag).second) {
      return Status::InvalidArgument(where + " sets --" + flag +
                                     " a second time (client_live_ttl_sec is client_ttl)");
    }
    if (!Parses(flag, value)) {
      return Status::InvalidArgument(where + ": '" + value + "' is not a valid " + info.type +
                                     " for --" + flag);
    }
    if (!info.is_default) {
      LOG(INFO) << where << " ignored: --" << flag << "=" << info.current_value
                << " given on the command line wins";
      continue;
    }
    if (gflags::SetCommandLineOptionWithMode(flag.c_str(), value.c_str(),
                                             gflags::SET_FLAG_IF_DEFAULT)
            .empty()) {
      return Status::InvalidArgument(where + ": cannot set --" + flag + " to '" + value + "'");
    }
  }
  LOG(INFO) << "config file " << path << ": " << entries.size() << " keys read";
  return Status::OK();
}

Status ResolveRpcFlags(int* rpc_port, int* rpc_threads) {
  if (FLAGS_port != 50051) LOG(WARNING) << "--port is deprecated, use --rpc_port instead";
  if (FLAGS_max_threads != 16) {
    LOG(WARNING) << "--max_threads is deprecated, use --rpc_thread_num instead";
  }
  if (FLAGS_rpc_port < 0 || FLAGS_rpc_port > 65535) {
    return Status::InvalidArgument("--rpc_port must be 0..65535");
  }
  *rpc_port = FLAGS_rpc_port > 0 ? FLAGS_rpc_port : FLAGS_port;
  if (FLAGS_rpc_port > 0 && FLAGS_port != 50051) {
    LOG(WARNING) << "both --rpc_port and --port are set: using --rpc_port=" << FLAGS_rpc_port;
  }
  if (*rpc_port <= 0 || *rpc_port > 65535) {
    return Status::InvalidArgument("--port / --rpc_port must be 1..65535");
  }
  if (FLAGS_rpc_thread_num < 0 || FLAGS_max_threads <= 0) {
    return Status::InvalidArgument("--rpc_thread_num must be >= 0 and --max_threads >= 1");
  }
  *rpc_threads = FLAGS_rpc_thread_num;
  if (*rpc_threads == 0) {
    const int cpus = static_cast<int>(std::thread::hardware_concurrency());
    *rpc_threads = cpus > 0 ? std::min(FLAGS_max_threads, cpus) : FLAGS_max_threads;
  } else if (FLAGS_max_threads != 16) {
    LOG(WARNING) << "both --rpc_thread_num and --max_threads are set: using --rpc_thread_num="
                 << FLAGS_rpc_thread_num;
  }
  return Status::OK();
}

Status MasterConfigFromFlags(MasterConfig* config) {
  if (FLAGS_metrics_port < 0 || FLAGS_metrics_port > 65535 ||
      FLAGS_http_metadata_server_port < 0 || FLAGS_http_metadata_server_port > 65535) {
    return Status::InvalidArgument(
        "--metrics_port and --http_metadata_server_port must be 0..65535");
  }
  if (FLAGS_eviction_high_watermark_ratio <= 0 || FLAGS_eviction_high_watermark_ratio > 1 ||
      FLAGS_eviction_ratio < 0 || FLAGS_eviction_ratio > 1) {
    return Status::InvalidArgument(
        "--eviction_high_watermark_ratio must be in (0, 1] and --eviction_ratio in [0, 1]");
  }
  if (FLAGS_client_ttl <= 0) return Status::InvalidArgument("--client_ttl must be > 0 seconds");
  if (!(FLAGS_max_client_inflight_ratio > 0 && FLAGS_max_client_inflight_ratio <= 1)) {
    return Status::InvalidArgument("--max_client_inflight_ratio must be in (0, 1]");
  }
  config->default_kv_lease_ttl_ms = FLAGS_default_kv_lease_ttl;
  config->default_kv_soft_pin_ttl_ms = FLAGS_default_kv_soft_pin_ttl;
  config->client_ttl_s = static_cast<uint64_t>(FLAGS_client_ttl);
  config->eviction_ratio = FLAGS_eviction_ratio;
  config->eviction_high_watermark_ratio = FLAGS_eviction_high_watermark_ratio;
  config->put_start_discard_timeout_s = FLAGS_put_start_discard_timeout_sec;
  config->max_client_inflight_ratio = FLAGS_max_client_inflight_ratio;
  if (FLAGS_max_total_pending_tasks == 0 || FLAGS_max_total_processing_tasks == 0 ||
      FLAGS_pending_task_timeout_sec == 0 || FLAGS_processing_task_timeout_sec == 0) {
    return Status::InvalidArgument(
        "--max_total_pending_tasks, --max_total_processing_tasks, --pending_task_timeout_sec "
        "and --processing_task_timeout_sec must be > 0");
  }
  constexpr uint64_t kMaxTaskTimeout = 365ull * 24 * 3600;  // a year: no overflow of times
  config->task_limits.max_pending = FLAGS_max_total_pending_tasks;
  config->task_limits.max_processing = FLAGS_max_total_processing_tasks;
  config->task_limits.max_finished = FLAGS_max_total_finished_tasks;
  config->task_limits.pending_timeout =
      std::chrono::seconds(std::min(FLAGS_pending_task_timeout_sec, kMaxTaskTimeout));
  config->task_limits.processing_timeout =
      std::chrono::seconds(std::min(FLAGS_processing_task_timeout_sec, kMaxTaskTimeout));
  return OffloadSettingsFromFlags(config);
}

Status ResolveHaSettings(int rpc_port, HaSettings* out) {
  HaSettings s;
  MC_RETURN_IF_ERROR(CheckRanges());
  s.cluster_id = FLAGS_cluster_id;
  MC_RETURN_IF_ERROR(CheckClusterId(&s.cluster_id));
  if (FLAGS_enable_oplog && !FLAGS_enable_ha) {
    return Status::InvalidArgument(
        "--enable_oplog requires --enable_ha=true (the operation log replicates the leader's "
        "metadata to the standbys): add --enable_ha=true or drop --enable_oplog");
  }
  s.enabled = FLAGS_enable_ha;
  s.backend = FLAGS_ha_backend_type;
  s.oplog = FLAGS_enable_oplog;
  s.oplog_poll_interval_ms = static_cast<uint32_t>(FLAGS_oplog_poll_interval_ms);
  s.oplog_batch_max_entries = FLAGS_oplog_batch_max_entries;
  s.batch_oplog_retry_timeout_sec = FLAGS_batch_oplog_retry_timeout_sec;
  s.lease_ttl_sec = static_cast<uint32_t>(FLAGS_ha_lease_ttl_sec);
  s.ack_before_durable = FLAGS_oplog_ack_before_durable;
  s.checkpoint_entries = FLAGS_oplog_checkpoint_entries;
  if (!s.enabled) {
    if (!FLAGS_ha_backend_connstring.empty() || !FLAGS_etcd_endpoints.empty()) {
      LOG(WARNING) << "--ha_backend_connstring / --etcd_endpoints are ignored without "
                      "--enable_ha=true";
    }
    *out = std::move(s);
    return Status::OK();
  }
  MC_RETURN_IF_ERROR(CheckBackend(s.backend, s.oplog));
  const std::string conn = EffectiveConnstring();
  if (Trim(conn).empty()) {
    return Status::InvalidArgument(
        "--enable_ha=true needs the etcd members: set --ha_backend_connstring=h1:2379;h2:2379 "
        "(or the legacy --etcd_endpoints)");
  }
  const char* source =
      FLAGS_ha_backend_connstring.empty() ? "--etcd_endpoints" : "--ha_backend_connstring";
  MC_RETURN_IF_ERROR(ParseEndpoints(source, conn, &s.endpoints));
  if (IsWildcard(FLAGS_rpc_address)) {
    return Status::InvalidArgument(
        "--rpc_address='" + FLAGS_rpc_address +
        "' with --enable_ha=true: the leader publishes --rpc_address for clients to dial, and "
        "other hosts cannot dial 0.0.0.0: set --rpc_address to this host's address");
  }
  if (rpc_port < 1 || rpc_port > 65535) {
    return Status::InvalidArgument("--rpc_port must be 1..65535 with --enable_ha=true");
  }
  HostPort self;
  self.host = FLAGS_rpc_address;
  if (self.host.size() > 2 && self.host.front() == '[' && self.host.back() == ']') {
    self.host = self.host.substr(1, self.host.size() - 2);
  }
  self.port = static_cast<uint16_t>(rpc_port);
  self.has_port = true;
  s.advertise_address = self.ToString();
  *out = std::move(s);
  return Status::OK();
}

}  // namespace store
}  // namespace mooncake
