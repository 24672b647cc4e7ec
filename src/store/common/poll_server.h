// PollServer: one thread that accepts TCP connections on a port and polls them all, for the
// small servers of the Store (MetricsServer, RealClientServer) whose clients may be idle,
// slow or hostile. What a connection's bytes mean is up to a Handler; the loop keeps the
// bounds that make such clients cheap:
//   - each connection has a deadline (Options::first_deadline from the accept, then whatever
//     the handler sets) and is closed once past it;
//   - at most Options::max_connections are open: past that the oldest connection that is not
//     pinned is closed to make room, and when all are pinned the new one is refused;
//   - out of descriptors, the pending connection is refused through a spare descriptor (so
//     poll does not spin), after closing the oldest unpinned one first where
//     Options::evict_when_out_of_fds;
//   - reads come in chunks of at most kReadChunk bytes: the handler bounds Conn::in.
// Each of these closes counts in dropped(). A connection polls for reading while its `out` is
// empty and for writing while not; once all of `out` is sent, it is closed.
//
// The cap and the victim choice are common/admission.h's; the port is bound by ListenTcp
// (common/net.h), without SO_REUSEPORT: a port in use is refused.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>

#include "common/admission.h"
#include "common/net.h"
#include "mooncake/status.h"

namespace mooncake {
namespace store {

class PollServer {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kReadChunk = 4096;

  struct Options {
    const char* name = "poll server";  // in log lines
    size_t max_connections = 1024;
    std::chrono::milliseconds first_deadline{2000};
    bool evict_when_out_of_fds = false;
    // Host "" binds every address; with this set, "" and "0.0.0.0" bind every IPv4 one.
    bool any_is_ipv4 = false;
  };

  // One connection, owned by the loop; the handler may change every field but fd.
  struct Conn {
    int fd = -1;
    Clock::time_point deadline;  // closed once past; Clock::time_point::max(): never
    bool pinned = false;         // never closed to make room for another connection
    std::string in;              // bytes received and not consumed by the handler
    std::string out;             // the reply; the connection closes once it is all sent
    size_t sent = 0;             // bytes of `out` sent
  };

  // What the loop asks of its owner. Every call comes on the loop's thread, one at a time.
  class Handler {
   public:
    virtual ~Handler() = default;
    // Bytes arrived (appended to c.in). false: close c.
    virtual bool OnRead(Conn& c, Clock::time_point now) = 0;
    // Once per turn of the loop (about every 100 ms, or sooner on events), before any
    // connection is served.
    virtual void OnTurn(Clock::time_point /*now*/) {}
    // Each turn, for every connection still open once served and checked against its
    // deadline. false: close c.
    virtual bool OnVisit(Conn& /*c*/, Clock::time_point /*now*/) { return true; }
    // c is about to be closed (for any reason, including Stop()).
    virtual void OnClose(const Conn& /*c*/) {}
  };

  // handler must outlive Stop().
  PollServer(Options options, Handler* handler)
      : options_(options), handler_(handler), admission_(options.name, {options.max_connections}) {}
  ~PollServer() { Stop(); }
  PollServer(const PollServer&) = delete;
  PollServer& operator=(const PollServer&) = delete;

  // Binds host:port (port 0: any free one) and starts the loop; an error says why not (a
  // port in use: Unavailable, "... (the port is in use)").
  Status Start(const std::string& host, int port);
  // Closes every connection (OnClose for each) and joins the loop. Idempotent.
  void Stop();
  int port() const { return port_; }
  // Connections closed for a deadline, to make room, or refused for want of room.
  uint64_t dropped() const { return dropped_.load(); }

 private:
  using ConnList = std::list<Conn>;  // oldest first
  void Loop();
  // Serves c after poll reported `revents`; false when c is to be closed.
  bool ServeConn(Conn& c, short revents, Clock::time_point now);
  // Accepts every pending connection (making room, or refusing, at the cap).
  void AcceptAll(Clock::time_point now);
  // Out of descriptors: closes the oldest unpinned connection where the options say so (true:
  // accept again), else refuses the pending one through the spare descriptor.
  bool OutOfDescriptors();
  void CloseConn(ConnList::iterator it);

  // Everything below but the atomics is the loop thread's (and Start / Stop's around it).
  const Options options_;
  Handler* const handler_;
  Admission admission_;  // the connection cap and the victim; counts conns_
  ConnList conns_;
  std::vector<pollfd> fds_;
  std::vector<ConnList::iterator> order_;  // conns_ in fds_ order (from fds_[2])
  int spare_ = -1;  // given up to take a connection when descriptors run out
  UniqueFd listen_fd_;
  int wake_fd_[2] = {-1, -1};
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> dropped_{0};
  std::thread thread_;
};

}  // namespace store
}  // namespace mooncake
