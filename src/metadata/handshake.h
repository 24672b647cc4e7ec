// The P2P handshake: upstream Mooncake's RPC daemon and its frames (docs/wire_protocol.md §1).
//
// Frame, each direction: u64 little-endian length (type byte + payload), u8 type, JSON.
// A frame whose first body byte is 4..0xfd is a legacy frame without a type byte and means
// Connection (answered in legacy framing); 0xfe and 0xff are rejected. One request per connection: the client writes its frame, reads the reply frame
// (same type), and closes; the server replies, shuts down its write side and waits (bounded)
// for the client's EOF.
//
// The server serves each connection on its own thread (common/conn_server.h) up to a cap, at
// most `max_per_address` from one address; a connection must finish authentication and its
// first frame within `first_frame_timeout_ms`, or it is closed (and when a cap is reached the
// oldest such connection makes room), so idle or slow sockets cannot delay other peers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/conn_server.h"
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
  std::string auth_secret;  // non-empty: mutual authentication before any frame (common/auth.h)
  // Server: deadline for authentication plus the first complete frame, and the caps.
  int first_frame_timeout_ms = 3000;
  size_t max_connections = 512;
  size_t max_per_address = 128;
};

// One request/reply exchange with the daemon at host:port, which must be the engine of
// segment `segment` (checked by the authentication, when a secret is set). Returns the reply
// payload. Unavailable when the peer cannot be reached; DataLoss for a malformed or
// mismatched reply; PermissionDenied when authentication fails.
Result<std::string> HandshakeCall(const std::string& host, uint16_t port,
                                  const std::string& segment, HandshakeType type,
                                  std::string_view payload, const HandshakeLimits& limits);

// The daemon. Handlers run on the server's connection threads and must be thread-safe.
class HandshakeServer {
 public:
  // Returns the reply payload for a request, or an error (the connection is then closed
  // without a reply and the error logged).
  using Handler = std::function<Result<std::string>(const HandshakeFrame& request)>;

  explicit HandshakeServer(HandshakeLimits limits);
  ~HandshakeServer();  // Stop()s
  HandshakeServer(const HandshakeServer&) = delete;
  HandshakeServer& operator=(const HandshakeServer&) = delete;

  // Takes ownership of a listening socket and starts serving. `own_names`: the segment
  // names an authenticating client may ask for (this engine's segment name).
  Status Start(UniqueFd listen_fd, Handler handler, std::vector<std::string> own_names);
  void Stop();
  // What the server refused or closed (tests).
  ConnCounters counters() const;

 private:
  void Serve(int fd);

  HandshakeLimits limits_;
  Handler handler_;
  std::vector<std::string> own_names_;
  std::unique_ptr<ConnServer> server_;
};

}  // namespace mooncake
