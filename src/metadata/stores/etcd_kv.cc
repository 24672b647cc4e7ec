// EtcdKv over etcd's JSON gateway (grpc-gateway): every call is one POST of a JSON request to
// "/v3/<service>/<method>", answered by one JSON object. proto3 JSON rules apply both ways:
// bytes are base64, int64 are decimal strings, and a field at its default (0, false, empty)
// is left out of a reply.
#include "metadata/stores/etcd_kv.h"

#include <atomic>
#include <cstdlib>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/thread_annotations.h"
#include "metadata/stores/curl_client.h"

namespace mooncake {
namespace {

using nlohmann::json;

constexpr size_t kMaxIdleClients = 8;

// int64 as the gateway renders it (a JSON string; a number is accepted too). False when the
// field is absent or malformed; *out is left alone then.
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

int64_t JsonInt64Or0(const json& j, const char* field) {
  int64_t v = 0;
  JsonInt64(j, field, &v);
  return v;
}

std::string JsonString(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

bool JsonBool(const json& j, const char* field) {
  auto it = j.find(field);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

// The store revision of a reply's "header" (0 when absent).
int64_t HeaderRevision(const json& reply) {
  auto h = reply.find("header");
  return h != reply.end() && h->is_object() ? JsonInt64Or0(*h, "revision") : 0;
}

// A gRPC status code and message from etcd as a Status, by what the caller should do.
Status FromGrpcCode(int64_t code, const std::string& m) {
  switch (code) {
    case 3:  // InvalidArgument; etcd's "request is too large" among them
      if (m.find("request is too large") != std::string::npos) {
        return Status::ResourceExhausted(m);
      }
      return Status::InvalidArgument(m);
    case 11: return Status::InvalidArgument(m);  // OutOfRange: a compacted or future revision
    case 4: return Status::DeadlineExceeded(m);
    case 5: return Status::NotFound(m);
    case 6: return Status::AlreadyExists(m);
    case 7:
    case 16: return Status::PermissionDenied(m);
    case 8: return Status::ResourceExhausted(m);
    case 9: return Status::FailedPrecondition(m);
    default: return Status::Unavailable(m);  // Unavailable, Internal, Unknown, no code at all
  }
}

// A gateway error reply ({"error","message","code"}) as a Status.
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
  return FromGrpcCode(code, where + ": " + message);
}

Result<std::string> Unbase64(const json& j, const char* field, const std::string& where) {
  std::string out;
  if (!Base64Decode(JsonString(j, field), &out)) {
    return Status::DataLoss(where + ": malformed base64 in '" + field + "'");
  }
  return out;
}

// A RangeResponse ({"kvs":[...],"more":true,"count":"N"}).
Result<EtcdRange> ParseRange(const json& reply, const std::string& where) {
  EtcdRange range;
  range.more = JsonBool(reply, "more");
  range.count = JsonInt64Or0(reply, "count");
  range.revision = HeaderRevision(reply);
  auto kvs = reply.find("kvs");
  if (kvs == reply.end()) return range;
  if (!kvs->is_array()) return Status::DataLoss(where + ": 'kvs' is not an array");
  for (const json& kv : *kvs) {
    if (!kv.is_object()) return Status::DataLoss(where + ": a kv is not an object");
    EtcdKeyValue out;
    MC_ASSIGN_OR_RETURN(out.key, Unbase64(kv, "key", where));
    MC_ASSIGN_OR_RETURN(out.value, Unbase64(kv, "value", where));
    out.create_revision = JsonInt64Or0(kv, "create_revision");
    out.mod_revision = JsonInt64Or0(kv, "mod_revision");
    out.version = JsonInt64Or0(kv, "version");
    out.lease = JsonInt64Or0(kv, "lease");
    range.kvs.push_back(std::move(out));
  }
  return range;
}

json CompareJson(const EtcdCompare& c) {
  static const char* const kTargets[] = {"CREATE", "MOD", "VERSION", "VALUE", "LEASE"};
  static const char* const kFields[] = {"create_revision", "mod_revision", "version", "value",
                                        "lease"};
  static const char* const kOps[] = {"EQUAL", "NOT_EQUAL", "GREATER", "LESS"};
  const int t = static_cast<int>(c.target);
  json j = {{"key", Base64Encode(c.key)}, {"target", kTargets[t]},
            {"result", kOps[static_cast<int>(c.op)]}};
  if (c.target == EtcdCompare::Target::kValue) {
    j[kFields[t]] = Base64Encode(c.value);
  } else {
    j[kFields[t]] = std::to_string(c.number);
  }
  return j;
}

json RangeJson(const std::string& key, const std::string& range_end, int64_t limit,
               bool keys_only) {
  json j = {{"key", Base64Encode(key)}};
  if (!range_end.empty()) j["range_end"] = Base64Encode(range_end);
  if (limit > 0) j["limit"] = std::to_string(limit);
  if (keys_only) j["keys_only"] = true;
  return j;
}

json PutJson(const std::string& key, const std::string& value, int64_t lease) {
  json j = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) j["lease"] = std::to_string(lease);
  return j;
}

json DeleteJson(const std::string& key, const std::string& range_end) {
  json j = {{"key", Base64Encode(key)}};
  if (!range_end.empty()) j["range_end"] = Base64Encode(range_end);
  return j;
}

json OpJson(const EtcdOp& op) {
  switch (op.type) {
    case EtcdOp::Type::kPut: return {{"request_put", PutJson(op.key, op.value, op.lease)}};
    case EtcdOp::Type::kDeleteRange:
      return {{"request_delete_range", DeleteJson(op.key, op.range_end)}};
    case EtcdOp::Type::kRange:
      return {{"request_range", RangeJson(op.key, op.range_end, op.limit, false)}};
  }
  return json::object();
}

// One ResponseOp of a txn reply, as the EtcdRange the header promises.
Result<EtcdRange> ParseResponseOp(const json& op, const std::string& where) {
  if (!op.is_object()) return Status::DataLoss(where + ": a txn response is not an object");
  if (auto r = op.find("response_range"); r != op.end() && r->is_object()) {
    return ParseRange(*r, where);
  }
  EtcdRange out;
  if (auto d = op.find("response_delete_range"); d != op.end() && d->is_object()) {
    out.count = JsonInt64Or0(*d, "deleted");
    out.revision = HeaderRevision(*d);
  } else if (auto p = op.find("response_put"); p != op.end() && p->is_object()) {
    out.revision = HeaderRevision(*p);
  }
  return out;
}

}  // namespace

struct EtcdKv::Impl {
  // A reply and the endpoint that gave it ("etcd h:p", for messages).
  struct Reply {
    json body;
    std::string where;
    std::string endpoint;
  };

