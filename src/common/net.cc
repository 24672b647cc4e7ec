#include "common/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>

namespace mooncake {
namespace {

using Clock = std::chrono::steady_clock;

int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

// Waits for `events` on fd; OK when ready, DeadlineExceeded on timeout.
Status WaitFor(int fd, short events, int timeout_ms, const char* what) {
  pollfd p{fd, events, 0};
  for (;;) {
    int r = ::poll(&p, 1, timeout_ms);
    if (r > 0) return Status::OK();
    if (r == 0) {
      return Status::DeadlineExceeded(std::string(what) + ": no progress for " +
                                      std::to_string(timeout_ms) + " ms");
    }
    if (errno != EINTR) return ErrnoStatus(std::string("poll for ") + what, errno);
  }
}

}  // namespace

std::string HostPort::ToString() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return has_port ? h + ":" + std::to_string(port) : h;
}

Result<HostPort> ParseHostPort(const std::string& s) {
  HostPort hp;
  std::string rest;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string::npos) {
      return Status::InvalidArgument("'" + s + "': '[' without ']' in an IPv6 address");
    }
    hp.host = s.substr(1, close - 1);
    rest = s.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') {
      return Status::InvalidArgument("'" + s + "': expected ':' after ']'");
    }
  } else {
    size_t colon = s.rfind(':');
    if (colon != std::string::npos && s.find(':') != colon) {
      hp.host = s;  // bare IPv6 address without port
    } else if (colon != std::string::npos) {
      hp.host = s.substr(0, colon);
      rest = s.substr(colon);
    } else {
      hp.host = s;
    }
  }
  if (hp.host.empty()) return Status::InvalidArgument("'" + s + "': the host part is empty");
  if (!rest.empty()) {
    std::string digits = rest.substr(1);
    char* end = nullptr;
    long p = std::strtol(digits.c_str(), &end, 10);
    if (digits.empty() || *end != '\0' || p < 1 || p > 65535) {
      return Status::InvalidArgument("'" + s + "': port must be a number in 1..65535");
    }
    hp.port = static_cast<uint16_t>(p);
    hp.has_port = true;
  }
  return hp;
}

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Status ErrnoStatus(const std::string& what, int err) {
  std::string msg = what + ": " + std::strerror(err);
  switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENOTCONN:
    case EADDRINUSE:
      return Status::Unavailable(msg);
    case ETIMEDOUT:
    case EAGAIN:
      return Status::DeadlineExceeded(msg);
    case EINVAL:
      return Status::InvalidArgument(msg);
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return Status::ResourceExhausted(msg);
    default:
      return Status::Unavailable(msg);
  }
}

Result<UniqueFd> ConnectTcp(const std::string& host, uint16_t port, int timeout_ms) {
  std::string where = HostPort{host, port, true}.ToString();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_s = std::to_string(port);
  int gai = ::getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res);
  if (gai != 0) {
    return Status::Unavailable("resolve " + where + ": " + ::gai_strerror(gai));
  }
  Status last = Status::Unavailable("connect " + where + ": no address");
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last = ErrnoStatus("socket for " + where, errno);
      continue;
    }
    SetNonBlocking(fd.get(), true);
    int r = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
    if (r != 0 && errno != EINPROGRESS) {
      last = ErrnoStatus("connect " + where, errno);
      continue;
    }
    if (r != 0) {
      Status w = WaitFor(fd.get(), POLLOUT, RemainingMs(deadline), ("connect " + where).c_str());
      if (!w.ok()) {
        last = w;
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = ErrnoStatus("connect " + where, err);
        continue;
      }
    }
    SetNonBlocking(fd.get(), false);
    SetNoDelay(fd.get());
    ::freeaddrinfo(res);
    return fd;
  }
  ::freeaddrinfo(res);
  return last;
}

Result<Listener> ListenTcp(const std::string& host, int port, const ListenOptions& options) {
  if (port < 0 || port > 65535) return Status::InvalidArgument("port must be 0..65535");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const bool any = host.empty() || (options.any_is_ipv4 && host == "0.0.0.0");
  const bool ipv4_only = any && options.any_is_ipv4;
  const std::string service = std::to_string(port);
  const std::string where = HostPort{host, static_cast<uint16_t>(port), true}.ToString();
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(any ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    return Status::InvalidArgument("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  }
  int err = EADDRNOTAVAIL;
  Listener l;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (ipv4_only && a->ai_family != AF_INET) continue;
    const int nonblock = options.nonblocking ? SOCK_NONBLOCK : 0;
    UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | nonblock, a->ai_protocol));
    if (!fd.valid()) {
      err = errno;
      continue;
    }
    int yes = 1, no = 0;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));  // never SO_REUSEPORT
    if (a->ai_family == AF_INET6) {
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof(no));
    }
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 ||
        ::listen(fd.get(), options.backlog) != 0) {
      err = errno;
      continue;
    }
    l.fd = std::move(fd);
    break;
  }
  ::freeaddrinfo(res);
  if (!l.fd.valid()) {
    return Status::Unavailable("cannot listen on " + where + ": " + std::strerror(err) +
                               (err == EADDRINUSE ? " (the port is in use)" : ""));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(l.fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
  l.port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return l;
}

Result<UniqueFd> ListenTcpInRange(uint16_t lo, uint16_t hi, int backlog, uint16_t* port,
                                  const std::string& bind_ip) {
  if (lo > hi) return Status::InvalidArgument("empty port range");
  in_addr ip{};
  if (!bind_ip.empty() && ::inet_pton(AF_INET, bind_ip.c_str(), &ip) != 1) {
    return Status::InvalidArgument("bind address '" + bind_ip + "' is not an IPv4 address");
  }
  std::random_device rd;
  uint32_t span = static_cast<uint32_t>(hi - lo) + 1;
  uint32_t start = rd() % span;
  ListenOptions options;
  options.backlog = backlog;
  options.any_is_ipv4 = true;
  for (uint32_t i = 0; i < span; ++i) {
    uint16_t p = static_cast<uint16_t>(lo + (start + i) % span);
    auto l = ListenTcp(bind_ip.empty() ? "0.0.0.0" : bind_ip, p, options);
    if (!l.ok()) continue;
    *port = p;
    return std::move(l->fd);
  }
  return Status::Unavailable("no free TCP port in " + std::to_string(lo) + "-" +
                             std::to_string(hi) + "; set MC_MIN_RPC_PORT/MC_MAX_RPC_PORT");
}

Status ReadFull(int fd, void* buf, size_t len, int timeout_ms) {
  char* p = static_cast<char*>(buf);
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  while (len > 0) {
    MC_RETURN_IF_ERROR(WaitFor(fd, POLLIN, timeout_ms < 0 ? -1 : RemainingMs(deadline), "read"));
    ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
    } else if (n == 0) {
      return Status::Unavailable("connection closed by peer");
    } else if (errno != EINTR && errno != EAGAIN) {
      return ErrnoStatus("recv", errno);
    }
  }
  return Status::OK();
}

Status WriteFull(int fd, const void* buf, size_t len, int timeout_ms) {
  const char* p = static_cast<const char*>(buf);
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  while (len > 0) {
    MC_RETURN_IF_ERROR(
        WaitFor(fd, POLLOUT, timeout_ms < 0 ? -1 : RemainingMs(deadline), "write"));
    // Non-blocking even on a blocking socket: a peer that stops reading cannot hold us.
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR && errno != EAGAIN) {
      return ErrnoStatus("send", errno);
    }
  }
  return Status::OK();
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void SetNonBlocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

std::string LocalAddressOf(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
  } else if (ss.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

}  // namespace mooncake
