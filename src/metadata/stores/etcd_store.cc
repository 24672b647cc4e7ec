#include "metadata/stores/etcd_store.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <utility>

namespace mooncake {
namespace {

using nlohmann::json;

constexpr int kRevokeTimeoutMs = 1000;

// grpc-gateway renders int64 as a JSON string; accepts a number too.
bool JsonInt64(const json& j, const char* field, int64_t* out) {
  auto it = j.find(field);
  if (it == j.end()) return false;
  if (it->is_number_integer()) {
    *out = it->get<int64_t>();
    return true;
  }
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0') return false;
    *out = v;
    return true;
  }
  return false;
}

std::string JsonString(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

// Maps a gateway error reply ({"error","message","code"} with a gRPC code) to a Status.
Status GatewayError(const std::string& where, long http_status, const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  int64_t code = -1;
  std::string message;
  if (!j.is_discarded() && j.is_object()) {
    JsonInt64(j, "code", &code);
    message = JsonString(j, "message");
    if (message.empty()) message = JsonString(j, "error");
  }
  if (message.empty()) {
    message = "HTTP " + std::to_string(http_status) + ": " + body.substr(0, 200);
    if (http_status == 404) message += " (is this the client URL of etcd 3.4 or later?)";
  }
  std::string m = where + ": " + message;
  switch (code) {
    case 3: return Status::InvalidArgument(m);
    case 4: return Status::DeadlineExceeded(m);
    case 5: return Status::NotFound(m);
    case 7:
    case 16: return Status::PermissionDenied(m);
    case 8: return Status::ResourceExhausted(m);
    case 9: return Status::FailedPrecondition(m);
    default: return Status::Unavailable(m);
  }
}

bool IsLeaseNotFound(const Status& s) {
  return s.IsNotFound() && s.message().find("lease not found") != std::string::npos;
}

}  // namespace

Result<std::unique_ptr<MetadataStore>> EtcdStore::Create(std::vector<HostPort> endpoints,
                                                         const StoreOptions& options) {
  if (endpoints.empty()) return Status::InvalidArgument("etcd: no endpoint given");
  std::unique_ptr<EtcdStore> store(new EtcdStore(std::move(endpoints), options));
  if (options.lease_ttl_s > 0) {
    std::lock_guard<std::mutex> lock(store->mu_);
    MC_RETURN_IF_ERROR(store->RenewLeaseLocked(store->client_));
    store->keepalive_thread_ = std::thread([s = store.get()] { s->KeepAliveLoop(); });
  } else {
    json probe = {{"key", Base64Encode("mooncake/")}, {"count_only", true}};
    auto r = store->Call(store->client_, "/v3/kv/range", probe);
    if (!r.ok()) return r.status();
  }
  return std::unique_ptr<MetadataStore>(std::move(store));
}

EtcdStore::EtcdStore(std::vector<HostPort> endpoints, const StoreOptions& options)
    : endpoints_(std::move(endpoints)),
      options_(options),
      client_(options.connect_timeout_ms, options.request_timeout_ms),
      keepalive_client_(options.connect_timeout_ms, options.request_timeout_ms) {}

EtcdStore::~EtcdStore() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (keepalive_thread_.joinable()) keepalive_thread_.join();
  int64_t id = lease_id_.load();
  if (id != 0) {
    auto r = Call(client_, "/v3/lease/revoke", json{{"ID", std::to_string(id)}},
                  kRevokeTimeoutMs);
    if (!r.ok()) {
      LOG(WARNING) << Describe() << ": revoking lease " << id << " failed ("
                   << r.status().ToString() << "); its keys expire in " << options_.lease_ttl_s
                   << " s";
    }
  }
}

std::string EtcdStore::Describe() const {
  std::string s = "etcd://";
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    if (i) s += ",";
    s += endpoints_[i].ToString();
  }
  return s;
}

Result<json> EtcdStore::Call(CurlClient& client, const std::string& path, const json& request,
                             int timeout_ms) {
  const std::string body = request.dump();
  const size_t n = endpoints_.size();
  const size_t first = current_.load() % n;
  std::string failures;
  for (size_t i = 0; i < n; ++i) {
    const size_t idx = (first + i) % n;
    const std::string hostport = endpoints_[idx].ToString();
    const std::string where = "etcd " + hostport;
    auto r = client.Perform("POST", "http://" + hostport + path, &body, "application/json",
                            timeout_ms);
    Status failed;
    if (!r.ok()) {
      failed = r.status().WithContext(where);
    } else if (r->status == 200) {
      current_.store(idx);
      json j = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) {
        return Status::DataLoss(where + ": " + path + ": malformed JSON reply");
      }
      return j;
    } else {
      failed = GatewayError(where, r->status, r->body);
    }
    // Only a store that cannot serve is worth another endpoint; other errors are answers.
    if (!failed.IsUnavailable()) {
      current_.store(idx);
      return failed;
    }
    if (n == 1) return failed;
    if (!failures.empty()) failures += "; ";
    failures += failed.message();
  }
  return Status::Unavailable(failures);
}

