// Issue 14, points 8d and 8e: mooncake_http_metadata_server refuses a port in use (before:
// a second server listened beside the first with SO_REUSEPORT and the keys were split between
// them), and stores form-encoded bodies up to --max_body_bytes (before: 413 past 8 KiB).
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <string>

#include "http_util.h"

#ifdef MC_HTTP_METADATA_SERVER_PATH
namespace mooncake {
namespace {

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
