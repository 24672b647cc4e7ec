// EtcdKv against a real etcd (scripts/store_servers.sh): ranges, bytes, txns, leases,
// compaction and status, endpoint failover; and its pure helpers (endpoint parsing, prefix
// ranges), which need no server.
#include "metadata/stores/etcd_kv.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "store_server.h"

namespace mooncake::testing {
namespace {

using std::chrono::steady_clock;

// A 127.0.0.1 listener that never accepts: connections complete in the kernel and then
// nothing answers, as with a SIGSTOPped member.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd_, 16) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~SilentListener() { close(fd_); }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

HostPort Local(uint16_t port) { return HostPort{"127.0.0.1", port, true}; }

EtcdKv::Options Short() {
  EtcdKv::Options o;
  o.connect_timeout_ms = 500;
  o.request_timeout_ms = 1000;
  return o;
}

class EtcdKvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    server_ = SharedServer("etcd", &error);
    if (!server_) {
      if (StoreServersRequired()) FAIL() << "cannot start etcd: " << error;
      GTEST_SKIP() << "cannot start etcd server: " << error;
    }
    kv_ = Open({Local(server_->port())});
    ASSERT_NE(kv_, nullptr);
    prefix_ = std::string("etcd_kv_test/") +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/";
    ASSERT_TRUE(kv_->Delete(prefix_, EtcdPrefixEnd(prefix_)).ok());
  }

  std::unique_ptr<EtcdKv> Open(std::vector<HostPort> endpoints,
                               const EtcdKv::Options& o = Short()) {
    auto r = EtcdKv::Create(std::move(endpoints), o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }

  StoreServer* server_ = nullptr;
  std::unique_ptr<EtcdKv> kv_;
  std::string prefix_;
};

TEST_F(EtcdKvTest, RangeOfAPrefixWithLimitMoreAndCount) {
  for (const char* k : {"a", "b", "c"}) ASSERT_TRUE(kv_->Put(prefix_ + k, k).ok());
  // Neighbours just outside the prefix range.
  const std::string outside = prefix_.substr(0, prefix_.size() - 1) + "0";
  ASSERT_TRUE(kv_->Put(outside, "x").ok());
  ASSERT_TRUE(kv_->Put(prefix_.substr(0, prefix_.size() - 1), "x").ok());

  auto r = kv_->Range(prefix_, EtcdPrefixEnd(prefix_), /*limit=*/2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->kvs.size(), 2u);
  EXPECT_EQ(r->kvs[0].key, prefix_ + "a");
  EXPECT_EQ(r->kvs[0].value, "a");
  EXPECT_EQ(r->kvs[1].key, prefix_ + "b");
  EXPECT_TRUE(r->more);
  EXPECT_EQ(r->count, 3);
  EXPECT_GT(r->revision, 0);

  r = kv_->Range(prefix_, EtcdPrefixEnd(prefix_), 0, /*keys_only=*/true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->kvs.size(), 3u);
  EXPECT_FALSE(r->more);
  EXPECT_EQ(r->count, 3);
  EXPECT_EQ(r->kvs[2].key, prefix_ + "c");
  for (const auto& kv : r->kvs) EXPECT_EQ(kv.value, "") << kv.key;

  r = kv_->Range(prefix_ + "b");  // the key alone
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].value, "b");
  r = kv_->Range(prefix_ + "absent");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->kvs.empty());
  EXPECT_EQ(r->count, 0);
  EXPECT_FALSE(r->more);
  ASSERT_TRUE(kv_->Delete(outside).ok());
  ASSERT_TRUE(kv_->Delete(prefix_.substr(0, prefix_.size() - 1)).ok());
}

