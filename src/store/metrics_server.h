// MetricsServer: the master's HTTP port (/metrics and the other read-only endpoints of
// master_http.h), a small event-driven HTTP/1.x server.
//
// One thread polls every connection, so idle or slow clients cost a file descriptor each and
// never a worker (cpp-httplib's pool of 8 threads, each held by a connection for up to its
// 5 s read timeout, let 200 idle connections stall /metrics for minutes). Each connection
// must deliver its request head (request line and headers, at most kMaxRequestBytes) within
// kRequestDeadline and take its reply within kReplyDeadline, or it is closed; past
// kMaxConnections the oldest connection is closed to make room. The replies waiting to be
// sent hold at most kMaxPendingReplyBytes together: a reply that would pass that is replaced
// by 503 (a few clients that ask for big listings and never read cannot exhaust memory).
// Every reply closes the connection (Connection: close); a HEAD gets the head alone. Request
// bodies are not read. Only GET and HEAD reach the handler (others: 405).
//
// The port is bound without SO_REUSEPORT: a port in use is refused.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

class MetricsServer {
 public:
  static constexpr size_t kMaxRequestBytes = 64 << 10;
  static constexpr size_t kMaxConnections = 512;
  static constexpr size_t kMaxPendingReplyBytes = 128 << 20;
  static constexpr std::chrono::milliseconds kRequestDeadline{2000};
  static constexpr std::chrono::milliseconds kReplyDeadline{5000};

  explicit MetricsServer(HttpHandler handler) : handler_(std::move(handler)) {}
  // Serves GET /metrics with body(), other paths 404.
  explicit MetricsServer(std::function<std::string()> body);
  ~MetricsServer() { Stop(); }
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Binds host:port (port 0: any free one) and starts serving. "" on success, else why not.
  std::string Start(const std::string& host, int port);
  void Stop();
  int port() const { return port_; }
  // Connections closed for missing a deadline, or to make room past kMaxConnections.
  uint64_t dropped() const { return dropped_.load(); }

 private:
  void Loop();

  HttpHandler handler_;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> dropped_{0};
  std::thread thread_;
};

}  // namespace store
}  // namespace mooncake
