// MetricsServer: the master's /metrics endpoint, a small event-driven HTTP/1.x server.
//
// One thread polls every connection, so idle or slow clients cost a file descriptor each and
// never a worker (cpp-httplib's pool of 8 threads, each held by a connection for up to its
// 5 s read timeout, let 200 idle connections stall /metrics for minutes). Each connection
// must deliver its request (at most kMaxRequestBytes) within kRequestDeadline and take its
// reply within kReplyDeadline, or it is closed; past kMaxConnections the oldest connection is
// closed to make room. Every reply closes the connection (Connection: close). GET /metrics
// answers 200 with the body callback's text, other paths 404, other methods 405.
//
// The port is bound without SO_REUSEPORT: a port in use is refused.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

namespace mooncake {
namespace store {

class MetricsServer {
 public:
  static constexpr size_t kMaxRequestBytes = 8192;
  static constexpr size_t kMaxConnections = 512;
  static constexpr std::chrono::milliseconds kRequestDeadline{2000};
  static constexpr std::chrono::milliseconds kReplyDeadline{5000};

  explicit MetricsServer(std::function<std::string()> body) : body_(std::move(body)) {}
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

  std::function<std::string()> body_;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> dropped_{0};
  std::thread thread_;
};

}  // namespace store
}  // namespace mooncake
