// RealClientServer: the listener of mooncake_client on --port, which tells dummy clients how
// to join (the RealClientConfig) and then says every kHeartbeatInterval that it still lives
// (real_client_wire.h). It never carries data: dummies move bytes with their own engine.
//
// One thread polls every connection (a PollServer). A connection must send the hello within
// kHelloDeadline or is closed; at most kMaxConnections are open: past that the oldest one that has
// not said its hello is closed to make room, and when all have, the new one is refused. So garbage,
// idle or slow connections can neither crash the server nor delay a dummy's hello.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "store/common/poll_server.h"
#include "store/real_client/real_client_wire.h"

namespace mooncake {
namespace store {

class RealClientServer : private PollServer::Handler {
 public:
  static constexpr size_t kMaxConnections = 1024;

  explicit RealClientServer(RealClientConfig config) : config_line_(EncodeConfig(config)) {}
  ~RealClientServer() override { Stop(); }
  RealClientServer(const RealClientServer&) = delete;
  RealClientServer& operator=(const RealClientServer&) = delete;

  // Binds host:port (port 0: any free one; host "" or "0.0.0.0": every IPv4 address) and
  // starts serving. "" on success, else why not.
  Status Start(const std::string& host, int port) { return poll_.Start(host, port); }
  void Stop() { poll_.Stop(); }
  int port() const { return poll_.port(); }
  size_t dummies() const { return dummies_.load(); }  // connections past the hello
  // Bad hello, late, or no room.
  uint64_t refused() const { return bad_hellos_.load() + poll_.dropped(); }

 private:
  using Clock = PollServer::Clock;
  // A connection is pinned (and has no deadline) once it said the hello: it is a dummy.
  bool OnRead(PollServer::Conn& c, Clock::time_point now) override;
  void OnTurn(Clock::time_point now) override;
  bool OnVisit(PollServer::Conn& c, Clock::time_point now) override;
  void OnClose(const PollServer::Conn& c) override {
    if (c.pinned) --dummies_;
  }

  const std::string config_line_;
  std::atomic<size_t> dummies_{0};
  std::atomic<uint64_t> bad_hellos_{0};
  Clock::time_point next_beat_{};  // the loop's thread only
  bool beat_ = false;              // this turn sends the heartbeat; the loop's thread only
  PollServer poll_{{"real client server", kMaxConnections, kHelloDeadline,
                    /*evict_when_out_of_fds=*/false, /*any_is_ipv4=*/true},
                   this};
};

}  // namespace store
}  // namespace mooncake
