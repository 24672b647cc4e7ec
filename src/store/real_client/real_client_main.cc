// mooncake_client: a standalone Store client (upstream's "real client"). It lends
// --global_segment_size bytes of its memory to the pool (a StoreClient with a global
// segment) and serves dummy clients (MooncakeDistributedStore.setup_dummy) on --port: it tells
// them which master, metadata server and protocol to use and says every 500 ms that it lives
// (real_client_wire.h). Dummies run store clients of their own and move their bytes with
// their own engines, straight to and from this process's segment. Flags and defaults follow
// upstream's mooncake_client (mooncake-store/src/real_client_main.cpp).
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <optional>
#include <string>
#include <thread>

#include "common/net.h"
#include "mooncake/options.h"
#include "mooncake/store/store_client.h"
#include "store/client/client_http.h"
#include "store/common/binary_main.h"
#include "store/real_client/real_client_server.h"

DEFINE_string(host, "0.0.0.0",
              "Local hostname: this client's segment name (host or host:port; 0.0.0.0 names "
              "it after the machine's hostname) and the address --port binds");
DEFINE_string(metadata_server, "http://127.0.0.1:8080/metadata",
              "Metadata server connection string (P2PHANDSHAKE, etcd://, redis://, http://)");
DEFINE_string(device_names, "", "Device names (no RDMA transport in this build: ignored)");
DEFINE_string(master_server_address, "127.0.0.1:50051",
              "Master server address: host:port, or etcd://h1:2379;h2:2379 to follow the HA "
              "leader (of the cluster MC_STORE_CLUSTER_ID names; dummies follow it too)");
DEFINE_string(protocol, "tcp", "Protocol");
DEFINE_int32(port, 50052, "Port serving dummy clients");
DEFINE_string(global_segment_size, "4 GB", "Size of the global segment (e.g. 4 GB, 512MB, 1.5G)");
DEFINE_string(local_buffer_size, "0", "Size of the local buffer (e.g. 16MB, 1GB)");
DEFINE_int32(threads, 1,
             "Threads of the dummy-client service (accepted for upstream's command lines: one "
             "poll loop serves every dummy, which move their data themselves)");
DEFINE_string(tenant_id, "default",
              "Tenant of this client and its dummies: with a master in strict multi-tenant "
              "mode (--enable_multi_tenants) their keys and quota are this tenant's");

DEFINE_bool(enable_http_server, false,
            "Enable embedded HTTP server for health check and metrics (/health, /metrics, "
            "/metrics/summary on --http_port)");
DEFINE_int32(http_port, 9300, "Port of the HTTP server of --enable_http_server");

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

// "4 GB", "16MB", "1.5G", "1048576" (bytes): B, K/KB, M/MB, G/GB, T/TB, powers of 1024, case
// and spaces ignored, as upstream's string_to_byte_size. nullopt for anything else.
std::optional<uint64_t> ParseByteSize(const std::string& text) {
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) s += static_cast<char>(std::toupper(c));
  }
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  double value = 0;
  try {
    size_t used = 0;
    value = std::stod(s.substr(0, i), &used);
    if (used != i) return std::nullopt;
  } catch (...) {
    return std::nullopt;
  }
  const std::string unit = s.substr(i);
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB") mult = 1024.0;
  else if (unit == "M" || unit == "MB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB") mult = 1024.0 * 1024 * 1024 * 1024;
  else return std::nullopt;
  const double bytes = value * mult;
  if (!std::isfinite(bytes) || bytes >= 18446744073709551615.0) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

// The store client's local_hostname: --host as given (with its port, if any), except that
// the wildcard 0.0.0.0 (which names no machine) becomes the machine's hostname.
std::string SegmentHost(const std::string& host) {
  auto hp = mooncake::ParseHostPort(host);
  if (!hp.ok() || (!hp->host.empty() && hp->host != "0.0.0.0")) return host;
  char name[256] = {0};
  std::string h = ::gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0' ? name
                                                                                : "127.0.0.1";
  return hp->has_port ? mooncake::HostPort{h, hp->port, true}.ToString() : h;
}

}  // namespace

