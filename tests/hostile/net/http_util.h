// Helpers of the tests that talk to mooncake_http_metadata_server directly.
#pragma once

#include <sys/socket.h>

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

// One HTTP/1.1 request on its own connection; returns the status code and sets *body.
inline int Http(uint16_t port, const std::string& method, const std::string& key,
         const std::string& content_type, const std::string& payload, std::string* body) {
  auto fd = ConnectTcp("127.0.0.1", port, 2000);
  if (!fd.ok()) return -1;
  std::string req = method + " /metadata?key=" + key + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n";
  if (!content_type.empty()) req += "Content-Type: " + content_type + "\r\n";
  if (method == "PUT") req += "Content-Length: " + std::to_string(payload.size()) + "\r\n";
  req += "\r\n" + payload;
  if (!WriteFull(fd->get(), req.data(), req.size(), 5000).ok()) return -1;
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

}  // namespace mooncake
