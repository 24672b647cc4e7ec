// The master's HTTP endpoints (master_http.h) over a MasterService on a fake clock: upstream's
// formats, no state changed by a query, bounded listings, 400 for bad queries.
#include "store/master/master_http.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "store/common/limits.h"
#include "store/master/master_service_test_fixture.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_support;  // NOLINT
using nlohmann::json;

class MasterHttpTest : public MasterServiceTest {
 protected:
  HttpReply Serve(const std::string& target) { return MasterHttp(master_.get()).Serve(target); }
  json Json(const std::string& target, int status) {
    HttpReply r = Serve(target);
    EXPECT_EQ(r.status, status) << target << ": " << r.body;
    EXPECT_EQ(r.content_type, "application/json; charset=utf-8") << target;
    return json::parse(r.body, nullptr, false);
  }
  static std::vector<std::string> Lines(const std::string& body) {
    std::vector<std::string> out;
    std::istringstream in(body);
    std::string line;
    while (std::getline(in, line)) out.push_back(line);
    return out;
  }
  static std::string Header(const HttpReply& r, const std::string& name) {
    for (const auto& h : r.headers) {
      if (h.first == name) return h.second;
    }
    return "";
  }
};

TEST_F(MasterHttpTest, QueryKeyListsTheReplicasAndGrantsNoLease) {
  ASSERT_EQ(Mount("c1", "seg-a", 0x10000000, MiB), kOk);
  ASSERT_EQ(Mount("c2", "seg-b", 0x20000000, MiB), kOk);
  ASSERT_EQ(Put("c1", "k", 1000, Config(2)), kOk);
  json j = Json("/query_key?key=k", 200);
  ASSERT_TRUE(j.is_object()) << j;
  EXPECT_EQ(j["success"], true);
  ASSERT_EQ(j["data"].size(), 2u) << j;
  std::set<std::string> endpoints;
  for (const auto& d : j["data"]) {
    EXPECT_EQ(d["size_"], 1000);
    EXPECT_EQ(d["protocol_"], "tcp");
    const uint64_t addr = d["buffer_address_"];
    const std::string seg = d["transport_endpoint_"];
    const uint64_t base = seg == "seg-a" ? 0x10000000 : 0x20000000;
    EXPECT_GE(addr, base);
    EXPECT_LE(addr + 1000, base + MiB);
    endpoints.insert(seg);
  }
  EXPECT_EQ(endpoints, (std::set<std::string>{"seg-a", "seg-b"}));
  // The same as the replicas a reader gets.
  auto got = Get("k");
  ASSERT_EQ(got.replicas_size(), 2);
  std::set<uint64_t> addrs;
  for (const auto& d : j["data"]) addrs.insert(d["buffer_address_"].get<uint64_t>());
  for (const auto& r : got.replicas()) EXPECT_EQ(addrs.count(r.buffer().addr()), 1u);

  // A query takes no lease: a plain remove right after it succeeds (after a Get it would not).
  ASSERT_EQ(Put("c1", "q", 10), kOk);
  const std::string before = master_->MetricsText();
  (void)Json("/query_key?key=q", 200);
  (void)Json("/batch_query_keys?keys=q", 200);
  EXPECT_EQ(master_->MetricsText(), before);  // not counted as a get either
  EXPECT_EQ(Remove("q"), kOk);
}

TEST_F(MasterHttpTest, QueryKeyErrors) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, MiB), kOk);
  json j = Json("/query_key?key=missing", 404);
  EXPECT_EQ(j["success"], false);
  EXPECT_EQ(j["error_code"], C(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(j["error_message"], "OBJECT_NOT_FOUND");
  // Still being written: not found, as for readers.
  ASSERT_EQ(PutStart("c1", "inflight", 10).code(), kOk);
  EXPECT_EQ(Json("/query_key?key=inflight", 404)["error_code"], C(ErrorCode::OBJECT_NOT_FOUND));
  // Bad queries: 400 with a message.
  for (const std::string& bad :
       {std::string("/query_key"), std::string("/query_key?key="), std::string("/query_key?k=x"),
        "/query_key?key=" + std::string(kMaxKeyBytes + 1, 'x')}) {
    json e = Json(bad, 400);
    EXPECT_EQ(e["success"], false) << bad;
    EXPECT_FALSE(e["error_message"].get<std::string>().empty()) << bad;
  }
  HttpReply r = Serve("/query_key?key=%zz");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("percent-encoding"), std::string::npos);
  EXPECT_EQ(Serve("/query_key?key=abc%4").status, 400);
}