TEST_F(EtcdKvTest, BytesWithNulAnd0xffRoundTrip) {
  const std::string key = prefix_ + std::string("k\0\xff\x01", 4);
  std::string value;
  for (int i = 0; i < 256; ++i) value.push_back(char(i));
  value += std::string("\0\0\xff\xff", 4);
  auto rev = kv_->Put(key, value);
  ASSERT_TRUE(rev.ok()) << rev.status().ToString();
  auto r = kv_->Range(key);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].key, key);
  EXPECT_EQ(r->kvs[0].value, value);
  EXPECT_EQ(r->kvs[0].create_revision, *rev);
  EXPECT_EQ(r->kvs[0].mod_revision, *rev);
  EXPECT_EQ(r->kvs[0].version, 1);
  EXPECT_EQ(r->kvs[0].lease, 0);
  // An empty value (left out of the reply) reads back empty; the version counts writes.
  auto rev2 = kv_->Put(key, "");
  ASSERT_TRUE(rev2.ok());
  EXPECT_GT(*rev2, *rev);
  r = kv_->Range(key);
  ASSERT_TRUE(r.ok() && r->kvs.size() == 1u);
  EXPECT_EQ(r->kvs[0].value, "");
  EXPECT_EQ(r->kvs[0].create_revision, *rev);
  EXPECT_EQ(r->kvs[0].mod_revision, *rev2);
  EXPECT_EQ(r->kvs[0].version, 2);
}

TEST_F(EtcdKvTest, DeleteRange) {
  for (const char* k : {"a", "b", "c"}) ASSERT_TRUE(kv_->Put(prefix_ + k, "v").ok());
  auto n = kv_->Delete(prefix_ + "a");
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 1);
  n = kv_->Delete(prefix_ + "a");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0);
  n = kv_->Delete(prefix_, EtcdPrefixEnd(prefix_));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2);
  EXPECT_EQ(kv_->Range(prefix_, EtcdPrefixEnd(prefix_))->count, 0);
}

TEST_F(EtcdKvTest, TxnCreateIfAbsentSucceedsOnce) {
  const std::string key = prefix_ + "leader";
  EtcdCompare absent;
  absent.key = key;
  absent.target = EtcdCompare::Target::kCreateRevision;
  absent.op = EtcdCompare::Op::kEqual;
  absent.number = 0;
  auto first = kv_->Txn({absent}, {EtcdOp::Put(key, "me")}, {EtcdOp::Get(key)});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->succeeded);
  ASSERT_EQ(first->responses.size(), 1u);  // the put's (empty)
  EXPECT_TRUE(first->responses[0].kvs.empty());
  EXPECT_GT(first->revision, 0);

  auto second = kv_->Txn({absent}, {EtcdOp::Put(key, "you")},
                         {EtcdOp::Get(key), EtcdOp::Delete(prefix_ + "none")});
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_FALSE(second->succeeded);
  ASSERT_EQ(second->responses.size(), 2u);
  ASSERT_EQ(second->responses[0].kvs.size(), 1u);
  EXPECT_EQ(second->responses[0].kvs[0].value, "me");
  EXPECT_EQ(second->responses[0].kvs[0].create_revision, first->revision);
  EXPECT_EQ(second->responses[1].count, 0);  // keys deleted
  EXPECT_EQ(kv_->Range(key)->kvs[0].value, "me");
}

