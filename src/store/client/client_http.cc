#include "store/client/client_http.h"

#include "mooncake/store/store_client.h"
#include "store/client/client_metrics.h"

namespace mooncake {
namespace store {

HttpReply ClientHttpAnswer(const std::string& target, const std::shared_ptr<StoreClient>& client) {
  const std::string path = target.substr(0, target.find('?'));
  HttpReply r;
  if (path == "/health") {
    // Upstream's HealthCheckStatus: 0 healthy, 1 not initialized, 2 master unreachable (the
    // heartbeat's last ping failed: no call is made here).
    const int code = !client ? 1 : client->master_reachable() ? 0 : 2;
    static const char* const kStatus[] = {"healthy", "not_initialized", "master_unreachable"};
    r.status = code == 0 ? 200 : 503;
    r.content_type = "application/json";
    r.body = std::string("{\"status\":\"") + kStatus[code] + "\",\"code\":" +
             std::to_string(code) + "}";
    return r;
  }
  if (path != "/metrics" && path != "/metrics/summary") {
    r.status = 404;
    r.body = "not found: the client serves /metrics, /metrics/summary and /health\n";
    return r;
  }
  ClientMetrics* m = client ? client->metrics() : nullptr;
  if (m == nullptr) {
    r.status = 503;
    r.body = client ? "metrics not available" : "client not initialized";
    return r;
  }
  if (path == "/metrics") {
    r.content_type = "text/plain; version=0.0.4";
    r.body = m->Prometheus();
  } else {
    r.body = m->Summary();
  }
  return r;
}

Result<std::unique_ptr<MetricsServer>> StartClientHttp(int port, ClientSource client) {
  auto server = std::make_unique<MetricsServer>(
      [client = std::move(client)](const std::string& target) {
        return ClientHttpAnswer(target, client());
      });
  MC_RETURN_IF_ERROR(server->Start("0.0.0.0", port));
  return server;
}

}  // namespace store
}  // namespace mooncake
