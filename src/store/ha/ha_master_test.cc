// HaMaster (ha_master.h) against a real etcd (tests/stores/store_server.h), two or three
// masters in this process, each with its own RpcServer, one cluster id per test; clients are
// real StoreClients following master_view (etcd://). And the log's codec, which needs no
// server.
#include "store/ha/ha_master.h"
#include "store/tenants/tenant_policy.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "metadata/stores/etcd_kv.h"
#include "mooncake/store/error_code.h"
#include "mooncake/store/store_client.h"
#include "store/ha/checkpoint.h"
#include "store/ha/master_view.h"
#include "store/ha/oplog_codec.h"
#include "store/ha/oplog_writer.h"
#include "store/master/master_rpc.h"
#include "store/rpc/rpc_client.h"
#include "store_server.h"  // tests/stores: the throwaway etcd

namespace mooncake {
namespace store {
namespace ha {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(OplogCodec, KeysSortAndParseAndBadValuesAreDataLoss) {
  EXPECT_EQ(OplogKey("c", 7), "mooncake-store/c/oplog/00000000000000000007");
  EXPECT_LT(OplogKey("c", 9), OplogKey("c", 10));
  EXPECT_EQ(*ParseOplogKey("c", OplogKey("c", 123456789)), 123456789u);
  EXPECT_FALSE(ParseOplogKey("c", "mooncake-store/c/oplog/12").ok());
  EXPECT_FALSE(ParseOplogKey("c", OplogKey("d", 1)).ok());
  EXPECT_FALSE(ParseOplogKey("c", OplogKey("c", 0)).ok());
  oplog::Batch b;
  b.set_batch_id(3);
  b.set_first_seq(10);
  b.add_entries()->set_key("k");
  b.mutable_entries(0)->set_kind(oplog::Entry::ERASE);
  const std::string v = EncodeBatch(b);
  auto back = DecodeBatch(v, 3);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->entries(0).key(), "k");
  EXPECT_EQ(DecodeBatch(v, 4).status().code(), Status::Code::kDataLoss);  // another key's
  for (size_t i = 0; i < v.size(); ++i) {  // every flipped byte is caught
    std::string bad = v;
    bad[i] ^= 0x20;
    EXPECT_EQ(DecodeBatch(bad, 3).status().code(), Status::Code::kDataLoss) << "byte " << i;
  }
  EXPECT_EQ(DecodeBatch("", 3).status().code(), Status::Code::kDataLoss);
  b.set_batch_id(0);  // ids start at 1: a batch 0 is no batch of ours (found by fuzz_oplog_apply)
  EXPECT_EQ(DecodeBatch(EncodeBatch(b), 0).status().code(), Status::Code::kDataLoss);
}

// One master: its HaMaster and RpcServer.
struct Node {
  std::unique_ptr<HaMaster> ha;
  std::unique_ptr<RpcServer> server;
  std::string address;
  void Stop() {
    if (ha) ha->Stop();
    if (server) server->Stop();
  }
  ~Node() { Stop(); }
};

class HaMasterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string err;
    etcd_ = mooncake::testing::SharedServer("etcd", &err);
    if (!etcd_) {
      if (mooncake::testing::StoreServersRequired()) FAIL() << "no etcd: " << err;
      GTEST_SKIP() << "no etcd: " << err;
    }
    auto kv = EtcdKv::Create({Etcd()}, EtcdKv::Options{});
    ASSERT_TRUE(kv.ok());
    kv_ = std::move(kv).value();
    cluster_ = std::string("ha_") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_TRUE(kv_->Delete(ClusterPrefix(cluster_), EtcdPrefixEnd(ClusterPrefix(cluster_))).ok());
  }
  HostPort Etcd() const { return HostPort{"127.0.0.1", etcd_->port(), true}; }