TEST_F(EtcdKvTest, ModRevisionFence) {
  const std::string key = prefix_ + "view", other = prefix_ + "log";
  auto rev = kv_->Put(key, "v1");
  ASSERT_TRUE(rev.ok());
  ASSERT_TRUE(kv_->Put(other, "x").ok());
  EtcdCompare fence;
  fence.key = key;
  fence.target = EtcdCompare::Target::kModRevision;
  fence.op = EtcdCompare::Op::kEqual;
  fence.number = *rev;
  // The holder of the fence writes, and deletes, while the key is as it saw it.
  auto ok = kv_->Txn({fence}, {EtcdOp::Put(other, "y"), EtcdOp::Delete(other + "-old")});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(ok->succeeded);
  ASSERT_EQ(ok->responses.size(), 2u);
  // Someone else moves the key on: the stale fence fails and writes nothing.
  ASSERT_TRUE(kv_->Put(key, "v2").ok());
  auto stale = kv_->Txn({fence}, {EtcdOp::Put(other, "z")});
  ASSERT_TRUE(stale.ok()) << stale.status().ToString();
  EXPECT_FALSE(stale->succeeded);
  EXPECT_TRUE(stale->responses.empty());
  EXPECT_EQ(kv_->Range(other)->kvs[0].value, "y");

  // The other targets and operators, all holding at once.
  auto now = kv_->Range(key);
  ASSERT_TRUE(now.ok() && now->kvs.size() == 1u);
  std::vector<EtcdCompare> all(5);
  for (auto& c : all) c.key = key;
  all[0].target = EtcdCompare::Target::kModRevision;
  all[0].op = EtcdCompare::Op::kGreater;
  all[0].number = *rev;
  all[1].target = EtcdCompare::Target::kVersion;
  all[1].op = EtcdCompare::Op::kLess;
  all[1].number = 3;
  all[2].target = EtcdCompare::Target::kValue;
  all[2].op = EtcdCompare::Op::kEqual;
  all[2].value = "v2";
  all[3].target = EtcdCompare::Target::kLease;
  all[3].op = EtcdCompare::Op::kEqual;
  all[3].number = 0;
  all[4].target = EtcdCompare::Target::kCreateRevision;
  all[4].op = EtcdCompare::Op::kNotEqual;
  all[4].number = 0;
  auto held = kv_->Txn(all, {EtcdOp::Get(prefix_, EtcdPrefixEnd(prefix_), 1)});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_TRUE(held->succeeded);
  ASSERT_EQ(held->responses.size(), 1u);
  EXPECT_EQ(held->responses[0].kvs.size(), 1u);
  EXPECT_TRUE(held->responses[0].more);
  all[2].value = "v1";
  auto broken = kv_->Txn(all, {});
  ASSERT_TRUE(broken.ok());
  EXPECT_FALSE(broken->succeeded);
}

TEST_F(EtcdKvTest, LeaseGrantKeepAliveRevoke) {
  auto lease = kv_->LeaseGrant(10);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_NE(*lease, 0);
  ASSERT_TRUE(kv_->Put(prefix_ + "a", "1", *lease).ok());
  ASSERT_TRUE(kv_->Put(prefix_ + "b", "2", *lease).ok());
  auto r = kv_->Range(prefix_ + "a");
  ASSERT_TRUE(r.ok() && r->kvs.size() == 1u);
  EXPECT_EQ(r->kvs[0].lease, *lease);
  auto ttl = kv_->LeaseKeepAlive(*lease);
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_EQ(*ttl, 10);

  ASSERT_TRUE(kv_->LeaseRevoke(*lease).ok());
  EXPECT_EQ(kv_->Range(prefix_, EtcdPrefixEnd(prefix_))->count, 0) << "revoke deletes its keys";
  ttl = kv_->LeaseKeepAlive(*lease);
  EXPECT_TRUE(ttl.status().IsNotFound()) << ttl.status().ToString();
  EXPECT_TRUE(kv_->LeaseRevoke(*lease).ok()) << "a lease already gone is OK";
  auto put = kv_->Put(prefix_ + "c", "3", *lease);
  EXPECT_TRUE(put.status().IsNotFound()) << put.status().ToString();
  EXPECT_NE(put.status().message().find("lease not found"), std::string::npos);
  EXPECT_TRUE(kv_->LeaseGrant(0).status().IsInvalidArgument());
}

TEST_F(EtcdKvTest, KeyUnderALeaseWithoutKeepAliveExpires) {
  auto lease = kv_->LeaseGrant(2);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  const auto granted = steady_clock::now();
  ASSERT_TRUE(kv_->Put(prefix_ + "k", "v", *lease).ok());
  EXPECT_EQ(kv_->Range(prefix_ + "k")->kvs.size(), 1u);
  bool gone = false;
  while (!gone && SecondsSince(granted) < 6) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto r = kv_->Range(prefix_ + "k");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    gone = r->kvs.empty();
  }
  const double took = SecondsSince(granted);
  EXPECT_TRUE(gone) << "the key outlived its lease";
  EXPECT_GE(took, 1.5);
  EXPECT_LE(took, 4.0);
  EXPECT_TRUE(kv_->LeaseKeepAlive(*lease).status().IsNotFound());
}

