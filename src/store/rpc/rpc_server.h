// RpcServer: serves the master's RPC wire (rpc_wire.h) on a TCP port.
//
// Options::threads event loops (epoll), each owning the connections it accepted; a request is
// handled on its loop's thread as soon as its last byte arrives (no hand-off), except the
// methods Options::slow names, which one worker thread runs so that a long RemoveAll does not
// hold up the other connections of its loop. Bounds that keep idle, slow or hostile clients
// cheap (issue 28: each is per connection, and the one over it is the one refused):
//   - at most Options::max_connections open. Past that, room is made on the accepting loop:
//     first the connection that has kept an incomplete request pending the largest share of
//     its life (at least kAbuseAfter, 1 s, in all: one that keeps a byte of a header pending
//     and completes a request now and then to restart the deadline is that), else the one
//     idle the longest (no request in progress), else the new one is refused;
//   - a request's bytes are buffered as they arrive (a header announcing 64 MiB reserves
//     nothing; once 64 KiB of it has come, its buffer is sized to it at once, in virtual
//     memory, instead of doubling and copying on the loop thread, up to twice the loop's
//     budget reserved so in all); a request begun must be complete within Options::request_deadline (10 s),
//     its 16-byte header within Options::header_deadline (2 s);
//   - buffered request bytes: each connection may hold kConnAllowance (64 KiB: any ping or
//     small call) outside any budget; what connections hold beyond their allowance is
//     charged to their loop, at most Options::max_buffered_bytes / threads per loop. A read
//     that would pass its loop's budget closes the loop's connection holding the most
//     buffered bytes (the hog: the reader itself only when it is the largest), never a
//     small reader. So in total at most max_buffered_bytes + max_connections x 64 KiB
//     (defaults: 1 GiB + 256 MiB), and per connection 64 KiB + its loop's budget;
//   - a connection's buffers (the request bytes, the replies) keep at most kKeepCapacity
//     (256 KiB) of capacity once their request / reply is done: an idle connection holds
//     no memory of its largest request;
//   - a frame that is not this protocol, or announces more than kMaxMessageBytes, closes the
//     connection (the latter after a kTooLarge reply), with a log line;
//   - a connection's next request is not read until its reply is sent (a client that does not
//     read its replies holds one reply's memory, and stalls only itself);
//   - a connection's turn (what the loop does for it before the loop's other connections have
//     theirs) is at most 1 MiB read, and at most kMaxRequestsPerTurn (16) requests or one of
//     1 MiB or more handled: one that pipelines thousands, or streams 64 MiB requests, takes
//     turns with the other connections of its loop, and what it sent past its turn stays in
//     the socket until its next one. A small call waits for at most one turn of each other
//     connection of its loop (the handler's work on each request bounded by master_rpc.h).
// The victim choice at the cap is common/admission.h's (with the ranks above); the cap itself
// is counted across loops without a lock (open_connections()). The port is bound by ListenTcp
// (common/net.h), without SO_REUSEPORT: a port in use is refused.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mooncake/status.h"
#include "store/rpc/rpc_wire.h"

namespace mooncake {
namespace store {

class RpcServer {
 public:
  // Handles one request: the payload is [data, data + n); appends the response's payload to
  // *out (kOk) or a message saying what was wrong (any other status). Called on loop threads
  // (and the worker) concurrently: it must be thread-safe.
  using Handler =
      std::function<RpcStatus(uint16_t method, const char* data, size_t n, std::string* out)>;

  struct Options {
    int threads = 2;
    size_t max_connections = 4096;
    std::chrono::milliseconds request_deadline{10000};
    std::chrono::milliseconds header_deadline{2000};  // an incomplete 16-byte header
    size_t max_buffered_bytes = 1ull << 30;
    std::function<bool(uint16_t method)> slow;  // run on the worker thread
  };

  RpcServer(Options options, Handler handler);
  ~RpcServer();
  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;

  // Binds host:port (port 0: any free one; host "0.0.0.0" or "" every IPv4 address, "::"
  // every address) and starts the loops; an error says why not (a port in use: Unavailable,
  // "cannot listen on HOST:PORT: ... (the port is in use)").
  Status Start(const std::string& host, int port);
  // Closes every connection and joins the threads. Idempotent.
  void Stop();
  int port() const { return port_; }

  // Connections closed by the bounds above (deadline, room, buffer budget, bad frames).
  uint64_t dropped() const { return dropped_.load(); }
  size_t open_connections() const { return open_.load(); }
  // Request bytes buffered (of all connections), and the capacity of all connections'
  // buffers (requests and replies): the memory the bounds above are about.
  size_t buffered_bytes() const { return buffered_.load(); }
  size_t buffer_capacity() const { return held_.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Conn;
  struct Loop;
  struct Job;
  void RunLoop(Loop* loop);
  // RunLoop's parts: the worker's replies; one connection's epoll event; the sweep that
  // closes connections past their deadlines.
  void TakeReplies(Loop* loop);
  void OnEvent(Loop* loop, uint64_t tag, uint32_t events);
  void CloseLate(Loop* loop, Clock::time_point now);
  void RunWorker();
  void Accept(Loop* loop);
  // Reads what is there; false when the connection is to be closed.
  bool OnReadable(Loop* loop, Conn* c);
  // Before c buffers n more bytes: closes the loop's hogs until its budget has room; false
  // when c is the hog (to be closed).
  bool MakeRoom(Loop* loop, Conn* c, size_t n);
  // At the cap: the connection to close for a new one (nullptr: none may go); *abuser: it
  // is one that kept requests pending, not an idle one.
  Conn* Victim(Loop* loop, bool* abuser);
  void Charge(Loop* loop, Conn* c);  // c's bytes beyond its allowance, to its loop's budget
  void Account(Conn* c);              // c's buffers' capacity, to held_
  // Handles the complete requests buffered (until one needs the worker or a reply is left
  // unsent); false when the connection is to be closed.
  bool Serve(Loop* loop, Conn* c);
  // Serve's parts: a frame that is not this protocol (false: close) or too large (true: the
  // kTooLarge reply queued, the connection closes once it is sent); a slow method's request
  // to the worker; the bytes handled dropped and the pending time accounted.
  bool RefuseFrame(Conn* c, HeaderCheck check, const FrameHeader& h, size_t at);
  void HandOff(Loop* loop, Conn* c, const FrameHeader& h, const char* payload);
  void EndTurn(Loop* loop, Conn* c, size_t at);
  // Gives the connections on the loop's ready list their next turn (Serve's budget).
  void ServeReady(Loop* loop);
  bool Flush(Conn* c);  // false: the connection failed
  void Rearm(Loop* loop, Conn* c);
  void Close(Loop* loop, Conn* c);
  // Whether c has nothing left to do (its client sent FIN, every reply is sent).
  bool Finished(const Conn* c) const;

  const Options options_;
  const Handler handler_;
  int listen_fd_ = -1;
  int spare_fd_ = -1;  // given up to take a connection when descriptors run out
  int port_ = 0;
  std::vector<std::unique_ptr<Loop>> loops_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<size_t> open_{0};
  std::atomic<size_t> buffered_{0};
  std::atomic<size_t> held_{0};
  std::atomic<uint64_t> next_id_{1};
  struct Worker;
  std::unique_ptr<Worker> worker_;
  bool started_ = false;
};

}  // namespace store
}  // namespace mooncake
