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
// Writes with a shared secret (MetadataServerOptions::auth_secret, the cluster's
// MC_AUTH_SECRET; empty: everything above, unchanged, and anyone may PUT or DELETE any key):
//   - Every PUT and DELETE must prove knowledge of the secret (docs/wire_protocol.md §5.5):
//     headers X-MC-Auth-Time (Unix seconds), X-MC-Auth-Nonce (16-64 hex digits) and
//     X-MC-Auth-Sig = Authenticator::SignStoreRequest(method, key as sent, body, time,
//     nonce). Missing, malformed or not verifying: 403 with what is wrong and what to do.
//     A time more than auth_window_s off the server's clock, or a nonce already used within
//     the window, is a replay: 403. Nonces are remembered for the window, at most
//     auth_max_nonces (past that the oldest is forgotten and requests no newer than it are
//     refused, so no forgotten nonce can be replayed). GETs stay open: engines verify the
//     entries' own signatures.
//   - Owner: an entry whose JSON value names "mc_auth_instance" (every engine with the secret
//     signs its descriptor and rpc_meta entry with its start's instance id) belongs to that
//     engine instance while the instance holds an rpc_meta entry on this server. A PUT that
//     would replace it with a value of another (or no) instance is refused with 409, until
//     the owner's rpc_meta entry is gone: deleted by the owner at shutdown, or by a new start
//     of that engine that found the old one dead (the engine's takeover of a crashed
//     predecessor). DELETE needs the proof only: the server cannot tell a crashed owner from
//     a live one (every holder of the secret is a full peer anyway). rpc_meta keys keep the
//     rule above (a different value: 400 Duplicate).
//
// Thread safety: Start / Stop from one thread; the table is safe for the server's workers.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "metadata/http_server/guarded_server.h"
#include "mooncake/status.h"

namespace mooncake::http {

struct MetadataServerOptions {
  size_t max_body_bytes = 16u << 20;          // 16 MiB
  size_t max_total_bytes = size_t(1) << 30;   // 1 GiB of keys and values
  GuardLimits guard;
  bool log_requests = false;  // one stderr line per request
  // Non-empty: PUT and DELETE need a proof of this secret, and owners' entries are kept
  // (see above). Never logged.
  std::string auth_secret;
  int auth_window_s = 60;            // replay window, each way
  size_t auth_max_nonces = 1 << 16;  // nonces remembered at most (about 100 bytes each)
};

class MetadataHttpServer {
 public:
  explicit MetadataHttpServer(MetadataServerOptions options = {});
  ~MetadataHttpServer();  // Stop()
  MetadataHttpServer(const MetadataHttpServer&) = delete;
  MetadataHttpServer& operator=(const MetadataHttpServer&) = delete;

  // Binds host:port (port 0: one the kernel chooses) and serves on a thread of its own.
  // An error says why not (a port in use: Unavailable, saying "in use").
  Status Start(const std::string& host, int port);
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