  std::unique_ptr<Node> Start(bool oplog = true, uint64_t checkpoint_entries = 100000,
                              const std::function<void(HaMaster::Options*)>& tweak = nullptr) {
    auto n = std::make_unique<Node>();
    // The port first (the address is published), then the HaMaster, then serving.
    RpcServer::Options ro;
    ro.slow = &IsSlowMasterMethod;
    Node* raw = n.get();
    ro.hold_position = [raw](uint16_t m, RpcStatus s) { return raw->ha->HoldPosition(m, s); };
    n->server = std::make_unique<RpcServer>(
        ro, [raw](uint16_t m, const char* d, size_t len, std::string* out) {
          if (!raw->ha) {
            out->append("starting");
            return RpcStatus::kNotLeader;
          }
          return raw->ha->Serve(m, d, len, out);
        });
    EXPECT_TRUE(n->server->Start("127.0.0.1", 0).ok());
    n->address = "127.0.0.1:" + std::to_string(n->server->port());
    HaMaster::Options o;
    o.endpoints = {Etcd()};
    o.cluster_id = cluster_;
    o.advertise_address = n->address;
    o.oplog = oplog;
    o.lease_ttl_sec = 2;
    o.poll_interval_ms = 100;
    o.config.default_kv_lease_ttl_ms = 200;
    o.checkpoint_entries = checkpoint_entries;
    if (tweak) tweak(&o);
    auto ha = HaMaster::Create(o);
    EXPECT_TRUE(ha.ok()) << ha.status().ToString();
    n->ha = std::move(ha).value();
    n->ha->Start(n->server.get());
    return n;
  }

