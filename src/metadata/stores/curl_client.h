// CurlClient: one libcurl easy handle behind a mutex, for the etcd (v3 JSON gateway) and http
// stores. Reusing the handle keeps the TCP connection to the store open between calls.
//
// Contract:
//   - Every request is bounded: connect by `connect_timeout_ms`, the whole exchange by
//     `request_timeout_ms`. No signals are used (CURLOPT_NOSIGNAL), so it is safe in threads.
//   - A transport failure (refused, reset, timeout, DNS) is Unavailable with a short reason
//     ("connect: Connection refused", "timed out after 3000 ms"); callers add the store name.
//   - A response body larger than `max_response_bytes` is ResourceExhausted.
//   - Any HTTP status is a successful Perform(); the caller interprets the status code.
// Thread-safe: concurrent calls are serialized.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "mooncake/status.h"

namespace mooncake {

struct HttpResponse {
  long status = 0;
  std::string body;
};

class CurlClient {
 public:
  static constexpr size_t kDefaultMaxResponseBytes = 64u << 20;

  CurlClient(int connect_timeout_ms, int request_timeout_ms,
             size_t max_response_bytes = kDefaultMaxResponseBytes);
  ~CurlClient();
  CurlClient(const CurlClient&) = delete;
  CurlClient& operator=(const CurlClient&) = delete;

  // `method` is "GET", "PUT", "POST" or "DELETE". `body` is sent (with `content_type`) when
  // non-null. `timeout_ms` > 0 overrides the request timeout for this call. `headers` are
  // extra "Name: value" request headers.
  Result<HttpResponse> Perform(const std::string& method, const std::string& url,
                               const std::string* body, const std::string& content_type,
                               int timeout_ms = 0,
                               const std::vector<std::string>& headers = {});

 private:
  std::mutex mu_;
  void* curl_ = nullptr;  // CURL*, kept opaque so that users need no curl headers
  int connect_timeout_ms_;
  int request_timeout_ms_;
  size_t max_response_bytes_;
};

// Percent-encodes everything but RFC 3986 unreserved characters (as curl_easy_escape does),
// so '/' becomes %2F.
std::string UrlEscape(const std::string& s);

// Standard base64 (with padding), as etcd's JSON gateway uses for bytes fields.
std::string Base64Encode(const std::string& in);
// False on a malformed input.
bool Base64Decode(const std::string& in, std::string* out);

}  // namespace mooncake
