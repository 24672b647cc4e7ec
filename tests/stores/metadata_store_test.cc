// The behaviour every metadata store shares (etcd, redis, our HTTP server), plus connection
// string parsing and the key helpers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "metadata/metadata_store.h"
#include "metadata/stores/store_env.h"
#include "store_server.h"

namespace mooncake::testing {
namespace {

using std::chrono::steady_clock;

TEST(CreateMetadataStoreTest, RejectsMalformedConnectionStrings) {
  for (const char* conn : {"", "P2PHANDSHAKE", "zookeeper://h:1", "etcd://", "etcd://h:1,,h:2",
                           "etcd://h:99999", "redis://", "redis://h:port", "http://",
                           "http:///metadata", "127.0.0.1:0"}) {
    auto r = CreateMetadataStore(conn, StoreOptions());
    ASSERT_FALSE(r.ok()) << conn;
    EXPECT_TRUE(r.status().IsInvalidArgument()) << conn << ": " << r.status().ToString();
  }
  auto r = CreateMetadataStore("zookeeper://h:1", StoreOptions());
  EXPECT_NE(r.status().message().find("unknown scheme 'zookeeper'"), std::string::npos)
      << r.status().ToString();
  StoreOptions bad_db;
  bad_db.redis_db_index = 256;
  r = CreateMetadataStore("redis://127.0.0.1:1", bad_db);
  EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
}

TEST(CreateMetadataStoreTest, KeyHelpersFollowUpstream) {
  EXPECT_EQ(KeyPrefix(""), "mooncake/");
  EXPECT_EQ(KeyPrefix("c1"), "mooncake/c1/");
  EXPECT_EQ(KeyPrefix("c1/"), "mooncake/c1/");
  EXPECT_EQ(SegmentKey("", "10.0.0.1:15000"), "mooncake/ram/10.0.0.1:15000");
  EXPECT_EQ(SegmentKey("c1", "nvmeof/x"), "mooncake/c1/nvmeof/x");
  EXPECT_EQ(RpcMetaKey("", "10.0.0.1:12345"), "mooncake/rpc_meta/10.0.0.1:12345");
}

TEST(CreateMetadataStoreTest, OptionsFromEnvironment) {
  setenv("MC_REDIS_USERNAME", "u", 1);
  setenv("MC_REDIS_PASSWORD", "p", 1);
  setenv("MC_REDIS_DB_INDEX", "7", 1);
  StoreOptions o = StoreOptionsFromEnvironment();
  EXPECT_EQ(o.redis_username, "u");
  EXPECT_EQ(o.redis_password, "p");
  EXPECT_EQ(o.redis_db_index, 7);
  setenv("MC_REDIS_DB_INDEX", "300", 1);
  EXPECT_EQ(StoreOptionsFromEnvironment().redis_db_index, 0);
  unsetenv("MC_REDIS_USERNAME");
  unsetenv("MC_REDIS_PASSWORD");
  unsetenv("MC_REDIS_DB_INDEX");
}

// Parameterized by the store kind: "etcd", "redis" or "http".
class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string error;
    server_ = SharedServer(GetParam(), &error);
    if (!server_) {
      if (StoreServersRequired()) FAIL() << "cannot start " << GetParam() << ": " << error;
      GTEST_SKIP() << "cannot start " << GetParam() << " server: " << error;
    }
    auto r = CreateMetadataStore(server_->ConnString(), StoreOptions());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    store_ = std::move(r).value();
  }

  // A key of this test's own, so that tests sharing a server do not meet.
  std::string Key(const std::string& suffix) const {
    return "mooncake/test/" +
           std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "/" +
           suffix;
  }

  StoreServer* server_ = nullptr;
  std::unique_ptr<MetadataStore> store_;
};

TEST_P(StoreTest, GetOfMissingKeyIsNotFound) {
  auto r = store_->Get(Key("missing"));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsNotFound()) << r.status().ToString();
}

TEST_P(StoreTest, PutGetRemoveRoundTrip) {
  const std::string key = Key("k");
  ASSERT_TRUE(store_->Put(key, "v1").ok());
  auto r = store_->Get(key);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "v1");
  ASSERT_TRUE(store_->Put(key, "v2").ok());  // replaces
  EXPECT_EQ(store_->Get(key).value(), "v2");
  ASSERT_TRUE(store_->Remove(key).ok());
  EXPECT_TRUE(store_->Get(key).status().IsNotFound());
  EXPECT_TRUE(store_->Remove(key).ok()) << "Remove of a missing key is OK";
  // A second client sees what the first wrote.
  ASSERT_TRUE(store_->Put(key, "v3").ok());
  auto other = CreateMetadataStore(server_->ConnString(), StoreOptions());
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ((*other)->Get(key).value(), "v3");
}