  // Waits until exactly one of `nodes` serves; its index, or -1.
  static int WaitLeader(const std::vector<Node*>& nodes, double seconds = 8) {
    const auto t0 = Clock::now();
    while (SecondsSince(t0) < seconds) {
      int serving = -1, count = 0;
      for (size_t i = 0; i < nodes.size(); ++i) {
        if (nodes[i]->ha->View().service_ready) {
          serving = static_cast<int>(i);
          ++count;
        }
      }
      if (count == 1) return serving;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return -1;
  }

  std::unique_ptr<StoreClient> Client() {
    StoreClientOptions o;
    o.local_hostname = "127.0.0.1";
    o.global_segment_size = 32 << 20;
    o.local_buffer_size = 8 << 20;
    o.master_server_addr = "etcd://127.0.0.1:" + std::to_string(etcd_->port());
    o.cluster_id = cluster_;
    o.rpc_timeout = milliseconds(2000);
    o.failover_timeout = milliseconds(8000);
    o.heartbeat_interval = milliseconds(200);
    int code = 0;
    std::string msg;
    auto c = StoreClient::Create(o, &code, &msg);
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
  std::string cluster_;
};

TEST_F(HaMasterTest, OneOfThreeServesAndTheOthersNameIt) {
  auto a = Start(), b = Start(), c = Start();
  const int l = WaitLeader({a.get(), b.get(), c.get()});
  ASSERT_GE(l, 0) << "no single leader";
  Node* nodes[] = {a.get(), b.get(), c.get()};
  Node* leader = nodes[l];
  auto view = kv_->Range(MasterViewKey(cluster_));
  ASSERT_TRUE(view.ok() && view->kvs.size() == 1);
  EXPECT_EQ(view->kvs[0].value, leader->address);
  for (Node* n : nodes) {
    const HaView v = n->ha->View();
    EXPECT_EQ(v.role, n == leader ? "leader" : "standby");
    EXPECT_EQ(v.ha_state, n == leader ? "serving" : "standby");
    if (n == leader) continue;
    // Dialled directly, a standby refuses with kNotLeader, naming the leader (after its next
    // poll of master_view).
    std::this_thread::sleep_for(milliseconds(300));
    RpcClient rc(n->address);
    rpc::PingRequest req;
    req.set_client_id("direct");
    rpc::PingResponse resp;
    Status s = rc.Call(MasterMethod::kPing, req, &resp, milliseconds(1000));
    EXPECT_TRUE(IsNotLeader(s)) << s.ToString();
    EXPECT_NE(s.message().find("the leader is " + leader->address), std::string::npos)
        << s.message();
  }
}

// A client given a standby's host:port (not etcd://) fails at setup, at once, with -1010
// and a message naming the leader: not a hang.
TEST_F(HaMasterTest, AClientGivenAStandbysAddressGetsAClearErrorAtOnce) {
  auto a = Start(), b = Start();
  const int l = WaitLeader({a.get(), b.get()});
  ASSERT_GE(l, 0);
  Node* standby = l == 0 ? b.get() : a.get();
  Node* leader = l == 0 ? a.get() : b.get();
  std::this_thread::sleep_for(milliseconds(300));  // the standby has read master_view
  StoreClientOptions o;
  o.local_hostname = "127.0.0.1";
  o.global_segment_size = 16 << 20;
  o.local_buffer_size = 4 << 20;
  o.master_server_addr = standby->address;
  o.rpc_timeout = milliseconds(2000);
  int code = 0;
  std::string msg;
  const auto t0 = Clock::now();
  auto c = StoreClient::Create(o, &code, &msg);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(code, ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS)) << msg;
  EXPECT_NE(msg.find(leader->address), std::string::npos) << msg;
  EXPECT_LT(SecondsSince(t0), 1.5);
}

// --oplog_ack_before_durable: replies do not wait for etcd, but at most 8 batches of
// entries stay undurable: a client faster than the writer is held back (before, the writer
// fell behind for good: its queue grew, no checkpoint could be written, etcd grew).
TEST_F(HaMasterTest, AckBeforeDurableKeepsTheUndurableWindowBounded) {
  auto a = Start(true, 100000, [](HaMaster::Options* o) {
    o->ack_before_durable = true;
    o->batch_max_entries = 1;  // one entry per etcd transaction: the writer is slow
  });
  ASSERT_EQ(WaitLeader({a.get()}), 0);
  auto c = Client();
  ASSERT_NE(c, nullptr);
  uint64_t worst = 0;
  for (int i = 0; i < 120; ++i) {
    ASSERT_EQ(Put(c.get(), "w" + std::to_string(i), std::string(100, 'w')), 0) << i;
    worst = std::max(worst, a->ha->View().pending_entries);
  }
  EXPECT_LE(worst, 8u + 2u) << "entries acknowledged and not durable";
  const auto t0 = Clock::now();
  while (a->ha->View().pending_entries > 0 && SecondsSince(t0) < 10) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(a->ha->View().pending_entries, 0u);
}

// Every acknowledged put is on the next leader: the old one stops (its lease revoked), a
// standby that applied the log promotes, the client follows, and every object reads back.
TEST_F(HaMasterTest, AcknowledgedPutsSurviveAFailover) {
  auto a = Start(), b = Start();
  int l = WaitLeader({a.get(), b.get()});
  ASSERT_GE(l, 0);
  Node* leader = l == 0 ? a.get() : b.get();
  Node* other = l == 0 ? b.get() : a.get();
  auto client = Client();
  ASSERT_TRUE(client);
  const int kObjects = 200;
  for (int i = 0; i < kObjects; ++i) {
    ASSERT_EQ(Put(client.get(), "k" + std::to_string(i), "value-" + std::to_string(i)), 0) << i;
  }
  const HaView before = leader->ha->View();
  EXPECT_GT(before.durable_seq, 2u * kObjects);
  EXPECT_EQ(before.pending_entries, 0u);
  const auto t0 = Clock::now();
  leader->Stop();
  ASSERT_EQ(WaitLeader({other}), 0) << "the standby did not take over";
  const double took = SecondsSince(t0);
  std::printf("[ha] failover after a clean stop: %.2f s\n", took);
  for (int i = 0; i < kObjects; ++i) {
    const std::string want = "value-" + std::to_string(i);
    int64_t rc = 0;
    EXPECT_EQ(Get(client.get(), "k" + std::to_string(i), want.size(), &rc), want) << i;
    EXPECT_EQ(rc, static_cast<int64_t>(want.size())) << i;
  }
  // And the new leader takes new puts, logged from where the old log ended.
  ASSERT_EQ(Put(client.get(), "after", "x"), 0);
  EXPECT_GT(other->ha->View().durable_seq, before.durable_seq);
  EXPECT_EQ(other->ha->View().promotions, 1u);
}

// A writer of an older view is fenced: its batch is refused, and it says why.
TEST_F(HaMasterTest, AWriterOfAnOlderViewIsFenced) {
  auto a = Start();
  ASSERT_EQ(WaitLeader({a.get()}), 0);
  const int64_t version = a->ha->View().view_version;
  ASSERT_GT(version, 0);
  std::string why;
  std::atomic<bool> failed{false};
  OplogWriter::Options wo;
  wo.cluster_id = cluster_;
  wo.view_version = version - 1;  // not the current view
  wo.next_batch_id = 1000000;
  wo.next_seq = 1;
  OplogWriter w(kv_.get(), wo, nullptr, [&](const std::string& w) {
    why = w;
    failed = true;
  });
  oplog::Entry e;
  e.set_kind(oplog::Entry::ERASE);
  e.set_key("k");
  w.Append(std::move(e));
  const auto t0 = Clock::now();
  while (!failed && SecondsSince(t0) < 5) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(failed);
  EXPECT_NE(why.find("another master leads"), std::string::npos) << why;
  EXPECT_EQ(w.durable(), 0u);
  auto r = kv_->Range(OplogKey(cluster_, 1000000));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->kvs.empty()) << "a fenced batch was written";
}

