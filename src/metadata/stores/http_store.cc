#include "metadata/stores/http_store.h"

#include <chrono>
#include <cstdlib>
#include <utility>

namespace mooncake {
namespace {

std::string SecretFromEnvironment() {
  const char* v = std::getenv("MC_AUTH_SECRET");
  return v ? v : "";
}

}  // namespace

Result<std::unique_ptr<MetadataStore>> HttpStore::Create(const std::string& url,
                                                         const StoreOptions& options) {
  std::unique_ptr<HttpStore> store(new HttpStore(url, options));
  auto r = store->client_.Perform("GET", store->KeyUrl("mooncake/.probe"), nullptr, "");
  if (!r.ok()) return r.status().WithContext(store->where_);
  return std::unique_ptr<MetadataStore>(std::move(store));
}

HttpStore::HttpStore(const std::string& url, const StoreOptions& options)
    : url_(url),
      // "http 127.0.0.1:8080/metadata", like "etcd 127.0.0.1:2379".
      where_(url.substr(0, url.find("://")) + " " + url.substr(url.find("://") + 3)),
      client_(options.connect_timeout_ms, options.request_timeout_ms),
      auth_(SecretFromEnvironment()) {}

std::vector<std::string> HttpStore::ProofHeaders(const std::string& method,
                                                 const std::string& key,
                                                 const std::string& body) const {
  if (!auth_.enabled()) return {};
  const std::string time = std::to_string(
      std::chrono::duration_cast<std::chrono::seconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
  auto nonce = Authenticator::NewInstanceId();  // 32 random hex digits
  if (!nonce.ok()) return {};  // the server (if it has the secret) refuses, saying why
  return {"X-MC-Auth-Time: " + time, "X-MC-Auth-Nonce: " + *nonce,
          "X-MC-Auth-Sig: " + auth_.SignStoreRequest(method, key, body, time, *nonce)};
}

std::string HttpStore::KeyUrl(const std::string& key) const {
  return url_ + (url_.find('?') == std::string::npos ? "?key=" : "&key=") + UrlEscape(key);
}

Status HttpStore::ErrorFor(const std::string& method, const std::string& key,
                           const HttpResponse& resp) const {
  std::string m = where_ + ": " + method + " '" + key + "': HTTP " +
                  std::to_string(resp.status) +
                  (resp.body.empty() ? "" : ": " + resp.body.substr(0, 600));
  if (resp.status == 404) return Status::NotFound(m);
  if (resp.status == 400 && method == "PUT" &&
      resp.body.find("Duplicate") != std::string::npos) {
    return Status::AlreadyExists(m);
  }
  if (resp.status == 401 || resp.status == 403) return Status::PermissionDenied(m);
  if (resp.status == 409) return Status::AlreadyExists(m);
  if (resp.status == 413) return Status::ResourceExhausted(m);
  if (resp.status >= 400 && resp.status < 500) return Status::InvalidArgument(m);
  return Status::Unavailable(m);
}

Result<std::string> HttpStore::Get(const std::string& key) {
  auto r = client_.Perform("GET", KeyUrl(key), nullptr, "");
  if (!r.ok()) return r.status().WithContext(where_);
  if (r->status != 200) return ErrorFor("GET", key, *r);
  return std::move(r->body);
}

Status HttpStore::Put(const std::string& key, const std::string& value) {
  auto r = client_.Perform("PUT", KeyUrl(key), &value, "application/json", 0,
                           ProofHeaders("PUT", key, value));
  if (!r.ok()) return r.status().WithContext(where_);
  if (r->status != 200) return ErrorFor("PUT", key, *r);
  return Status::OK();
}

Status HttpStore::Remove(const std::string& key) {
  auto r = client_.Perform("DELETE", KeyUrl(key), nullptr, "", 0, ProofHeaders("DELETE", key, ""));
  if (!r.ok()) return r.status().WithContext(where_);
  if (r->status == 404) return Status::OK();
  if (r->status != 200) return ErrorFor("DELETE", key, *r);
  return Status::OK();
}

}  // namespace mooncake