  Impl(std::vector<HostPort> e, const Options& o) : endpoints(std::move(e)), options(o) {}

  std::unique_ptr<CurlClient> TakeClient() MC_EXCLUDES(pool_mu) {
    {
      MutexLock lock(&pool_mu);
      if (!idle.empty()) {
        std::unique_ptr<CurlClient> c = std::move(idle.back());
        idle.pop_back();
        return c;
      }
    }
    return std::make_unique<CurlClient>(options.connect_timeout_ms, options.request_timeout_ms,
                                        options.max_response_bytes);
  }

  void ReturnClient(std::unique_ptr<CurlClient> c) MC_EXCLUDES(pool_mu) {
    MutexLock lock(&pool_mu);
    if (idle.size() < kMaxIdleClients) idle.push_back(std::move(c));
  }

  // POSTs `request` to `path` on the endpoints in turn, from the one that answered last;
  // the reply of the first that answers, or its error (only Unavailable moves on).
  Result<Reply> Call(const std::string& path, const json& request, int timeout_ms);

  const std::vector<HostPort> endpoints;
  const Options options;
  std::atomic<size_t> current{0};  // the endpoint tried first
  Mutex pool_mu;
  std::vector<std::unique_ptr<CurlClient>> idle MC_GUARDED_BY(pool_mu);
};

Result<EtcdKv::Impl::Reply> EtcdKv::Impl::Call(const std::string& path, const json& request,
                                               int timeout_ms) {
  const std::string body = request.dump();
  const size_t n = endpoints.size();
  const size_t first = current.load(std::memory_order_relaxed) % n;
  std::unique_ptr<CurlClient> client = TakeClient();
  std::string failures;
  Status failed;
  for (size_t i = 0; i < n; ++i) {
    const size_t idx = (first + i) % n;
    const std::string hostport = endpoints[idx].ToString();
    const std::string where = "etcd " + hostport;
    auto r = client->Perform("POST", "http://" + hostport + path, &body, "application/json",
                             timeout_ms);
    if (!r.ok()) {
      failed = r.status().WithContext(where);
    } else if (r->status == 200) {
      current.store(idx, std::memory_order_relaxed);
      ReturnClient(std::move(client));
      json j = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) {
        return Status::DataLoss(where + ": " + path + ": malformed JSON reply: " +
                                r->body.substr(0, 200));
      }
      return Reply{std::move(j), where, hostport};
    } else {
      failed = GatewayError(where, r->status, r->body);
    }
    // Only a member that cannot serve is worth another; other errors are answers.
    if (!failed.IsUnavailable()) {
      current.store(idx, std::memory_order_relaxed);
      ReturnClient(std::move(client));
      return failed;
    }
    if (!failures.empty()) failures += "; ";
    failures += failed.message();
  }
  ReturnClient(std::move(client));
  if (n == 1) return failed;
  return Status::Unavailable(failures);
}

