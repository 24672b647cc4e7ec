// The P2P handshake: upstream Mooncake's RPC daemon and its frames (docs/wire_protocol.md §1).
//
// Frame, each direction: u64 little-endian length (type byte + payload), u8 type, JSON.
// A frame whose first body byte is 4..0xfd is a legacy frame without a type byte and means
// Connection (answered in legacy framing); 0xfe and 0xff are rejected. One request per connection: the client writes its frame, reads the reply frame
// (same type), and closes; the server replies, shuts down its write side and waits (bounded)
// for the client's EOF.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/net.h"
#include "mooncake/status.h"

namespace mooncake {

enum class HandshakeType : uint8_t {
  kConnection = 0,
  kMetadata = 1,
  kNotify = 2,
  kProbe = 3,
};

const char* HandshakeTypeName(HandshakeType t);

struct HandshakeFrame {
  HandshakeType type = HandshakeType::kConnection;
  bool legacy = false;  // the peer sent no type byte
  std::string payload;
};

// The 8-byte length prefix followed by type and payload.
std::string EncodeHandshakeFrame(HandshakeType type, std::string_view payload);
// Checks a length prefix against the limit. DataLoss for 0 or over `max_length`.
Status CheckHandshakeLength(uint64_t length, size_t max_length);
// Interprets a frame body (the `length` bytes after the prefix).
Result<HandshakeFrame> DecodeHandshakeBody(std::string_view body);
// Parses one whole frame (prefix + body) from a buffer; DataLoss if truncated or malformed.
Result<HandshakeFrame> DecodeHandshakeFrame(std::string_view bytes, size_t max_length);

// Reads one frame from a socket within `timeout_ms`.
Result<HandshakeFrame> ReadHandshakeFrame(int fd, size_t max_length, int timeout_ms);

struct HandshakeLimits {
  size_t max_length = 1 << 20;
  int connect_timeout_ms = 5000;
  int io_timeout_ms = 10000;
  std::string auth_secret;  // non-empty: challenge/answer before any frame (common/auth.h)
};

// One request/reply exchange with the daemon at host:port. Returns the reply payload.
// Unavailable when the peer cannot be reached; DataLoss for a malformed or mismatched reply.
Result<std::string> HandshakeCall(const std::string& host, uint16_t port, HandshakeType type,
                                  std::string_view payload, const HandshakeLimits& limits);

// The daemon. Handlers run on the server's worker threads and must be thread-safe.
class HandshakeServer {
 public:
  // Returns the reply payload for a request, or an error (the connection is then closed
  // without a reply and the error logged).
  using Handler = std::function<Result<std::string>(const HandshakeFrame& request)>;

  HandshakeServer(HandshakeLimits limits, int threads);
  ~HandshakeServer();  // Stop()s
  HandshakeServer(const HandshakeServer&) = delete;
  HandshakeServer& operator=(const HandshakeServer&) = delete;

  // Takes ownership of a listening socket and starts serving.
  Status Start(UniqueFd listen_fd, Handler handler);
  void Stop();

 private:
  void AcceptLoop();
  void WorkerLoop();
  void Serve(int fd);

  HandshakeLimits limits_;
  int num_threads_;
  Handler handler_;
  UniqueFd listen_fd_;
  int wake_fd_[2] = {-1, -1};  // self-pipe that stops the accept loop
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> pending_;  // accepted sockets; GUARDED_BY(mu_)
};

}  // namespace mooncake