TEST_F(MasterHttpTest, KeysArePercentDecoded) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, MiB), kOk);
  ASSERT_EQ(Put("c1", "a b/c&d=e,f", 10), kOk);
  EXPECT_EQ(Json("/query_key?key=a%20b%2Fc%26d%3De%2Cf", 200)["data"].size(), 1u);
  EXPECT_EQ(Json("/query_key?key=a+b/c%26d%3De,f", 200)["data"].size(), 1u);
  EXPECT_EQ(Json("/query_key?other=1&key=a+b%2Fc%26d%3De%2cf", 200)["data"].size(), 1u);
}

TEST_F(MasterHttpTest, BatchQueryKeys) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, MiB), kOk);
  ASSERT_EQ(Put("c1", "k1", 10), kOk);
  ASSERT_EQ(Put("c1", "k2", 20), kOk);
  json j = Json("/batch_query_keys?keys=k1,missing,k2,k1", 200);
  EXPECT_EQ(j["success"], true);
  ASSERT_EQ(j["data"].size(), 3u) << j;
  EXPECT_EQ(j["data"]["k1"]["ok"], true);
  EXPECT_EQ(j["data"]["k1"]["values"][0]["size_"], 10);
  EXPECT_EQ(j["data"]["k2"]["values"][0]["size_"], 20);
  EXPECT_EQ(j["data"]["k2"]["values"][0]["transport_endpoint_"], "seg");
  EXPECT_EQ(j["data"]["missing"]["ok"], false);
  EXPECT_EQ(j["data"]["missing"]["error"], "OBJECT_NOT_FOUND");
  EXPECT_FALSE(j["data"]["missing"].contains("values"));
  // Split at ',' after decoding, as upstream: %2C separates keys too.
  EXPECT_EQ(Json("/batch_query_keys?keys=k1%2Ck2", 200)["data"].size(), 2u);
  // An empty element is a bad key, reported per key.
  EXPECT_EQ(Json("/batch_query_keys?keys=k1,", 200)["data"][""]["error"], "INVALID_KEY");
  // No keys, too many keys: 400 {"success":false,"error":...}.
  for (const std::string& bad : {std::string("/batch_query_keys"),
                                 std::string("/batch_query_keys?keys=")}) {
    json e = Json(bad, 400);
    EXPECT_EQ(e["success"], false);
    EXPECT_NE(e["error"].get<std::string>().find("No keys provided"), std::string::npos);
  }
  std::string many = "/batch_query_keys?keys=k";
  for (size_t i = 0; i < kMaxBatchItems; ++i) many += ",k";
  EXPECT_NE(Json(many, 400)["error"].get<std::string>().find("keys in one request"),
            std::string::npos);
}

