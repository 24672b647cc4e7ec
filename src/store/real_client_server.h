// RealClientServer: the listener of mooncake_client on --port, which tells dummy clients how
// to join (the RealClientConfig) and then says every kHeartbeatInterval that it still lives
// (real_client_wire.h). It never carries data: dummies move bytes with their own engine.
//
// One thread polls every connection. A connection must send the hello within kHelloDeadline
// or is closed; at most kMaxConnections are open: past that the oldest one that has not said
// its hello is closed to make room, and when all have, the new one is refused. So garbage,
// idle or slow connections can neither crash the server nor delay a dummy's hello.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "store/real_client_wire.h"

namespace mooncake {
namespace store {

class RealClientServer {
 public:
  static constexpr size_t kMaxConnections = 1024;

  explicit RealClientServer(RealClientConfig config) : config_line_(EncodeConfig(config)) {}
  ~RealClientServer() { Stop(); }
  RealClientServer(const RealClientServer&) = delete;
  RealClientServer& operator=(const RealClientServer&) = delete;

  // Binds host:port (port 0: any free one; host "" or "0.0.0.0": every IPv4 address) and
  // starts serving. "" on success, else why not.
  std::string Start(const std::string& host, int port);
  void Stop();
  int port() const { return port_; }
  size_t dummies() const { return dummies_.load(); }       // connections past the hello
  uint64_t refused() const { return refused_.load(); }      // bad hello, late, or no room

 private:
  void Loop();

  const std::string config_line_;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> dummies_{0};
  std::atomic<uint64_t> refused_{0};
  std::thread thread_;
};

}  // namespace store
}  // namespace mooncake
