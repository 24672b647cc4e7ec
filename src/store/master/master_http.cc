#include "store/master/master_http.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_set>
#include <vector>

#include "mooncake/store/error_code.h"
#include "store/common/limits.h"
#include "store/common/metrics_text.h"
#include "store/tenants/tenant_id.h"

namespace mooncake {
namespace store {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kEndpoints[] =
    "/metrics /metrics/summary /health /leader /role /ha_status /kv_events/status /get_all_keys "
    "/get_all_segments /query_segment?segment= /query_key?key= /batch_query_keys?keys= "
    "/api/v1/tenant_quotas";

constexpr char kTenantQuotas[] = "/api/v1/tenant_quotas";

HttpReply Reply(int status, std::string content_type, std::string body) {
  HttpReply r;
  r.status = status;
  r.content_type = std::move(content_type);
  r.body = std::move(body);
  return r;
}

// Invalid UTF-8 (keys are bytes) is replaced, never thrown on.
std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

HttpReply JsonReply(int status, const Json& j) {
  return Reply(status, "application/json; charset=utf-8", Dump(j));
}

HttpReply ErrorJson(int status, ErrorCode code, const std::string& message) {
  Json j;
  j["success"] = false;
  j["error_code"] = ToInt(code);
  j["error_message"] = message;
  return JsonReply(status, j);
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decodes `s` ('+' is a space); nullopt on a bad escape.
std::optional<std::string> Decode(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] != '%') {
      out += s[i];
    } else {
      if (i + 2 >= s.size()) return std::nullopt;
      const int hi = HexValue(s[i + 1]);
      const int lo = HexValue(s[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    }
  }
  return out;
}

// name -> decoded value (the first of repeated names); false on a bad escape.
bool ParseQuery(const std::string& query, std::map<std::string, std::string>* params) {
  size_t pos = 0;
  while (pos <= query.size() && !query.empty()) {
    size_t amp = query.find('&', pos);
    if (amp == std::string::npos) amp = query.size();
    const std::string part = query.substr(pos, amp - pos);
    if (!part.empty()) {
      const size_t eq = part.find('=');
      auto name = Decode(part.substr(0, eq));
      auto value = Decode(eq == std::string::npos ? "" : part.substr(eq + 1));
      if (!name || !value) return false;
      params->emplace(*name, *value);
    }
    pos = amp + 1;
  }
  return true;
}

Json Descriptor(const MasterService::ReplicaView& r) {
  Json d;
  d["size_"] = r.size;
  d["buffer_address_"] = r.addr;
  d["protocol_"] = "tcp";
  d["transport_endpoint_"] = r.segment_name;
  return d;
}

HttpReply Listing(const std::vector<std::string>& items, size_t total) {
  std::string body;
  for (const auto& s : items) {
    body += s;
    body += '\n';
  }
  HttpReply r = Reply(200, "text/plain; version=0.0.4", std::move(body));
  r.headers.emplace_back("X-Mooncake-Total-Count", std::to_string(total));
  if (items.size() < total) r.headers.emplace_back("X-Mooncake-Truncated", "true");
  return r;
}

// "service plane is not active: ..." (upstream's words first), saying where to go instead.
std::string NotActiveMessage(const HaView& view) {
  std::string m = "service plane is not active: ";
  if (view.role == "leader") {
    return m + "this master is the leader, in state " + view.ha_state + "; retry shortly";
  }
  m += "this master is a standby; ";
  m += view.leader_address.empty() ? "no leader is known yet"
                                   : "the leader is " + view.leader_address;
  if (view.ha_state != "standby") m += " (ha_state " + view.ha_state + ")";
  return m;
}

// Upstream's reply of the table endpoints on a master that is not serving.
HttpReply NotActive(const HaView& view) {
  HttpReply r =
      ErrorJson(503, ErrorCode::UNAVAILABLE_IN_CURRENT_MODE, NotActiveMessage(view));
  if (view.role == "leader") r.headers.emplace_back("Retry-After", "1");
  return r;
}

// The summary's tail: the HA counters and the leader, when HA is on.
std::string HaSummary(const HaView& view) {
  if (!view.enabled) return "";
  std::string text = ", ha={applied_seq: " + std::to_string(view.applied_seq) +
                     " | durable_seq: " + std::to_string(view.durable_seq) +
                     " | pending: " + std::to_string(view.pending_entries) +
                     " | checkpoint_seq: " + std::to_string(view.checkpoint_seq) + "}";
  if (!view.leader_address.empty()) {
    text += ", leader=" + view.leader_address +
            ", view_version=" + std::to_string(view.view_version);
  }
  return text;
}

HttpReply Summary(MasterService& master, const HaView& view) {
  std::string text = "role=" + view.role + ", state=" + view.ha_state +
                     ", service_ready=" + (view.service_ready ? "true" : "false");
  if (!view.service_ready) {
    return Reply(200, "text/plain; version=0.0.4",
                 text + ", master={" + NotActiveMessage(view) + "}" + HaSummary(view));
  }
  const auto s = master.GetSummary();
  text += ", master={Mem Storage: " + ByteSizeString(s.allocated) + " / " + ByteSizeString(s.capacity);
  if (s.capacity > 0) {
    char pct[32];
    std::snprintf(pct, sizeof(pct), " (%.1f%%)",
                  100.0 * static_cast<double>(s.allocated) / static_cast<double>(s.capacity));
    text += pct;
  }
  text += " | Keys: " + std::to_string(s.keys) + " (soft-pinned: " +
          std::to_string(s.soft_pinned_keys) + ") | Clients: " + std::to_string(s.clients) +
          " | Segments: " + std::to_string(s.segments) + "}" + HaSummary(view);
  return Reply(200, "text/plain; version=0.0.4", text);
}

// ?tenant_id= of the key queries and listings (ours: upstream's read the default tenant's).
std::string TenantParam(const std::map<std::string, std::string>& params) {
  auto it = params.find("tenant_id");
  return it == params.end() || it->second.empty() ? std::string("default") : it->second;
}

HttpReply QueryKey(MasterService& master, const std::map<std::string, std::string>& params) {
  auto it = params.find("key");
  if (it == params.end() || it->second.empty()) {
    return ErrorJson(400, ErrorCode::INVALID_KEY, "a key is required: /query_key?key=<key>");
  }
  if (it->second.size() > kMaxKeyBytes) {
    return ErrorJson(400, ErrorCode::INVALID_KEY,
                     "the key is over " + std::to_string(kMaxKeyBytes) + " bytes");
  }
  std::vector<MasterService::ReplicaView> replicas;
  const ErrorCode code = master.QueryKey(it->second, &replicas, TenantParam(params));
  if (code == ErrorCode::INVALID_PARAMS) return ErrorJson(400, code, "invalid tenant_id");
  if (code != ErrorCode::OK) return ErrorJson(404, code, ErrorCodeName(code));
  Json data = Json::array();
  for (const auto& r : replicas) data.push_back(Descriptor(r));
  Json j;
  j["success"] = true;
  j["data"] = std::move(data);
  return JsonReply(200, j);
}

HttpReply BatchQueryKeys(MasterService& master,
                         const std::map<std::string, std::string>& params) {
  auto bad = [](const std::string& message) {
    Json j;
    j["success"] = false;
    j["error"] = message;
    return JsonReply(400, j);
  };
  auto it = params.find("keys");
  if (it == params.end() || it->second.empty()) {
    return bad("No keys provided. Use ?keys=key1,key2,...");
  }
  std::vector<std::string> keys;
  size_t pos = 0;
  for (;;) {
    const size_t comma = it->second.find(',', pos);
    keys.push_back(it->second.substr(pos, comma - pos));
    if (keys.size() > kMaxBatchItems) {
      return bad("over " + std::to_string(kMaxBatchItems) + " keys in one request");
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  // ordered_json's object is a vector searched linearly: dedup and append without it, or
  // 4096 long keys cost 4096^2 / 2 key comparisons (seconds).
  Json data = Json::object();
  auto& entries = data.get_ref<Json::object_t&>();
  std::unordered_set<std::string> seen;
  for (const auto& key : keys) {
    if (!seen.insert(key).second) continue;
    std::vector<MasterService::ReplicaView> replicas;
    const ErrorCode code = master.QueryKey(key, &replicas, TenantParam(params));
    Json item;
    item["ok"] = code == ErrorCode::OK;
    if (code != ErrorCode::OK) {
      item["error"] = ErrorCodeName(code);
    } else {
      Json values = Json::array();
      for (const auto& r : replicas) values.push_back(Descriptor(r));
      item["values"] = std::move(values);
    }
    entries.emplace_back(key, std::move(item));  // a vector's: no search
  }
  Json j;
  j["success"] = true;
  j["data"] = std::move(data);
  return JsonReply(200, j);
}

HttpReply QuerySegment(MasterService& master,
                       const std::map<std::string, std::string>& params) {
  auto it = params.find("segment");
  if (it == params.end() || it->second.empty()) {
    return Reply(400, "text/plain", "a segment is required: /query_segment?segment=<name>\n");
  }
  size_t total = 0;
  uint64_t used = 0, capacity = 0;
  bool found = false;
  for (const auto& s : master.ListSegments(SIZE_MAX, &total)) {
    if (s.name != it->second) continue;
    found = true;
    used += s.allocated;
    capacity += s.size;
  }
  if (!found) return Reply(404, "text/plain", "segment not found: " + it->second + "\n");
  return Reply(200, "text/plain; version=0.0.4",
               it->second + "\nUsed(bytes): " + std::to_string(used) +
                   "\nCapacity(bytes) : " + std::to_string(capacity) + "\n");
}

bool WalksATable(const std::string& path) {
  return path == "/get_all_keys" || path == "/get_all_segments" || path == "/query_segment" ||
         path == "/batch_query_keys" || path == "/metrics/summary";
}

// The endpoints that read the master's tables: only a serving master answers them.
bool NeedsService(const std::string& path) {
  return path == "/get_all_keys" || path == "/get_all_segments" || path == "/query_segment" ||
         path == "/batch_query_keys" || path == "/query_key" || path == kTenantQuotas;
}

// Upstream's HA metrics (ha_*) and ours (master_ha_*), for a master run with HA.
std::string HaMetricsText(const HaView& view) {
  std::string out;
  auto metric = [&](const char* type, const char* name, const char* help, uint64_t v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
           name + " " + std::to_string(v) + "\n";
  };
  const bool leader = view.role == "leader";
  const uint64_t lag =
      !leader && view.durable_seq > view.applied_seq ? view.durable_seq - view.applied_seq : 0;
  metric("gauge", "ha_oplog_applied_sequence_id",
         "Last log sequence this master applied (standby) or appended (leader)",
         view.applied_seq);
  metric("gauge", "ha_oplog_last_sequence_id", "Last log sequence durable in etcd",
         view.durable_seq);
  metric("gauge", "ha_oplog_standby_lag",
         "Durable log entries this standby has not applied yet (0 on the leader)", lag);
  metric("gauge", "ha_oplog_pending_entries", "Log entries appended, not yet durable in etcd",
         view.pending_entries);
  metric("counter", "ha_batch_record_durable_batches_total", "Log batches written to etcd",
         view.durable_batches);
  metric("counter", "ha_batch_record_durable_entries_total",
         "Log entries in the batches written to etcd", view.durable_entries);
  metric("counter", "master_ha_fenced_writes_total",
         "Log batches refused because another master leads", view.fenced_writes);
  metric("counter", "master_ha_promotions_total", "Times this master became the leader",
         view.promotions);
  metric("gauge", "master_ha_checkpoint_sequence_id",
         "Log sequence the latest metadata checkpoint covers", view.checkpoint_seq);
  metric("gauge", "master_ha_role", "1 on the leader, 0 on a standby", leader ? 1 : 0);
  metric("gauge", "master_ha_service_ready", "1 while this master serves Store calls",
         view.service_ready ? 1 : 0);
  return out;
}

HttpReply Health(const HaView& view) {
  Json j;
  j["status"] = "ok";
  j["role"] = view.role;
  j["ha_state"] = view.ha_state;
  j["service_ready"] = view.service_ready;
  if (!view.leader_address.empty()) {
    j["leader_address"] = view.leader_address;
    j["view_version"] = view.view_version;
  }
  return JsonReply(200, j);
}

HttpReply Leader(const HaView& view) {
  Json j;
  j["present"] = !view.leader_address.empty();
  if (!view.leader_address.empty()) {
    j["leader_address"] = view.leader_address;
    j["view_version"] = view.view_version;
  }
  return JsonReply(200, j);
}

Json SnapshotJson(const TenantSnapshot& s) {
  Json j;
  j["tenant_id"] = s.tenant_id;
  j["requested_quota_bytes"] = s.requested_quota_bytes;
  j["effective_quota_bytes"] = s.effective_quota_bytes;
  j["charged_bytes"] = s.charged_bytes;
  j["admission_closed"] = s.admission_closed;
  j["over_quota"] = s.over_quota;
  j["has_explicit_policy"] = s.has_explicit_policy;
  return j;
}

HttpReply NotStrict() {
  return ErrorJson(409, ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                   "tenant quotas need strict multi-tenant mode: start the master with "
                   "--enable_multi_tenants");
}

// GET /api/v1/tenant_quotas[?tenant_id=T]: every tenant with a policy or a charge, or T's.
HttpReply TenantQuotas(MasterService& master, const std::map<std::string, std::string>& params) {
  if (!master.multi_tenants()) return NotStrict();
  Json j;
  j["success"] = true;
  auto it = params.find("tenant_id");
  if (it == params.end() || it->second.empty()) {
    Json data = Json::array();
    for (const TenantSnapshot& s : master.TenantSnapshots()) data.push_back(SnapshotJson(s));
    j["data"] = std::move(data);
    return JsonReply(200, j);
  }
  TenantSnapshot s;
  const ErrorCode code = master.TenantSnapshotOf(it->second, &s);
  if (code == ErrorCode::INVALID_PARAMS) return ErrorJson(400, code, "Invalid tenant_id");
  if (code != ErrorCode::OK) return ErrorJson(404, code, ErrorCodeName(code));
  j["data"] = SnapshotJson(s);
  return JsonReply(200, j);
}

HttpReply Route(MasterService& master, const HaView& view, const std::string& path,
                const std::map<std::string, std::string>& params) {
  if (path == "/metrics") {
    std::string text = master.MetricsText();
    if (view.enabled) text += HaMetricsText(view);
    return Reply(200, "text/plain; version=0.0.4", std::move(text));
  }
  if (path == "/metrics/summary") return Summary(master, view);
  if (path == "/health") return Health(view);
  if (path == "/leader") return Leader(view);
  if (path == "/role") return Reply(200, "text/plain; charset=utf-8", view.role);
  if (path == "/ha_status") return Reply(200, "text/plain; charset=utf-8", view.ha_state);
  if (NeedsService(path) && !view.service_ready) return NotActive(view);
  if (path == "/get_all_keys") {
    size_t total = 0;
    auto keys = master.ListKeys(kMaxListed, kMaxListedBytes, &total, TenantParam(params));
    return Listing(keys, total);
  }
  if (path == "/get_all_segments") {
    size_t total = 0;
    std::vector<std::string> names;
    size_t bytes = 0;
    for (auto& s : master.ListSegments(kMaxListed, &total)) {
      if (bytes + s.name.size() > kMaxListedBytes) break;
      bytes += s.name.size();
      names.push_back(std::move(s.name));
    }
    return Listing(names, total);
  }
  if (path == "/query_segment") return QuerySegment(master, params);
  if (path == "/query_key") return QueryKey(master, params);
  if (path == "/batch_query_keys") return BatchQueryKeys(master, params);
  if (path == kTenantQuotas) return TenantQuotas(master, params);
  return Reply(404, "text/plain", "unknown path " + path + "; this master serves " +
                                      std::string(kEndpoints) + "\n");
}

}  // namespace

HttpReply MasterHttp::ServeWrite(const std::string& method, const std::string& target,
                                 const std::string& body) {
  const size_t q = target.find('?');
  const std::string path = target.substr(0, q);
  std::map<std::string, std::string> params;
  if (q != std::string::npos && !ParseQuery(target.substr(q + 1), &params)) {
    return Reply(400, "text/plain", "bad percent-encoding in the query\n");
  }
  if (path != kTenantQuotas || (method != "PUT" && method != "DELETE")) {
    return Reply(405, "text/plain", method + " " + path + ": only PUT and DELETE " +
                                        kTenantQuotas + " change anything on this master\n");
  }
  auto it = params.find("tenant_id");
  if (it == params.end() || !TenantIdProblem(it->second).empty()) {
    return ErrorJson(400, ErrorCode::INVALID_PARAMS, "Missing or invalid tenant_id");
  }
  const std::string tenant = it->second;
  uint64_t bytes = 0;
  if (method == "PUT") {
    const Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
    const Json* v = j.is_object() && j.contains("requested_quota_bytes")
                        ? &j["requested_quota_bytes"]
                        : nullptr;
    if (v == nullptr || !v->is_number_unsigned() || v->get<uint64_t>() == 0 ||
        v->get<uint64_t>() > TenantLedger::kMaxQuotaBytes) {
      return ErrorJson(400, ErrorCode::INVALID_PARAMS,
                       "the body must be {\"requested_quota_bytes\": N} with N in [1, 2^63 - 1]");
    }
    bytes = v->get<uint64_t>();
  }
  const HaView view = ha_view_ ? ha_view_() : HaView{};
  if (!view.service_ready) return NotActive(view);
  const std::shared_ptr<MasterService> master = master_();
  if (!master->multi_tenants()) return NotStrict();
  // One change at a time: the policy saved is the one in force.
  MutexLock admin(&admin_mu_);
  TenantPolicies policies = master->GetTenantPolicies();
  Json j;
  j["success"] = true;
  if (method == "PUT") {
    if (policies.count(tenant) == 0 && policies.size() >= kMaxTenants) {
      return ErrorJson(409, ErrorCode::INVALID_PARAMS,
                       "the policy holds " + std::to_string(policies.size()) +
                           " tenants, the limit: remove one first");
    }
    policies[tenant] = bytes;
    if (policies_ != nullptr) {
      const Status saved = policies_->Save(policies);
      if (!saved.ok()) {
        return ErrorJson(500, ErrorCode::INTERNAL_ERROR,
                         "the policy was not changed: " + saved.message());
      }
    }
    TenantSnapshot now;
    const ErrorCode code = master->UpsertTenantPolicy(tenant, bytes, &now);
    if (code != ErrorCode::OK) return ErrorJson(400, code, ErrorCodeName(code));
    j["data"] = SnapshotJson(now);
    return JsonReply(200, j);
  }
  TenantSnapshot last;
  const ErrorCode code = master->DeleteTenantPolicy(tenant, &last);
  if (code == ErrorCode::OBJECT_NOT_FOUND) {
    return ErrorJson(404, code, "tenant " + tenant + " has no policy");
  }
  if (code == ErrorCode::TENANT_NOT_EMPTY) {
    return ErrorJson(409, code, "TENANT_NOT_EMPTY: tenant " + tenant +
                                    " still holds objects; remove them first");
  }
  if (code != ErrorCode::OK) return ErrorJson(400, code, ErrorCodeName(code));
  policies.erase(tenant);
  if (policies_ != nullptr) {
    const Status saved = policies_->Save(policies);
    if (!saved.ok()) {
      master->UpsertTenantPolicy(tenant, last.requested_quota_bytes, nullptr);
      return ErrorJson(500, ErrorCode::INTERNAL_ERROR,
                       "the policy was not changed: " + saved.message());
    }
  }
  j["data"] = SnapshotJson(last);
  return JsonReply(200, j);
}

HttpReply MasterHttp::Serve(const std::string& target) {
  const size_t q = target.find('?');
  const std::string path = target.substr(0, q);
  std::map<std::string, std::string> params;
  if (q != std::string::npos && !ParseQuery(target.substr(q + 1), &params)) {
    return Reply(400, "text/plain", "bad percent-encoding in the query\n");
  }
  if (path == "/kv_events/status") {
    std::function<std::string()> status;
    {
      MutexLock lock(&mu_);
      status = kv_events_status_;
    }
    return Reply(200, "application/json; charset=utf-8",
                 status ? status()
                        : std::string("{\"enabled\":false,\"published_batches\":0,"
                                      "\"published_events\":0,\"dropped_events\":0,"
                                      "\"skipped_unparsed_keys\":0}"));
  }
  const HaView view = ha_view_ ? ha_view_() : HaView{};
  // A master that does not serve walks no table: it answers without waiting its turn.
  const std::shared_ptr<MasterService> master = master_();
  if (!WalksATable(path) || !view.service_ready) return Route(*master, view, path, params);
  const auto start = now_();
  {
    MutexLock lock(&mu_);
    if (heavy_after_ > start + kWalkBurst) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          heavy_after_ - kWalkBurst - start)
                          .count();
      HttpReply r = Reply(503, "text/plain",
                          "the master is busy with listings; retry in " +
                              std::to_string(ms + 1) + " ms\n");
      r.headers.emplace_back("Retry-After", "1");
      return r;
    }
  }
  HttpReply r = Route(*master, view, path, params);
  const auto took = now_() - start;
  {
    // Each walk owes four times its length of time without walks (walks take <= 1/5 of the
    // time on average); up to kWalkBurst of that debt may stand, so a few listings in a row
    // (a dashboard's refresh) are served.
    MutexLock lock(&mu_);
    heavy_after_ = std::max(heavy_after_, start) + 5 * took;
  }
  return r;
}

}  // namespace store
}  // namespace mooncake
