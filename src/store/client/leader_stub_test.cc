// LeaderStub (leader_stub.h): a StoreClient given etcd://... follows the leader that
// master_view names. A real etcd (tests/stores/store_server.h) and two in-process masters
// (RpcServer + ServeMasterRpc over one MasterService, so that the new leader knows what the
// old one did, as a replicated one would), each answering kNotLeader while it is a standby,
// or hanging (it read the request and never answers) while the test says so.
#include "store/client/leader_stub.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "metadata/stores/etcd_kv.h"
#include "mooncake/store/error_code.h"
#include "mooncake/store/store_client.h"
#include "store/ha/master_view.h"
#include "store/master/master_rpc.h"
#include "store/master/master_service.h"
#include "store/rpc/rpc_client.h"
#include "store/rpc/rpc_server.h"
#include "store_server.h"  // tests/stores: the throwaway etcd

namespace mooncake {
namespace store {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
const int kNoLeader = ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// One master: serves `service` while kServe, answers kNotLeader while kStandby, holds every
// request unanswered while kHang (until the mode changes).
class TestMaster {
 public:
  enum Mode { kServe, kStandby, kHang };
  TestMaster(MasterService* service, Mode mode) : service_(service), mode_(mode) {
    RpcServer::Options o;
    o.slow = &IsSlowMasterMethod;
    server_ = std::make_unique<RpcServer>(
        o, [this](uint16_t m, const char* d, size_t n, std::string* out) {
          return Handle(m, d, n, out);
        });
    EXPECT_TRUE(server_->Start("127.0.0.1", 0).ok());
  }
  ~TestMaster() { Stop(); }
  void set_mode(Mode m) { mode_ = m; }
  void Stop() {
    mode_ = kStandby;
    server_->Stop();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(server_->port()); }
  int calls(MasterMethod m) const { return calls_[static_cast<int>(m)].load(); }

 private:
  RpcStatus Handle(uint16_t m, const char* d, size_t n, std::string* out) {
    if (m <= kMaxMethod) ++calls_[m];
    while (mode_ == kHang) std::this_thread::sleep_for(milliseconds(5));
    if (mode_ == kStandby) {
      out->append("standby (test); the leader is elsewhere");
      return RpcStatus::kNotLeader;
    }
    return ServeMasterRpc(service_, m, d, n, out);
  }
  MasterService* const service_;
  std::atomic<Mode> mode_;
  std::atomic<int> calls_[kMaxMethod + 1] = {};
  std::unique_ptr<RpcServer> server_;
};

class LeaderStubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string err;
    etcd_ = mooncake::testing::SharedServer("etcd", &err);
    if (!etcd_) {
      if (mooncake::testing::StoreServersRequired()) FAIL() << "no etcd: " << err;
      GTEST_SKIP() << "no etcd: " << err;
    }
    auto kv = EtcdKv::Create({HostPort{"127.0.0.1", etcd_->port(), true}}, EtcdKv::Options{});
    ASSERT_TRUE(kv.ok()) << kv.status().ToString();
    kv_ = std::move(kv).value();
    // A cluster of this test's own: its key is nobody else's.
    cluster_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    key_ = MasterViewKey(cluster_);
    ASSERT_TRUE(kv_->Delete(key_).ok());
  }
  void TearDown() override {
    if (kv_ && lease_ != 0) (void)kv_->LeaseRevoke(lease_);
  }

  // A new view naming `address` (the key deleted and created again: a higher
  // create_revision), under a lease of the test's own.
  int64_t Publish(const std::string& address) {
    if (lease_ != 0) (void)kv_->LeaseRevoke(lease_);
    auto lease = kv_->LeaseGrant(30);
    EXPECT_TRUE(lease.ok()) << lease.status().ToString();
    lease_ = lease.ok() ? *lease : 0;
    EXPECT_TRUE(kv_->Put(key_, address, lease_).ok());
    auto r = kv_->Range(key_);
    EXPECT_TRUE(r.ok() && r->kvs.size() == 1);
    return r.ok() && !r->kvs.empty() ? r->kvs[0].create_revision : 0;
  }
  std::string EtcdAddr() const { return "etcd://127.0.0.1:" + std::to_string(etcd_->port()); }

