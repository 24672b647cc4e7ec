// RealClientServer and its wire (real_client_wire.h): a dummy's hello gets the config and then
// heartbeats; wrong, oversized, late or surplus connections are closed without delaying a
// dummy; DecodeConfig refuses malformed lines; a port in use is refused.
#include "store/real_client/real_client_server.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"

namespace mooncake {
namespace store {
namespace {

using Clock = std::chrono::steady_clock;

RealClientConfig Sample() {
  RealClientConfig c;
  c.master_server_address = "127.0.0.1:50051";
  c.metadata_server = "http://127.0.0.1:8080/metadata";
  c.protocol = "tcp";
  c.device_names = "";
  c.host = "node-1";
  c.segment_name = "node-1:12345";
  return c;
}

// A connection whose reads time out after `timeout_s`, or -1.
int Connect(int port, int timeout_s = 5) {
  auto fd = ConnectTcp("127.0.0.1", static_cast<uint16_t>(port), 2000);
  if (!fd.ok()) return -1;
  timeval tv{timeout_s, 0};
  ::setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd->Release();
}

// Reads until `n` newlines arrived, the peer closed, or a read timed out.
std::string ReadLines(int fd, size_t n) {
  std::string out;
  char buf[4096];
  size_t lines = 0;
  while (lines < n) {
    ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r <= 0) break;
    for (ssize_t i = 0; i < r; ++i) lines += buf[i] == '\n';
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

// True when the server closes `fd` (recv returns 0 or a reset) within the read timeout.
bool Closed(int fd) {
  char buf[256];
  while (true) {
    ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r == 0) return true;
    if (r < 0) return errno == ECONNRESET;
  }
}

TEST(RealClientWire, ConfigRoundTrips) {
  const RealClientConfig c = Sample();
  const std::string line = EncodeConfig(c);
  ASSERT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1);
  auto d = DecodeConfig(line.substr(0, line.size() - 1));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->master_server_address, c.master_server_address);
  EXPECT_EQ(d->metadata_server, c.metadata_server);
  EXPECT_EQ(d->segment_name, c.segment_name);
  EXPECT_EQ(d->host, c.host);
  EXPECT_TRUE(SameCluster(*d, c));
  RealClientConfig other = c;
  other.master_server_address = "10.0.0.1:50051";
  EXPECT_FALSE(SameCluster(other, c));
}

TEST(RealClientWire, DecodeRefusesMalformedLines) {
  const std::string full = EncodeConfig(Sample());
  for (const std::string& bad :
       {std::string(""), std::string("garbage"), std::string("[1,2]"), std::string("{}"),
        std::string("{\"master_server_address\":1}"),
        full.substr(0, full.size() / 2),
        std::string(R"({"master_server_address":"","metadata_server":"m","protocol":"tcp",)"
                    R"("device_names":"","host":"h","segment_name":"s"})"),
        "{\"pad\":\"" + std::string(kMaxConfigBytes, 'x') + "\"}"}) {
    auto d = DecodeConfig(bad);
    EXPECT_FALSE(d.ok()) << bad.substr(0, 80);
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), Status::Code::kDataLoss);
    }
  }
}

TEST(RealClientServer, HelloGetsTheConfigThenHeartbeats) {
  RealClientServer server(Sample());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  int fd = Connect(server.port());
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::send(fd, kDummyHello, sizeof(kDummyHello) - 1, MSG_NOSIGNAL),
            static_cast<ssize_t>(sizeof(kDummyHello) - 1));
  const auto t0 = Clock::now();
  const std::string got = ReadLines(fd, 3);  // the config and two heartbeats
  const auto took = Clock::now() - t0;
  const size_t nl = got.find('\n');
  ASSERT_NE(nl, std::string::npos) << got;
  auto d = DecodeConfig(got.substr(0, nl));
  ASSERT_TRUE(d.ok()) << got;
  EXPECT_EQ(d->segment_name, "node-1:12345");
  EXPECT_EQ(got.substr(nl + 1), "\n\n");
  EXPECT_LT(took, 3 * kHeartbeatInterval + std::chrono::milliseconds(500));
  EXPECT_EQ(server.dummies(), 1u);
  // What a dummy sends later is dropped; the heartbeats go on.
  ASSERT_GT(::send(fd, "anything\n", 9, MSG_NOSIGNAL), 0);
  EXPECT_EQ(ReadLines(fd, 1), "\n");
  ::close(fd);
  for (int i = 0; i < 50 && server.dummies() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(server.dummies(), 0u);
}

TEST(RealClientServer, ClosesWrongOversizedAndSilentConnections) {
  RealClientServer server(Sample());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  int wrong = Connect(server.port());
  int big = Connect(server.port());
  int silent = Connect(server.port());
  int partial = Connect(server.port());
  ASSERT_TRUE(wrong >= 0 && big >= 0 && silent >= 0 && partial >= 0);
  const auto t0 = Clock::now();
  (void)::send(wrong, "GET / HTTP/1.1\r\n\r\n", 18, MSG_NOSIGNAL);
  const std::string flood(kMaxHelloBytes + 10, 'M');
  (void)::send(big, flood.data(), flood.size(), MSG_NOSIGNAL);
  (void)::send(partial, "MOONCAKE-DUMMY", 14, MSG_NOSIGNAL);
  EXPECT_TRUE(Closed(wrong));
  EXPECT_TRUE(Closed(big));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(1));
  EXPECT_TRUE(Closed(silent));
  EXPECT_TRUE(Closed(partial));
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, kHelloDeadline - std::chrono::milliseconds(200));
  EXPECT_LT(took, kHelloDeadline + std::chrono::seconds(1));
  EXPECT_GE(server.refused(), 4u);
  for (int fd : {wrong, big, silent, partial}) ::close(fd);
}

TEST(RealClientServer, AnswersADummyBesideMoreIdleConnectionsThanItKeeps) {
  const size_t want = RealClientServer::kMaxConnections + 100;
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < 2 * want + 64) {
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 2 * want + 64);
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur < 2 * want + 64) GTEST_SKIP() << "RLIMIT_NOFILE too low: " << lim.rlim_cur;
  RealClientServer server(Sample());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  std::vector<int> idle;
  for (size_t i = 0; i < want; ++i) {
    int fd = Connect(server.port());
    if (fd >= 0) idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = Clock::now();
  int fd = Connect(server.port());
  ASSERT_GE(fd, 0);
  (void)::send(fd, kDummyHello, sizeof(kDummyHello) - 1, MSG_NOSIGNAL);
  const std::string got = ReadLines(fd, 1);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(1));
  EXPECT_TRUE(DecodeConfig(got.substr(0, got.find('\n'))).ok()) << got;
  ::close(fd);
  for (int i : idle) ::close(i);
}

TEST(RealClientServer, RefusesAPortInUse) {
  RealClientServer a(Sample());
  ASSERT_TRUE(a.Start("127.0.0.1", 0).ok());
  RealClientServer b(Sample());
  EXPECT_FALSE(b.Start("127.0.0.1", a.port()).ok());
}

}  // namespace
}  // namespace store
}  // namespace mooncake
