// Strict multi-tenant mode, through the RPC layer as a client reaches it (ServeMasterRpc:
// the keys scoped there), and the admin API (MasterHttp). An attacker's view: a tenant that
// names another tenant's keys every way the calls allow sees, reads, removes and evicts none
// of them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "store/master/master_http.h"
#include "store/master/master_rpc.h"
#include "store/master/master_service.h"
#include "store/tenants/tenant_id.h"

namespace mooncake {
namespace store {
namespace {

constexpr int32_t kOk = 0;
int32_t C(ErrorCode c) { return ToInt(c); }

// A strict-mode standby given `master`'s export and promoted: it rebuilds the charges from
// every object and upsert.
std::unique_ptr<MasterService> PromotedCopy(MasterService* master) {
  MasterConfig config;
  config.enable_multi_tenants = true;
  config.standby = true;
  auto standby = std::make_unique<MasterService>(config);
  master->ExportState([&](oplog::Entry&& e) { EXPECT_TRUE(standby->Apply(e).ok()); });
  EXPECT_TRUE(standby->Promote().ok());
  return standby;
}

class TenantsTest : public ::testing::Test {
 protected:
  void Make(bool strict, const TenantPolicies& policies = {{"a", 1 << 20}, {"b", 1 << 20}}) {
    MasterConfig config;
    config.enable_multi_tenants = strict;
    master_ = std::make_unique<MasterService>(config);
    master_->SetTenantPolicies(policies);
    rpc::MountSegmentRequest m;
    m.set_client_id("holder");
    m.set_segment_name("seg");
    m.set_base(1 << 30);
    m.set_size(4 << 20);
    ASSERT_EQ(master_->MountSegment(m).code(), kOk);
  }

  template <class Resp, class Req>
  Resp Call(MasterMethod method, const Req& req) {
    std::string in, out;
    req.SerializeToString(&in);
    EXPECT_EQ(ServeMasterRpc(master_.get(), static_cast<uint16_t>(method), in.data(), in.size(),
                             &out),
              RpcStatus::kOk);
    Resp r;
    EXPECT_TRUE(r.ParseFromString(out));
    return r;
  }
  rpc::KeysRequest Keys(const std::string& tenant, std::vector<std::string> keys) {
    rpc::KeysRequest r;
    r.set_client_id("client-" + tenant);
    r.set_tenant_id(tenant);
    for (auto& k : keys) r.add_keys(k);
    return r;
  }
  int32_t Put(const std::string& tenant, const std::string& key, uint64_t size,
              bool end = true, bool upsert = false) {
    rpc::PutStartRequest r;
    r.set_client_id("client-" + tenant);
    r.set_tenant_id(tenant);
    r.set_upsert(upsert);
    auto* item = r.add_items();
    item->set_key(key);
    item->set_size(size);
    auto resp = Call<rpc::PutStartResponse>(MasterMethod::kPutStart, r);
    if (resp.code() != kOk) return resp.code();
    if (resp.results(0).code() != kOk || !end) return resp.results(0).code();
    return Call<rpc::CodesResponse>(MasterMethod::kPutEnd, Keys(tenant, {key})).codes(0);
  }
  int32_t Get(const std::string& tenant, const std::string& key) {
    auto r = Call<rpc::GetReplicaListResponse>(MasterMethod::kGetReplicaList, Keys(tenant, {key}));
    return r.code() != kOk ? r.code() : r.results(0).code();
  }
  int32_t Exist(const std::string& tenant, const std::string& key) {
    auto r = Call<rpc::ExistResponse>(MasterMethod::kExistKey, Keys(tenant, {key}));
    return r.code() != kOk ? r.code() : r.results(0).code();
  }
  uint64_t Charged(const std::string& tenant) {
    TenantSnapshot s;
    return master_->TenantSnapshotOf(tenant, &s) == ErrorCode::OK ? s.charged_bytes : 0;
  }
  uint64_t Allocated() { return master_->GetStats().allocated(); }

