// Helpers of the tests that talk to mooncake_http_metadata_server directly.
#pragma once

#include <sys/socket.h>
#include <sys/time.h>

#include <string>

#include "../../child_process.h"
#include "common/net.h"

namespace mooncake {

// The port from the server's "listening on host:port" line.
inline uint16_t PortOf(Child& server) {
  std::string line = server.ReadLine();
  auto colon = line.rfind(':');
  EXPECT_NE(colon, std::string::npos) << line;
  return colon == std::string::npos ? 0 : static_cast<uint16_t>(std::stoi(line.substr(colon + 1)));
}

// Sends raw request bytes on a connection of their own and reads the reply until the server
// closes it (or nothing comes for timeout_ms): the status code (-1: no reply), *body.
inline int SendHttp(uint16_t port, const std::string& req, std::string* body,
                    int timeout_ms = 5000) {
  auto fd = ConnectTcp("127.0.0.1", port, 2000);
  if (!fd.ok()) return -1;
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (!WriteFull(fd->get(), req.data(), req.size(), timeout_ms).ok()) return -1;
  std::string reply;
  char buf[65536];
  for (;;) {
    ssize_t n = ::recv(fd->get(), buf, sizeof(buf), 0);
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  if (reply.size() < 12) return -1;
  size_t head_end = reply.find("\r\n\r\n");
  if (body) *body = head_end == std::string::npos ? "" : reply.substr(head_end + 4);
  return std::stoi(reply.substr(9, 3));
}

// One HTTP/1.1 request on its own connection; returns the status code and sets *body.
inline int Http(uint16_t port, const std::string& method, const std::string& key,
                const std::string& content_type, const std::string& payload, std::string* body,
                int timeout_ms = 5000) {
  std::string req = method + " /metadata?key=" + key + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n";
  if (!content_type.empty()) req += "Content-Type: " + content_type + "\r\n";
  if (method == "PUT") req += "Content-Length: " + std::to_string(payload.size()) + "\r\n";
  return SendHttp(port, req + "\r\n" + payload, body, timeout_ms);
}

}  // namespace mooncake