  std::unique_ptr<StoreClient> Client(const std::string& addr, int* code, std::string* msg,
                                      milliseconds failover = milliseconds(3000)) {
    StoreClientOptions o;
    o.local_hostname = "127.0.0.1";
    o.global_segment_size = 16 << 20;
    o.local_buffer_size = 4 << 20;
    o.master_server_addr = addr;
    o.cluster_id = cluster_;
    o.rpc_timeout = milliseconds(1000);
    o.failover_timeout = failover;
    o.heartbeat_interval = milliseconds(200);
    return StoreClient::Create(o, code, msg);
  }
  std::unique_ptr<StoreClient> Client(const std::string& addr) {
    int code = 0;
    std::string msg;
    auto c = Client(addr, &code, &msg);
    EXPECT_NE(c, nullptr) << code << " " << msg;
    return c;
  }

  static int Put(StoreClient* c, const std::string& key, const std::string& v) {
    return c->Put(key, {{const_cast<char*>(v.data()), v.size()}}, ReplicateConfig());
  }
  static std::string Get(StoreClient* c, const std::string& key, size_t size, int64_t* rc) {
    std::string out(size, '\0');
    *rc = c->Get(key, {{out.data(), out.size()}});
    return out;
  }

  mooncake::testing::StoreServer* etcd_ = nullptr;
  std::unique_ptr<EtcdKv> kv_;
  std::string cluster_, key_;
  int64_t lease_ = 0;
  MasterService service_{MasterConfig{}};
};

TEST_F(LeaderStubTest, SetupThroughEtcdReachesTheLeaderAndFollowsANewView) {
  TestMaster a(&service_, TestMaster::kServe), b(&service_, TestMaster::kStandby);
  const int64_t v1 = Publish(a.address());
  auto c = Client(EtcdAddr());
  ASSERT_TRUE(c);
  ASSERT_EQ(Put(c.get(), "k1", "one"), 0);
  int64_t rc = 0;
  EXPECT_EQ(Get(c.get(), "k1", 3, &rc), "one");
  EXPECT_GT(a.calls(MasterMethod::kPutStart), 0);
  EXPECT_EQ(b.calls(MasterMethod::kPing) + b.calls(MasterMethod::kPutStart), 0);

  // A new view, the old master still serving: within a poll (200 ms) the calls go to b.
  b.set_mode(TestMaster::kServe);
  const int64_t v2 = Publish(b.address());
  EXPECT_GT(v2, v1);
  const auto t0 = Clock::now();
  while (b.calls(MasterMethod::kPing) == 0 && SecondsSince(t0) < 2) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_GT(b.calls(MasterMethod::kPing), 0) << "the heartbeat did not move to the new leader";
  const int a_puts = a.calls(MasterMethod::kPutStart);
  ASSERT_EQ(Put(c.get(), "k2", "two"), 0);
  EXPECT_EQ(a.calls(MasterMethod::kPutStart), a_puts);
  EXPECT_GT(b.calls(MasterMethod::kPutStart), 0);
  EXPECT_EQ(Get(c.get(), "k1", 3, &rc), "one");  // b knows what a did (one service)
}