  std::unique_ptr<MasterService> master_;
};

TEST_F(TenantsTest, TheSameKeyInTwoTenantsIsTwoObjects) {
  Make(true);
  ASSERT_EQ(Put("a", "k", 100), kOk);
  EXPECT_EQ(Get("b", "k"), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Exist("b", "k"), C(ErrorCode::OBJECT_NOT_FOUND));
  ASSERT_EQ(Put("b", "k", 200), kOk);  // not OBJECT_ALREADY_EXISTS
  auto a = Call<rpc::GetReplicaListResponse>(MasterMethod::kGetReplicaList, Keys("a", {"k"}));
  auto b = Call<rpc::GetReplicaListResponse>(MasterMethod::kGetReplicaList, Keys("b", {"k"}));
  EXPECT_EQ(a.results(0).size(), 100u);
  EXPECT_EQ(b.results(0).size(), 200u);
  EXPECT_NE(a.results(0).replicas(0).buffer().addr(), b.results(0).replicas(0).buffer().addr());
  EXPECT_EQ(Charged("a"), 100u);
  EXPECT_EQ(Charged("b"), 200u);
}

TEST_F(TenantsTest, NoCallOfOneTenantReachesAnothersObjects) {
  Make(true, {{"a", 1 << 20}, {"b", 1 << 20}, {"default", 1 << 20}});
  ASSERT_EQ(Put("a", "victim", 100), kOk);
  ASSERT_EQ(Put("a", "victim2", 100), kOk);
  // Forged spellings of a's stored key, from b and from the default tenant.
  const std::vector<std::string> forged = {std::string("a\0victim", 8), "victim",
                                           std::string("\0victim", 7)};
  for (const std::string t : {"b", "default", ""}) {
    for (const std::string& k : forged) {
      EXPECT_EQ(Get(t, k), C(ErrorCode::OBJECT_NOT_FOUND)) << t;
      EXPECT_EQ(Exist(t, k), C(ErrorCode::OBJECT_NOT_FOUND)) << t;
      auto rm = Call<rpc::CodesResponse>(MasterMethod::kRemove, Keys(t, {k}));
      EXPECT_EQ(rm.codes(0), C(ErrorCode::OBJECT_NOT_FOUND)) << t;
    }
    // Mixed batches: the sender's own key and a's, forced.
    ASSERT_EQ(Put(t, "own", 10), kOk) << t;
    auto rk = Keys(t, {"own", "victim", forged[0]});
    rk.set_force(true);
    auto rm = Call<rpc::CodesResponse>(MasterMethod::kRemove, rk);
    EXPECT_EQ(rm.codes(0), kOk);
    EXPECT_EQ(rm.codes(1), C(ErrorCode::OBJECT_NOT_FOUND));
    EXPECT_EQ(rm.codes(2), C(ErrorCode::OBJECT_NOT_FOUND));
    // Regex removes and remove-all take the sender's objects only, matched as it named them.
    ASSERT_EQ(Put(t, "own", 10), kOk);
    for (const char* re : {".*", "victim", "^a", "a\\x00victim", "\\x00"}) {
      rpc::RemoveByRegexRequest r;
      r.set_client_id("x");
      r.set_tenant_id(t);
      r.set_regex(re);
      r.set_force(true);
      const auto count = Call<rpc::CountResponse>(MasterMethod::kRemoveByRegex, r).count();
      EXPECT_EQ(count, std::string(re) == ".*" ? 1 : 0) << t << " " << re;
    }
    auto all = Keys(t, {});
    all.set_force(true);
    EXPECT_EQ(Call<rpc::CountResponse>(MasterMethod::kRemoveAll, all).count(), 0) << t;
    // Replica clear of a's keys (by the client id that wrote them, too).
    rpc::ReplicaClearRequest rc;
    rc.set_client_id("client-a");
    rc.set_tenant_id(t);
    rc.add_keys("victim");
    rc.add_keys(forged[0]);
    EXPECT_EQ(Call<rpc::ReplicaClearResponse>(MasterMethod::kReplicaClear, rc).cleared_keys_size(), 0);
    // Putting over a's key is a new object of the sender's, never a's.
    ASSERT_EQ(Put(t, "victim", 50, true, /*upsert=*/true), kOk);
    auto all2 = Keys(t, {});
    all2.set_force(true);
    EXPECT_EQ(Call<rpc::CountResponse>(MasterMethod::kRemoveAll, all2).count(), 1) << t;
  }
  EXPECT_EQ(Get("a", "victim"), kOk);
  EXPECT_EQ(Get("a", "victim2"), kOk);
  EXPECT_EQ(Charged("a"), 200u);
  // The admin views: each tenant's keys as it named them.
  size_t total = 0;
  auto keys = master_->ListKeys(100, 1 << 20, &total, "a");
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"victim", "victim2"}));
  EXPECT_TRUE(master_->ListKeys(100, 1 << 20, &total, "b").empty());
  std::vector<MasterService::ReplicaView> replicas;
  EXPECT_EQ(master_->QueryKey("victim", &replicas, "a"), ErrorCode::OK);
  EXPECT_EQ(master_->QueryKey("victim", &replicas, "b"), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(master_->QueryKey("victim", &replicas), ErrorCode::OBJECT_NOT_FOUND);
}

TEST_F(TenantsTest, AReplicaClearReplyNamesTheKeysAsSent) {
  Make(true);
  ASSERT_EQ(Put("a", "k", 100), kOk);
  rpc::ReplicaClearRequest rc;
  rc.set_client_id("client-a");
  rc.set_tenant_id("a");
  rc.add_keys("k");
  // A fresh write counts as leased for one lease TTL: nothing cleared yet, and nothing
  // else in the reply.
  auto r = Call<rpc::ReplicaClearResponse>(MasterMethod::kReplicaClear, rc);
  for (const auto& k : r.cleared_keys()) EXPECT_EQ(k, "k");
}

TEST_F(TenantsTest, OnlyRegisteredTenantsWriteAndBadTenantIdsAreRefused) {
  Make(true);
  EXPECT_EQ(Put("c", "k", 10), C(ErrorCode::TENANT_NOT_REGISTERED));
  EXPECT_EQ(Put("default", "k", 10), C(ErrorCode::TENANT_NOT_REGISTERED));
  EXPECT_EQ(Put("", "k", 10), C(ErrorCode::TENANT_NOT_REGISTERED));  // "" is "default"
  EXPECT_EQ(Put("_admin", "k", 10), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(Put(std::string("a\nb"), "k", 10), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(Put(std::string(kMaxTenantIdBytes + 1, 't'), "k", 10), C(ErrorCode::INVALID_PARAMS));
  EXPECT_EQ(Get("_admin", "k"), C(ErrorCode::INVALID_PARAMS));
  // Reads of an unregistered tenant find nothing (no error beyond that).
  EXPECT_EQ(Get("c", "k"), C(ErrorCode::OBJECT_NOT_FOUND));
  // A key's bound is the tenant's key, the prefix on top.
  const std::string longest(kMaxKeyBytes, 'k');
  EXPECT_EQ(Put("a", longest, 10), kOk);
  EXPECT_EQ(Put("a", longest + "k", 10), C(ErrorCode::INVALID_KEY));
  EXPECT_EQ(Put("a", "", 10), C(ErrorCode::INVALID_KEY));
  // Without a policy a tenant cannot write; with one it can.
  TenantSnapshot now;
  ASSERT_EQ(master_->UpsertTenantPolicy("c", 100, &now), ErrorCode::OK);
  EXPECT_EQ(now.effective_quota_bytes, 100u);
  EXPECT_EQ(Put("c", "k", 10), kOk);
}

// A put that eviction cannot make room for takes nothing: the tenant's cache stays.
TEST_F(TenantsTest, AQuotaEvictionThatCannotMakeRoomEvictsNothing) {
  Make(true, {{"a", 1000}});
  ASSERT_EQ(Put("a", "a0", 300), kOk);
  ASSERT_EQ(Put("a", "a1", 300), kOk);
  ASSERT_EQ(Put("a", "a2", 300), kOk);
  ASSERT_EQ(Get("a", "a1"), kOk);  // leased: not evictable
  ASSERT_EQ(Get("a", "a2"), kOk);
  EXPECT_EQ(Put("a", "big", 500), C(ErrorCode::TENANT_QUOTA_EXCEEDED));  // a0 frees 300 < 400
  EXPECT_EQ(Exist("a", "a0"), kOk);
  EXPECT_EQ(Put("a", "huge", 2000), C(ErrorCode::TENANT_QUOTA_EXCEEDED));  // over the quota
  EXPECT_EQ(Exist("a", "a0"), kOk);
  EXPECT_EQ(Charged("a"), 900u);
  // A batch of such puts: one eviction attempt, each item refused, a0 still there.
  rpc::PutStartRequest r;
  r.set_client_id("client-a");
  r.set_tenant_id("a");
  for (int i = 0; i < 64; ++i) {
    auto* item = r.add_items();
    item->set_key("b" + std::to_string(i));
    item->set_size(500);
  }
  auto resp = Call<rpc::PutStartResponse>(MasterMethod::kPutStart, r);
  for (const auto& res : resp.results()) EXPECT_EQ(res.code(), C(ErrorCode::TENANT_QUOTA_EXCEEDED));
  EXPECT_EQ(Exist("a", "a0"), kOk);
  // A bad tenant id is a refused request (master_refused_requests_total).
  const auto before = master_->MetricsText();
  EXPECT_EQ(Put("_x", "k", 1), C(ErrorCode::INVALID_PARAMS));
  EXPECT_NE(master_->MetricsText().find("master_refused_requests_total 1\n"), std::string::npos);
  EXPECT_NE(before.find("master_refused_requests_total 0\n"), std::string::npos);
}

// Keys a master stored before strict mode was turned on may hold any bytes before a NUL: the
// charges rebuilt from them never break the metrics' text.
TEST_F(TenantsTest, KeysFromBeforeStrictModeKeepTheMetricsParseable) {
  Make(false);
  ASSERT_EQ(Put("", std::string("x\ny\"z\0k", 7), 10), kOk);
  const std::string text = PromotedCopy(master_.get())->MetricsText();
  EXPECT_NE(text.find("mooncake_tenant_quota_charged_bytes{tenant_id=\"x\\ny\\\"z\"} 10\n"),
            std::string::npos)
      << text;
}

TEST_F(TenantsTest, AFullQuotaEvictsTheTenantsOwnObjectsOnly) {
  Make(true, {{"a", 1000}, {"b", 1 << 20}});
  ASSERT_EQ(Put("b", "b0", 300), kOk);
  ASSERT_EQ(Put("a", "a0", 300), kOk);
  ASSERT_EQ(Put("b", "b1", 300), kOk);
  ASSERT_EQ(Put("a", "a1", 300), kOk);
  ASSERT_EQ(Put("a", "a2", 300), kOk);
  EXPECT_EQ(Charged("a"), 900u);
  ASSERT_EQ(Put("a", "a3", 300), kOk);  // a0, the least recently used of a's, goes
  EXPECT_EQ(Exist("a", "a0"), C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(Exist("a", "a1"), kOk);
  EXPECT_EQ(Exist("b", "b0"), kOk);
  EXPECT_EQ(Exist("b", "b1"), kOk);
  EXPECT_EQ(Charged("a"), 900u);
  // Leased objects are not taken: over quota then.
  for (const char* k : {"a1", "a2", "a3"}) ASSERT_EQ(Get("a", k), kOk);
  EXPECT_EQ(Put("a", "a4", 300), C(ErrorCode::TENANT_QUOTA_EXCEEDED));
  EXPECT_EQ(Put("a", "big", 2000), C(ErrorCode::TENANT_QUOTA_EXCEEDED));
  EXPECT_EQ(Charged("a"), 900u);
  EXPECT_EQ(Put("b", "b2", 300), kOk);  // b's quota is its own
  const std::string metrics = master_->MetricsText();
  EXPECT_NE(metrics.find("mooncake_tenant_quota_charged_bytes{tenant_id=\"a\"} 900"), std::string::npos);
  EXPECT_NE(metrics.find("mooncake_tenant_quota_reject_total{tenant_id=\"a\",reason=\"quota_exceeded\"} 2"),
            std::string::npos);
  EXPECT_NE(metrics.find("mooncake_tenant_evict_bytes_total{tenant_id=\"a\"} 300"), std::string::npos);
}

// The charges the master keeps as it goes, against those rebuilt from its state (a standby
// given its export and promoted recomputes them from every object and upsert).
void ExpectChargesAsRebuilt(MasterService* master, const char* when) {
  auto standby = PromotedCopy(master);
  standby->SetTenantPolicies(master->GetTenantPolicies());
  for (const char* t : {"a", "b"}) {
    TenantSnapshot kept, rebuilt;
    master->TenantSnapshotOf(t, &kept);
    standby->TenantSnapshotOf(t, &rebuilt);
    ASSERT_EQ(kept.charged_bytes, rebuilt.charged_bytes) << t << " " << when;
  }
}

// Every path that places or frees memory keeps the charges right.
TEST_F(TenantsTest, ChargesFollowEveryPlacementAndFree) {
  Make(true, {{"a", 3 << 20}, {"b", 3 << 20}});
  rpc::MountSegmentRequest m;
  m.set_client_id("holder2");
  m.set_segment_name("seg2");
  m.set_base(2ull << 30);
  m.set_size(4 << 20);
  ASSERT_EQ(master_->MountSegment(m).code(), kOk);
  std::mt19937 rng(7);
  const std::vector<std::string> tenants = {"a", "b"};
  for (int i = 0; i < 3000; ++i) {
    const std::string t = tenants[rng() % 2];
    const std::string key = "k" + std::to_string(rng() % 40);
    const uint64_t size = 1 + rng() % 100000;
    switch (rng() % 7) {
      case 0: Put(t, key, size); break;
      case 1: Put(t, key, size, /*end=*/false); break;
      case 2: Put(t, key, size, true, /*upsert=*/true); break;
      case 3: Put(t, key, size, false, /*upsert=*/true); break;
      case 4: Call<rpc::CodesResponse>(MasterMethod::kPutRevoke, Keys(t, {key})); break;
      case 5: {
        auto r = Keys(t, {key});
        r.set_force(true);
        Call<rpc::CodesResponse>(MasterMethod::kRemove, r);
        break;
      }
      case 6: Call<rpc::CodesResponse>(MasterMethod::kPutEnd, Keys(t, {key})); break;
    }
    if (i % 50 == 0) ExpectChargesAsRebuilt(master_.get(), ("step " + std::to_string(i)).c_str());
    if (::testing::Test::HasFatalFailure()) return;
  }
  ExpectChargesAsRebuilt(master_.get(), "the end");
  // A segment unmounted: its replicas are dropped, and their charges with them.
  rpc::UnmountSegmentRequest u;
  u.set_client_id("holder2");
  u.set_segment_name("seg2");
  u.set_base(2ull << 30);
  ASSERT_EQ(master_->UnmountSegment(u).code(), kOk);
  ExpectChargesAsRebuilt(master_.get(), "after the unmount");
  // Everything removed or revoked: nothing charged, nothing allocated.
  for (const std::string t : {"a", "b"}) {
    for (int k = 0; k < 40; ++k) {
      Call<rpc::CodesResponse>(MasterMethod::kPutRevoke, Keys(t, {"k" + std::to_string(k)}));
    }
    auto all = Keys(t, {});
    all.set_force(true);
    Call<rpc::CountResponse>(MasterMethod::kRemoveAll, all);
  }
  EXPECT_EQ(Charged("a") + Charged("b"), 0u);
  EXPECT_EQ(Allocated(), 0u);
}

TEST_F(TenantsTest, APromotedStandbyRebuildsTheCharges) {
  Make(true);
  ASSERT_EQ(Put("a", "k1", 100), kOk);
  ASSERT_EQ(Put("a", "k2", 50, /*end=*/false), kOk);
  ASSERT_EQ(Put("b", "k1", 70), kOk);
  auto standby = PromotedCopy(master_.get());
  standby->SetTenantPolicies({{"a", 1 << 20}, {"b", 1 << 20}});
  TenantSnapshot s;
  ASSERT_EQ(standby->TenantSnapshotOf("a", &s), ErrorCode::OK);
  EXPECT_EQ(s.charged_bytes, 150u);
  ASSERT_EQ(standby->TenantSnapshotOf("b", &s), ErrorCode::OK);
  EXPECT_EQ(s.charged_bytes, 70u);
}

TEST_F(TenantsTest, WithoutStrictModeEveryTenantSharesOneKeySpace) {
  Make(false);
  ASSERT_EQ(Put("a", "k", 100), kOk);
  EXPECT_EQ(Get("b", "k"), kOk);
  EXPECT_EQ(Put("b", "k", 100), C(ErrorCode::OBJECT_ALREADY_EXISTS));
  EXPECT_EQ(Put("_whatever", "k2", 100), kOk);  // not read at all
  TenantSnapshot s;
  EXPECT_EQ(master_->TenantSnapshotOf("a", &s), ErrorCode::UNAVAILABLE_IN_CURRENT_MODE);
  EXPECT_EQ(master_->MetricsText().find("mooncake_tenant"), std::string::npos);
}

using Json = nlohmann::json;

TEST_F(TenantsTest, TheAdminApiChangesAndSavesThePolicy) {
  Make(true, {{"a", 1000}});
  char dir[] = "/tmp/master_tenants_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/quotas.yaml";
  auto source = MakeTenantPolicySource("file", path, "c");
  ASSERT_TRUE(source.ok());
  MasterHttp http(master_.get());
  http.SetTenantPolicySource(source->get());
  auto body = [](const HttpReply& r) { return Json::parse(r.body); };

  HttpReply r = http.Serve("/api/v1/tenant_quotas");
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(body(r)["data"].size(), 1u);
  EXPECT_EQ(body(r)["data"][0]["tenant_id"], "a");

  r = http.ServeWrite("PUT", "/api/v1/tenant_quotas?tenant_id=tenant-b",
                      R"({"requested_quota_bytes":2147483648})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(body(r)["data"]["requested_quota_bytes"], 2147483648u);
  EXPECT_EQ(body(r)["data"]["has_explicit_policy"], true);
  EXPECT_EQ(body(r)["data"]["admission_closed"], false);
  // Saved before it took effect: the file names both tenants.
  auto saved = (*source)->Load();
  ASSERT_TRUE(saved.ok()) << saved.status().message();
  EXPECT_EQ(*saved, (TenantPolicies{{"a", 1000}, {"tenant-b", 2147483648u}}));

  r = http.Serve("/api/v1/tenant_quotas?tenant_id=tenant-b");
  ASSERT_EQ(r.status, 200);
  // The pool holds 4 MiB: the requests (2 GiB + 1000) share it in proportion.
  EXPECT_LT(body(r)["data"]["effective_quota_bytes"].get<uint64_t>(), 4u << 20);
  EXPECT_EQ(http.Serve("/api/v1/tenant_quotas?tenant_id=nobody").status, 404);
  EXPECT_EQ(http.Serve("/api/v1/tenant_quotas?tenant_id=_x").status, 400);

  for (const char* bad : {"", "{}", "{\"requested_quota_bytes\":0}",
                          "{\"requested_quota_bytes\":-1}", "{\"requested_quota_bytes\":\"5\"}",
                          "{\"requested_quota_bytes\":9223372036854775808}", "nope"}) {
    r = http.ServeWrite("PUT", "/api/v1/tenant_quotas?tenant_id=c", bad);
    EXPECT_EQ(r.status, 400) << bad;
  }
  EXPECT_EQ(http.ServeWrite("PUT", "/api/v1/tenant_quotas", "{\"requested_quota_bytes\":1}").status, 400);
  EXPECT_EQ(http.ServeWrite("PUT", "/api/v1/tenant_quotas?tenant_id=_c", "{\"requested_quota_bytes\":1}").status, 400);
  EXPECT_EQ(http.ServeWrite("POST", "/get_all_keys", "").status, 405);
  // A bounded number of tenants: past kMaxTenants a new one is refused, a known one updated.
  TenantPolicies many = master_->GetTenantPolicies();
  for (size_t i = many.size(); i < kMaxTenants; ++i) many["t" + std::to_string(i)] = 1;
  master_->SetTenantPolicies(many);
  EXPECT_EQ(http.ServeWrite("PUT", "/api/v1/tenant_quotas?tenant_id=one-more",
                            "{\"requested_quota_bytes\":1}").status, 409);
  EXPECT_EQ(http.ServeWrite("PUT", "/api/v1/tenant_quotas?tenant_id=t100",
                            "{\"requested_quota_bytes\":2}").status, 200);
  many.erase("t100");
  for (size_t i = 0; i < kMaxTenants; ++i) many.erase("t" + std::to_string(i));
  master_->SetTenantPolicies(many);
  ASSERT_TRUE((*source)->Save(many).ok());

  // A tenant that holds objects keeps its policy.
  ASSERT_EQ(Put("tenant-b", "k", 100), kOk);
  r = http.ServeWrite("DELETE", "/api/v1/tenant_quotas?tenant_id=tenant-b", "");
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_EQ(body(r)["error_code"], C(ErrorCode::TENANT_NOT_EMPTY));
  auto rm = Keys("tenant-b", {"k"});
  rm.set_force(true);
  ASSERT_EQ(Call<rpc::CodesResponse>(MasterMethod::kRemove, rm).codes(0), kOk);
  r = http.ServeWrite("DELETE", "/api/v1/tenant_quotas?tenant_id=tenant-b", "");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(body(r)["data"]["tenant_id"], "tenant-b");
  EXPECT_EQ(Put("tenant-b", "k", 100), C(ErrorCode::TENANT_NOT_REGISTERED));
  EXPECT_EQ(*(*source)->Load(), (TenantPolicies{{"a", 1000}}));
  EXPECT_EQ(http.ServeWrite("DELETE", "/api/v1/tenant_quotas?tenant_id=tenant-b", "").status, 404);

  // A policy that cannot be saved changes nothing.
  unlink(path.c_str());
  rmdir(dir);
  r = http.ServeWrite("PUT", "/api/v1/tenant_quotas?tenant_id=c", "{\"requested_quota_bytes\":5}");
  EXPECT_EQ(r.status, 500) << r.body;
  EXPECT_EQ(Put("c", "k", 1), C(ErrorCode::TENANT_NOT_REGISTERED));
}

TEST_F(TenantsTest, TheAdminApiNeedsStrictMode) {
  Make(false);
  MasterHttp http(master_.get());
  HttpReply r = http.Serve("/api/v1/tenant_quotas");
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(Json::parse(r.body)["error_code"], C(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE));
  r = http.ServeWrite("PUT", "/api/v1/tenant_quotas?tenant_id=a", "{\"requested_quota_bytes\":5}");
  EXPECT_EQ(r.status, 409);
}

}  // namespace
}  // namespace store
}  // namespace mooncake

namespace mooncake {
namespace store {
namespace {

// Replica tasks in strict mode: the key is the tenant's, another tenant neither sees the
// object nor the task, the new replica is charged to the tenant, and a copy over the quota
// makes room by evicting the tenant's own objects (the one being copied among them: then the
// task fails cleanly).
TEST_F(TenantsTest, ReplicaTasksAreTheTenantsAndChargedToIt) {
  Make(true, {{"a", 700 << 10}, {"b", 1 << 20}});
  rpc::MountSegmentRequest m;
  m.set_client_id("holder2");
  m.set_segment_name("seg2");
  m.set_base(1ull << 32);
  m.set_size(4 << 20);
  ASSERT_EQ(master_->MountSegment(m).code(), kOk);
  auto where = [&](const std::string& tenant, const std::string& key) {
    std::set<std::string> out;
    auto r = Call<rpc::GetReplicaListResponse>(MasterMethod::kGetReplicaList, Keys(tenant, {key}));
    if (r.code() == kOk && r.results(0).code() == kOk) {
      for (const auto& rep : r.results(0).replicas()) out.insert(rep.buffer().segment_name());
    }
    return out;
  };
  auto copy = [&](const std::string& tenant, const std::string& key, const std::string& target) {
    rpc::ReplicaTaskRequest r;
    r.set_client_id("client-" + tenant);
    r.set_tenant_id(tenant);
    r.set_key(key);
    r.add_targets(target);
    return Call<rpc::ReplicaTaskResponse>(MasterMethod::kCreateReplicaTask, r);
  };
  auto query = [&](const std::string& tenant, const rpc::ReplicaTaskResponse& t) {
    rpc::QueryTaskRequest r;
    r.set_tenant_id(tenant);
    r.set_id_hi(t.id_hi());
    r.set_id_lo(t.id_lo());
    return Call<rpc::QueryTaskResponse>(MasterMethod::kQueryTask, r);
  };
  auto run = [&](const std::string& executor) {  // fetch and report every task as copied
    rpc::FetchTasksRequest f;
    f.set_client_id(executor);
    auto got = Call<rpc::FetchTasksResponse>(MasterMethod::kFetchTasks, f);
    for (const auto& t : got.tasks()) {
      rpc::FinishTaskRequest fin;
      fin.set_client_id(executor);
      fin.set_id_hi(t.id_hi());
      fin.set_id_lo(t.id_lo());
      fin.set_ok(true);
      EXPECT_EQ(Call<rpc::FinishTaskResponse>(MasterMethod::kFinishTask, fin).code(), kOk);
    }
    return got.tasks_size();
  };
  ASSERT_EQ(Put("a", "k", 200 << 10), kOk);
  const std::set<std::string> first = where("a", "k");
  ASSERT_EQ(first.size(), 1u);
  const std::string from = *first.begin();
  const std::string to = from == "seg" ? "seg2" : "seg";
  const std::string executor = from == "seg" ? "holder" : "holder2";
  EXPECT_EQ(copy("b", "k", to).code(), C(ErrorCode::OBJECT_NOT_FOUND));  // not b's key
  auto t = copy("a", "k", to);
  ASSERT_EQ(t.code(), kOk) << t.message();
  EXPECT_EQ(query("b", t).code(), C(ErrorCode::TASK_NOT_FOUND));  // not b's task
  EXPECT_EQ(run(executor), 1);
  EXPECT_EQ(query("a", t).status(), 3u) << query("a", t).task_message();
  EXPECT_EQ(where("a", "k"), (std::set<std::string>{"seg", "seg2"}));
  EXPECT_EQ(Charged("a"), 400u << 10);
  // Over the quota: a second object, then a copy of it needs room.
  ASSERT_EQ(Put("a", "k2", 250 << 10), kOk);
  EXPECT_EQ(Charged("a"), 650u << 10);
  const std::string from2 = *where("a", "k2").begin();
  auto t2 = copy("a", "k2", from2 == "seg" ? "seg2" : "seg");
  ASSERT_EQ(t2.code(), kOk) << t2.message();
  run(from2 == "seg" ? "holder" : "holder2");
  auto q2 = query("a", t2);
  EXPECT_GE(q2.status(), 2u);  // ended, one way or the other
  EXPECT_LE(Charged("a"), 700u << 10);
  if (q2.status() == 3u) {
    EXPECT_EQ(where("a", "k2").size(), 2u);
  } else {
    EXPECT_NE(q2.task_message().find("evicted"), std::string::npos) << q2.task_message();
  }
}

}  // namespace
}  // namespace store
}  // namespace mooncake
