#include "metadata/stores/curl_client.h"

#include <curl/curl.h>

#include <cstdint>
#include <cstring>
#include <mutex>

namespace mooncake {
namespace {

void GlobalInitOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Sink {
  std::string* out;
  size_t limit;
  bool overflow = false;
};

size_t WriteToSink(char* data, size_t size, size_t nmemb, void* user) {
  auto* sink = static_cast<Sink*>(user);
  size_t n = size * nmemb;
  if (sink->out->size() + n > sink->limit) {
    sink->overflow = true;
    return 0;  // makes curl fail with CURLE_WRITE_ERROR
  }
  sink->out->append(data, n);
  return n;
}

// A short reason for a failed transfer, without the store's name.
std::string DescribeCurlError(CURL* curl, CURLcode rc, const char* errbuf) {
  long os_errno = 0;
  curl_easy_getinfo(curl, CURLINFO_OS_ERRNO, &os_errno);
  std::string detail = errbuf[0] ? std::string(errbuf) : std::string(curl_easy_strerror(rc));
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
      if (os_errno != 0) return std::string("connect: ") + std::strerror(int(os_errno));
      return "connect: " + detail;
    case CURLE_COULDNT_RESOLVE_HOST:
      return "cannot resolve host: " + detail;
    case CURLE_OPERATION_TIMEDOUT:
      return "timed out: " + detail;
    default:
      if (os_errno != 0 && rc != CURLE_WRITE_ERROR) {
        return detail + " (" + std::strerror(int(os_errno)) + ")";
      }
      return detail;
  }
}

}  // namespace

CurlClient::CurlClient(int connect_timeout_ms, int request_timeout_ms, size_t max_response_bytes)
    : connect_timeout_ms_(connect_timeout_ms > 0 ? connect_timeout_ms : 1500),
      request_timeout_ms_(request_timeout_ms > 0 ? request_timeout_ms : 3000),
      max_response_bytes_(max_response_bytes) {
  GlobalInitOnce();
  curl_ = curl_easy_init();
}

CurlClient::~CurlClient() {
  if (curl_) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

Result<HttpResponse> CurlClient::Perform(const std::string& method, const std::string& url,
                                         const std::string* body,
                                         const std::string& content_type, int timeout_ms,
                                         const std::vector<std::string>& extra_headers) {
  std::lock_guard<std::mutex> lock(mu_);
  auto* curl = static_cast<CURL*>(curl_);
  if (!curl) return Status::Internal("curl_easy_init failed");
  curl_easy_reset(curl);  // keeps the connection cache

  HttpResponse resp;
  Sink sink{&resp.body, max_response_bytes_};
  char errbuf[CURL_ERROR_SIZE];
  errbuf[0] = '\0';
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, long(connect_timeout_ms_));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, long(timeout_ms > 0 ? timeout_ms
                                                                 : request_timeout_ms_));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &WriteToSink);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
#if LIBCURL_VERSION_NUM >= 0x075500  // 7.85: CURLOPT_PROTOCOLS is deprecated from here on
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
#else
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS, long(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif

  struct curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
  if (method == "GET") {
    curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  if (body) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body->data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body->size()));
    if (!content_type.empty()) {
      headers = curl_slist_append(headers, ("Content-Type: " + content_type).c_str());
    }
  }
  for (const std::string& h : extra_headers) headers = curl_slist_append(headers, h.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);

  CURLcode rc = curl_easy_perform(curl);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    if (sink.overflow) {
      return Status::ResourceExhausted("response larger than " +
                                       std::to_string(max_response_bytes_) + " bytes");
    }
    return Status::Unavailable(DescribeCurlError(curl, rc, errbuf));
  }
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &resp.status);
  return resp;
}

std::string UrlEscape(const std::string& s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3);
  for (unsigned char c : s) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
        c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(char(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string Base64Encode(const std::string& in) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) |
                 uint32_t(uint8_t(in[i + 2]));
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
    out.push_back(kAlphabet[v & 63]);
  }
  size_t rest = in.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

bool Base64Decode(const std::string& in, std::string* out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;  // '-' and '_': the URL-safe alphabet
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  out->clear();
  out->reserve(in.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t pad = 0;
  for (char c : in) {
    if (c == '=') {
      ++pad;
      continue;
    }
    if (pad > 0) return false;  // data after padding
    int v = value(c);
    if (v < 0) return false;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(char((acc >> bits) & 0xff));
    }
  }
  return pad <= 2 && bits < 6;
}

}  // namespace mooncake