// The old leader read the request and never answers (hung, or its host gone); the view
// changes later. A get (GetReplicaList: resent) waits for the new leader and succeeds; a put
// (PutStart, whose bytes all went out: the master may have acted) fails, and is not sent to
// the new leader.
TEST_F(LeaderStubTest, AGetWaitsForTheNewLeaderAndAPutStartThatMayHaveActedDoesNot) {
  TestMaster a(&service_, TestMaster::kServe), b(&service_, TestMaster::kStandby);
  Publish(a.address());
  auto c = Client(EtcdAddr());
  ASSERT_TRUE(c);
  ASSERT_EQ(Put(c.get(), "k", "value"), 0);

  a.set_mode(TestMaster::kHang);
  const auto t0 = Clock::now();
  auto get = std::async(std::launch::async, [&] {
    int64_t rc = 0;
    std::string v = Get(c.get(), "k", 5, &rc);
    return std::make_pair(rc, v);
  });
  std::this_thread::sleep_for(milliseconds(1500));  // past the first attempt's 1 s timeout
  b.set_mode(TestMaster::kServe);
  Publish(b.address());
  auto [rc, v] = get.get();
  EXPECT_EQ(rc, 5);
  EXPECT_EQ(v, "value");
  EXPECT_LT(SecondsSince(t0), 3.0);  // within the bound (failover_timeout 3 s)
  EXPECT_GT(b.calls(MasterMethod::kGetReplicaList), 0);

  // Now b hangs, and the view moves to a (serving again) while the put waits for b.
  b.set_mode(TestMaster::kHang);
  a.set_mode(TestMaster::kServe);
  const int a_puts = a.calls(MasterMethod::kPutStart);
  const auto t1 = Clock::now();
  auto put = std::async(std::launch::async, [&] { return Put(c.get(), "k2", "v2"); });
  std::this_thread::sleep_for(milliseconds(300));
  Publish(a.address());
  EXPECT_EQ(put.get(), ToInt(ErrorCode::RPC_FAIL));
  EXPECT_LT(SecondsSince(t1), 2.0);  // the RPC timeout, no wait for a view
  EXPECT_EQ(a.calls(MasterMethod::kPutStart), a_puts) << "a PutStart that may have acted was resent";
  b.set_mode(TestMaster::kStandby);
}

// Calls that provably did nothing are sent to the new leader whatever their method: a master
// that is gone (connection refused: nothing was sent), one that answers kNotLeader (it
// made none of the changes asked for).
TEST_F(LeaderStubTest, CallsThatDidNothingAreSentToTheNewLeader) {
  TestMaster a(&service_, TestMaster::kServe), b(&service_, TestMaster::kStandby),
      d(&service_, TestMaster::kServe);
  Publish(a.address());
  auto c = Client(EtcdAddr());
  ASSERT_TRUE(c);
  ASSERT_EQ(Put(c.get(), "k", "value"), 0);

  a.Stop();  // gone: connections refused
  const auto t0 = Clock::now();
  auto put = std::async(std::launch::async, [&] { return Put(c.get(), "k2", "v2"); });
  std::this_thread::sleep_for(milliseconds(700));
  b.set_mode(TestMaster::kServe);
  Publish(b.address());
  EXPECT_EQ(put.get(), 0);
  EXPECT_LT(SecondsSince(t0), 3.0);
  int64_t rc = 0;
  EXPECT_EQ(Get(c.get(), "k2", 2, &rc), "v2");

  b.set_mode(TestMaster::kStandby);  // b lost its lease: it says so, and the view follows
  auto put2 = std::async(std::launch::async, [&] { return Put(c.get(), "k3", "v3"); });
  std::this_thread::sleep_for(milliseconds(400));
  Publish(d.address());
  EXPECT_EQ(put2.get(), 0);
  EXPECT_GT(b.calls(MasterMethod::kPutStart), 0);
  EXPECT_GT(d.calls(MasterMethod::kPutStart), 0);
}