Result<std::string> EtcdStore::Get(const std::string& key) {
  MC_ASSIGN_OR_RETURN(json reply, Call(client_, "/v3/kv/range", json{{"key", Base64Encode(key)}}));
  auto kvs = reply.find("kvs");
  if (kvs == reply.end() || !kvs->is_array() || kvs->empty()) {
    return Status::NotFound(Describe() + ": no key '" + key + "'");
  }
  const json& kv = (*kvs)[0];
  std::string value;
  // proto3 leaves an empty value out of the reply.
  if (kv.is_object() && !Base64Decode(JsonString(kv, "value"), &value)) {
    return Status::DataLoss(Describe() + ": malformed base64 value for '" + key + "'");
  }
  return value;
}

Status EtcdStore::PutLocked(CurlClient& client, const std::string& key,
                            const std::string& value, int64_t lease_id) {
  json request = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease_id != 0) request["lease"] = std::to_string(lease_id);
  auto r = Call(client, "/v3/kv/put", request);
  return r.ok() ? Status::OK() : r.status();
}

Status EtcdStore::Put(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = PutLocked(client_, key, value, lease_id_.load());
  if (IsLeaseNotFound(s)) {
    // The lease expired (we were cut off longer than the TTL): take a new one, which also
    // writes our earlier keys again, then retry this one.
    LOG(WARNING) << Describe() << ": lease " << lease_id_.load() << " is gone; granting a new one";
    MC_RETURN_IF_ERROR(RenewLeaseLocked(client_));
    s = PutLocked(client_, key, value, lease_id_.load());
  }
  if (s.ok() && options_.lease_ttl_s > 0) leased_[key] = value;
  return s;
}

Status EtcdStore::Remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto r = Call(client_, "/v3/kv/deleterange", json{{"key", Base64Encode(key)}});
  if (!r.ok()) return r.status();
  leased_.erase(key);
  return Status::OK();
}

Status EtcdStore::RenewLeaseLocked(CurlClient& client) {
  MC_ASSIGN_OR_RETURN(json reply, Call(client, "/v3/lease/grant",
                                       json{{"TTL", std::to_string(options_.lease_ttl_s)}}));
  int64_t id = 0;
  if (!JsonInt64(reply, "ID", &id) || id == 0) {
    std::string error = JsonString(reply, "error");
    return Status::Unavailable(Describe() + ": lease grant failed" +
                               (error.empty() ? std::string(": no lease ID") : ": " + error));
  }
  lease_id_.store(id);
  for (const auto& [key, value] : leased_) {
    Status s = PutLocked(client, key, value, id);
    if (!s.ok()) return s.WithContext("re-publishing '" + key + "' under a new lease");
  }
  return Status::OK();
}

void EtcdStore::KeepAliveLoop() {
  const auto interval =
      std::chrono::milliseconds(std::max(200, options_.lease_ttl_s * 1000 / 3));
  bool failing = false;
  std::unique_lock<std::mutex> stop_lock(stop_mu_);
  while (!stop_cv_.wait_for(stop_lock, interval, [this] { return stop_; })) {
    stop_lock.unlock();
    const int64_t id = lease_id_.load();
    auto r = Call(keepalive_client_, "/v3/lease/keepalive", json{{"ID", std::to_string(id)}});
    int64_t ttl = 0;
    if (r.ok()) {
      // A streamed reply: {"result":{...,"TTL":"10"}}, TTL left out once the lease is gone;
      // or {"error":{...}} when the server could not serve the stream.
      auto result = r->find("result");
      if (result != r->end() && result->is_object()) {
        JsonInt64(*result, "TTL", &ttl);
      } else {
        r = Status::Unavailable(Describe() + ": keep-alive reply without a result: " +
                                r->dump().substr(0, 200));
      }
    }
    if (!r.ok()) {
      if (!failing) {
        LOG(WARNING) << Describe() << ": lease keep-alive failed: " << r.status().ToString();
      }
      failing = true;
    } else if (ttl <= 0) {
      // The lease expired while we could not reach the store: renew it unless a Put did.
      std::lock_guard<std::mutex> lock(mu_);
      if (lease_id_.load() == id) {
        LOG(WARNING) << Describe() << ": lease " << id << " expired; granting a new one";
        Status s = RenewLeaseLocked(keepalive_client_);
        failing = !s.ok();
        if (!s.ok()) LOG(WARNING) << Describe() << ": " << s.ToString();
      }
    } else {
      if (failing) LOG(INFO) << Describe() << ": lease keep-alive works again";
      failing = false;
    }
    stop_lock.lock();
  }
}

}  // namespace mooncake
