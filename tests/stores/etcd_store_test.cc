// etcd specifics: endpoint lists and failover, the lease that makes a crashed engine's keys
// expire, and its keep-alive.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include <nlohmann/json.hpp>

#include "metadata/metadata_store.h"
#include "metadata/stores/curl_client.h"
#include "store_server.h"

extern char** environ;

namespace mooncake::testing {
namespace {

using std::chrono::steady_clock;

class EtcdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    server_ = SharedServer("etcd", &error);
    if (!server_) {
      if (StoreServersRequired()) FAIL() << "cannot start etcd: " << error;
      GTEST_SKIP() << "cannot start etcd server: " << error;
    }
    hostport_ = "127.0.0.1:" + std::to_string(server_->port());
  }

  // A store with lease TTL `ttl_s`; fails the test when it cannot be made.
  std::unique_ptr<MetadataStore> Open(const std::string& conn, int ttl_s) {
    StoreOptions o;
    o.lease_ttl_s = ttl_s;
    auto r = CreateMetadataStore(conn, o);
    EXPECT_TRUE(r.ok()) << conn << ": " << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }

  StoreServer* server_ = nullptr;
  std::string hostport_;
};

TEST_F(EtcdStoreTest, BareHostPortAndEndpointListsFailOver) {
  const std::string dead = "127.0.0.1:" + std::to_string(RefusingPort());
  for (const std::string& conn :
       {hostport_, "etcd://" + dead + "," + hostport_, dead + ";" + hostport_,
        "etcd://http://" + hostport_ + "/"}) {
    auto store = Open(conn, 0);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put("mooncake/test/failover", conn).ok()) << conn;
    EXPECT_EQ(store->Get("mooncake/test/failover").value(), conn);
  }
  auto store = Open("etcd://" + dead + "," + hostport_, 0);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Describe(), "etcd://" + dead + "," + hostport_);
  // All endpoints down: Unavailable naming each.
  const std::string dead2 = "127.0.0.1:" + std::to_string(RefusingPort());
  auto r = CreateMetadataStore("etcd://" + dead + "," + dead2, StoreOptions());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsUnavailable());
  EXPECT_NE(r.status().message().find("etcd " + dead + ": connect: Connection refused"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("etcd " + dead2), std::string::npos);
}

TEST_F(EtcdStoreTest, CleanDestructionRevokesTheLeaseAtOnce) {
  auto writer = Open("etcd://" + hostport_, 30);
  auto reader = Open("etcd://" + hostport_, 0);
  ASSERT_TRUE(writer && reader);
  ASSERT_TRUE(writer->Put("mooncake/test/revoked", "v").ok());
  ASSERT_TRUE(reader->Put("mooncake/test/unleased", "v").ok());
  EXPECT_TRUE(reader->Get("mooncake/test/revoked").ok());
  writer.reset();
  EXPECT_TRUE(reader->Get("mooncake/test/revoked").status().IsNotFound());
  // Keys written without a lease stay.
  reader.reset();
  auto again = Open("etcd://" + hostport_, 0);
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(again->Get("mooncake/test/unleased").ok());
}