TEST_F(LeaderStubTest, TheHostPortOfAStandbyIsRefusedAtOnceWithWhatToDo) {
  TestMaster b(&service_, TestMaster::kStandby);
  int code = 0;
  std::string msg;
  const auto t0 = Clock::now();
  auto c = Client(b.address(), &code, &msg);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(code, kNoLeader);
  EXPECT_LT(SecondsSince(t0), 1.0);
  EXPECT_NE(msg.find("is not the leader"), std::string::npos) << msg;
  EXPECT_NE(msg.find("standby (test)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("etcd://"), std::string::npos) << msg;
}

TEST_F(LeaderStubTest, WithNoLeaderInEtcdSetupFailsWithinTheBound) {
  int code = 0;
  std::string msg;
  const auto t0 = Clock::now();
  auto c = Client(EtcdAddr(), &code, &msg, milliseconds(1500));
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(code, kNoLeader);
  EXPECT_GT(SecondsSince(t0), 1.3);  // it waited for a leader to be named
  EXPECT_LT(SecondsSince(t0), 2.5);
  EXPECT_NE(msg.find(key_), std::string::npos) << msg;
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(etcd_->port())), std::string::npos) << msg;

  // A value that names no leader yet (upstream's newer masters while they warm up) is the same.
  ASSERT_TRUE(kv_->Put(key_, "__mooncake_service_warming__:42").ok());
  c = Client(EtcdAddr(), &code, &msg, milliseconds(500));
  EXPECT_EQ(code, kNoLeader);
  EXPECT_NE(msg.find("warming"), std::string::npos) << msg;
}

TEST_F(LeaderStubTest, TheBoundHoldsWithEtcdDown) {
  // No etcd at all: setup fails within the bound, naming the endpoint.
  const uint16_t dead = mooncake::testing::RefusingPort();
  const std::string dead_addr = "127.0.0.1:" + std::to_string(dead);
  int code = 0;
  std::string msg;
  auto t0 = Clock::now();
  auto c = Client("etcd://" + dead_addr, &code, &msg, milliseconds(1500));
  EXPECT_EQ(code, kNoLeader);
  EXPECT_LT(SecondsSince(t0), 2.5);
  EXPECT_NE(msg.find(dead_addr), std::string::npos) << msg;

  // A dead endpoint first, a live one after: the live one answers.
  TestMaster a(&service_, TestMaster::kServe);
  Publish(a.address());
  c = Client("etcd://" + dead_addr + ";127.0.0.1:" + std::to_string(etcd_->port()));
  ASSERT_TRUE(c);
  ASSERT_EQ(Put(c.get(), "k", "value"), 0);
  c.reset();

  // Following a leader through an etcd of its own that then dies: calls go on while the
  // leader lives; once it is gone too, a call fails within the bound.
  std::string err;
  auto own = mooncake::testing::StoreServer::Start("etcd", "", &err);
  ASSERT_TRUE(own) << err;
  auto kv = EtcdKv::Create({HostPort{"127.0.0.1", own->port(), true}}, EtcdKv::Options{});
  ASSERT_TRUE(kv.ok());
  ASSERT_TRUE((*kv)->Put(key_, a.address()).ok());
  c = Client("etcd://127.0.0.1:" + std::to_string(own->port()), &code, &msg, milliseconds(2000));
  ASSERT_TRUE(c) << code << " " << msg;
  ASSERT_EQ(Put(c.get(), "k", "value"), 0);  // (the first client's went with its segment)
  own->Kill();
  int64_t rc = 0;
  EXPECT_EQ(Get(c.get(), "k", 5, &rc), "value");
  a.Stop();
  t0 = Clock::now();
  Get(c.get(), "k", 5, &rc);
  EXPECT_EQ(rc, ToInt(ErrorCode::RPC_FAIL));
  EXPECT_GT(SecondsSince(t0), 1.8);  // it waited for a new leader...
  EXPECT_LT(SecondsSince(t0), 2.6);  // ...for failover_timeout (2 s), no longer
}

