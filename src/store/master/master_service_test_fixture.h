// Fixtures of the MasterService unit tests (master_service_test.cc, master_eviction_test.cc):
// a MasterService on a fake clock, with one-line helpers for its RPCs.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "mooncake/store/error_code.h"
#include "store/master/master_service.h"

namespace mooncake {
namespace store {
namespace testing_support {

using Clock = MasterService::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;

constexpr int32_t kOk = 0;
inline int32_t C(ErrorCode c) { return ToInt(c); }

// A ChangeSink that keeps every entry (the HA log's, for a standby to apply).
class Collect : public ChangeSink {
 public:
  uint64_t Append(oplog::Entry&& e) override {
    entries.push_back(std::move(e));
    return entries.size();
  }
  std::vector<oplog::Entry> entries;
};

class MasterServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(MasterConfig{}); }

  void Make(MasterConfig config) {
    now_ = Clock::time_point() + std::chrono::hours(1000);
    master_ = std::make_unique<MasterService>(config, [this] { return now_; });
  }
  void Advance(Clock::duration d) { now_ += d; }

  int32_t Mount(const std::string& client, const std::string& name, uint64_t base,
                uint64_t size) {
    rpc::MountSegmentRequest req;
    req.set_client_id(client);
    req.set_segment_name(name);
    req.set_base(base);
    req.set_size(size);
    return master_->MountSegment(req).code();
  }
  int32_t Unmount(const std::string& client, const std::string& name, uint64_t base) {
    rpc::UnmountSegmentRequest req;
    req.set_client_id(client);
    req.set_segment_name(name);
    req.set_base(base);
    return master_->UnmountSegment(req).code();
  }
  rpc::PingResponse Ping(const std::string& client) {
    rpc::PingRequest req;
    req.set_client_id(client);
    return master_->Ping(req);
  }
  static rpc::ReplicateConfig Config(uint32_t replicas = 1,
                                     std::vector<std::string> preferred = {},
                                     bool soft_pin = false, bool hard_pin = false) {
    rpc::ReplicateConfig c;
    c.set_replica_num(replicas);
    for (auto& p : preferred) c.add_preferred_segments(p);
    c.set_with_soft_pin(soft_pin);
    c.set_with_hard_pin(hard_pin);
    return c;
  }
  rpc::PutStartResult PutStart(const std::string& client, const std::string& key, uint64_t size,
                               const rpc::ReplicateConfig& config = Config(), uint64_t nonce = 0,
                               bool upsert = false) {
    rpc::PutStartRequest req;
    req.set_client_id(client);
    req.set_put_nonce(nonce);
    req.set_upsert(upsert);
    auto* item = req.add_items();
    item->set_key(key);
    item->set_size(size);
    *req.mutable_config() = config;
    auto resp = master_->PutStart(req);
    EXPECT_EQ(resp.results_size(), 1);
    return resp.results_size() == 1 ? resp.results(0) : rpc::PutStartResult();
  }
  rpc::KeysRequest Keys(const std::string& client, const std::vector<std::string>& keys,
                        bool force = false) {
    rpc::KeysRequest req;
    req.set_client_id(client);
    for (const auto& k : keys) req.add_keys(k);
    req.set_force(force);
    return req;
  }
  int32_t PutEnd(const std::string& client, const std::string& key) {
    auto resp = master_->PutEnd(Keys(client, {key}));
    EXPECT_EQ(resp.codes_size(), 1);
    return resp.codes_size() == 1 ? resp.codes(0) : -99999;
  }
  int32_t PutRevoke(const std::string& client, const std::string& key) {
    auto resp = master_->PutRevoke(Keys(client, {key}));
    EXPECT_EQ(resp.codes_size(), 1);
    return resp.codes_size() == 1 ? resp.codes(0) : -99999;
  }
  // PutStart then PutEnd; the first non-OK code, or OK.
  int32_t Put(const std::string& client, const std::string& key, uint64_t size,
              const rpc::ReplicateConfig& config = Config()) {
    auto r = PutStart(client, key, size, config);
    if (r.code() != kOk) return r.code();
    return PutEnd(client, key);
  }
  rpc::GetReplicaListResult Get(const std::string& key) {
    auto resp = master_->GetReplicaList(Keys("reader", {key}));
    EXPECT_EQ(resp.results_size(), 1);
    return resp.results_size() == 1 ? resp.results(0) : rpc::GetReplicaListResult();
  }
  int32_t Exist(const std::string& key) {
    auto resp = master_->ExistKey(Keys("reader", {key}));
    EXPECT_EQ(resp.results_size(), 1);
    return resp.results_size() == 1 ? resp.results(0).code() : -99999;
  }
  int32_t Remove(const std::string& key, bool force = false) {
    auto resp = master_->Remove(Keys("remover", {key}, force));
    EXPECT_EQ(resp.codes_size(), 1);
    return resp.codes_size() == 1 ? resp.codes(0) : -99999;
  }
  rpc::CountResponse RemoveByRegex(const std::string& re, bool force = false) {
    rpc::RemoveByRegexRequest req;
    req.set_client_id("remover");
    req.set_regex(re);
    req.set_force(force);
    return master_->RemoveByRegex(req);
  }
  std::set<std::string> SegmentsOf(const rpc::GetReplicaListResult& r) {
    std::set<std::string> out;
    for (const auto& rep : r.replicas()) out.insert(rep.buffer().segment_name());
    return out;
  }
  // The keys among `keys` that ExistKey still finds.
  std::set<std::string> Present(const std::vector<std::string>& keys) {
    std::set<std::string> out;
    for (const auto& k : keys) {
      if (Exist(k) == kOk) out.insert(k);
    }
    return out;
  }
  // "name value" lines of the Prometheus text (a labelled sample under its name with the
  // labels, e.g. master_value_size_bytes_bucket{le="4096"}); also checks each family has HELP
  // and TYPE lines, and a histogram's samples are its _bucket, _sum and _count.
  std::map<std::string, uint64_t> Metrics() {
    std::map<std::string, uint64_t> out;
    std::set<std::string> helped, typed, histograms;
    std::istringstream in(master_->MetricsText());
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      std::istringstream words(line);
      if (line.rfind("# HELP ", 0) == 0) {
        std::string hash, help, name;
        words >> hash >> help >> name;
        helped.insert(name);
      } else if (line.rfind("# TYPE ", 0) == 0) {
        std::string hash, type, name, kind;
        words >> hash >> type >> name >> kind;
        EXPECT_TRUE(kind == "gauge" || kind == "counter" || kind == "histogram") << line;
        typed.insert(name);
        if (kind == "histogram") histograms.insert(name);
      } else {
        std::string name, extra;
        uint64_t value = 0;
        EXPECT_TRUE(static_cast<bool>(words >> name >> value)) << "not 'name value': " << line;
        EXPECT_FALSE(static_cast<bool>(words >> extra)) << "trailing text: " << line;
        std::string family = name.substr(0, name.find('{'));
        for (const char* suffix : {"_bucket", "_sum", "_count"}) {
          const std::string sfx = suffix;
          if (family.size() > sfx.size() &&
              family.compare(family.size() - sfx.size(), sfx.size(), sfx) == 0 &&
              histograms.count(family.substr(0, family.size() - sfx.size()))) {
            family = family.substr(0, family.size() - sfx.size());
            break;
          }
        }
        EXPECT_TRUE(family == name.substr(0, name.find('{')) || histograms.count(family)) << line;
        EXPECT_TRUE(helped.count(family)) << name << " has no # HELP line";
        EXPECT_TRUE(typed.count(family)) << name << " has no # TYPE line";
        EXPECT_EQ(out.count(name), 0u) << name << " twice";
        out[name] = value;
      }
    }
    return out;
  }