TEST_F(EtcdKvTest, CompactionThenStatus) {
  int64_t rev = 0;
  for (int i = 0; i < 20; ++i) {
    auto r = kv_->Put(prefix_ + "k", std::string(1000, char('a' + i % 26)));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    rev = *r;
  }
  Status s = kv_->Compact(rev);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = kv_->Compact(rev);
  EXPECT_TRUE(s.ok()) << "a revision already compacted is OK: " << s.ToString();
  s = kv_->Compact(rev + 1000000);
  EXPECT_TRUE(s.IsInvalidArgument()) << "a future revision: " << s.ToString();
  auto st = kv_->GetStatus();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_GT(st->db_size, 0);
  EXPECT_GT(st->db_size_in_use, 0);
  EXPECT_LE(st->db_size_in_use, st->db_size);
  EXPECT_GE(st->revision, rev);
  EXPECT_EQ(st->endpoint, "127.0.0.1:" + std::to_string(server_->port()));
}

TEST_F(EtcdKvTest, GatewayErrorsMapToStatus) {
  auto r = kv_->Range("");  // etcd: "key is not provided"
  EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("etcd 127.0.0.1:"), std::string::npos);
  auto put = kv_->Put(prefix_ + "big", std::string(2u << 20, 'x'));  // over 1.5 MiB
  EXPECT_TRUE(put.status().code() == Status::Code::kResourceExhausted) << put.status().ToString();
  EXPECT_TRUE(EtcdKv::Create({}, Short()).status().IsInvalidArgument());
}

TEST_F(EtcdKvTest, FailsOverFromAClosedPort) {
  const HostPort dead = Local(RefusingPort());
  auto kv = Open({dead, Local(server_->port())});
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(kv->Describe(),
            "etcd " + dead.ToString() + ",127.0.0.1:" + std::to_string(server_->port()));
  ASSERT_TRUE(kv->Put(prefix_ + "k", "v").ok());
  auto r = kv->Range(prefix_ + "k");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kvs.at(0).value, "v");
}

TEST_F(EtcdKvTest, AllEndpointsDeadIsUnavailableNamingEach) {
  const HostPort dead1 = Local(RefusingPort()), dead2 = Local(RefusingPort());
  SilentListener silent;
  ASSERT_NE(silent.port(), 0);
  auto kv = Open({dead1, dead2, Local(silent.port())});
  ASSERT_NE(kv, nullptr);
  const auto start = steady_clock::now();
  auto r = kv->Range(prefix_ + "k");
  const double took = SecondsSince(start);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("etcd " + dead1.ToString() + ": connect: Connection refused"),
            std::string::npos) << m;
  EXPECT_NE(m.find("etcd " + dead2.ToString() + ": connect"), std::string::npos) << m;
  EXPECT_NE(m.find("etcd 127.0.0.1:" + std::to_string(silent.port()) + ": timed out"),
            std::string::npos) << m;
  EXPECT_LE(took, 3 * 1.0 + 1.0) << "endpoints x request timeout";
}

TEST_F(EtcdKvTest, StoppedMemberCostsOneTimeout) {
  SilentListener silent;
  ASSERT_NE(silent.port(), 0);
  auto kv = Open({Local(silent.port()), Local(server_->port())});
  ASSERT_NE(kv, nullptr);
  auto start = steady_clock::now();
  auto r = kv->Put(prefix_ + "k", "v");
  double took = SecondsSince(start);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GE(took, 0.9);
  EXPECT_LE(took, 2.0);
  // The member that answered is asked first from now on.
  start = steady_clock::now();
  ASSERT_TRUE(kv->Range(prefix_ + "k").ok());
  EXPECT_LE(SecondsSince(start), 0.5);
}

