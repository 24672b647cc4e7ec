// ConnServer: the accept loop of a thread-per-connection server, shared by the handshake
// server, the TCP data server and the same-host (shm) server. It accepts on a listening
// socket, serves each connection on its own thread, reaps finished ones, and on Stop shuts
// every connection down and joins every thread, so no serve function outlives the server.
//
// Admission policy (issue 14, point 7), so that a few idle or slow sockets cannot lock out a
// legitimate peer:
// - at most `max_connections` live connections, and at most `max_per_address` from one remote
//   address (TCP: the peer's IP; unix sockets: the peer's uid, the boundary between users);
// - with `first_frame_timeout_ms` > 0 the serve function must call MarkEstablished() once the
//   peer has authenticated / sent its first complete frame; a connection not established in
//   time is shut down, and when a cap is reached the oldest connection not yet established
//   (of that address, for the per-address cap) is shut down to make room for the new one.
//   Established connections are never closed for idling: persistent data connections may
//   be quiet for hours. At a cap with nothing to evict the new connection is refused.
// - a thread that cannot be created (std::system_error, EAGAIN) refuses that connection;
//   the server keeps serving.
// The caps, the counters and the log lines are common/admission.h's (the policy all servers
// share); the victim here is the oldest connection not yet established.
// Refusals are counted (counters()) and logged at most once per 10 s, never per connection.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "common/admission.h"
#include "common/net.h"
#include "common/thread_annotations.h"
#include "mooncake/status.h"

namespace mooncake {

struct ConnLimits {
  size_t max_connections = 4096;
  size_t max_per_address = 0;      // 0: no per-address cap
  int first_frame_timeout_ms = 0;  // 0: no deadline and no eviction
};

// What the server refused or closed, since it started (tests, logs): Admission's counters
// (evicted: not-yet-established connections shut down to make room; deadline_closed: not
// established within first_frame_timeout_ms) and the connections handed to a serve thread.
struct ConnCounters : AdmissionCounters {
  uint64_t accepted = 0;
};

class ConnServer {
 public:
  // serve(fd) runs on the connection's own thread and returns when it is done with it; the
  // server then shuts the socket down (the peer sees it closed) and closes it once reaped.
  // on_accept(fd), if set, runs on the accept thread before the serve thread starts.
  using ServeFn = std::function<void(int fd)>;
  using AcceptFn = std::function<void(int fd)>;

  ConnServer(std::string name, ConnLimits limits, ServeFn serve, AcceptFn on_accept = {});
  ConnServer(std::string name, size_t max_connections, ServeFn serve, AcceptFn on_accept = {})
      : ConnServer(std::move(name), ConnLimits{max_connections, 0, 0}, std::move(serve),
                   std::move(on_accept)) {}
  ~ConnServer();  // Stop()
  ConnServer(const ConnServer&) = delete;
  ConnServer& operator=(const ConnServer&) = delete;

  // Takes a listening socket and starts accepting.
  Status Start(UniqueFd listen_fd);
  // Closes the listener and every connection; joins all threads. Idempotent.
  void Stop();

  // Called by a serve function (on its own thread): this connection has authenticated or
  // sent its first complete frame; it is no longer subject to the first-frame deadline or
  // eviction. A no-op on any other thread.
  static void MarkEstablished();

  // Waits until `n` bytes can be read from `fd` without consuming them (MSG_PEEK), at most
  // `timeout_ms`. False on timeout, EOF or error. A serve function's first-frame check for
  // protocols where the client speaks first.
  static bool WaitForBytes(int fd, size_t n, int timeout_ms);

  // Connections accepted so far, and those whose serve function has not returned (tests).
  uint64_t accepted() const { return accepted_.load(); }
  size_t active() const;
  ConnCounters counters() const;

  // Test hook: makes the next `n` thread creations fail as if the system had no threads.
  void FailThreadCreationForTest(int n) { fail_threads_for_test_.store(n); }

 private:
  struct Conn {
    int fd = -1;
    std::string address;
    std::chrono::steady_clock::time_point accepted_at;
    std::thread thread;
    std::atomic<bool> established{false};
    std::atomic<bool> done{false};
    bool evicted = false;  // shut down by us, its thread ending (ConnServer::mu_)
  };
  void AcceptLoop();
  void Admit(int fd) MC_EXCLUDES(mu_);
  // Starts conn's serve thread; false (conn refused) when no thread can be created.
  bool StartThread(Conn* conn) MC_REQUIRES(mu_);
  void ReapFinishedLocked() MC_REQUIRES(mu_);
  void EnforceDeadlinesLocked() MC_REQUIRES(mu_);
  // Shuts down the oldest live, not established connection (of `address`, if non-null).
  bool EvictOneLocked(const std::string* address) MC_REQUIRES(mu_);
  // Shuts c down (its thread ends) and stops counting it as live.
  void ShutDownLocked(Conn* c, uint64_t AdmissionCounters::*why, const char* what)
      MC_REQUIRES(mu_);

  const std::string name_;
  const ConnLimits limits_;
  const ServeFn serve_;
  const AcceptFn on_accept_;
  UniqueFd listen_fd_;
  int wake_fd_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<int> fail_threads_for_test_{0};
  std::thread acceptor_;
  mutable Mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_ MC_GUARDED_BY(mu_);
  Admission admission_ MC_GUARDED_BY(mu_);  // live: accepted, not done, not evicted
};

}  // namespace mooncake