// Found by fuzz_master_http: the reply's JSON object was searched linearly per key, so a
// batch of kMaxBatchItems long distinct keys took seconds (4096^2 / 2 comparisons of 4 KiB).
TEST_F(MasterHttpTest, ABatchOfManyLongKeysIsAnsweredQuicklyInRequestOrder) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, MiB), kOk);
  const std::string prefix(kMaxKeyBytes - 6, 'p');
  auto key = [&](size_t i) {
    char n[8];
    std::snprintf(n, sizeof(n), "%06zu", i);
    return prefix + n;
  };
  ASSERT_EQ(Put("c1", key(7), 10), kOk);
  auto batch = [&](size_t n) {  // n keys, key(0) twice (first and last)
    std::string t = "/batch_query_keys?keys=" + key(0);
    for (size_t i = 1; i < n; ++i) t += "," + key(i + 1 < n ? i : 0);
    return t;
  };
  // Linear, not quadratic, in the number of keys: 8 times the keys take about 8 times as
  // long (a quadratic reply builder took 64 times, over 5 s for the full batch). A ratio, not
  // a time, so that a slow or sanitized build does not fail it; best of 3 against noise.
  auto best = [&](const std::string& t) {
    auto b = std::chrono::steady_clock::duration::max();
    for (int i = 0; i < 3; ++i) {
      const auto start = std::chrono::steady_clock::now();
      HttpReply reply = Serve(t);
      b = std::min(b, std::chrono::steady_clock::now() - start);
      EXPECT_EQ(reply.status, 200);
    }
    return b;
  };
  const std::string target = batch(kMaxBatchItems);
  const auto small = best(batch(kMaxBatchItems / 8));
  const auto large = best(target);
  EXPECT_LT(large, small * 24 + std::chrono::milliseconds(50));
  HttpReply r = Serve(target);
  ASSERT_EQ(r.status, 200);
  json j = json::parse(r.body);  // (not ordered_json: its parse would be quadratic too)
  ASSERT_EQ(j["data"].size(), kMaxBatchItems - 1);  // key(0) once
  EXPECT_LT(r.body.find(key(0)), r.body.find(key(1)));  // in request order
  EXPECT_LT(r.body.find(key(1)), r.body.find(key(2)));
  EXPECT_EQ(j["data"][key(7)]["ok"], true);
  EXPECT_EQ(j["data"][key(9)]["ok"], false);
}

TEST_F(MasterHttpTest, GetAllKeysListsCompleteObjects) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, MiB), kOk);
  ASSERT_EQ(Put("c1", "k1", 10), kOk);
  ASSERT_EQ(Put("c1", "k2", 10), kOk);
  ASSERT_EQ(PutStart("c1", "inflight", 10).code(), kOk);
  HttpReply r = Serve("/get_all_keys");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/plain; version=0.0.4");
  auto lines = Lines(r.body);
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()),
            (std::set<std::string>{"k1", "k2"}));
  EXPECT_EQ(lines.size(), 2u);
  EXPECT_EQ(Header(r, "X-Mooncake-Total-Count"), "2");
  EXPECT_EQ(Header(r, "X-Mooncake-Truncated"), "");
}

TEST_F(MasterHttpTest, GetAllKeysIsCutAtTheByteBound) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, 64 * MiB), kOk);
  // kMaxListedBytes of 4 KiB keys, plus some: the listing stops at the bound and says so.
  const size_t n = kMaxListedBytes / kMaxKeyBytes + 10;
  for (size_t i = 0; i < n; ++i) {
    std::string key = std::to_string(i);
    key.resize(kMaxKeyBytes, 'x');
    ASSERT_EQ(Put("c1", key, 64), kOk) << i;
  }
  HttpReply r = Serve("/get_all_keys");
  EXPECT_EQ(r.status, 200);
  EXPECT_LE(r.body.size(), kMaxListedBytes + kMaxListedBytes / kMaxKeyBytes);  // keys + '\n's
  EXPECT_EQ(Lines(r.body).size(), kMaxListedBytes / kMaxKeyBytes);
  EXPECT_EQ(Header(r, "X-Mooncake-Total-Count"), std::to_string(n));
  EXPECT_EQ(Header(r, "X-Mooncake-Truncated"), "true");
  size_t total = 0;
  EXPECT_EQ(master_->ListKeys(3, kMaxListedBytes, &total).size(), 3u);
  EXPECT_EQ(total, n);
}

