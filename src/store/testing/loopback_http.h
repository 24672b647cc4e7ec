// Loopback socket helpers for tests of the HTTP servers (MetricsServer, the master's
// --metrics_port): free ports, a held port, and raw-socket HTTP requests. Header only; needs
// nothing but common/net.h.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <set>
#include <random>
#include <cstdio>
#include <string>

#include "common/net.h"

namespace mooncake {
namespace store {
namespace testing_master {

// A port nobody listens on now, below the kernel's ephemeral range (a port taken from that
// range can be handed to another process's outgoing connection or listener before the test's
// server binds it: a parallel test run lost a master to that): a random one of
// [10000, ephemeral low) that binds, else one the kernel chooses. Never the same port twice
// in one process (a test that asks for three ports at once must get three).
inline int FreePort() {
  static std::mutex mu;
  static std::set<int> given;
  static std::mt19937 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  int low = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &low) != 1) low = 32768;
    std::fclose(f);
  }
  auto bind_port = [](int want) {  // the port bound (0: the kernel's choice), or -1
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(want));
    int port = -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      socklen_t len = sizeof(a);
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
      port = ntohs(a.sin_port);
    }
    ::close(fd);
    return port;
  };
  for (int attempt = 0; attempt < 256 && low > 11000; ++attempt) {
    const int want = 10000 + static_cast<int>(rng() % static_cast<unsigned>(low - 10000));
    if (given.count(want)) continue;
    if (bind_port(want) == want) {
      given.insert(want);
      return want;
    }
  }
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int port = bind_port(0);
    if (port < 0) return -1;
    if (given.insert(port).second) return port;
  }
  return -1;
}

// A socket listening on 127.0.0.1 (no SO_REUSEPORT) that holds a port: its number in *port.
// The caller closes it; -1 on failure.
inline int HoldLoopbackPort(int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 1) != 0) {
    ::close(fd);
    return -1;
  }
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

// A connection to 127.0.0.1:port whose reads time out after 5 s (the caller closes it), or -1.
inline int ConnectLoopback(int port) {
  auto fd = ConnectTcp("127.0.0.1", static_cast<uint16_t>(port), 2000);
  if (!fd.ok()) return -1;
  timeval tv{5, 0};
  ::setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd->Release();
}

// Sends `request` to 127.0.0.1:port and reads until the server closes (or 5 s pass); what
// it read, or "" when it could not connect. A short send still reads: a server may answer
// an oversized request and close before reading all of it.
inline std::string Exchange(int port, const std::string& request) {
  int fd = ConnectLoopback(port);
  if (fd < 0) return "";
  (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

// One HTTP/1.1 request (Connection: close; a PUT carries Content-Length); the whole
// response, or "" on failure.
inline std::string HttpRequest(int port, const std::string& method, const std::string& target,
                               const std::string& body = "") {
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (method == "PUT") req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  return Exchange(port, req + "\r\n" + body);
}

// GET http://127.0.0.1:port/path; the whole response, or "" on failure.
inline std::string HttpGet(int port, const std::string& path) {
  return HttpRequest(port, "GET", path);
}

// The status code of a response, or -1.
inline int StatusOf(const std::string& reply) {
  return reply.size() >= 12 ? std::atoi(reply.substr(9, 3).c_str()) : -1;
}
// The body of a response ("" without one).
inline std::string BodyOf(const std::string& reply) {
  const size_t end = reply.find("\r\n\r\n");
  return end == std::string::npos ? "" : reply.substr(end + 4);
}

}  // namespace testing_master
}  // namespace store
}  // namespace mooncake
