// mooncake_master: the Store's master service. Flags and defaults follow upstream's
// mooncake_master where upstream has them (docs/store_upstream.md); the master serves
// MasterService over the Store's RPC wire (rpc_wire.h, rpc_server.h) on
// --rpc_address:--rpc_port, with --enable_metric_reporting its
// HTTP endpoints (master_http.h: /metrics, /get_all_segments, /query_key, ...) on
// --metrics_host:--metrics_port, and with --enable_http_metadata_server the transfer
// engine's HTTP metadata protocol (the same server as mooncake_http_metadata_server) on
// --http_metadata_server_host:--http_metadata_server_port.
// Upstream's deprecated aliases: --port (used when --rpc_port is 0, its default) and
// --max_threads (used when --rpc_thread_num is 0, its default; capped at the CPU count).
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <thread>

#include "store/common/binary_main.h"
#include "store/common/limits.h"
#include "store/master/master_rpc.h"
#include "store/master/master_service.h"
#include "store/master/master_http.h"
#include "store/master/metrics_server.h"
#include "store/rpc/rpc_server.h"
#include "metadata/http_server/metadata_http_server.h"

DEFINE_int32(rpc_port, 0, "Port of the master's RPC service (0: the value of --port)");
DEFINE_int32(port, 50051, "Port of the master's RPC service (deprecated: use --rpc_port)");
DEFINE_string(rpc_address, "0.0.0.0", "Address the RPC service binds");
DEFINE_int32(rpc_thread_num, 0,
             "RPC event loops (0: --max_threads, capped at the number of CPUs)");
DEFINE_int32(max_threads, 16, "RPC event loops (deprecated: use --rpc_thread_num)");
DEFINE_uint64(default_kv_lease_ttl, 10000,
              "Lease an object gets on each get (ms): it cannot be removed or evicted meanwhile");
DEFINE_uint64(default_kv_soft_pin_ttl, 30 * 60 * 1000,
              "How long a soft pin protects an object from eviction after its last access (ms)");
DEFINE_int64(client_ttl, 10,
             "Seconds without a heartbeat after which a client's segments are unmounted");
DEFINE_double(eviction_ratio, 0.05, "Share of capacity freed below the watermark by eviction");
DEFINE_double(eviction_high_watermark_ratio, 0.9,
              "Allocated share of capacity above which objects are evicted");
DEFINE_uint64(put_start_discard_timeout_sec, 30,
              "Seconds after which a put that was started but not ended is discarded");
DEFINE_double(max_client_inflight_ratio, 0.5,
              "Share of the capacity one client's puts in flight (started, not ended) may hold "
              "(not an upstream flag)");
DEFINE_bool(enable_metric_reporting, true, "Serve Prometheus metrics and log them periodically");
DEFINE_int32(metrics_port, 9003,
             "Port of the HTTP endpoints (/metrics, /get_all_segments, /query_key, ...)");
DEFINE_string(metrics_host, "",
              "Address the HTTP endpoints bind (\"\": the --rpc_address; \"::\" for IPv6)");
DEFINE_bool(enable_http_metadata_server, false,
            "Serve the transfer engine's HTTP metadata protocol (/metadata) in this process");
DEFINE_int32(http_metadata_server_port, 8080, "Port of the HTTP metadata server");
DEFINE_string(http_metadata_server_host, "0.0.0.0", "Address the HTTP metadata server binds");

namespace {

using mooncake::Status;
using mooncake::store::MasterService;

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }  // the main loop polls the flag

// The RPC port and loops from the flags, upstream's deprecated aliases resolved as upstream
// does; an error names the flag.
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

// The master's configuration from the flags; an error names the flag out of range.
Status ConfigFromFlags(mooncake::store::MasterConfig* config) {
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
  return Status::OK();
}

// With --enable_http_metadata_server, the embedded metadata server, started (else null).
Status StartMetadataServer(std::unique_ptr<mooncake::http::MetadataHttpServer>* out) {
  if (!FLAGS_enable_http_metadata_server) return Status::OK();
  mooncake::http::MetadataServerOptions mds;
  // As mooncake_http_metadata_server: with the cluster's secret, writes must prove it.
  if (const char* secret = std::getenv("MC_AUTH_SECRET")) mds.auth_secret = secret;
  auto metadata = std::make_unique<mooncake::http::MetadataHttpServer>(mds);
  const Status started =
      metadata->Start(FLAGS_http_metadata_server_host, FLAGS_http_metadata_server_port);
  if (!started.ok()) {
    return Status::Unavailable("cannot serve HTTP metadata: " + started.message() +
                               " (choose another port with --http_metadata_server_port, or "
                               "stop the server holding it)");
  }
  LOG(INFO) << "HTTP metadata server listening on " << FLAGS_http_metadata_server_host << ":"
            << metadata->port() << " (http://<this host>:" << metadata->port()
            << "/metadata), writes "
            << (mds.auth_secret.empty() ? "open to anyone (no MC_AUTH_SECRET)"
                                        : "need MC_AUTH_SECRET's proof");
  *out = std::move(metadata);
  return Status::OK();
}