TEST_F(MasterHttpTest, SegmentsHealthSummaryAndUnknownPaths) {
  EXPECT_EQ(Serve("/get_all_segments").body, "");
  ASSERT_EQ(Mount("c1", "seg-a", 0x10000000, MiB), kOk);
  ASSERT_EQ(Mount("c2", "seg-b", 0x20000000, 2 * MiB), kOk);
  HttpReply segs = Serve("/get_all_segments");
  EXPECT_EQ(segs.status, 200);
  EXPECT_EQ(segs.body, "seg-a\nseg-b\n");
  EXPECT_EQ(Header(segs, "X-Mooncake-Total-Count"), "2");
  ASSERT_EQ(Put("c1", "k", 1000, Config(1, {"seg-b"})), kOk);
  HttpReply q = Serve("/query_segment?segment=seg-b");
  EXPECT_EQ(q.status, 200);
  EXPECT_NE(q.body.find("seg-b\nUsed(bytes): "), std::string::npos) << q.body;
  EXPECT_NE(q.body.find("Capacity(bytes) : " + std::to_string(2 * MiB) + "\n"), std::string::npos);
  EXPECT_EQ(Serve("/query_segment?segment=nope").status, 404);
  EXPECT_EQ(Serve("/query_segment").status, 400);

  json h = Json("/health", 200);
  EXPECT_EQ(h["status"], "ok");
  EXPECT_EQ(h["role"], "leader");
  EXPECT_EQ(h["service_ready"], true);
  EXPECT_EQ(Serve("/role").body, "leader");
  EXPECT_EQ(Serve("/ha_status").body, "serving");

  HttpReply m = Serve("/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("master_key_count 1\n"), std::string::npos);
  HttpReply s = Serve("/metrics/summary");
  EXPECT_EQ(s.status, 200);
  EXPECT_NE(s.body.find("role=leader, state=serving, service_ready=true, master={Mem Storage: "),
            std::string::npos)
      << s.body;
  EXPECT_NE(s.body.find(" / 3.00 MB"), std::string::npos) << s.body;
  EXPECT_NE(s.body.find("Keys: 1 (soft-pinned: 0) | Clients: 2 | Segments: 2}"),
            std::string::npos)
      << s.body;

  HttpReply u = Serve("/nope?x=1");
  EXPECT_EQ(u.status, 404);
  EXPECT_NE(u.body.find("/get_all_segments"), std::string::npos);
}

HaView StandbyView() {
  HaView v;
  v.enabled = true;
  v.role = "standby";
  v.ha_state = "standby";
  v.service_ready = false;
  v.leader_address = "10.0.0.1:50051";
  v.view_version = 42;
  v.applied_seq = 90;
  v.durable_seq = 100;
  v.checkpoint_seq = 50;
  return v;
}

HaView LeaderView() {
  HaView v;
  v.enabled = true;
  v.leader_address = "10.0.0.2:50051";
  v.view_version = 43;
  v.applied_seq = 120;
  v.durable_seq = 110;
  v.pending_entries = 10;
  v.checkpoint_seq = 100;
  v.durable_batches = 7;
  v.durable_entries = 110;
  v.fenced_writes = 1;
  v.promotions = 2;
  return v;
}

TEST_F(MasterHttpTest, WithoutHaLeaderIsAbsentAndNoHaMetrics) {
  json l = Json("/leader", 200);
  EXPECT_EQ(l, json::parse(R"({"present":false})"));
  json h = Json("/health", 200);
  EXPECT_EQ(h, json::parse(
                   R"({"status":"ok","role":"leader","ha_state":"serving","service_ready":true})"));
  const std::string m = Serve("/metrics").body;
  EXPECT_EQ(m.find("ha_oplog_"), std::string::npos);
  EXPECT_EQ(m.find("master_ha_"), std::string::npos);
  EXPECT_EQ(Serve("/metrics/summary").body.find("ha={"), std::string::npos);
}

TEST_F(MasterHttpTest, KvEventsStatusIsUpstreamsDisabledReplyOrThePublishers) {
  EXPECT_EQ(Json("/kv_events/status", 200),
            json::parse(R"({"enabled":false,"published_batches":0,"published_events":0,)"
                        R"("dropped_events":0,"skipped_unparsed_keys":0})"));
  MasterHttp http(master_.get());
  http.SetKvEventsStatus([] { return std::string(R"({"enabled":true,"published_events":3})"); });
  HttpReply r = http.Serve("/kv_events/status");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["published_events"], 3);
}

