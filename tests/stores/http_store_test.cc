// mooncake_http_metadata_server against upstream's contract, raw and through HttpStore.
#include <signal.h>
#include <sys/socket.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "metadata/metadata_store.h"
#include "common/net.h"
#include "metadata/stores/curl_client.h"
#include "store_server.h"

namespace mooncake::testing {
namespace {

using std::chrono::steady_clock;

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    server_ = SharedServer("http", &error);
    if (!server_) {
      if (StoreServersRequired()) FAIL() << "cannot start http: " << error;
      GTEST_SKIP() << "cannot start the http metadata server: " << error;
    }
    base_ = server_->ConnString();
  }

  HttpResponse Request(const std::string& method, const std::string& url,
                       const std::string* body = nullptr) {
    auto r = client_.Perform(method, url, body, "application/json");
    EXPECT_TRUE(r.ok()) << method << " " << url << ": " << r.status().ToString();
    return r.ok() ? *r : HttpResponse{};
  }

  StoreServer* server_ = nullptr;
  std::string base_;
  CurlClient client_{1500, 3000};
};

TEST_F(HttpServerTest, StatusCodesOfTheRawProtocol) {
  const std::string url = base_ + "?key=" + UrlEscape("mooncake/test/raw key");
  EXPECT_EQ(Request("GET", url).status, 404);
  EXPECT_EQ(Request("GET", url).body, "metadata not found");
  EXPECT_EQ(Request("DELETE", url).status, 404);
  std::string value = "{\"a\":1}\n";
  EXPECT_EQ(Request("PUT", url, &value).status, 200);
  HttpResponse got = Request("GET", url);
  EXPECT_EQ(got.status, 200);
  EXPECT_EQ(got.body, value);
  EXPECT_EQ(Request("DELETE", url).status, 200);
  EXPECT_EQ(Request("GET", url).status, 404);
  // No key, or an empty / blank one: 400.
  for (const std::string& bad : {base_, base_ + "?key=", base_ + "?key=%20%20", base_ + "?k=x"}) {
    HttpResponse r = Request("GET", bad);
    EXPECT_EQ(r.status, 400) << bad;
    EXPECT_EQ(r.body, "metadata key is required");
    EXPECT_EQ(Request("PUT", bad, &value).status, 400) << bad;
    EXPECT_EQ(Request("DELETE", bad).status, 400) << bad;
  }
  EXPECT_EQ(Request("POST", url, &value).status, 405);
  EXPECT_EQ(Request("GET", "http://127.0.0.1:" + std::to_string(server_->port()) +
                               "/other?key=x").status,
            404);
}

TEST_F(HttpServerTest, DuplicateRpcMetaRule) {
  auto r = CreateMetadataStore(base_, StoreOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto& store = *r;
  const std::string rpc = RpcMetaKey("", "10.0.0.9:12345");
  const std::string a = "{\"ip_or_host_name\":\"10.0.0.9\",\"rpc_port\":15001}\n";
  const std::string b = "{\"ip_or_host_name\":\"10.0.0.9\",\"rpc_port\":15002}\n";
  ASSERT_TRUE(store->Put(rpc, a).ok());
  // The identical value again is accepted (a restarted engine republishing itself).
  EXPECT_TRUE(store->Put(rpc, a).ok());
  // A different value is refused, as upstream does.
  Status s = store->Put(rpc, b);
  EXPECT_EQ(s.code(), Status::Code::kAlreadyExists) << s.ToString();
  EXPECT_NE(s.message().find("Duplicate rpc_meta key not allowed"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(store->Get(rpc).value(), a);
  // After a Remove the key may be written anew.
  ASSERT_TRUE(store->Remove(rpc).ok());
  EXPECT_TRUE(store->Put(rpc, b).ok());
  EXPECT_EQ(store->Get(rpc).value(), b);
  // Other keys are replaced freely.
  const std::string seg = SegmentKey("", "10.0.0.9:12345");
  EXPECT_TRUE(store->Put(seg, a).ok());
  EXPECT_TRUE(store->Put(seg, b).ok());
  EXPECT_EQ(store->Get(seg).value(), b);
}

TEST(HttpServerOwnTest, BodyLimitLogLineAndCleanExitOnSigterm) {
  MC_SERVER_OR_SKIP(server, "http", "--max_body_bytes 1000");
  auto r = CreateMetadataStore(server->ConnString(), StoreOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE((*r)->Put("mooncake/test/small", std::string(1000, 'x')).ok());
  Status s = (*r)->Put("mooncake/test/large", std::string(1001, 'x'));
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("HTTP 413"), std::string::npos) << s.ToString();

  ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
  auto start = steady_clock::now();
  while (ProcessAlive(server->pid()) && SecondsSince(start) < 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(ProcessAlive(server->pid())) << "the server did not exit on SIGTERM";
  std::ifstream log(server->dir() + "/http.log");
  std::stringstream ss;
  ss << log.rdbuf();
  EXPECT_NE(ss.str().find("mooncake_http_metadata_server listening on 127.0.0.1:" +
                          std::to_string(server->port()) + "\n"),
            std::string::npos)
      << ss.str();
  EXPECT_NE(ss.str().find("stopped"), std::string::npos) << ss.str();
}

// SIGTERM ends the server at once even with an idle connection (no byte sent) and an idle
// keep-alive connection open: before, it waited out the keep-alive (about 5 s), because the
// connections' waits asked httplib's is_running(), which stays true until they end.
TEST(HttpServerOwnTest, SigtermIsPromptWithIdleConnectionsOpen) {
  MC_SERVER_OR_SKIP(server, "http", "");
  auto idle = ConnectTcp("127.0.0.1", static_cast<uint16_t>(server->port()), 2000);
  ASSERT_TRUE(idle.ok()) << idle.status().ToString();
  auto keep = ConnectTcp("127.0.0.1", static_cast<uint16_t>(server->port()), 2000);
  ASSERT_TRUE(keep.ok()) << keep.status().ToString();
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(keep->get(), get.data(), get.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(get.size()));
  char reply[512];
  ASSERT_GT(::recv(keep->get(), reply, sizeof(reply), 0), 0);  // answered, kept alive
  std::this_thread::sleep_for(std::chrono::milliseconds(200));

  ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
  auto start = steady_clock::now();
  while (ProcessAlive(server->pid()) && SecondsSince(start) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(ProcessAlive(server->pid())) << "the server did not exit on SIGTERM";
  EXPECT_LT(SecondsSince(start), 2.0) << "SIGTERM waited out the idle connections";
}

}  // namespace
}  // namespace mooncake::testing