int main(int argc, char* argv[]) {
  mooncake::store::InitBinary(
      "mooncake_client: a standalone Mooncake Store client serving dummies", &argc, &argv);
  using mooncake::store::Fail;
  if (FLAGS_port <= 0 || FLAGS_port > 65535) return Fail("--port must be 1..65535");
  if (FLAGS_enable_http_server && (FLAGS_http_port <= 0 || FLAGS_http_port > 65535)) {
    return Fail("--http_port must be 1..65535");
  }
  auto gseg = ParseByteSize(FLAGS_global_segment_size);
  auto lbuf = ParseByteSize(FLAGS_local_buffer_size);
  if (!gseg) return Fail("--global_segment_size '" + FLAGS_global_segment_size + "' is not a size");
  if (!lbuf) return Fail("--local_buffer_size '" + FLAGS_local_buffer_size + "' is not a size");
  if (!FLAGS_device_names.empty()) {
    LOG(WARNING) << "--device_names " << FLAGS_device_names << " ignored (no RDMA transport)";
  }

  mooncake::store::StoreClientOptions o;
  o.local_hostname = SegmentHost(FLAGS_host);
  o.metadata_server = FLAGS_metadata_server;
  o.global_segment_size = *gseg;
  // This process stages nothing itself (dummies move their own bytes); the store client
  // still wants a staging buffer, so 0 means a small one.
  o.local_buffer_size = std::max<uint64_t>(*lbuf, 1 << 20);
  o.protocol = FLAGS_protocol;
  o.master_server_addr = FLAGS_master_server_address;
  o.tenant_id = FLAGS_tenant_id;  // checked by setup (INVALID_PARAMS, saying why)
  int code = 0;
  std::string message;
  std::shared_ptr<mooncake::store::StoreClient> client =
      mooncake::store::StoreClient::Create(o, &code, &message);
  if (!client) return Fail("store client setup failed (" + std::to_string(code) + "): " + message);
  std::unique_ptr<mooncake::store::MetricsServer> http;
  if (FLAGS_enable_http_server) {
    auto server = mooncake::store::StartClientHttp(FLAGS_http_port, [client] { return client; });
    if (server.ok()) {
      http = std::move(server).value();
      LOG(INFO) << "HTTP server on port " << FLAGS_http_port
                << ": /health, /metrics, /metrics/summary";
    } else {
      LOG(WARNING) << "Failed to start client HTTP server on port " << FLAGS_http_port << " ("
                   << server.status().message() << "); continuing without HTTP endpoints";
    }
  }

  const std::string segment = client->segment_name();
  mooncake::store::RealClientConfig config;
  config.master_server_address = FLAGS_master_server_address;
  config.metadata_server = FLAGS_metadata_server;
  config.protocol = FLAGS_protocol;
  config.device_names = FLAGS_device_names;
  {
    auto hp = mooncake::ParseHostPort(o.local_hostname);
    config.host = hp.ok() ? hp->host : o.local_hostname;  // dummies add ports of their own
  }
  config.segment_name = segment;
  config.store_cluster_id = mooncake::EngineOptions::FromEnvironment().store_cluster_id;
  config.tenant_id = FLAGS_tenant_id;
  mooncake::store::RealClientServer server(config);
  auto bind = mooncake::ParseHostPort(FLAGS_host);
  const mooncake::Status started = server.Start(bind.ok() ? bind->host : FLAGS_host, FLAGS_port);
  if (!started.ok()) {
    return Fail("cannot serve dummy clients on port " + std::to_string(FLAGS_port) + ": " +
                started.message() +
                " (in use? choose another with --port)");
  }
  LOG(INFO) << "Real client service on " << FLAGS_host << ":" << server.port() << ": segment "
            << segment << " (" << *gseg << " bytes), master " << FLAGS_master_server_address
            << ", metadata " << FLAGS_metadata_server;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  LOG(INFO) << "Real client stopping";
  server.Stop();
  http.reset();
  client->Close();
  return 0;
}
