// The client's HTTP port (upstream's client HTTP server: setup(enable_client_http_server=True,
// client_http_port=9300), mooncake_client --enable_http_server --http_port): GET /metrics
// (ClientMetrics' Prometheus text, "text/plain; version=0.0.4"), /metrics/summary (its
// summary), /health ({"status":"healthy","code":0}; 503 with "not_initialized" (1) or
// "master_unreachable" (2)). /metrics and /metrics/summary are 503 "client not initialized"
// without a client and "metrics not available" when MC_STORE_CLIENT_METRIC turned them off.
// Other paths: 404. Served by store/common's MetricsServer (one polling thread, bounded
// connections and deadlines).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "mooncake/status.h"
#include "store/common/metrics_server.h"

namespace mooncake {
namespace store {

class StoreClient;

// The client an answer is about, or null (not set up, closed). Called on the server's thread.
using ClientSource = std::function<std::shared_ptr<StoreClient>()>;

// The reply to a GET of `target` (path, maybe with a query string, which is ignored).
HttpReply ClientHttpAnswer(const std::string& target, const std::shared_ptr<StoreClient>& client);

// Serves the client's port on all interfaces; `port` 1..65535 (checked by the caller).
Result<std::unique_ptr<MetricsServer>> StartClientHttp(int port, ClientSource client);

}  // namespace store
}  // namespace mooncake