TEST_P(StoreTest, ValuesWithNewlinesAndJson) {
  const std::string json =
      "{\"buffers\":[{\"addr\":140230000000000,\"length\":2147483648,\"name\":\"127.0.0.1:1\"}],"
      "\"name\":\"127.0.0.1:1\",\"protocol\":\"tcp\",\"tcp_data_port\":15873,"
      "\"note\":\"tab\\t quote\\\" unicode \xc3\xa9\"}\n";
  const std::string multi = "line1\nline2\r\n\n  {\"a\": [1, 2]}\n";
  std::string big(300000, 'x');
  for (size_t i = 0; i < big.size(); i += 97) big[i] = '\n';
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, std::string>>{
           {"json", json}, {"multi", multi}, {"big", big}, {"empty", ""}}) {
    ASSERT_TRUE(store_->Put(Key(name), value).ok()) << name;
    auto r = store_->Get(Key(name));
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    EXPECT_EQ(*r, value) << name;
  }
}

TEST_P(StoreTest, KeysWithSlashesAndSpecialCharacters) {
  const std::vector<std::string> keys = {
      SegmentKey("", "10.0.0.1:15000"), SegmentKey("cluster-a", "nvmeof/disk/0"),
      RpcMetaKey("", "10.0.0.1:12345"), Key("a/b/c//d/"), Key("sp ace&amp=1?x#y%20+~")};
  for (const auto& key : keys) {
    ASSERT_TRUE(store_->Put(key, "value of " + key).ok()) << key;
  }
  for (const auto& key : keys) {
    auto r = store_->Get(key);
    ASSERT_TRUE(r.ok()) << key << ": " << r.status().ToString();
    EXPECT_EQ(*r, "value of " + key);
    EXPECT_TRUE(store_->Remove(key).ok()) << key;
    EXPECT_TRUE(store_->Get(key).status().IsNotFound()) << key;
  }
  // A key is not a prefix: "a/b" does not find "a/b/c".
  ASSERT_TRUE(store_->Put(Key("p/q/r"), "deep").ok());
  EXPECT_TRUE(store_->Get(Key("p/q")).status().IsNotFound());
}

TEST_P(StoreTest, ConcurrentClientsOfOneStore) {
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        std::string key = Key(std::to_string(t) + "/" + std::to_string(i));
        std::string value = "v" + std::to_string(t * 100 + i);
        if (!store_->Put(key, value).ok()) ++failures;
        auto r = store_->Get(key);
        if (!r.ok() || *r != value) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

// Parameterized by the store kind, without the shared server.
class StoreKindTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StoreKindTest, UnreachableAtCreationIsUnavailableAndNamesTheStore) {
  const std::string kind = GetParam();
  std::string conn = kind + "://127.0.0.1:" + std::to_string(RefusingPort());
  if (kind == "http") conn += "/metadata";
  auto start = steady_clock::now();
  auto r = CreateMetadataStore(conn, StoreOptions());
  EXPECT_LT(SecondsSince(start), 5.0);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  EXPECT_EQ(r.status().message().rfind(kind + " ", 0), 0u) << r.status().ToString();
  EXPECT_NE(r.status().message().find("127.0.0.1:"), std::string::npos);
  EXPECT_NE(r.status().message().find("refused"), std::string::npos) << r.status().ToString();
}

TEST_P(StoreKindTest, SilentServerTimesOutAtCreation) {
  // A listener that never accepts: the TCP connect succeeds, no answer ever comes.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 8), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string kind = GetParam();
  std::string conn = kind + "://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  if (kind == "http") conn += "/metadata";
  auto start = steady_clock::now();
  auto r = CreateMetadataStore(conn, ShortTimeouts());
  double elapsed = SecondsSince(start);
  close(fd);
  EXPECT_LT(elapsed, 3.0);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("timed out"), std::string::npos)
      << r.status().ToString();
}

TEST_P(StoreKindTest, KilledServerGivesErrorsNotHangs) {
  MC_SERVER_OR_SKIP(server, GetParam(), "");
  auto r = CreateMetadataStore(server->ConnString(), ShortTimeouts());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto& store = *r;
  ASSERT_TRUE(store->Put("mooncake/test/killed", "v").ok());
  ASSERT_TRUE(store->Get("mooncake/test/killed").ok());
  server->Kill();
  for (int round = 0; round < 2; ++round) {
    auto start = steady_clock::now();
    auto g = store->Get("mooncake/test/killed");
    EXPECT_LT(SecondsSince(start), 3.0);
    ASSERT_FALSE(g.ok());
    EXPECT_TRUE(g.status().IsUnavailable()) << g.status().ToString();
    EXPECT_NE(g.status().message().find(GetParam()), std::string::npos)
        << g.status().ToString();
    start = steady_clock::now();
    Status p = store->Put("mooncake/test/killed", "w");
    EXPECT_LT(SecondsSince(start), 3.0);
    EXPECT_TRUE(p.IsUnavailable()) << p.ToString();
    start = steady_clock::now();
    EXPECT_FALSE(store->Remove("mooncake/test/killed").ok());
    EXPECT_LT(SecondsSince(start), 3.0);
  }
  // Destroying the store with its server gone is bounded too (etcd revokes its lease).
  auto start = steady_clock::now();
  store.reset();
  EXPECT_LT(SecondsSince(start), 3.0);
}

std::string KindName(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

INSTANTIATE_TEST_SUITE_P(AllStores, StoreTest, ::testing::Values("etcd", "redis", "http"),
                         KindName);
INSTANTIATE_TEST_SUITE_P(AllStores, StoreKindTest, ::testing::Values("etcd", "redis", "http"),
                         KindName);

}  // namespace
}  // namespace mooncake::testing
