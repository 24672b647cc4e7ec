// HttpStore: upstream's HTTP metadata protocol, spoken with libcurl:
//   GET|PUT|DELETE <url>?key=<url-escaped key>   (or &key= when the URL has a query already)
// A PUT carries the value as its body with Content-Type: application/json.
//
// Contract:
//   - Only HTTP 200 is success. GET 404 is NotFound; DELETE 404 is OK (the key is gone).
//   - PUT 400 whose body says "Duplicate" (a server that refuses to replace an rpc_meta key) is
//     AlreadyExists; other 4xx are InvalidArgument; 5xx and transport failures are Unavailable
//     ("http 127.0.0.1:8080/metadata: connect: Connection refused").
//   - Creation sends one GET (of a probe key) and accepts any HTTP answer: it only proves that
//     the server is there.
//   - Bounded by StoreOptions timeouts (upstream: 1.5 s to connect, 3 s in all).
//   - With MC_AUTH_SECRET in the environment (read at creation), every PUT and DELETE carries
//     a proof of the secret (X-MC-Auth-Time, X-MC-Auth-Nonce, X-MC-Auth-Sig: docs/wire_protocol.md
//     §5.5), which a server that has the secret requires; servers without one ignore it. A
//     refusal (403, or 409: the entry belongs to another live engine instance) is
//     PermissionDenied / AlreadyExists with the server's reason. GETs are never signed.
//     (The engine's EngineOptions::auth_secret set in code alone does not reach this client;
//     set MC_AUTH_SECRET.)
// Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/auth.h"
#include "metadata/metadata_store.h"
#include "metadata/stores/curl_client.h"

namespace mooncake {

class HttpStore final : public MetadataStore {
 public:
  // `url` is "http://host:port/path" or https.
  static Result<std::unique_ptr<MetadataStore>> Create(const std::string& url,
                                                       const StoreOptions& options);

  Result<std::string> Get(const std::string& key) override;
  Status Put(const std::string& key, const std::string& value) override;
  Status Remove(const std::string& key) override;
  std::string Describe() const override { return url_; }

 private:
  HttpStore(const std::string& url, const StoreOptions& options);
  std::string KeyUrl(const std::string& key) const;
  // The status for a non-200 answer to `method` on `key`.
  Status ErrorFor(const std::string& method, const std::string& key,
                  const HttpResponse& resp) const;

  // The proof headers of a write (none without a secret).
  std::vector<std::string> ProofHeaders(const std::string& method, const std::string& key,
                                        const std::string& body) const;

  const std::string url_;
  const std::string where_;  // "http 127.0.0.1:8080/metadata"
  CurlClient client_;
  const Authenticator auth_;  // MC_AUTH_SECRET
};

}  // namespace mooncake
