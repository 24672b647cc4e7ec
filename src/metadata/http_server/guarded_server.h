// GuardedServer: cpp-httplib's Server with connection handling that idle or slow clients,
// from however many addresses, cannot stall (issue 14, point 7; issue 28, item 11).
// cpp-httplib alone serves connections on a fixed pool of 8 threads and gives each read 5 s,
// so 8-16 slow sockets take every worker.
//
// - The accepting thread only files a connection; `max_connections` worker threads serve
//   them, one connection each at a time. At most `max_connections` more wait for a worker
//   (past that the waiting one from the busiest address is closed, counted as shed).
// - At most `max_per_address` connections, served or waiting, from one remote IP; more are
//   closed at once (counted), so one address cannot take every thread.
// - A free worker takes the waiting connection whose address has the fewest served, then
//   the oldest: a client on an address of its own goes before a crowd's next connection.
// - When connections wait and every worker is taken, workers are freed by shedding: the
//   served connection closed is one that waits on its client (for a request, in the middle
//   of one, or for it to read the reply) and has done so for at least `shed_after_ms` in
//   its current request or idle spell, from the address with the most served connections,
//   then the one waiting longest. A connection in a handler is never shed. Checked on every
//   new connection and every 100 ms. So slow and idle connections, however many and from
//   however many addresses, delay a client whose request arrives at once by at most about
//   shed_after_ms + 100 ms.
// - A request's head (request line and headers) must arrive within `head_timeout_ms`: for
//   the first request from the moment a worker takes the connection (the wait for the first
//   byte included), for the next ones from their first byte; no read may wait more than
//   `read_timeout_ms`, and a request ends within `request_timeout_ms`; the deadlines hold
//   however the bytes trickle (they are not per read). A head is at most `max_head_bytes`.
//   An idle keep-alive connection is closed after `keep_alive_ms`.
// - Every wait looks every 100 ms whether the server was stopped: stop() ends the
//   connections at once instead of waiting out their deadlines.
// - The listening socket does not set SO_REUSEPORT: a port in use is refused, not shared;
//   its accept backlog is `listen_backlog` (cpp-httplib's 5 drops a crowd's SYNs, and each
//   drop delays that client by a 1 s retransmission).
// Threads: at most max_connections workers and the accepting one; sockets: at most
// 2 x max_connections. Refusals, sheds and timeouts are counted (counters()) and logged at
// most once per 10 s. The per-address cap, the victims' choice, the counters and the log
// lines are common/admission.h's (the policy every server shares); the port is bound by
// ListenTcp (common/net.h).
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/admission.h"
#include "common/thread_annotations.h"
#include "mooncake/status.h"

namespace mooncake::http {

struct GuardLimits {
  size_t max_connections = 256;
  size_t max_per_address = 32;
  int head_timeout_ms = 3000;
  int read_timeout_ms = 5000;
  int request_timeout_ms = 60000;
  int keep_alive_ms = 5000;
  int shed_after_ms = 250;
  size_t max_head_bytes = 64 << 10;  // request line and headers (cpp-httplib bounds each line)
  int listen_backlog = 1024;  // cpp-httplib's is 5 (the kernel caps it at somaxconn)
};

struct GuardCounters {
  uint64_t refused_address = 0;  // closed at once: the address had max_per_address open
  uint64_t timed_out = 0;        // closed: head, body or keep-alive deadline passed mid-request
  uint64_t thread_failures = 0;  // a thread could not be created (the connection waited)
  uint64_t shed = 0;             // closed while slow or idle to free a worker, or waiting
                                 // when max_connections already waited
};

class GuardedServer : public httplib::Server {
 public:
  explicit GuardedServer(GuardLimits limits);
  ~GuardedServer() override;
  GuardCounters counters() const;

  // Binds host:port (port 0: any free one) with ListenTcp, a backlog of listen_backlog and
  // TCP_NODELAY (accepted sockets inherit it); the port bound. Then listen_after_bind().
  Result<int> Bind(const std::string& host, int port);

  // True once stop() was called (httplib's is_running() stays true until every connection
  // thread has ended, so waits must not use it to notice a stop).
  bool stopping() const { return svr_sock_ == INVALID_SOCKET; }

  // A served connection, as the shedding sees it (used by the stream, not for callers).
  struct Conn {
    int fd = -1;
    std::string ip;
    std::atomic<int64_t> since_ms{0};     // start of the current request or idle spell
    std::atomic<bool> on_client{false};   // blocked on the client (read, write, next request)
    bool shed = false;                    // GuardedServer::mu_
  };
  // Used by the stream and the task queue (not for callers).
  void NoteTimeout() MC_EXCLUDES(mu_);
  void Tick() MC_EXCLUDES(mu_);  // sheds if connections wait (at most every 100 ms)
  void StartWorkers() MC_EXCLUDES(mu_);
  void StopWorkers() MC_EXCLUDES(mu_);

 private:
  struct Waiting {
    int fd;
    std::string ip;
    int64_t since_ms;
  };
  struct Load {  // of one address (the total, served and waiting, is admission_'s)
    size_t served = 0;
    size_t shedding = 0;  // served, shed, not yet ended
  };

  // Runs on the accepting thread: files the connection (see the task queue).
  bool process_and_close_socket(socket_t sock) override MC_EXCLUDES(mu_);
  void Work() MC_EXCLUDES(mu_);
  // Takes the waiting connection whose address has the fewest served, then the oldest.
  void TakeWaitingLocked(Conn* conn) MC_REQUIRES(mu_);
  void Serve(Conn& c);
  void ShedLocked() MC_REQUIRES(mu_);
  void DropWaitingLocked() MC_REQUIRES(mu_);
  void ForgetLocked(const std::string& ip, bool served) MC_REQUIRES(mu_);

  const GuardLimits limits_;
  mutable Mutex mu_;
  CondVar cv_;
  Admission admission_ MC_GUARDED_BY(mu_);       // served and waiting, per address
  std::map<std::string, Load> loads_ MC_GUARDED_BY(mu_);  // addresses with one served
  std::deque<Waiting> waiting_ MC_GUARDED_BY(mu_);
  std::set<Conn*> served_ MC_GUARDED_BY(mu_);
  std::vector<std::thread> workers_ MC_GUARDED_BY(mu_);
  size_t idle_workers_ MC_GUARDED_BY(mu_) = 0;
  size_t shed_pending_ MC_GUARDED_BY(mu_) = 0;  // shed, not yet ended
  bool workers_stopping_ MC_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> last_tick_ms_{0};
};

}  // namespace mooncake::http
