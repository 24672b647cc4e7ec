// MetadataHttpServer: upstream Mooncake's HTTP metadata protocol over an in-memory table, on a
// GuardedServer (guarded_server.h). One implementation, used by the standalone
// mooncake_http_metadata_server and by mooncake_master --enable_http_metadata_server.
//
// Route /metadata, with the key in the query (?key=...; surrounding whitespace is dropped):
//   GET     200 + the value | 404 "metadata not found"
//   PUT     200 "metadata updated" (the body is the value); a key containing "rpc_meta" that
//           exists already with a different value: 400 "Duplicate rpc_meta key not allowed".
//           Upstream's first server refused every re-PUT of an rpc_meta key, so a restarted
//           engine that republished the very same address failed to start; like upstream's
//           later servers, a re-PUT of the identical value is accepted (200 "metadata unchanged").
//   DELETE  200 "metadata deleted" | 404 "metadata not found"
//   other methods 405; no or empty key 400 "metadata key is required".
// GET /health: 200 "OK" (as upstream's master-embedded server); other paths 404.
// The /metadata replies have Content-Type application/json, as upstream's.
// Bounds: a body over max_body_bytes is 413, whatever its Content-Type (form-encoded bodies
// too: cpp-httplib's own 8 KiB form limit does not apply); a PUT that would take the stored
// keys and values over max_total_bytes is 507; URIs and headers are bounded by cpp-httplib
// (8 KiB). Connections: see GuardLimits. The port is bound without SO_REUSEPORT: a port in
// use is refused, so two servers never split the keys between them.
//
// Thread safety: Start / Stop from one thread; the table is safe for the server's workers.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "metadata/http_server/guarded_server.h"

namespace mooncake::http {

struct MetadataServerOptions {
  size_t max_body_bytes = 16u << 20;          // 16 MiB
  size_t max_total_bytes = size_t(1) << 30;   // 1 GiB of keys and values
  GuardLimits guard;
  bool log_requests = false;  // one stderr line per request
};

class MetadataHttpServer {
 public:
  explicit MetadataHttpServer(MetadataServerOptions options = {});
  ~MetadataHttpServer();  // Stop()
  MetadataHttpServer(const MetadataHttpServer&) = delete;
  MetadataHttpServer& operator=(const MetadataHttpServer&) = delete;

  // Binds host:port (port 0: one the kernel chooses) and serves on a thread of its own.
  // "" on success, else why not (a port in use says "in use").
  std::string Start(const std::string& host, int port);
  // Stops accepting and ends every connection; returns within about 100 ms plus the time
  // of the handlers running. Idempotent.
  void Stop();
  // Started and not stopped (nor ended by itself).
  bool serving() const;
  // The bound port (after Start).
  int port() const { return port_; }
  GuardCounters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace mooncake::http