// A corrupted batch stops a standby from applying (and from ever leading on that log).
TEST_F(HaMasterTest, ACorruptBatchKeepsAStandbyFromServing) {
  auto a = Start();
  ASSERT_EQ(WaitLeader({a.get()}), 0);
  auto client = Client();
  ASSERT_TRUE(client);
  ASSERT_EQ(Put(client.get(), "k", "v"), 0);
  client.reset();  // unmounts while a leader serves
  a->Stop();
  auto r = kv_->Range(OplogKey(cluster_, 1));
  ASSERT_TRUE(r.ok() && r->kvs.size() == 1);
  std::string bad = r->kvs[0].value;
  bad[bad.size() / 2] ^= 1;
  ASSERT_TRUE(kv_->Put(OplogKey(cluster_, 1), bad).ok());
  auto b = Start();
  std::this_thread::sleep_for(milliseconds(1500));
  const HaView v = b->ha->View();
  EXPECT_FALSE(v.service_ready);
  EXPECT_NE(v.ha_state, "serving");
}

// The leader checkpoints every 100 entries and deletes the log before; a standby started
// after that loads the checkpoint and the log's tail, and serves every object once promoted.
TEST_F(HaMasterTest, CheckpointsCompactTheLogAndALateStandbyStartsFromOne) {
  auto a = Start(true, 100);
  ASSERT_EQ(WaitLeader({a.get()}), 0);
  auto client = Client();
  ASSERT_TRUE(client);
  const int kObjects = 300;  // about 600 entries: several checkpoints
  for (int i = 0; i < kObjects; ++i) {
    ASSERT_EQ(Put(client.get(), "k" + std::to_string(i), "v" + std::to_string(i)), 0) << i;
  }
  const auto t0 = Clock::now();
  while (a->ha->View().checkpoint_seq <= 400 && SecondsSince(t0) < 5) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  const HaView v = a->ha->View();
  EXPECT_GT(v.checkpoint_seq, 400u) << "durable " << v.durable_seq;
  auto manifest = kv_->Range(ManifestKey(cluster_));
  ASSERT_TRUE(manifest.ok() && manifest->kvs.size() == 1);
  auto m = DecodeManifest(manifest->kvs[0].value);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->seq, v.checkpoint_seq);
  auto log = kv_->Range(OplogPrefix(cluster_), EtcdPrefixEnd(OplogPrefix(cluster_)), 0, true);
  ASSERT_TRUE(log.ok());
  EXPECT_LT(log->count, static_cast<int64_t>(v.durable_batches)) << "nothing was deleted";
  auto first = log->kvs.empty() ? Result<uint64_t>(Status::NotFound("none"))
                                : ParseOplogKey(cluster_, log->kvs[0].key);
  EXPECT_TRUE(log->kvs.empty() || *first > m->last_batch);
  auto chunks = kv_->Range(CheckpointPrefix(cluster_) + "0",
                           CheckpointPrefix(cluster_) + "a", 0, true);
  ASSERT_TRUE(chunks.ok());
  EXPECT_EQ(static_cast<uint64_t>(chunks->count), m->chunks) << "older chunks were kept";

  auto b = Start(true, 100);  // after the compaction: it needs the checkpoint
  const auto t1 = Clock::now();
  while (b->ha->View().applied_seq < a->ha->View().durable_seq && SecondsSince(t1) < 5) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(b->ha->View().applied_seq, a->ha->View().durable_seq);
  EXPECT_EQ(b->ha->View().checkpoint_seq, m->seq);
  a->Stop();
  ASSERT_EQ(WaitLeader({b.get()}), 0);
  for (int i = 0; i < kObjects; ++i) {
    const std::string want = "v" + std::to_string(i);
    int64_t rc = 0;
    EXPECT_EQ(Get(client.get(), "k" + std::to_string(i), want.size(), &rc), want) << i;
  }
  ASSERT_EQ(Put(client.get(), "after", "x"), 0);
  client.reset();  // unmounts while b serves
}

// Without the oplog the masters still elect one leader, which starts empty.
TEST_F(HaMasterTest, WithoutTheOplogANewLeaderStartsEmpty) {
  auto a = Start(false), b = Start(false);
  const int l = WaitLeader({a.get(), b.get()});
  ASSERT_GE(l, 0);
  auto client = Client();
  ASSERT_TRUE(client);
  ASSERT_EQ(Put(client.get(), "k", "v"), 0);
  auto r = kv_->Range(OplogPrefix(cluster_), EtcdPrefixEnd(OplogPrefix(cluster_)));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kvs.size(), 0u) << "no oplog was asked for";
}