// With --enable_metric_reporting, the HTTP endpoints (master_http.h), started (else null).
// Event-driven (metrics_server.h): idle or slow connections cannot stall it.
// Two HTTP stacks in one process, still (issue 27 part 3 asked for one): the metrics port on
// the poll loop, the metadata server on cpp-httplib (GuardedServer). Neither carries the
// other's documented bounds without a rewrite: cpp-httplib (Debian's shared 0.11 build) caps
// a request URI at 8 KiB, compiled in, where /batch_query_keys takes up to a 64 KiB head, and
// its threads hold a reply each (no kMaxPendingReplyBytes); the poll loop reads no bodies,
// keep-alive, Expect: 100-continue or chunked requests, which /metadata PUTs need. Both share
// the listen helper (common/net.h) and the admission policy (common/admission.h).
Status StartMetrics(mooncake::store::MasterHttp* http,
                    std::unique_ptr<mooncake::store::MetricsServer>* out) {
  if (!FLAGS_enable_metric_reporting) return Status::OK();
  auto metrics = std::make_unique<mooncake::store::MetricsServer>(
      [http](const std::string& target) { return http->Serve(target); });
  const std::string host = FLAGS_metrics_host.empty() ? FLAGS_rpc_address : FLAGS_metrics_host;
  const Status started = metrics->Start(host, FLAGS_metrics_port);
  if (!started.ok()) {
    return Status::Unavailable("cannot serve metrics on port " +
                               std::to_string(FLAGS_metrics_port) + ": " + started.message() +
                               " (choose another with --metrics_port, or "
                               "--enable_metric_reporting=false)");
  }
  *out = std::move(metrics);
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  mooncake::store::InitBinary(
      "mooncake_master: the Mooncake Store master (placement and metadata)", &argc, &argv);
  using mooncake::store::Fail;
  int rpc_port = 0, rpc_threads = 0;
  mooncake::store::MasterConfig config;
  Status flags = ResolveRpcFlags(&rpc_port, &rpc_threads);
  if (flags.ok()) flags = ConfigFromFlags(&config);
  if (!flags.ok()) return Fail(flags.message());
  MasterService master(config);

  std::signal(SIGPIPE, SIG_IGN);  // a peer that closes early is an error on the send, not a kill
  // The metadata server first: engines started once the master says it is up may use it.
  std::unique_ptr<mooncake::http::MetadataHttpServer> metadata;
  Status started = StartMetadataServer(&metadata);
  if (!started.ok()) return Fail(started.message());

  const std::string address = FLAGS_rpc_address + ":" + std::to_string(rpc_port);
  mooncake::store::RpcServer::Options rpc_options;
  rpc_options.threads = rpc_threads;
  rpc_options.slow = &mooncake::store::IsSlowMasterMethod;
  mooncake::store::RpcServer server(
      rpc_options, [&master](uint16_t method, const char* data, size_t n, std::string* out) {
        return mooncake::store::ServeMasterRpc(&master, method, data, n, out);
      });
  started = server.Start(FLAGS_rpc_address, rpc_port);
  if (!started.ok()) return Fail(started.message() + " (choose another port with --rpc_port)");

  mooncake::store::MasterHttp http(&master);
  std::unique_ptr<mooncake::store::MetricsServer> metrics;
  started = StartMetrics(&http, &metrics);
  if (!started.ok()) return Fail(started.message());
  LOG(INFO) << "Master service started on " << address << " (lease " << config.default_kv_lease_ttl_ms
            << " ms, client ttl " << config.client_ttl_s << " s, eviction at "
            << config.eviction_high_watermark_ratio << " freeing " << config.eviction_ratio
            << ", " << rpc_threads << " RPC loops)"
            << (metrics ? ", HTTP endpoints on :" + std::to_string(metrics->port()) : "")
            << (metadata ? ", HTTP metadata on :" + std::to_string(metadata->port()) : "");

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  while (!g_stop.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    master.Tick();
  }
  LOG(INFO) << "Master service stopping";
  server.Stop();
  if (metrics) metrics->Stop();
  if (metadata) metadata->Stop();
  return 0;
}