TEST_F(EtcdStoreTest, KeepAliveHoldsKeysPastTheTtl) {
  auto writer = Open("etcd://" + hostport_, 2);
  auto reader = Open("etcd://" + hostport_, 0);
  ASSERT_TRUE(writer && reader);
  ASSERT_TRUE(writer->Put("mooncake/test/kept", "v").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  auto r = reader->Get("mooncake/test/kept");
  EXPECT_TRUE(r.ok()) << "the keep-alive thread should hold the key: " << r.status().ToString();
}

// Revokes, behind the store's back, the lease that `key` is attached to.
void RevokeLeaseOf(const std::string& hostport, const std::string& key) {
  CurlClient client(1500, 3000);
  std::string range = nlohmann::json{{"key", Base64Encode(key)}}.dump();
  auto r = client.Perform("POST", "http://" + hostport + "/v3/kv/range", &range,
                          "application/json");
  ASSERT_TRUE(r.ok() && r->status == 200) << r.status().ToString();
  auto reply = nlohmann::json::parse(r->body, nullptr, false);
  ASSERT_TRUE(reply.contains("kvs")) << r->body;
  std::string lease = reply["kvs"][0].value("lease", "");
  ASSERT_FALSE(lease.empty()) << "the key has no lease: " << r->body;
  std::string revoke = nlohmann::json{{"ID", lease}}.dump();
  r = client.Perform("POST", "http://" + hostport + "/v3/lease/revoke", &revoke,
                     "application/json");
  ASSERT_TRUE(r.ok() && r->status == 200) << r.status().ToString();
}

TEST_F(EtcdStoreTest, LostLeaseIsRenewedAndKeysPublishedAgain) {
  auto writer = Open("etcd://" + hostport_, 3);
  auto reader = Open("etcd://" + hostport_, 0);
  ASSERT_TRUE(writer && reader);
  ASSERT_TRUE(writer->Put("mooncake/test/renew-a", "a").ok());
  ASSERT_TRUE(writer->Put("mooncake/test/renew-b", "b").ok());
  ASSERT_TRUE(writer->Remove("mooncake/test/renew-b").ok());
  // A Put after the lease is gone takes a new lease and writes the earlier keys again.
  ASSERT_NO_FATAL_FAILURE(RevokeLeaseOf(hostport_, "mooncake/test/renew-a"));
  EXPECT_TRUE(reader->Get("mooncake/test/renew-a").status().IsNotFound());
  ASSERT_TRUE(writer->Put("mooncake/test/renew-c", "c").ok());
  EXPECT_EQ(reader->Get("mooncake/test/renew-a").value(), "a");
  EXPECT_EQ(reader->Get("mooncake/test/renew-c").value(), "c");
  EXPECT_TRUE(reader->Get("mooncake/test/renew-b").status().IsNotFound())
      << "a removed key stays removed";
  // Without a Put, the keep-alive thread notices within TTL/3 and does the same.
  ASSERT_NO_FATAL_FAILURE(RevokeLeaseOf(hostport_, "mooncake/test/renew-a"));
  auto start = steady_clock::now();
  bool back = false;
  while (!back && SecondsSince(start) < 4) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    back = reader->Get("mooncake/test/renew-a").ok() && reader->Get("mooncake/test/renew-c").ok();
  }
  EXPECT_TRUE(back) << "the keys were not published again under a new lease";
}

TEST_F(EtcdStoreTest, KeysOfAKilledProcessExpireAfterTheTtl) {
  constexpr int kTtl = 2;
  const std::string key = "mooncake/test/crashed-child";
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::string conn = "etcd://" + hostport_, ttl = std::to_string(kTtl), value = "child";
  char* argv[] = {const_cast<char*>(MC_STORE_LEASE_CHILD_PATH), conn.data(), ttl.data(),
                  const_cast<char*>(key.c_str()), value.data(), nullptr};
  pid_t child = -1;
  int rc = posix_spawn(&child, MC_STORE_LEASE_CHILD_PATH, &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  ASSERT_EQ(rc, 0) << "cannot start " << MC_STORE_LEASE_CHILD_PATH;
  char buf[16] = {0};
  ssize_t n = read(out[0], buf, sizeof(buf) - 1);  // "ready\n", or EOF if it failed
  close(out[0]);
  if (n <= 0 || std::string(buf, size_t(n)).rfind("ready", 0) != 0) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    FAIL() << "the child did not put its key";
  }

  auto reader = Open("etcd://" + hostport_, 0);
  ASSERT_NE(reader, nullptr);
  ASSERT_TRUE(reader->Get(key).ok());
  ASSERT_EQ(kill(child, SIGKILL), 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  auto killed_at = steady_clock::now();
  // A crash revokes nothing: the key outlives the process until the lease runs out.
  EXPECT_TRUE(reader->Get(key).ok()) << "the key vanished before its TTL ran out";
  bool gone = false;
  while (SecondsSince(killed_at) < kTtl + 4) {
    auto r = reader->Get(key);
    if (r.status().IsNotFound()) {
      gone = true;
      break;
    }
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(gone) << "the key outlived its lease";
  EXPECT_LE(SecondsSince(killed_at), kTtl + 2.0);
}

}  // namespace
}  // namespace mooncake::testing