// KV events come from the leader only: a standby applying the log reports nothing, and a
// promoted one reports the changes it makes, not the ones it took over.
TEST_F(HaMasterTest, OnlyTheLeaderReportsObjectEvents) {
  struct Recorder : ObjectEventSink {
    void ObjectStored(const std::string& key) override { Add("stored:" + key); }
    void ObjectRemoved(const std::string& key) override { Add("removed:" + key); }
    void Add(std::string e) {
      std::lock_guard<std::mutex> l(mu);
      events.push_back(std::move(e));
    }
    std::vector<std::string> Take() {
      std::lock_guard<std::mutex> l(mu);
      return std::exchange(events, {});
    }
    std::mutex mu;
    std::vector<std::string> events;
  } ra, rb;
  auto a = Start(true, 100000, [&](HaMaster::Options* o) { o->events = &ra; });
  auto b = Start(true, 100000, [&](HaMaster::Options* o) { o->events = &rb; });
  const int l = WaitLeader({a.get(), b.get()});
  ASSERT_GE(l, 0);
  Node* leader = l == 0 ? a.get() : b.get();
  Node* other = l == 0 ? b.get() : a.get();
  Recorder& lr = l == 0 ? ra : rb;
  Recorder& orr = l == 0 ? rb : ra;
  auto client = Client();
  ASSERT_TRUE(client);
  ASSERT_EQ(Put(client.get(), "k1", "v1"), 0);
  ASSERT_EQ(Put(client.get(), "k2", "v2"), 0);
  EXPECT_EQ(lr.Take(), (std::vector<std::string>{"stored:k1", "stored:k2"}));
  const auto t0 = Clock::now();
  while (other->ha->View().applied_seq < leader->ha->View().durable_seq && SecondsSince(t0) < 5) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(orr.Take().empty()) << "a standby applying the log reported events";
  leader->Stop();
  ASSERT_EQ(WaitLeader({other}), 0);
  ASSERT_EQ(Put(client.get(), "k3", "v3"), 0);
  EXPECT_EQ(orr.Take(), (std::vector<std::string>{"stored:k3"}));
  EXPECT_TRUE(lr.Take().empty()) << "a stepped-down master reported events";
}

// A new leader loads what is not in the log (the tenant quota policy) before it serves; one
// that cannot steps down and serves only once it can.
TEST_F(HaMasterTest, ALeaderServesOnlyOnceItsPolicyIsLoaded) {
  std::atomic<int> calls{0};
  auto a = Start(true, 100000, [&](HaMaster::Options* o) {
    o->config.enable_multi_tenants = true;
    o->before_serving = [&](MasterService* m) {
      if (calls.fetch_add(1) == 0) return Status::Unavailable("the policy store is down");
      m->SetTenantPolicies({{"team-a", 1 << 20}});
      return Status::OK();
    };
  });
  ASSERT_EQ(WaitLeader({a.get()}, 15), 0);
  EXPECT_GE(calls.load(), 2);
  const auto snaps = a->ha->master()->TenantSnapshots();
  ASSERT_EQ(snaps.size(), 1u);
  EXPECT_EQ(snaps[0].tenant_id, "team-a");
}

// The etcd connector of the tenant quota policy (tenants/tenant_policy.h), on a real etcd: no
// key is the empty policy, a save is the whole YAML under the cluster's key, a value that is
// not a policy is an error naming the key.
TEST_F(HaMasterTest, TheTenantPolicyLivesInEtcd) {
  auto source = MakeTenantPolicySource("etcd", "127.0.0.1:" + std::to_string(etcd_->port()),
                                       cluster_);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  auto empty = (*source)->Load();
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->empty());
  ASSERT_TRUE((*source)->Save({{"team-a", 1 << 30}, {"team-b", 5}}).ok());
  auto loaded = (*source)->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(*loaded, (TenantPolicies{{"team-a", 1 << 30}, {"team-b", 5}}));
  const std::string key = "mooncake-store/" + cluster_ + "/tenant_quota_policy";
  auto raw = kv_->Range(key);
  ASSERT_TRUE(raw.ok());
  ASSERT_EQ(raw->kvs.size(), 1u);
  EXPECT_NE(raw->kvs[0].value.find("version: 1"), std::string::npos);
  ASSERT_TRUE(kv_->Put(key, "tenants: {").ok());
  auto bad = (*source)->Load();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(key), std::string::npos);
  auto down = MakeTenantPolicySource("etcd", "127.0.0.1:1", cluster_);
  ASSERT_TRUE(down.ok());
  EXPECT_FALSE((*down)->Load().ok());
}

}  // namespace
}  // namespace ha
}  // namespace store
}  // namespace mooncake