// A standby: the state endpoints answer, the table endpoints 503 naming the leader.
TEST_F(MasterHttpTest, AStandbyAnswersItsStateAndRefusesTheTables) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, MiB), kOk);
  ASSERT_EQ(Put("c1", "k", 10), kOk);
  HaView view = StandbyView();
  MasterHttp http(master_.get(), [&] { return view; });
  auto json_of = [&](const std::string& target, int status) {
    HttpReply r = http.Serve(target);
    EXPECT_EQ(r.status, status) << target << ": " << r.body;
    EXPECT_EQ(r.content_type, "application/json; charset=utf-8") << target;
    return json::parse(r.body, nullptr, false);
  };
  json h = json_of("/health", 200);
  EXPECT_EQ(h, json::parse(R"({"status":"ok","role":"standby","ha_state":"standby",
                               "service_ready":false,"leader_address":"10.0.0.1:50051",
                               "view_version":42})"));
  EXPECT_EQ(json_of("/leader", 200),
            json::parse(R"({"present":true,"leader_address":"10.0.0.1:50051",
                            "view_version":42})"));
  EXPECT_EQ(http.Serve("/role").body, "standby");
  EXPECT_EQ(http.Serve("/ha_status").body, "standby");
  const std::string want =
      "service plane is not active: this master is a standby; the leader is 10.0.0.1:50051";
  for (const std::string t : {"/get_all_keys", "/get_all_segments", "/query_segment?segment=seg",
                              "/query_key?key=k", "/batch_query_keys?keys=k"}) {
    json e = json_of(t, 503);
    EXPECT_EQ(e["success"], false) << t;
    EXPECT_EQ(e["error_code"], C(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE)) << t;
    EXPECT_EQ(e["error_message"], want) << t;
    EXPECT_EQ(Header(http.Serve(t), "Retry-After"), "") << t;  // go to the leader instead
  }
  HttpReply s = http.Serve("/metrics/summary");
  EXPECT_EQ(s.status, 200);
  EXPECT_EQ(s.body, "role=standby, state=standby, service_ready=false, master={" + want +
                        "}, ha={applied_seq: 90 | durable_seq: 100 | pending: 0 | "
                        "checkpoint_seq: 50}, leader=10.0.0.1:50051, view_version=42");
  // /metrics always answers, the HA metrics appended.
  HttpReply m = http.Serve("/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("master_key_count 1\n"), std::string::npos);
  for (const std::string line :
       {"ha_oplog_applied_sequence_id 90", "ha_oplog_last_sequence_id 100",
        "ha_oplog_standby_lag 10", "ha_oplog_pending_entries 0", "master_ha_role 0",
        "master_ha_service_ready 0", "master_ha_checkpoint_sequence_id 50"}) {
    EXPECT_NE(m.body.find("\n" + line + "\n"), std::string::npos) << line << "\n" << m.body;
  }
  EXPECT_NE(m.body.find("# TYPE ha_oplog_standby_lag gauge\n"), std::string::npos);

  // Other standby states and no leader known: said so; the leader's ("standby" role) too.
  view.ha_state = "catching_up";
  view.leader_address.clear();
  view.view_version = 0;
  EXPECT_EQ(json_of("/get_all_keys", 503)["error_message"],
            "service plane is not active: this master is a standby; no leader is known yet "
            "(ha_state catching_up)");
  EXPECT_EQ(json_of("/leader", 200), json::parse(R"({"present":false})"));
  json h2 = json_of("/health", 200);
  EXPECT_FALSE(h2.contains("leader_address"));
  EXPECT_FALSE(h2.contains("view_version"));
  EXPECT_EQ(http.Serve("/ha_status").body, "catching_up");
}