  Clock::time_point now_;
  std::unique_ptr<MasterService> master_;
};

// ---- MountSegment / UnmountSegment / Ping ----


class MasterEvictionTest : public MasterServiceTest {
 protected:
  static constexpr uint64_t kObj = 100 * KiB;
  static constexpr uint64_t kSeg = 10 * kObj;  // exactly ten objects
  // Eviction only to make an allocation fit (watermark 1, nothing freed below it).
  void MakeExact(uint64_t lease_ms = 10000) {
    MasterConfig c;
    c.eviction_high_watermark_ratio = 1.0;
    c.eviction_ratio = 0.0;
    c.default_kv_lease_ttl_ms = lease_ms;
    Make(c);
    ASSERT_EQ(Mount("c1", "seg", 0x10000000, kSeg), kOk);
  }
  std::vector<std::string> Fill(const std::string& prefix, int n,
                                const rpc::ReplicateConfig& config = Config()) {
    std::vector<std::string> keys;
    for (int i = 0; i < n; ++i) {
      keys.push_back(prefix + std::to_string(i));
      EXPECT_EQ(Put("c1", keys.back(), kObj, config), kOk) << keys.back();
      Advance(seconds(1));
    }
    return keys;
  }
  std::set<std::string> Gone(const std::vector<std::string>& keys) {
    std::set<std::string> out;
    for (const auto& k : keys) {
      if (Exist(k) != kOk) out.insert(k);
    }
    return out;
  }
  void ExpireLeases() { Advance(milliseconds(master_->config().default_kv_lease_ttl_ms + 1)); }
};

}  // namespace testing_support
}  // namespace store
}  // namespace mooncake
