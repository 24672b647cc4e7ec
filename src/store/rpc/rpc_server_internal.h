// RpcServer's internals shared by rpc_server.cc (start, stop, the loops, accept, the worker)
// and rpc_server_conn.cc (one connection's reads, requests, replies, closes).
#pragma once

#include <glog/logging.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/thread_annotations.h"
#include "store/rpc/rpc_server.h"

namespace mooncake {
namespace store {
namespace rpc_internal {

using Clock = std::chrono::steady_clock;
constexpr size_t kReadChunk = 256 << 10;
// Replies of pipelined requests gathered before the loop writes them.
constexpr size_t kMaxGatheredReply = 1 << 20;
// Requests of one connection handled in one turn: a connection that pipelines many then
// waits for the other connections of its loop to have their turn (Loop::ready).
constexpr size_t kMaxRequestsPerTurn = 16;
// Bytes read from one connection in one turn; a request of this size or more ends its turn.
constexpr size_t kMaxReadPerTurn = 4 * kReadChunk;
constexpr size_t kMaxHandledPerTurn = 1 << 20;
// Request bytes a connection may always buffer, outside its loop's budget.
constexpr size_t kConnAllowance = 64 << 10;
// Capacity a buffer keeps once its request / reply is done.
constexpr size_t kKeepCapacity = 256 << 10;
// At the connection cap, a connection that has kept incomplete requests pending this long
// in all is closed before any idle one.
constexpr std::chrono::milliseconds kAbuseAfter{1000};
// epoll's data for a connection: its fd and (the low 32 bits of) its id, so that an event of
// a connection closed earlier in the same batch is not taken for a new one on the same fd.
inline uint64_t EventTag(int fd, uint64_t id) {
  return (id << 32) | static_cast<uint32_t>(fd);
}

// Logs at most one line a second per call site.
bool LogNow(std::atomic<int64_t>* last);
// host:port of the peer of fd, for log lines.
std::string PeerOf(int fd);

}  // namespace rpc_internal

using rpc_internal::Clock;

struct RpcServer::Conn {
  int fd = -1;
  uint64_t id = 0;
  std::string in;      // bytes received, not yet handled
  std::string out;     // reply bytes not yet sent
  size_t sent = 0;     // of out
  bool busy = false;   // a request is on the worker, or its reply is held (Holds), or waits
  bool waiting = false;  // busy with a waiting request (Loop::waiting)
  bool eof = false;    // the client sent FIN: serve what came, then close
  bool close_after_flush = false;
  bool more = false;    // requests left in `in` when its turn ended (Serve's budget)
  bool queued = false;  // on its loop's ready list
  uint32_t events = 0;  // what epoll watches for now
  Clock::time_point last_active;
  Clock::time_point partial_since = Clock::time_point::max();  // an incomplete request began
  Clock::time_point created;
  Clock::duration pending_total{0};  // with an incomplete request, before partial_since
  size_t job_bytes = 0;  // the payload of its request on the worker / of its held reply
  size_t charged = 0;    // in.size() + job_bytes beyond kConnAllowance, charged to its loop
  size_t held = 0;      // in's and out's capacity, as counted in RpcServer::held_
  size_t reserved = 0;  // in's capacity reserved for its large first request (OnReadable)
};

struct RpcServer::Job {
  Loop* loop;
  int fd;
  uint64_t conn_id;
  uint16_t method;
  uint32_t seq;
  std::string payload;
  std::string reply;  // the whole frame, filled by the worker (or the loop, for a held one)
  // A waiting request (rpc_server_wait.cc): what it waits on, until when; the wake count
  // before its handler ran, and whether the loop has looked at it since it began to wait.
  std::string topic;
  Clock::time_point deadline;
  uint64_t wakes = 0;
  bool fresh = false;
};

// Replies held until their log position is durable (rpc_server.h), with what decides it.
// Lock order: mu before a Loop's done_mu (a release delivers under mu, so that Stop, which
// clears `live` under mu, never races a delivery to a loop it is about to destroy).
struct RpcServer::Holds {
  mutable Mutex mu;
  uint64_t durable MC_GUARDED_BY(mu) = 0;
  bool failed MC_GUARDED_BY(mu) = false;  // FailHeld's state, until ResetHeld
  std::string message MC_GUARDED_BY(mu);  // FailHeld's
  bool live MC_GUARDED_BY(mu) = false;    // the loops run (Start .. Stop): replies may go
  std::multimap<uint64_t, std::unique_ptr<Job>> jobs MC_GUARDED_BY(mu);  // by position
};

struct RpcServer::Loop {
  int ep = -1;
  int wake = -1;  // eventfd: the worker's replies, Stop()
  std::thread thread;
  std::unordered_map<int, std::unique_ptr<Conn>> conns;
  Mutex done_mu;
  std::vector<std::unique_ptr<Job>> done MC_GUARDED_BY(done_mu);
  std::string scratch;
  // Requests waiting for a wake (Job::topic), and the topics woken since the loop last
  // looked (WakeWaiting, any thread).
  std::vector<std::unique_ptr<Job>> waiting;
  Mutex woken_mu;
  std::unordered_set<std::string> woken MC_GUARDED_BY(woken_mu);
  std::atomic<bool> any_woken{false};
  // Connections whose turn ended with requests left (Conn::more) and their replies sent:
  // served again after the next epoll_wait, which then does not sleep. {fd, Conn::id}.
  std::vector<std::pair<int, uint64_t>> ready;
  size_t budget = 0;   // Options::max_buffered_bytes / threads
  size_t charged = 0;  // sum of its connections' Conn::charged
  size_t reserved = 0;  // sum of its connections' Conn::reserved
};

struct RpcServer::Worker {
  Mutex mu;
  CondVar cv;
  std::deque<std::unique_ptr<Job>> jobs MC_GUARDED_BY(mu);
  std::thread thread;
};

}  // namespace store
}  // namespace mooncake
