// Issue 14, points 8d and 8e: mooncake_http_metadata_server refuses a port in use (before:
// a second server listened beside the first with SO_REUSEPORT and the keys were split between
// them), and stores form-encoded bodies up to --max_body_bytes (before: 413 past 8 KiB).
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <string>

#include "../../child_process.h"
#include "common/net.h"

#ifdef MC_HTTP_METADATA_SERVER_PATH
namespace mooncake {
namespace {

uint16_t PortOf(Child& server) {
  std::string line = server.ReadLine();
  auto colon = line.rfind(':');
  EXPECT_NE(colon, std::string::npos) << line;
  return colon == std::string::npos ? 0 : static_cast<uint16_t>(std::stoi(line.substr(colon + 1)));
}

// One HTTP/1.1 request on its own connection; returns the status code and sets *body.
int Http(uint16_t port, const std::string& method, const std::string& key,
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

TEST(HostileNet, SecondHttpMetadataServerOnAPortInUseIsRefused) {
  Child first({MC_HTTP_METADATA_SERVER_PATH, "--port", "0", "--host", "127.0.0.1"});
  uint16_t port = PortOf(first);
  ASSERT_NE(port, 0);
  Child second({MC_HTTP_METADATA_SERVER_PATH, "--port", std::to_string(port), "--host",
                "127.0.0.1"});
  std::string said = second.ReadLine();  // "" once it exited; its "listening" line otherwise
  std::printf("http metadata server: a second server on port %u: %s\n", port,
              said.empty() ? "refused the port" : said.c_str());
  ASSERT_EQ(said, "") << "the second server must refuse the port, not share it";
  EXPECT_EQ(second.Wait(), 1);
  // The first one holds every key.
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(Http(port, "PUT", "k" + std::to_string(i), "", "v", nullptr), 200);
  }
  std::string body;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(Http(port, "GET", "k" + std::to_string(i), "", "", &body), 200) << i;
    EXPECT_EQ(body, "v");
  }
}

TEST(HostileNet, FormEncodedBodiesUpToTheBodyLimitAreStored) {
  Child server({MC_HTTP_METADATA_SERVER_PATH, "--port", "0", "--host", "127.0.0.1",
                "--max_body_bytes", "1048576"});
  uint16_t port = PortOf(server);
  ASSERT_NE(port, 0);
  const std::string form = "application/x-www-form-urlencoded";
  for (size_t size : {size_t(100), size_t(8192), size_t(8193), size_t(64 << 10),
                      size_t(1 << 20)}) {
    std::string value(size, 'a');
    int put = Http(port, "PUT", "f", form, value, nullptr);
    std::printf("http metadata server: form-encoded PUT of %zu bytes: %d\n", size, put);
    EXPECT_EQ(put, 200) << size;
    std::string got;
    EXPECT_EQ(Http(port, "GET", "f", "", "", &got), 200);
    EXPECT_EQ(got.size(), size);
  }
  EXPECT_EQ(Http(port, "PUT", "f", form, std::string((1 << 20) + 1, 'a'), nullptr), 413);
  EXPECT_EQ(Http(port, "PUT", "g", "", std::string((1 << 20) + 1, 'a'), nullptr), 413);
}

}  // namespace
}  // namespace mooncake
#endif