// A new leader that does not know this client (here: a master of another service, which
// never saw it) answers the heartbeat so; the client remounts its segment there.
TEST_F(LeaderStubTest, TheHeartbeatRemountsOnANewLeaderThatDoesNotKnowTheClient) {
  MasterConfig quick;
  quick.default_kv_lease_ttl_ms = 100;  // a remounted segment takes objects after one TTL
  MasterService fresh(quick);
  TestMaster a(&service_, TestMaster::kServe), b(&fresh, TestMaster::kServe);
  Publish(a.address());
  auto c = Client(EtcdAddr());
  ASSERT_TRUE(c);
  size_t total = 0;
  EXPECT_TRUE(fresh.ListSegments(10, &total).empty());
  Publish(b.address());
  const auto t0 = Clock::now();
  while (fresh.ListSegments(10, &total).empty() && SecondsSince(t0) < 3) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_EQ(fresh.ListSegments(10, &total).size(), 1u) << "no remount on the new leader";
  EXPECT_GT(b.calls(MasterMethod::kMountSegment), 0);
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(Put(c.get(), "after", "x"), 0);
  int64_t rc = 0;
  EXPECT_EQ(Get(c.get(), "after", 1, &rc), "x");
}

// Without etcd: the address forms.
TEST(LeaderStubAddress, OtherSchemesAndBadClustersAreRefusedAsParameters) {
  for (const std::string addr : {"redis://127.0.0.1:6379", "k8s://ns/lease", "zk://h:2181"}) {
    auto m = MakeMasterStub(addr, "c", milliseconds(100), milliseconds(100));
    ASSERT_FALSE(m.ok()) << addr;
    EXPECT_TRUE(m.status().IsInvalidArgument()) << m.status().ToString();
    EXPECT_NE(m.status().message().find("etcd only"), std::string::npos) << m.status().ToString();
  }
  EXPECT_TRUE(MakeMasterStub("etcd://", "c", milliseconds(100), milliseconds(100))
                  .status()
                  .IsInvalidArgument());
  for (const std::string& bad : std::vector<std::string>{"", "a/b", "a b", std::string(129, 'x')}) {
    auto m = MakeMasterStub("etcd://127.0.0.1:1", bad, milliseconds(100), milliseconds(100));
    EXPECT_TRUE(m.status().IsInvalidArgument()) << "'" << bad << "': " << m.status().ToString();
  }
  EXPECT_TRUE(CheckStoreClusterId("mooncake_cluster").ok());
  EXPECT_TRUE(CheckStoreClusterId(std::string(128, 'x')).ok());
  EXPECT_TRUE(CheckStoreClusterId("A-z.0_9").ok());
  // host:port is the RPC stub, as before (no connection until a call).
  auto plain = MakeMasterStub("127.0.0.1:50051", "c", milliseconds(100), milliseconds(100));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->address(), "127.0.0.1:50051");

  StoreClientOptions o;
  o.local_hostname = "127.0.0.1";
  o.master_server_addr = "redis://127.0.0.1:6379";
  int code = 0;
  std::string msg;
  EXPECT_EQ(StoreClient::Create(o, &code, &msg), nullptr);
  EXPECT_EQ(code, ToInt(ErrorCode::INVALID_PARAMS));
  EXPECT_NE(msg.find("etcd only"), std::string::npos) << msg;
}

TEST(LeaderStubAddress, RpcClientTellsANotLeaderAnswerApart) {
  RpcServer server(RpcServer::Options{}, [](uint16_t, const char*, size_t, std::string* out) {
    out->append("standby; the leader is 10.0.0.9:50051");
    return RpcStatus::kNotLeader;
  });
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  RpcClient client("127.0.0.1:" + std::to_string(server.port()));
  rpc::PingRequest q;
  rpc::PingResponse r;
  Status s = client.Call(MasterMethod::kPing, q, &r, milliseconds(1000));
  EXPECT_TRUE(s.IsFailedPrecondition()) << s.ToString();
  EXPECT_TRUE(IsNotLeader(s));
  EXPECT_NE(s.message().find("the master at 127.0.0.1:" + std::to_string(server.port()) +
                             " is not the leader: standby; the leader is 10.0.0.9:50051"),
            std::string::npos)
      << s.message();
  EXPECT_FALSE(IsNotLeader(Status::FailedPrecondition("something else")));
  EXPECT_FALSE(IsNotLeader(Status::Unavailable("x is not the leader: y")));
}

}  // namespace
}  // namespace store
}  // namespace mooncake
