// MetricsServer: a small event-driven HTTP/1.x server for the Store's HTTP ports: the master's
// (/metrics and the other endpoints of master_http.h) and a client's (client_http.h: /metrics,
// /metrics/summary, /health).
//
// One thread polls every connection (a PollServer), so idle or slow clients cost a file descriptor
// each and never a worker (cpp-httplib's pool of 8 threads, each held by a connection for up to its
// 5 s read timeout, let 200 idle connections stall /metrics for minutes). Each connection must
// deliver its request head (request line and headers, at most kMaxRequestBytes) within
// kRequestDeadline and take its reply within kReplyDeadline, or it is closed; past kMaxConnections
// the oldest connection is closed to make room. The replies waiting to be sent hold at most
// kMaxPendingReplyBytes together: a reply that would pass that is replaced by 503 (a few clients
// that ask for big listings and never read cannot exhaust memory). Every reply closes the
// connection (Connection: close); a HEAD gets the head alone. GET and HEAD reach the handler;
// PUT, POST and DELETE reach the write handler when one is set (else 405), with their body:
// at most kMaxBodyBytes, its length given by Content-Length (none: an empty body; chunked
// bodies get 411, longer ones 413), all of it within kRequestDeadline. No 100-continue is
// sent: a client that waits for one (curl does for bodies over 1 MiB) sends after its wait.
//
// The port is bound without SO_REUSEPORT: a port in use is refused.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "store/common/poll_server.h"

namespace mooncake {
namespace store {

// What a handler answers. The server adds Content-Length and Connection: close.
struct HttpReply {
  int status = 200;
  std::string content_type = "text/plain";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra header lines
};

// Called on the server's thread for each GET / HEAD: `target` is the request target as
// sent (path and query, not decoded).
using HttpHandler = std::function<HttpReply(const std::string& target)>;
// Called on the server's thread for each PUT / POST / DELETE, with its body.
using HttpWriteHandler = std::function<HttpReply(const std::string& method,
                                                 const std::string& target,
                                                 const std::string& body)>;

class MetricsServer : private PollServer::Handler {
 public:
  static constexpr size_t kMaxRequestBytes = 64 << 10;
  static constexpr size_t kMaxBodyBytes = 64 << 10;
  static constexpr size_t kMaxConnections = 512;
  static constexpr size_t kMaxPendingReplyBytes = 128 << 20;
  static constexpr std::chrono::milliseconds kRequestDeadline{2000};
  static constexpr std::chrono::milliseconds kReplyDeadline{5000};

  explicit MetricsServer(HttpHandler handler) : handler_(std::move(handler)) {}
  // Serves GET /metrics with body(), other paths 404.
  explicit MetricsServer(std::function<std::string()> body);
  ~MetricsServer() override { Stop(); }
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Before Start.
  void SetWriteHandler(HttpWriteHandler h) { write_handler_ = std::move(h); }

  // Binds host:port (port 0: any free one) and starts serving. "" on success, else why not.
  Status Start(const std::string& host, int port) { return poll_.Start(host, port); }
  void Stop() { poll_.Stop(); }
  int port() const { return poll_.port(); }
  // Connections closed for missing a deadline, or to make room past kMaxConnections.
  uint64_t dropped() const { return poll_.dropped(); }

 private:
  using Clock = PollServer::Clock;
  bool OnRead(PollServer::Conn& c, Clock::time_point now) override;
  void OnClose(const PollServer::Conn& c) override { pending_ -= c.out.size(); }
  // The reply to the complete request head in `in`, or to one past kMaxRequestBytes.
  HttpReply Answer(const std::string& in, bool* head_only);

  HttpHandler handler_;
  HttpWriteHandler write_handler_;
  size_t pending_ = 0;  // bytes of the replies of open connections; the loop's thread only
  PollServer poll_{{"metrics server", kMaxConnections, kRequestDeadline,
                    /*evict_when_out_of_fds=*/true, /*any_is_ipv4=*/false},
                   this};
};

}  // namespace store
}  // namespace mooncake
