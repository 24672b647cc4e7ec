// MetricsServer: answers GET /metrics beside more idle connections than it keeps, closes
// connections that miss the request deadline, refuses oversized and foreign requests, and
// refuses a port in use.
#include "store/common/metrics_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "store/testing/loopback_http.h"  // tests/store_master

namespace mooncake {
namespace store {
namespace {

using Clock = std::chrono::steady_clock;
using testing_master::ConnectLoopback;
using testing_master::Exchange;

TEST(MetricsServer, ServesBesideMoreIdleConnectionsThanItKeeps) {
  MetricsServer server([] { return std::string("metric_a 1\n"); });
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  std::vector<int> idle;
  for (size_t i = 0; i < MetricsServer::kMaxConnections + 200; ++i) {
    int fd = ConnectLoopback(server.port());
    if (fd >= 0) idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = Clock::now();
  const std::string reply = Exchange(server.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(1));
  EXPECT_NE(reply.find("HTTP/1.1 200 OK"), std::string::npos) << reply;
  EXPECT_NE(reply.find("metric_a 1"), std::string::npos);
  EXPECT_GE(server.dropped(), 200u);  // the oldest idle ones made room
  for (int fd : idle) ::close(fd);
}

TEST(MetricsServer, ASlowRequestIsCutAtTheDeadline) {
  MetricsServer server([] { return std::string("m 1\n"); });
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  int fd = ConnectLoopback(server.port());
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::send(fd, "GET /met", 8, MSG_NOSIGNAL), 8);
  const auto t0 = Clock::now();
  char c;
  EXPECT_EQ(::recv(fd, &c, 1, 0), 0);  // closed, no reply
  const auto waited = Clock::now() - t0;
  EXPECT_GE(waited, MetricsServer::kRequestDeadline - std::chrono::milliseconds(200));
  EXPECT_LT(waited, MetricsServer::kRequestDeadline + std::chrono::seconds(1));
  ::close(fd);
}

TEST(MetricsServer, ForeignOversizedAndMalformedRequestsGetAnAnswer) {
  MetricsServer server([] { return std::string("m 1\n"); });
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  EXPECT_NE(Exchange(server.port(), "GET /other HTTP/1.1\r\n\r\n").find(" 404 "), std::string::npos);
  EXPECT_NE(Exchange(server.port(), "POST /metrics HTTP/1.1\r\n\r\n").find(" 405 "),
            std::string::npos);
  const std::string big(MetricsServer::kMaxRequestBytes + 1000, 'a');
  EXPECT_NE(Exchange(server.port(), "GET /metrics HTTP/1.1\r\nX: " + big).find(" 431 "),
            std::string::npos);
  EXPECT_NE(Exchange(server.port(), "GET /metrics?" + big).find(" 414 "), std::string::npos);
  EXPECT_NE(Exchange(server.port(), "GET metrics HTTP/1.1\r\n\r\n").find(" 400 "),
            std::string::npos);
  EXPECT_NE(Exchange(server.port(), "\r\n\r\n").find(" 405 "), std::string::npos);
  EXPECT_NE(Exchange(server.port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n").find(" 200 "),
            std::string::npos);
}

TEST(MetricsServer, AHandlerSeesTheTargetAndAHeadGetsNoBody) {
  MetricsServer server([](const std::string& target) {
    HttpReply r;
    r.status = target == "/missing" ? 404 : 200;
    r.body = "target=" + target;
    r.headers.emplace_back("X-Extra", "1");
    return r;
  });
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  const std::string get = Exchange(server.port(), "GET /a/b?c=%20d HTTP/1.1\r\n\r\n");
  EXPECT_NE(get.find("HTTP/1.1 200 OK"), std::string::npos) << get;
  EXPECT_NE(get.find("X-Extra: 1\r\n"), std::string::npos) << get;
  EXPECT_NE(get.find("\r\n\r\ntarget=/a/b?c=%20d"), std::string::npos) << get;
  EXPECT_NE(Exchange(server.port(), "GET /missing HTTP/1.1\r\n\r\n").find(" 404 Not Found"),
            std::string::npos);
  const std::string head = Exchange(server.port(), "HEAD /x HTTP/1.1\r\n\r\n");
  EXPECT_NE(head.find("Content-Length: 9\r\n"), std::string::npos) << head;
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n") << head;  // no body
  EXPECT_NE(Exchange(server.port(), "DELETE /x HTTP/1.1\r\n\r\n").find(" 405 "),
            std::string::npos);
}

TEST(MetricsServer, AHandlerThatThrowsGets500AndTheServerGoesOn) {
  MetricsServer server([](const std::string& target) -> HttpReply {
    if (target == "/throw") throw std::runtime_error("boom");
    return HttpReply{};
  });
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  const std::string r = Exchange(server.port(), "GET /throw HTTP/1.1\r\n\r\n");
  EXPECT_NE(r.find(" 500 "), std::string::npos) << r;
  EXPECT_NE(r.find("boom"), std::string::npos) << r;
  EXPECT_NE(Exchange(server.port(), "GET /ok HTTP/1.1\r\n\r\n").find(" 200 "),
            std::string::npos);
}

// Clients that ask for big replies and never read them hold at most kMaxPendingReplyBytes:
// a reply that would pass it is a 503 instead, and once they go, the same request succeeds.
TEST(MetricsServer, RepliesNobodyReadsAreBounded) {
  const std::string big(16 << 20, 'b');
  MetricsServer server([&](const std::string& target) {
    HttpReply r;
    r.body = target == "/big" ? big : "small";
    return r;
  });
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  std::vector<int> stalled;
  const size_t n = MetricsServer::kMaxPendingReplyBytes / big.size();
  for (size_t i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    int small_buf = 4096;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small_buf, sizeof(small_buf));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(server.port()));
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    const char req[] = "GET /big HTTP/1.1\r\n\r\n";
    ASSERT_EQ(::send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL), ssize_t(sizeof(req) - 1));
    stalled.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string busy = Exchange(server.port(), "GET /big HTTP/1.1\r\n\r\n");
  EXPECT_NE(busy.find(" 503 "), std::string::npos) << busy.substr(0, 200);
  EXPECT_NE(Exchange(server.port(), "GET /small HTTP/1.1\r\n\r\n").find(" 200 OK"),
            std::string::npos);
  for (int fd : stalled) ::close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string ok = Exchange(server.port(), "GET /big HTTP/1.1\r\n\r\n");
  EXPECT_NE(ok.find(" 200 OK"), std::string::npos) << ok.substr(0, 200);
  EXPECT_GT(ok.size(), big.size());
}

TEST(MetricsServer, APortInUseIsRefused) {
  MetricsServer first([] { return std::string(); });
  ASSERT_TRUE(first.Start("127.0.0.1", 0).ok());
  MetricsServer second([] { return std::string(); });
  const Status started = second.Start("127.0.0.1", first.port());
  ASSERT_FALSE(started.ok());
  EXPECT_NE(started.message().find("in use"), std::string::npos) << started.ToString();
}

}  // namespace
}  // namespace store
}  // namespace mooncake