Result<std::unique_ptr<EtcdKv>> EtcdKv::Create(std::vector<HostPort> endpoints,
                                               const Options& options) {
  if (endpoints.empty()) return Status::InvalidArgument("etcd: no endpoint given");
  return std::unique_ptr<EtcdKv>(
      new EtcdKv(std::make_unique<Impl>(std::move(endpoints), options)));
}

EtcdKv::EtcdKv(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdKv::~EtcdKv() = default;

std::string EtcdKv::Describe() const {
  std::string s = "etcd ";
  for (size_t i = 0; i < impl_->endpoints.size(); ++i) {
    if (i) s += ",";
    s += impl_->endpoints[i].ToString();
  }
  return s;
}

Result<EtcdRange> EtcdKv::Range(const std::string& key, const std::string& range_end,
                                int64_t limit, bool keys_only, int timeout_ms) {
  MC_ASSIGN_OR_RETURN(Impl::Reply r, impl_->Call("/v3/kv/range",
                                                 RangeJson(key, range_end, limit, keys_only),
                                                 timeout_ms));
  return ParseRange(r.body, r.where);
}

Result<int64_t> EtcdKv::Put(const std::string& key, const std::string& value, int64_t lease,
                            int timeout_ms) {
  MC_ASSIGN_OR_RETURN(Impl::Reply r,
                      impl_->Call("/v3/kv/put", PutJson(key, value, lease), timeout_ms));
  return HeaderRevision(r.body);
}

Result<int64_t> EtcdKv::Delete(const std::string& key, const std::string& range_end,
                               int timeout_ms) {
  MC_ASSIGN_OR_RETURN(Impl::Reply r, impl_->Call("/v3/kv/deleterange",
                                                 DeleteJson(key, range_end), timeout_ms));
  return JsonInt64Or0(r.body, "deleted");
}

Result<EtcdTxnResult> EtcdKv::Txn(const std::vector<EtcdCompare>& compares,
                                  const std::vector<EtcdOp>& success,
                                  const std::vector<EtcdOp>& failure, int timeout_ms) {
  json request = {{"compare", json::array()}, {"success", json::array()},
                  {"failure", json::array()}};
  for (const EtcdCompare& c : compares) request["compare"].push_back(CompareJson(c));
  for (const EtcdOp& op : success) request["success"].push_back(OpJson(op));
  for (const EtcdOp& op : failure) request["failure"].push_back(OpJson(op));
  MC_ASSIGN_OR_RETURN(Impl::Reply r, impl_->Call("/v3/kv/txn", request, timeout_ms));
  EtcdTxnResult result;
  result.succeeded = JsonBool(r.body, "succeeded");
  result.revision = HeaderRevision(r.body);
  auto responses = r.body.find("responses");
  if (responses != r.body.end()) {
    if (!responses->is_array()) return Status::DataLoss(r.where + ": 'responses' is not an array");
    for (const json& op : *responses) {
      MC_ASSIGN_OR_RETURN(EtcdRange range, ParseResponseOp(op, r.where));
      result.responses.push_back(std::move(range));
    }
  }
  const size_t ran = (result.succeeded ? success : failure).size();
  if (result.responses.size() != ran) {
    return Status::DataLoss(r.where + ": txn answered " + std::to_string(result.responses.size()) +
                            " responses for " + std::to_string(ran) + " ops");
  }
  return result;
}

Result<int64_t> EtcdKv::LeaseGrant(int64_t ttl_s, int timeout_ms) {
  if (ttl_s <= 0) {
    return Status::InvalidArgument(Describe() + ": lease TTL must be positive, not " +
                                   std::to_string(ttl_s));
  }
  MC_ASSIGN_OR_RETURN(Impl::Reply r, impl_->Call("/v3/lease/grant",
                                                 json{{"TTL", std::to_string(ttl_s)}},
                                                 timeout_ms));
  int64_t id = JsonInt64Or0(r.body, "ID");
  if (id == 0) {
    std::string error = JsonString(r.body, "error");
    return Status::Unavailable(r.where + ": lease grant failed: " +
                               (error.empty() ? std::string("no lease ID") : error));
  }
  return id;
}

Result<int64_t> EtcdKv::LeaseKeepAlive(int64_t lease, int timeout_ms) {
  MC_ASSIGN_OR_RETURN(Impl::Reply r, impl_->Call("/v3/lease/keepalive",
                                                 json{{"ID", std::to_string(lease)}},
                                                 timeout_ms));
  // A streamed reply: {"result":{...,"TTL":"10"}}, TTL left out once the lease is gone; or
  // {"error":{"grpc_code":N,"message":...}} when the stream failed.
  auto result = r.body.find("result");
  if (result == r.body.end() || !result->is_object()) {
    auto error = r.body.find("error");
    if (error != r.body.end() && error->is_object()) {
      int64_t code = -1;
      if (!JsonInt64(*error, "grpc_code", &code)) JsonInt64(*error, "code", &code);
      return FromGrpcCode(code, r.where + ": lease keep-alive: " + JsonString(*error, "message"));
    }
    return Status::Unavailable(r.where + ": keep-alive reply without a result: " +
                               r.body.dump().substr(0, 200));
  }
  int64_t ttl = JsonInt64Or0(*result, "TTL");
  if (ttl <= 0) {
    return Status::NotFound(r.where + ": lease " + std::to_string(lease) +
                            " not found (expired or revoked)");
  }
  return ttl;
}

Status EtcdKv::LeaseRevoke(int64_t lease, int timeout_ms) {
  auto r = impl_->Call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}, timeout_ms);
  if (!r.ok() && !r.status().IsNotFound()) return r.status();
  return Status::OK();
}

Status EtcdKv::Compact(int64_t revision, int timeout_ms) {
  // physical: the reply waits until the old revisions are removed from the backend, so that
  // a status taken after it sees their space free.
  json request = {{"revision", std::to_string(revision)}, {"physical", true}};
  auto r = impl_->Call("/v3/kv/compaction", request, timeout_ms);
  if (!r.ok()) {
    if (r.status().IsInvalidArgument() &&
        r.status().message().find("has been compacted") != std::string::npos) {
      return Status::OK();
    }
    return r.status();
  }
  return Status::OK();
}

Result<EtcdKv::MemberStatus> EtcdKv::GetStatus(int timeout_ms) {
  MC_ASSIGN_OR_RETURN(Impl::Reply r,
                      impl_->Call("/v3/maintenance/status", json::object(), timeout_ms));
  MemberStatus s;
  s.db_size = JsonInt64Or0(r.body, "dbSize");
  s.db_size_in_use = JsonInt64Or0(r.body, "dbSizeInUse");
  s.revision = HeaderRevision(r.body);
  s.endpoint = r.endpoint;
  return s;
}

}  // namespace mooncake