// A leader warming up is not ready either: 503 with Retry-After; once serving, everything.
TEST_F(MasterHttpTest, ALeaderServesOnceReady) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, MiB), kOk);
  ASSERT_EQ(Put("c1", "k", 10), kOk);
  HaView view = LeaderView();
  view.ha_state = "leader_warmup";
  view.service_ready = false;
  MasterHttp http(master_.get(), [&] { return view; });
  HttpReply warm = http.Serve("/query_key?key=k");
  EXPECT_EQ(warm.status, 503);
  EXPECT_EQ(Header(warm, "Retry-After"), "1");
  EXPECT_NE(warm.body.find("service plane is not active: this master is the leader, in state "
                           "leader_warmup; retry shortly"),
            std::string::npos)
      << warm.body;
  EXPECT_EQ(http.Serve("/role").body, "leader");

  view.ha_state = "serving";
  view.service_ready = true;
  EXPECT_EQ(http.Serve("/query_key?key=k").status, 200);
  EXPECT_EQ(http.Serve("/get_all_keys").body, "k\n");
  json h = json::parse(http.Serve("/health").body);
  EXPECT_EQ(h, json::parse(R"({"status":"ok","role":"leader","ha_state":"serving",
                               "service_ready":true,"leader_address":"10.0.0.2:50051",
                               "view_version":43})"));
  EXPECT_EQ(http.Serve("/ha_status").body, "serving");
  HttpReply s = http.Serve("/metrics/summary");
  EXPECT_NE(s.body.find("role=leader, state=serving, service_ready=true, master={Mem Storage: "),
            std::string::npos)
      << s.body;
  EXPECT_NE(s.body.find("Segments: 1}, ha={applied_seq: 120 | durable_seq: 110 | pending: 10 "
                        "| checkpoint_seq: 100}, leader=10.0.0.2:50051, view_version=43"),
            std::string::npos)
      << s.body;
  const std::string m = http.Serve("/metrics").body;
  for (const std::string line :
       {"ha_oplog_applied_sequence_id 120", "ha_oplog_last_sequence_id 110",
        "ha_oplog_standby_lag 0", "ha_oplog_pending_entries 10",
        "ha_batch_record_durable_batches_total 7", "ha_batch_record_durable_entries_total 110",
        "master_ha_fenced_writes_total 1", "master_ha_promotions_total 2",
        "master_ha_checkpoint_sequence_id 100", "master_ha_role 1", "master_ha_service_ready 1"}) {
    EXPECT_NE(m.find("\n" + line + "\n"), std::string::npos) << line << "\n" << m;
  }
  EXPECT_NE(m.find("# TYPE master_ha_promotions_total counter\n"), std::string::npos);
}

// Each walk of d owes 4 d without walks; up to 100 ms of that may stand (a few listings in a
// row are served), past it they answer 503 + Retry-After until the debt is paid; cheap
// endpoints are never held off.
TEST_F(MasterHttpTest, TableWalksTakeAtMostAFifthOfTheTime) {
  ASSERT_EQ(Mount("c1", "seg", 0x10000000, MiB), kOk);
  ASSERT_EQ(Put("c1", "k", 10), kOk);
  auto t = MasterHttp::Clock::time_point() + std::chrono::hours(1);
  // Each reading of the clock moves it 2 ms on: every handler "takes" 2 ms.
  MasterHttp http(master_.get(), [&] { return t += milliseconds(2); });
  // Each walk: start, +2 ms end; owes 10 ms, of which 4 ms pass by the next one's start.
  int served = 0;
  HttpReply busy;
  for (int i = 0; i < 40; ++i) {
    busy = http.Serve(i % 2 ? "/get_all_keys" : "/metrics/summary");
    if (busy.status != 200) break;
    ++served;
  }
  EXPECT_GE(served, 3);  // a burst is served
  EXPECT_LE(served, 25);  // then the walks are held off
  EXPECT_EQ(busy.status, 503);
  EXPECT_EQ(Header(busy, "Retry-After"), "1");
  EXPECT_NE(busy.body.find("retry in"), std::string::npos);
  EXPECT_EQ(http.Serve("/query_key?key=k").status, 200);  // cheap: not held off
  EXPECT_EQ(http.Serve("/metrics").status, 200);
  EXPECT_EQ(http.Serve("/health").status, 200);
  // Four fifths of the time without walks: 4 ms of every 5 ms pass idle, so the debt of the
  // burst (~100 ms) is paid within 200 ms.
  t += milliseconds(200);
  EXPECT_EQ(http.Serve("/get_all_segments").status, 200);
  // Walks in a steady stream are held to a fifth of the time: over 1 s of walking, with
  // the clock idling 8 ms each time one is refused, about 1/5 of the time is walking.
  int walked_ms = 0;
  const auto begin = t;
  while (t - begin < std::chrono::seconds(1)) {
    if (http.Serve("/get_all_keys").status == 200) {
      walked_ms += 2;
    } else {
      t += milliseconds(8);
    }
  }
  const double share = walked_ms / double(std::chrono::duration_cast<milliseconds>(t - begin).count());
  EXPECT_GT(share, 0.1);
  EXPECT_LT(share, 0.3);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
