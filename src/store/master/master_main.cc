// mooncake_master: the Store's master service. Flags and defaults follow upstream's
// mooncake_master where upstream has them (docs/store_upstream.md); the master serves
// MasterService over the Store's RPC wire (rpc_wire.h, rpc_server.h) on
// --rpc_address:--rpc_port, with --enable_metric_reporting its
// HTTP endpoints (master_http.h: /metrics, /get_all_segments, /query_key, ...) on
// --metrics_host:--metrics_port, and with --enable_http_metadata_server the transfer
// engine's HTTP metadata protocol (the same server as mooncake_http_metadata_server) on
// --http_metadata_server_host:--http_metadata_server_port.
// The flags (upstream's deprecated aliases, --config_path, the HA flags) are defined and
// checked in master_flags.h.
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
#include "store/ha/ha_master.h"
#include "store/master/master_flags.h"
#include "store/master/master_rpc.h"
#include "store/master/master_service.h"
#include "store/master/master_http.h"
#include "store/common/metrics_server.h"
#include "store/rpc/rpc_server.h"
#include "metadata/http_server/metadata_http_server.h"

namespace {

using mooncake::Status;
using mooncake::store::MasterService;

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }  // the main loop polls the flag

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
  metrics->SetWriteHandler(
      [http](const std::string& method, const std::string& target, const std::string& body) {
        return http->ServeWrite(method, target, body);
      });
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
  mooncake::store::HaSettings ha;
  // The config file first: every flag read below may come from it.
  Status flags = mooncake::store::ApplyConfigFile(FLAGS_config_path);
  if (flags.ok()) flags = mooncake::store::ResolveRpcFlags(&rpc_port, &rpc_threads);
  if (flags.ok()) flags = mooncake::store::MasterConfigFromFlags(&config);
  if (flags.ok()) flags = mooncake::store::ResolveHaSettings(rpc_port, &ha);
  bool kv_events = false;
  mooncake::store::kv_events::PublisherOptions kv_options;
  if (flags.ok()) flags = mooncake::store::KvEventSettingsFromFlags(&kv_events, &kv_options);
  std::unique_ptr<mooncake::store::TenantPolicySource> tenant_policies;
  if (flags.ok()) {
    flags = mooncake::store::TenantSettingsFromFlags(ha.cluster_id, &config, &tenant_policies);
  }
  if (!flags.ok()) return Fail(flags.message());
  // Strict mode: the quota policy, read before serving (and by each new HA leader).
  auto load_policies = [source = tenant_policies.get()](MasterService* m) {
    if (source == nullptr) return Status::OK();
    auto loaded = source->Load();
    if (!loaded.ok()) {
      return Status::Unavailable("tenant quota policy (" + source->Describe() +
                                 "): " + loaded.status().message());
    }
    m->SetTenantPolicies(*loaded);
    LOG(INFO) << "strict multi-tenant mode: " << loaded->size() << " tenants in the quota policy ("
              << source->Describe() << ")";
    return Status::OK();
  };
  // With --enable_ha the MasterService is HaMaster's (a standby's until it leads).
  std::unique_ptr<MasterService> alone;
  std::unique_ptr<mooncake::store::ha::HaMaster> ha_master;
  // KV events (as upstream: a missing endpoint or backend id, or a bind failure, is logged and
  // the master serves on without them). Snapshots read the master serving at that moment.
  std::unique_ptr<mooncake::store::kv_events::KvEventPublisher> publisher;
  kv_options.scoped_keys = config.enable_multi_tenants;
  if (kv_events) {
    auto started_events = mooncake::store::kv_events::KvEventPublisher::Start(
        kv_options, [&alone, &ha_master](const std::function<void(const std::string&)>& fn) {
          if (ha_master) {
            ha_master->master()->ForEachCompleteKey(fn);
          } else if (alone) {
            alone->ForEachCompleteKey(fn);
          }
        });
    if (started_events.ok()) {
      publisher = std::move(started_events).value();
    } else {
      LOG(ERROR) << "--enable_kv_events: " << started_events.status().message()
                 << "; serving without KV events";
    }
  }
  if (ha.enabled) {
    mooncake::store::ha::HaMaster::Options o;
    o.endpoints = ha.endpoints;
    o.cluster_id = ha.cluster_id;
    o.advertise_address = ha.advertise_address;
    o.config = config;
    o.oplog = ha.oplog;
    o.lease_ttl_sec = ha.lease_ttl_sec;
    o.poll_interval_ms = ha.oplog_poll_interval_ms;
    o.batch_max_entries = ha.oplog_batch_max_entries;
    o.retry_timeout_sec = ha.batch_oplog_retry_timeout_sec;
    o.ack_before_durable = ha.ack_before_durable;
    o.checkpoint_entries = ha.checkpoint_entries;
    o.events = publisher.get();
    o.before_serving = load_policies;
    auto created = mooncake::store::ha::HaMaster::Create(std::move(o));
    if (!created.ok()) return Fail("--enable_ha: " + created.status().message());
    ha_master = std::move(*created);
  } else {
    alone = std::make_unique<MasterService>(config);
    if (publisher) alone->SetEventSink(publisher.get());
    const Status loaded = load_policies(alone.get());
    if (!loaded.ok()) return Fail("--enable_multi_tenants: " + loaded.message());
  }
  mooncake::store::ha::HaMaster* const ha_ptr = ha_master.get();
  MasterService* const alone_ptr = alone.get();

  std::signal(SIGPIPE, SIG_IGN);  // a peer that closes early is an error on the send, not a kill
  // The metadata server first: engines started once the master says it is up may use it.
  std::unique_ptr<mooncake::http::MetadataHttpServer> metadata;
  Status started = StartMetadataServer(&metadata);
  if (!started.ok()) return Fail(started.message());

  const std::string address = FLAGS_rpc_address + ":" + std::to_string(rpc_port);
  mooncake::store::RpcServer::Options rpc_options;
  rpc_options.threads = rpc_threads;
  rpc_options.slow = &mooncake::store::IsSlowMasterMethod;
  rpc_options.max_wait = std::chrono::milliseconds(1000);  // OffloadFetch's long poll
  if (ha_ptr != nullptr) {
    // Replies wait until their changes are durable in etcd (ha_master.h).
    rpc_options.hold_position = [ha_ptr](uint16_t method, mooncake::store::RpcStatus st) {
      return ha_ptr->HoldPosition(method, st);
    };
  }
  mooncake::store::RpcServer server(
      rpc_options,
      [ha_ptr, alone_ptr](uint16_t method, const char* data, size_t n, std::string* out) {
        if (ha_ptr != nullptr) return ha_ptr->Serve(method, data, n, out);
        return mooncake::store::ServeMasterRpc(alone_ptr, method, data, n, out);
      });
  if (alone_ptr != nullptr) {
    // Offload fetches wait for work instead of polling (cleared before the server stops).
    alone_ptr->SetDiskWorkWaker([&server](const std::string& client) { server.WakeWaiting(client); });
  }
  started = server.Start(FLAGS_rpc_address, rpc_port);
  if (!started.ok()) return Fail(started.message() + " (choose another port with --rpc_port)");
  if (ha_ptr != nullptr) ha_ptr->Start(&server);

  auto http = ha_ptr != nullptr ? std::make_unique<mooncake::store::MasterHttp>(
                                      [ha_ptr] { return ha_ptr->master(); },
                                      [ha_ptr] { return ha_ptr->View(); })
                                : std::make_unique<mooncake::store::MasterHttp>(alone_ptr);
  if (publisher) http->SetKvEventsStatus([p = publisher.get()] { return p->StatusJson(); });
  http->SetTenantPolicySource(tenant_policies.get());
  std::unique_ptr<mooncake::store::MetricsServer> metrics;
  started = StartMetrics(http.get(), &metrics);
  if (!started.ok()) return Fail(started.message());
  LOG(INFO) << "Master service started on " << address << " (lease " << config.default_kv_lease_ttl_ms
            << " ms, client ttl " << config.client_ttl_s << " s, eviction at "
            << config.eviction_high_watermark_ratio << " freeing " << config.eviction_ratio
            << ", " << rpc_threads << " RPC loops)"
            << (metrics ? ", HTTP endpoints on :" + std::to_string(metrics->port()) : "")
            << (metadata ? ", HTTP metadata on :" + std::to_string(metadata->port()) : "")
            << (ha_ptr ? ", HA on " + ha.advertise_address + " (cluster " + ha.cluster_id +
                             (ha.oplog ? ", oplog" : ", no oplog: a new leader starts empty") +
                             "; a standby until it wins master_view)"
                       : std::string());

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  while (!g_stop.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (ha_ptr != nullptr) {
      ha_ptr->Tick();
    } else {
      alone->Tick();
    }
  }
  LOG(INFO) << "Master service stopping";
  if (ha_ptr != nullptr) ha_ptr->Stop();  // steps down first: the lease is revoked
  if (alone) alone->SetDiskWorkWaker(nullptr);
  server.Stop();
  if (alone) alone->SetEventSink(nullptr);
  http->SetKvEventsStatus(nullptr);
  publisher.reset();  // publishes what is queued
  if (metrics) metrics->Stop();
  if (metadata) metadata->Stop();
  return 0;
}