TEST_F(EtcdKvTest, ConcurrentCallsDoNotSerialize) {
  SilentListener silent;
  ASSERT_NE(silent.port(), 0);
  auto kv = Open({Local(silent.port())});
  ASSERT_NE(kv, nullptr);
  const auto start = steady_clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&] { EXPECT_TRUE(kv->Range("k").status().IsUnavailable()); });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(SecondsSince(start), 1.8) << "three stuck calls should overlap, not queue";
  // The pool keeps working for an endpoint that answers, with a per-call timeout.
  auto good = Open({Local(server_->port())});
  ASSERT_NE(good, nullptr);
  threads.clear();
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < 20; ++j) {
        const std::string k = prefix_ + std::to_string(i) + "/" + std::to_string(j);
        EXPECT_TRUE(good->Put(k, k, 0, 2000).ok());
        auto r = good->Range(k, "", 0, false, 2000);
        EXPECT_TRUE(r.ok() && r->kvs.size() == 1u && r->kvs[0].value == k);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good->Range(prefix_, EtcdPrefixEnd(prefix_))->count, 80);
}

TEST(EtcdKvHelpersTest, ParseEtcdEndpoints) {
  auto e = ParseEtcdEndpoints("h1:2379;h2:2380");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_EQ(e->size(), 2u);
  EXPECT_EQ((*e)[0].ToString(), "h1:2379");
  EXPECT_EQ((*e)[1].ToString(), "h2:2380");
  e = ParseEtcdEndpoints("http://h1:1,http://h2/,h3");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_EQ(e->size(), 3u);
  EXPECT_EQ((*e)[0].ToString(), "h1:1");
  EXPECT_EQ((*e)[1].ToString(), "h2:2379");
  EXPECT_EQ((*e)[2].ToString(), "h3:2379");
  e = ParseEtcdEndpoints("[::1]:2379, [::1]");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_EQ(e->size(), 2u);
  EXPECT_EQ((*e)[0].host, "::1");
  EXPECT_EQ((*e)[0].port, 2379);
  EXPECT_EQ((*e)[1].ToString(), "[::1]:2379");

  for (const char* bad : {"", " ", "h1:2379,,h2:2379", "h1:2379;", ",h1", "h:99999", "h:port",
                          "http://", "ftp://h:1"}) {
    auto r = ParseEtcdEndpoints(bad);
    EXPECT_TRUE(r.status().IsInvalidArgument()) << "'" << bad << "': " << r.status().ToString();
  }
  auto r = ParseEtcdEndpoints("h1:1,,h2:2");
  EXPECT_NE(r.status().message().find("item 2 is empty"), std::string::npos)
      << r.status().ToString();
  r = ParseEtcdEndpoints("h1:1;https://h2:2379");
  ASSERT_TRUE(r.status().IsInvalidArgument());
  EXPECT_NE(r.status().message().find("https"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("not supported"), std::string::npos);
}

TEST(EtcdKvHelpersTest, PrefixEnd) {
  EXPECT_EQ(EtcdPrefixEnd("a"), "b");
  EXPECT_EQ(EtcdPrefixEnd("mooncake/"), "mooncake0");
  EXPECT_EQ(EtcdPrefixEnd("ab\xfe"), "ab\xff");
  EXPECT_EQ(EtcdPrefixEnd("a\xff"), "b");
  EXPECT_EQ(EtcdPrefixEnd("a\xff\xff"), "b");
  EXPECT_EQ(EtcdPrefixEnd(std::string("a\0", 2)), std::string("a\x01", 2));
  EXPECT_EQ(EtcdPrefixEnd("\xff"), std::string(1, '\0'));
  EXPECT_EQ(EtcdPrefixEnd("\xff\xff"), std::string(1, '\0'));
  EXPECT_EQ(EtcdPrefixEnd(""), std::string(1, '\0'));
}

}  // namespace
}  // namespace mooncake::testing
