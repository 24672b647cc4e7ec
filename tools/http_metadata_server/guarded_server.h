// GuardedServer: cpp-httplib's Server with connection handling that a few idle or slow
// clients cannot stall (issue 14, point 7). cpp-httplib alone serves connections on a fixed
// pool of 8 threads and gives each read 5 s, so 8-16 slow sockets take every worker.
//
// - One thread per connection, up to `max_connections` threads (then connections wait for a
//   free one); a failure to create a thread leaves the connection queued, never aborts.
// - At most `max_per_address` connections served at once from one remote IP; more are closed
//   at once (counted), so one address cannot take every thread.
// - A request's head (request line and headers) must arrive within `head_timeout_ms` of its
//   first byte being awaited; its body must keep moving (no read waits more than
//   `read_timeout_ms`) and end within `request_timeout_ms`. An idle keep-alive connection is
//   closed after `keep_alive_ms`.
// - Every wait looks every 100 ms whether the server was stopped: stop() ends the
//   connections at once instead of waiting out their deadlines.
// - The listening socket does not set SO_REUSEPORT: a port in use is refused, not shared.
// Refusals and timeouts are counted (counters()) and logged at most once per 10 s.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace mooncake::http {

struct GuardLimits {
  size_t max_connections = 256;
  size_t max_per_address = 32;
  int head_timeout_ms = 3000;
  int read_timeout_ms = 5000;
  int request_timeout_ms = 60000;
  int keep_alive_ms = 5000;
};

struct GuardCounters {
  uint64_t refused_address = 0;  // closed at once: the address had max_per_address open
  uint64_t timed_out = 0;        // closed: head, body or keep-alive deadline passed mid-request
  uint64_t thread_failures = 0;  // a thread could not be created (the connection waited)
};

class GuardedServer : public httplib::Server {
 public:
  explicit GuardedServer(GuardLimits limits);
  GuardCounters counters() const;

  // True once stop() was called (httplib's is_running() stays true until every connection
  // thread has ended, so waits must not use it to notice a stop).
  bool stopping() const { return svr_sock_ == INVALID_SOCKET; }

  // Used by the stream and the pool (not for callers).
  void NoteTimeout();
  void NoteThreadFailure();

 private:
  bool process_and_close_socket(socket_t sock) override;
  bool Admit(const std::string& ip);
  void Release(const std::string& ip);
  void MaybeLog();

  const GuardLimits limits_;
  mutable std::mutex mu_;
  std::map<std::string, size_t> per_address_;  // GUARDED_BY(mu_)
  GuardCounters counters_;                     // GUARDED_BY(mu_)
  int64_t last_log_ms_ = 0;                    // GUARDED_BY(mu_)
  uint64_t logged_total_ = 0;                  // GUARDED_BY(mu_)
};

}  // namespace mooncake::http
