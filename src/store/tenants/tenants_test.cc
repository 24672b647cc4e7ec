#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include "store/tenants/tenant_id.h"
#include "store/tenants/tenant_ledger.h"
#include "store/tenants/tenant_policy.h"

namespace mooncake {
namespace store {
namespace {

TEST(TenantId, UpstreamsRulesAndALengthBound) {
  EXPECT_EQ(TenantIdProblem("tenant-a"), "");
  EXPECT_EQ(TenantIdProblem("default"), "");
  EXPECT_EQ(TenantIdProblem("a b/c.d"), "");
  EXPECT_NE(TenantIdProblem(""), "");
  EXPECT_NE(TenantIdProblem("_system"), "");
  EXPECT_NE(TenantIdProblem(std::string("a\0b", 3)), "");
  EXPECT_NE(TenantIdProblem("a\nb"), "");
  EXPECT_NE(TenantIdProblem("a\x7f"), "");
  EXPECT_EQ(TenantIdProblem(std::string(kMaxTenantIdBytes, 'x')), "");
  // UTF-8 only: the policy's YAML and the real client's JSON would turn other bytes into
  // another id.
  for (const char* ok : {"\xc3\xa9quipe", "\xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x98\x80"}) {
    EXPECT_EQ(TenantIdProblem(ok), "") << ok;
  }
  for (const char* bad : {"\xff", "a\xc3", "\xed\xa0\x80", "\xc0\xaf", "\xe0\x80\xaf",
                          "\xf4\x90\x80\x80", "\x80"}) {
    EXPECT_NE(TenantIdProblem(bad), "") << bad;
  }
  EXPECT_NE(TenantIdProblem(std::string(kMaxTenantIdBytes + 1, 'x')), "");
}

TEST(TenantId, ScopedKeysNameOneTenantAndKeyEach) {
  EXPECT_EQ(ScopedKey("default", "k"), "k");
  EXPECT_EQ(ScopedKey("a", "k"), std::string("a\0k", 3));
  // A key spelled like another tenant's scoped key stays its sender's.
  const std::string forged("b\0victim", 8);
  EXPECT_NE(ScopedKey("a", forged), ScopedKey("b", "victim"));
  EXPECT_NE(ScopedKey("default", forged), ScopedKey("b", "victim"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"default", "k"}, {"default", forged}, {"a", "k"}, {"a", forged},
      {"b", "victim"},  {"default", "b"},    {"b", ""},  {"default", std::string("\0", 1)}};
  std::set<std::string> seen;
  for (const auto& [t, k] : cases) {
    const std::string s = ScopedKey(t, k);
    EXPECT_TRUE(seen.insert(s).second) << t;
    EXPECT_EQ(TenantOf(s), t);
    EXPECT_EQ(LocalKey(s), k);
  }
}

TEST(TenantId, TheTenantsKeyIsBoundNotThePrefix) {
  const std::string tenant(kMaxTenantIdBytes, 't');
  EXPECT_EQ(ScopedKeyProblem(ScopedKey(tenant, std::string(kMaxKeyBytes, 'k'))), "");
  EXPECT_NE(ScopedKeyProblem(ScopedKey(tenant, std::string(kMaxKeyBytes + 1, 'k'))), "");
  EXPECT_EQ(ScopedKeyProblem(ScopedKey(tenant, "")), "empty key");
  EXPECT_EQ(ScopedKeyProblem(""), "empty key");
  EXPECT_NE(ScopedKeyProblem(std::string(kMaxKeyBytes + 1, 'k')), "");
}

TEST(TenantPolicy, QuotasInUpstreamsUnits) {
  EXPECT_EQ(*ParseQuotaBytes("200GB"), 200ull << 30);
  EXPECT_EQ(*ParseQuotaBytes("1"), 1u);
  EXPECT_EQ(*ParseQuotaBytes("7B"), 7u);
  EXPECT_EQ(*ParseQuotaBytes("3KB"), 3u << 10);
  EXPECT_EQ(*ParseQuotaBytes("2TB"), 2ull << 40);
  for (const char* bad : {"", "GB", "0", "0GB", "12 GB", "1PB", "1gb", "-5", "99999999999999999999",
                          "9000000TB"}) {
    EXPECT_FALSE(ParseQuotaBytes(bad).ok()) << bad;
  }
}

TEST(TenantPolicy, YamlIsCheckedWhole) {
  auto ok = ParseTenantPolicyYaml(
      "version: 1\ntenants:\n  - name: tenant-a\n    quota: 200GB\n  - name: b\n    quota: 5\n");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->at("tenant-a"), 200ull << 30);
  EXPECT_EQ(ok->at("b"), 5u);
  ASSERT_TRUE(ParseTenantPolicyYaml("version: 1\n").ok());
  for (const char* bad : {"", "[1, 2]", "version: 2\ntenants: []\n", "tenants: []\n",
                          "version: 1\ntenants: {a: 1}\n",
                          "version: 1\ntenants:\n  - name: _x\n    quota: 1\n",
                          "version: 1\ntenants:\n  - name: a\n    quota: 0\n",
                          "version: 1\ntenants:\n  - name: a\n",
                          "version: 1\ntenants:\n  - quota: 1\n",
                          "version: 1\ntenants:\n  - name: a\n    quota: 1\n  - name: a\n    quota: 2\n",
                          "version: [1\n"}) {
    auto r = ParseTenantPolicyYaml(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_FALSE(r.status().message().empty());
    }
  }
  const TenantPolicies p = {{"a", 1}, {"odd: name", 12345}, {"#x", 1ull << 40}};
  auto back = ParseTenantPolicyYaml(TenantPolicyYaml(p));
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << TenantPolicyYaml(p);
  EXPECT_EQ(*back, p);
}

TEST(TenantPolicy, TheFileIsReplacedWholeAndAMissingOneIsAnError) {
  char dir[] = "/tmp/tenants_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/quotas.yaml";
  auto source = MakeTenantPolicySource("file", path, "c");
  ASSERT_TRUE(source.ok());
  auto missing = (*source)->Load();
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
  ASSERT_TRUE((*source)->Save({{"a", 10}, {"b", 20}}).ok());
  auto loaded = (*source)->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(*loaded, (TenantPolicies{{"a", 10}, {"b", 20}}));
  EXPECT_NE(access((path + ".tmp").c_str(), F_OK), 0);
  std::ofstream(path) << "version: 1\ntenants: nope\n";
  EXPECT_FALSE((*source)->Load().ok());
  unlink(path.c_str());
  rmdir(dir);
  EXPECT_FALSE(MakeTenantPolicySource("redis", "x", "c").ok());
  EXPECT_FALSE(MakeTenantPolicySource("file", "", "c").ok());
}

TEST(TenantLedger, OnlyRegisteredTenantsWriteWithinTheirQuota) {
  TenantLedger l;
  uint64_t deficit = 0;
  EXPECT_EQ(l.Admit("a", 1, 1000, &deficit), ErrorCode::TENANT_NOT_REGISTERED);
  l.SetPolicies({{"a", 100}});
  EXPECT_EQ(l.Admit("a", 100, 1000, &deficit), ErrorCode::OK);
  l.Charge("a", 60);
  EXPECT_EQ(l.Admit("a", 40, 1000, &deficit), ErrorCode::OK);
  EXPECT_EQ(l.Admit("a", 50, 1000, &deficit), ErrorCode::TENANT_QUOTA_EXCEEDED);
  EXPECT_EQ(deficit, 10u);
  l.Release("a", 60);
  EXPECT_EQ(l.Charged("a"), 0u);
  EXPECT_EQ(l.Admit("b", 1, 1000, &deficit), ErrorCode::TENANT_NOT_REGISTERED);
  EXPECT_EQ(l.Upsert("b", 0), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(l.Upsert("b", TenantLedger::kMaxQuotaBytes + 1), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(l.Upsert("b", 5), ErrorCode::OK);
  EXPECT_EQ(l.Admit("b", 5, 1000, &deficit), ErrorCode::OK);
}

TEST(TenantLedger, AnOverbookedPoolIsSharedInProportion) {
  TenantLedger l;
  l.SetPolicies({{"a", 300}, {"b", 100}, {"c", 100}});
  auto snaps = l.Snapshots(1000);
  ASSERT_EQ(snaps.size(), 3u);
  for (const auto& s : snaps) EXPECT_EQ(s.effective_quota_bytes, s.requested_quota_bytes);
  snaps = l.Snapshots(101);  // 60.6, 20.2, 20.2: 60 + 20 + 20, one left for the largest remainder
  EXPECT_EQ(snaps[0].effective_quota_bytes, 61u);
  EXPECT_EQ(snaps[1].effective_quota_bytes, 20u);
  EXPECT_EQ(snaps[2].effective_quota_bytes, 20u);
  l.Charge("b", 30);
  auto b = l.Snapshot("b", 101);
  ASSERT_TRUE(b.has_value());
  EXPECT_TRUE(b->over_quota);
  EXPECT_FALSE(b->admission_closed);
  uint64_t deficit = 0;
  EXPECT_EQ(l.Admit("b", 1, 101, &deficit), ErrorCode::TENANT_QUOTA_EXCEEDED);
  EXPECT_EQ(deficit, 11u);
}

TEST(TenantLedger, APolicyGoesOnlyWhenItsTenantHoldsNothing) {
  TenantLedger l;
  l.SetPolicies({{"a", 100}});
  TenantSnapshot last;
  EXPECT_EQ(l.RemoveIfEmpty("zz", &last), ErrorCode::OBJECT_NOT_FOUND);
  l.Charge("a", 1);
  EXPECT_EQ(l.RemoveIfEmpty("a", &last), ErrorCode::TENANT_NOT_EMPTY);
  EXPECT_TRUE(l.Registered("a"));
  l.Release("a", 1);
  EXPECT_EQ(l.RemoveIfEmpty("a", &last), ErrorCode::OK);
  EXPECT_EQ(last.requested_quota_bytes, 100u);
  EXPECT_FALSE(l.Registered("a"));
  EXPECT_FALSE(l.Snapshot("a", 1000).has_value());
  // A tenant whose policy went while it still held memory (a policy file edited, then
  // reloaded) is listed with admission closed until its charge is gone.
  l.SetPolicies({{"b", 10}});
  l.Charge("b", 4);
  l.SetPolicies({});
  auto b = l.Snapshot("b", 1000);
  ASSERT_TRUE(b.has_value());
  EXPECT_TRUE(b->admission_closed);
  EXPECT_EQ(b->charged_bytes, 4u);
  l.ClearCharges();
  EXPECT_TRUE(l.Snapshots(1000).empty());
}

}  // namespace
}  // namespace store
}  // namespace mooncake
