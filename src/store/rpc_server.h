// RpcServer: serves the master's RPC wire (rpc_wire.h) on a TCP port.
//
// Options::threads event loops (epoll), each owning the connections it accepted; a request is
// handled on its loop's thread as soon as its last byte arrives (no hand-off), except the
// methods Options::slow names, which one worker thread runs so that a long RemoveAll does not
// hold up the other connections of its loop. Bounds that keep idle, slow or hostile clients
// cheap:
//   - at most Options::max_connections open: past that the connection idle the longest (no
//     request in progress) is closed to make room, or the new one is refused when none is idle;
//   - a request's bytes are buffered as they arrive (a header announcing 64 MiB reserves
//     nothing), a request begun must be complete within Options::request_deadline, and the
//     bytes buffered for incomplete requests of all connections together are bounded by
//     Options::max_buffered_bytes (the connection that would pass it is closed);
//   - a frame that is not this protocol, or announces more than kMaxMessageBytes, closes the
//     connection (the latter after a kTooLarge reply), with a log line;
//   - a connection's next request is not read until its reply is sent (a client that does not
//     read its replies holds one reply's memory, and stalls only itself);
//   - a connection's requests are handled at most kMaxRequestsPerTurn (16) a turn: one that
//     pipelines thousands takes turns with the other connections of its loop, and what it
//     sent past its turn stays in the socket until its next one.
// The port is bound without SO_REUSEPORT: a port in use is refused.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "store/rpc_wire.h"

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
    size_t max_buffered_bytes = 1ull << 30;
    std::function<bool(uint16_t method)> slow;  // run on the worker thread
  };

  RpcServer(Options options, Handler handler);
  ~RpcServer();
  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;

  // Binds host:port (port 0: any free one; host "0.0.0.0" or "" every IPv4 address, "::"
  // every address) and starts the loops. "" on success, else why not.
  std::string Start(const std::string& host, int port);
  // Closes every connection and joins the threads. Idempotent.
  void Stop();
  int port() const { return port_; }

  // Connections closed by the bounds above (deadline, room, buffer budget, bad frames).
  uint64_t dropped() const { return dropped_.load(); }
  size_t open_connections() const { return open_.load(); }

 private:
  struct Conn;
  struct Loop;
  struct Job;
  void RunLoop(Loop* loop);
  void RunWorker();
  void Accept(Loop* loop);
  // Reads what is there; false when the connection is to be closed.
  bool OnReadable(Loop* loop, Conn* c);
  // Handles the complete requests buffered (until one needs the worker or a reply is left
  // unsent); false when the connection is to be closed.
  bool Serve(Loop* loop, Conn* c);
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
  std::atomic<uint64_t> next_id_{1};
  struct Worker;
  std::unique_ptr<Worker> worker_;
  bool started_ = false;
};

}  // namespace store
}  // namespace mooncake
