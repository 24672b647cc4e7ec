// Socket helpers. errno becomes a Status here, once, with the peer and the call in the message
// ("connect 127.0.0.1:15001: Connection refused").
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "mooncake/status.h"

namespace mooncake {

struct HostPort {
  std::string host;
  uint16_t port = 0;
  bool has_port = false;
  std::string ToString() const;  // "host:port", "[v6]:port"
};

// Parses "host", "host:port", "[v6addr]" or "[v6addr]:port". Errors: empty host, bad port.
Result<HostPort> ParseHostPort(const std::string& s);

// A file descriptor closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) Reset(o.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

Status ErrnoStatus(const std::string& what, int err);

// Connects with a bounded wait; the returned socket is blocking, with TCP_NODELAY.
Result<UniqueFd> ConnectTcp(const std::string& host, uint16_t port, int timeout_ms);

// The one listen helper of every TCP server of the project (ConnServer's users, PollServer,
// RpcServer, the HTTP metadata server).
struct ListenOptions {
  int backlog = 1024;
  bool nonblocking = false;  // the listening socket (accept4 flags are the caller's)
  // Host "" binds every address (what getaddrinfo lists first for a passive socket); with
  // this set, "" and "0.0.0.0" bind every IPv4 address.
  bool any_is_ipv4 = false;
};
struct Listener {
  UniqueFd fd;
  int port = 0;  // the port bound (the one the kernel chose for port 0)
};
// Binds host:port (port 0: any free one) with SO_REUSEADDR and never SO_REUSEPORT, so a port
// in use is refused, not shared; an IPv6 socket also takes IPv4 (IPV6_V6ONLY off). Errors:
// InvalidArgument "cannot resolve 'HOST': ..."; Unavailable "cannot listen on HOST:PORT:
// <strerror>", with " (the port is in use)" for EADDRINUSE.
Result<Listener> ListenTcp(const std::string& host, int port, const ListenOptions& options = {});

// Binds a listening IPv4 socket (0.0.0.0, or `bind_ip`) on a free port in [lo, hi], starting
// at a random port; *port receives the one chosen. Unavailable if every port is taken.
Result<UniqueFd> ListenTcpInRange(uint16_t lo, uint16_t hi, int backlog, uint16_t* port,
                                  const std::string& bind_ip = "");

// Blocking full read/write bounded by a deadline of `timeout_ms` from the call
// (negative: no deadline). Read returns Unavailable on EOF before `len` bytes.
Status ReadFull(int fd, void* buf, size_t len, int timeout_ms);
Status WriteFull(int fd, const void* buf, size_t len, int timeout_ms);

void SetNoDelay(int fd);
void SetNonBlocking(int fd, bool on);
// The local IPv4 address a socket is bound to, as text.
std::string LocalAddressOf(int fd);

}  // namespace mooncake
