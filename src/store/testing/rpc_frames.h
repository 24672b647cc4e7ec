// Raw frames of the master's RPC wire (src/store/rpc/rpc_wire.h) for tests that play a client
// the library would never be: foreign bytes, huge or trickled frames, unread replies.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>

#include "store/rpc/rpc_wire.h"

namespace mooncake {
namespace store {
namespace testing_rpc {

inline std::string Frame(uint16_t method, uint32_t seq, const std::string& payload,
                         uint32_t announced = UINT32_MAX) {
  std::string f(kFrameHeaderBytes, '\0');
  EncodeHeader(&f[0], FrameHeader{method, 0, seq,
                                  announced == UINT32_MAX ? static_cast<uint32_t>(payload.size())
                                                          : announced});
  return f + payload;
}

inline bool SendAll(int fd, const std::string& bytes) {
  for (size_t off = 0; off < bytes.size();) {
    ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads until `n` bytes or EOF / error / timeout; what came.
inline std::string ReadUpTo(int fd, size_t n, std::chrono::milliseconds timeout) {
  std::string out;
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (out.size() < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) break;
    char buf[65536];
    ssize_t got = ::recv(fd, buf, std::min(sizeof(buf), n - out.size()), 0);
    if (got <= 0) break;
    out.append(buf, static_cast<size_t>(got));
  }
  return out;
}

struct Reply {
  FrameHeader header;
  std::string payload;
};

// One reply frame, or nullopt (EOF, timeout, not a frame).
inline std::optional<Reply> ReadReply(int fd, std::chrono::milliseconds timeout) {
  std::string head = ReadUpTo(fd, kFrameHeaderBytes, timeout);
  Reply r;
  if (head.size() != kFrameHeaderBytes ||
      DecodeHeader(head.data(), &r.header) != HeaderCheck::kOk) {
    return std::nullopt;
  }
  r.payload = ReadUpTo(fd, r.header.length, timeout);
  if (r.payload.size() != r.header.length) return std::nullopt;
  return r;
}

// True when the peer closed the connection within `timeout`.
inline bool ClosedWithin(int fd, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return true;
  }
  return false;
}

}  // namespace testing_rpc
}  // namespace store
}  // namespace mooncake
