// Fuzzes the master's HTTP port: MasterHttp::Serve (src/store/master_http.*: query parsing,
// percent-decoding, key lists, limits, the listing throttle) called directly, and a real
// MetricsServer (src/store/metrics_server.*: request heads, methods, routing, reply framing)
// serving MasterHttp on loopback TCP, both against one small MasterService built once: two
// segments ("seg-a", "seg b"), complete objects under awkward keys (a space, a comma, a
// percent sign, UTF-8, a byte that is not UTF-8, a key of kMaxKeyBytes) and one object still
// being written.
//
// Input format: byte 0 bit 0 clear - direct calls; set - the server.
//   Direct: records, each: byte t, then the target: t bits 6-7: 0/1 raw (a byte n, n = 255:
//   a u16 follows; then n bytes), 2 /batch_query_keys?keys= and a byte b: with b bit 1 (once
//   per input) kMaxBatchItems - 1 + (b >> 2) % 4 keys, else 1 + (b >> 2) % 64 ("k<i>", or
//   with b bit 0 the real keys but the long one, in turn), 3 /query_key?key= with a key of
//   kMaxKeyBytes (+ 1 when the next byte is odd), percent-encoded. t bits 0-2: time since
//   the last request
//   {0, 0.5, 1, 2, 5, 20, 100, 1000} ms; bits 3-5: how long the request takes on the fake
//   clock {0, 0.2, 1, 1.5, 3, 10, 50, 500} ms.
//   Checked against a model written from master_http.h: percent-decoding ('+' a space, '%'
//   and two hex digits, else 400; the first of repeated names), every endpoint's status and
//   body (exact for /health, /role, /ha_status, /query_segment and the listings: every
//   complete key once, Total-Count, no Truncated; /query_key's and /batch_query_keys' JSON:
//   replicas per key, ok iff complete, at most kMaxBatchItems keys, the key length bound),
//   and the throttle (503 + Retry-After exactly for table walks while the walks' debt, 5 x
//   each walk's length on top of the debt still standing at its start, ends more than
//   MasterHttp::kWalkBurst after the request). Every JSON body parses.
//   Server: byte 1 % 3 + 1 connections; each but the last a u16 length and that many bytes,
//   the last the rest; byte 1 bit 7: the last stream is padded (no "\r\n\r\n") past
//   kMaxRequestBytes. All connect, send, shut down their write side and read until EOF.
//   Checked: no reply without a complete head (unless over kMaxRequestBytes: 414, or 431
//   when the request line had ended); 405 for methods other than GET / HEAD; 400 for a
//   request line without a target starting with '/' and a version; else exactly the bytes
//   of MasterHttp::Serve(target)'s reply as metrics_server.h frames it (status line,
//   Content-Type, Content-Length, extra headers, Connection: close; HEAD: no body) and the
//   handler called once per such request. Every reply is a well-formed HTTP/1.1 response.
//   When bytes follow the head (unread by design), the server's close may reset the
//   connection and drop the reply's tail: then a prefix of it is enough.
#include <arpa/inet.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "store/common/limits.h"
#include "store/master/master_http.h"
#include "store/master/master_service.h"
#include "store/common/metrics_server.h"

namespace {

using mooncake::store::HttpReply;
using mooncake::store::kMaxBatchItems;
using mooncake::store::kMaxKeyBytes;
using mooncake::store::MasterConfig;
using mooncake::store::MasterHttp;
using mooncake::store::MasterService;
using mooncake::store::MetricsServer;
namespace rpc = mooncake::store::rpc;
using Json = nlohmann::json;
using HClock = MasterHttp::Clock;

struct Object {
  std::string key;
  size_t replicas;
};

struct World {
  MasterService::Clock::time_point master_now =
      MasterService::Clock::time_point() + std::chrono::hours(1000);
  std::unique_ptr<MasterService> master;
  std::vector<Object> objects;        // complete
  std::string writing = "being written";
  std::vector<std::string> segments = {"seg-a", "seg b"};
  // The direct MasterHttp's fake clock: start on its first call of a request, start + took
  // after that.
  HClock::time_point start = HClock::time_point() + std::chrono::hours(1);
  HClock::duration took{0};
  int calls = 0;
  std::unique_ptr<MasterHttp> direct;
  std::unique_ptr<MasterHttp> served;  // the server's: a clock that never moves (no 503)
  std::unique_ptr<MetricsServer> server;
  std::atomic<uint64_t> handler_calls{0};
};
World* w = nullptr;

void Build() {
  w = new World;
  MasterConfig config;
  w->master = std::make_unique<MasterService>(config, [] { return w->master_now; });
  auto mount = [](const std::string& client, const std::string& name, uint64_t base) {
    rpc::MountSegmentRequest req;
    req.set_client_id(client);
    req.set_segment_name(name);
    req.set_base(base);
    req.set_size(1 << 20);
    if (w->master->MountSegment(req).code() != 0) fuzz::Fail("setup: mount %s", name.c_str());
  };
  mount("c1", "seg-a", 0x10000000);
  mount("c2", "seg b", 0x20000000);
  auto put = [](const std::string& key, uint32_t replicas, bool end) {
    rpc::PutStartRequest req;
    req.set_client_id("c1");
    auto* item = req.add_items();
    item->set_key(key);
    item->set_size(100 + key.size());
    req.mutable_config()->set_replica_num(replicas);
    auto resp = w->master->PutStart(req);
    if (resp.code() != 0 || resp.results_size() != 1 || resp.results(0).code() != 0) {
      fuzz::Fail("setup: PutStart %s", key.c_str());
    }
    if (!end) return;
    rpc::KeysRequest k;
    k.set_client_id("c1");
    k.add_keys(key);
    auto e = w->master->PutEnd(k);
    if (e.codes_size() != 1 || e.codes(0) != 0) fuzz::Fail("setup: PutEnd %s", key.c_str());
    w->objects.push_back({key, replicas});
  };
  put("k1", 1, true);
  put("k 2", 2, true);
  put("a,b", 1, true);
  put("%41", 1, true);
  put("caf\xc3\xa9", 2, true);
  put("x\xff", 1, true);
  put(std::string(kMaxKeyBytes, 'L'), 1, true);
  put(w->writing, 1, false);
  w->direct = std::make_unique<MasterHttp>(w->master.get(), [] {
    return w->calls++ == 0 ? w->start : w->start + w->took;
  });
  w->served = std::make_unique<MasterHttp>(w->master.get(),
                                           [] { return HClock::time_point() + std::chrono::hours(1); });
  w->server = std::make_unique<MetricsServer>([](const std::string& target) {
    ++w->handler_calls;
    return w->served->Serve(target);
  });
  const mooncake::Status started = w->server->Start("127.0.0.1", 0);
  const std::string err = started.ok() ? "" : started.message();
  if (!started.ok()) fuzz::Fail("MetricsServer::Start: %s", err.c_str());
}

const Object* Find(const std::string& key) {
  for (const auto& o : w->objects) {
    if (o.key == key) return &o;
  }
  return nullptr;
}

// ---------------------------------------------------------------- the query model
int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = static_cast<char>(c | 0x20);
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

bool PercentDecode(const std::string& s, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      *out += ' ';
    } else if (s[i] == '%') {
      if (s.size() - i < 3 || Hex(s[i + 1]) < 0 || Hex(s[i + 2]) < 0) return false;
      *out += static_cast<char>(Hex(s[i + 1]) * 16 + Hex(s[i + 2]));
      i += 2;
    } else {
      *out += s[i];
    }
  }
  return true;
}

std::string PercentEncode(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (;;) {
    size_t next = s.find(sep, pos);
    out.push_back(s.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
    if (next == std::string::npos) return out;
    pos = next + 1;
  }
}

// False on a bad escape; the first value of each name.
bool Query(const std::string& q, std::map<std::string, std::string>* params) {
  for (const std::string& part : Split(q, '&')) {
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    std::string name, value;
    if (!PercentDecode(part.substr(0, eq), &name)) return false;
    if (!PercentDecode(eq == std::string::npos ? "" : part.substr(eq + 1), &value)) return false;
    params->emplace(name, value);
  }
  return true;
}

std::string Header(const HttpReply& r, const std::string& name) {
  for (const auto& h : r.headers) {
    if (h.first == name) return h.second;
  }
  return "";
}

bool WalksATable(const std::string& path) {
  return path == "/get_all_keys" || path == "/get_all_segments" || path == "/query_segment" ||
         path == "/batch_query_keys" || path == "/metrics/summary";
}

Json ParseBody(const HttpReply& r, const std::string& target) {
  if (r.content_type != "application/json; charset=utf-8") {
    fuzz::Fail("%s: content type %s, not JSON", target.c_str(), r.content_type.c_str());
  }
  Json j = Json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fuzz::Fail("%s: body is not a JSON object", target.c_str());
  return j;
}

void Expect(bool ok, const std::string& target, const char* what) {
  if (!ok) fuzz::Fail("MasterHttp %.200s: %s", target.c_str(), what);
}

// The reply Serve gave `target` (served now, not throttled) against the model.
void CheckRoute(const std::string& target, const std::string& path,
                const std::map<std::string, std::string>& params, const HttpReply& r) {
  auto param = [&](const char* name) -> const std::string* {
    auto it = params.find(name);
    return it == params.end() ? nullptr : &it->second;
  };
  if (path == "/metrics") {
    Expect(r.status == 200 && r.content_type == "text/plain; version=0.0.4", target, "/metrics");
  } else if (path == "/metrics/summary") {
    Expect(r.status == 200 && r.body.rfind("role=leader, state=serving", 0) == 0, target,
           "/metrics/summary");
  } else if (path == "/health") {
    Expect(r.status == 200 && ParseBody(r, target) == Json{{"status", "ok"}, {"role", "leader"},
                                                           {"ha_state", "serving"},
                                                           {"service_ready", true}},
           target, "/health");
  } else if (path == "/leader") {  // no HA: no leader address to name
    Expect(r.status == 200 && ParseBody(r, target) == Json{{"present", false}}, target, "/leader");
  } else if (path == "/role" || path == "/ha_status") {
    Expect(r.status == 200 && r.body == (path == "/role" ? "leader" : "serving"), target, path.c_str());
  } else if (path == "/api/v1/tenant_quotas") {  // served (master_http.cc); any query: an answer
    Expect(r.status >= 200 && r.status < 500, target, "/api/v1/tenant_quotas: an answer, no 5xx");
  } else if (path == "/kv_events/status") {  // no publisher set: upstream's disabled reply
    Expect(r.status == 200 && ParseBody(r, target) == Json{{"enabled", false},
                                                           {"published_batches", 0},
                                                           {"published_events", 0},
                                                           {"dropped_events", 0},
                                                           {"skipped_unparsed_keys", 0}},
           target, "/kv_events/status");
  } else if (path == "/get_all_keys") {
    std::multiset<std::string> want, got;
    for (const auto& o : w->objects) want.insert(o.key);
    for (const auto& l : Split(r.body, '\n')) got.insert(l);
    if (got.count("") != 0) got.erase(got.find(""));  // after the last '\n'
    Expect(r.status == 200 && got == want, target, "/get_all_keys lists every complete key once");
    Expect(Header(r, "X-Mooncake-Total-Count") == std::to_string(want.size()) &&
               Header(r, "X-Mooncake-Truncated").empty(),
           target, "/get_all_keys headers");
  } else if (path == "/get_all_segments") {
    Expect(r.status == 200 && r.body == "seg-a\nseg b\n" &&
               Header(r, "X-Mooncake-Total-Count") == "2",
           target, "/get_all_segments");
  } else if (path == "/query_segment") {
    const std::string* s = param("segment");
    if (s == nullptr || s->empty()) {
      Expect(r.status == 400, target, "no segment: 400");
    } else if (*s == "seg-a" || *s == "seg b") {
      Expect(r.status == 200 && r.body.rfind(*s + "\nUsed(bytes): ", 0) == 0 &&
                 r.body.find("\nCapacity(bytes) : 1048576\n") != std::string::npos,
             target, "/query_segment of a mounted segment");
    } else {
      Expect(r.status == 404, target, "/query_segment of an unknown segment: 404");
    }
  } else if (path == "/query_key") {
    const std::string* k = param("key");
    if (k == nullptr || k->empty() || k->size() > kMaxKeyBytes) {
      Expect(r.status == 400, target, "no key, or one over kMaxKeyBytes: 400");
      Expect(ParseBody(r, target)["success"] == false, target, "400 says success false");
      return;
    }
    const Object* o = Find(*k);
    Json j = ParseBody(r, target);
    if (o == nullptr) {
      Expect(r.status == 404 && j["success"] == false && j["error_code"] == -704, target,
             "/query_key of no complete object: 404, -704");
      return;
    }
    Expect(r.status == 200 && j["success"] == true && j["data"].is_array() &&
               j["data"].size() == o->replicas,
           target, "/query_key: one descriptor per replica");
    for (const auto& d : j["data"]) {
      Expect(d["size_"] == 100 + o->key.size() && d["protocol_"] == "tcp", target, "descriptor");
    }
  } else if (path == "/batch_query_keys") {
    const std::string* ks = param("keys");
    if (ks == nullptr || ks->empty()) {
      Expect(r.status == 400, target, "no keys: 400");
      return;
    }
    const auto keys = Split(*ks, ',');
    Json j = ParseBody(r, target);
    if (keys.size() > kMaxBatchItems) {
      Expect(r.status == 400 && j["success"] == false, target, "over kMaxBatchItems keys: 400");
      return;
    }
    Expect(r.status == 200 && j["success"] == true && j["data"].is_object(), target,
           "/batch_query_keys: 200");
    std::set<std::string> distinct(keys.begin(), keys.end());
    Expect(j["data"].size() <= distinct.size(), target, "more results than keys");
    for (const auto& k : distinct) {
      // Keys that are not UTF-8 come back with U+FFFD (and may then collide): skip them.
      try {
        (void)Json(k).dump();
      } catch (const std::exception&) {
        continue;
      }
      Expect(j["data"].contains(k), target, "a key of the request is missing in the reply");
      const Json& item = j["data"][k];
      const Object* o = Find(k);
      Expect(item["ok"] == (o != nullptr), target, "ok iff the object is complete");
      if (o != nullptr) Expect(item["values"].size() == o->replicas, target, "values");
    }
  } else {
    Expect(r.status == 404, target, "unknown path: 404");
  }
}

// ---------------------------------------------------------------- direct calls
void Direct(fuzz::Reader& in) {
  using std::chrono::microseconds;
  const microseconds gaps[] = {microseconds(0), microseconds(500), microseconds(1000),
                               microseconds(2000), microseconds(5000), microseconds(20000),
                               microseconds(100000), microseconds(1000000)};
  const microseconds takes[] = {microseconds(0), microseconds(200), microseconds(1000),
                                microseconds(1500), microseconds(3000), microseconds(10000),
                                microseconds(50000), microseconds(500000)};
  // A fresh MasterHttp per input: the throttle starts open.
  w->direct = std::make_unique<MasterHttp>(w->master.get(), [] {
    return w->calls++ == 0 ? w->start : w->start + w->took;
  });
  HClock::time_point heavy_after{};
  bool big_done = false;
  for (int n = 0; n < 16 && !in.empty(); ++n) {
    const uint8_t t = in.U8();
    std::string target;
    switch (t >> 6) {
      case 0:
      case 1: {
        size_t len = in.U8();
        if (len == 255) len = in.U16();
        target = in.Bytes(len);
        break;
      }
      case 2: {
        const uint8_t kind = in.U8();
        const bool big = (kind & 2) && !big_done;  // slow under the sanitizers: one per input
        big_done = big_done || big;
        const size_t count = big ? kMaxBatchItems - 1 + ((kind >> 2) & 3) : 1 + (kind >> 2) % 64;
        target = "/batch_query_keys?keys=";
        for (size_t i = 0; i < count; ++i) {
          if (i) target += ',';
          // Real keys (not the long one), or others.
          target += (kind & 1) ? PercentEncode(w->objects[i % (w->objects.size() - 1)].key)
                               : "k" + std::to_string(i);
        }
        break;
      }
      default:
        target = "/query_key?key=" + std::string(kMaxKeyBytes - 1, 'L') +
                 ((in.U8() & 1) ? "%4C%4C" : "%4C");
        break;
    }
    w->start += gaps[t & 7];
    w->took = takes[(t >> 3) & 7];
    w->calls = 0;
    HttpReply r;
    try {
      r = w->direct->Serve(target);
    } catch (const std::exception& e) {
      fuzz::Fail("MasterHttp::Serve threw: %s", e.what());
    }
    const size_t q = target.find('?');
    const std::string path = target.substr(0, q);
    std::map<std::string, std::string> params;
    if (q != std::string::npos && !Query(target.substr(q + 1), &params)) {
      Expect(r.status == 400 && r.body == "bad percent-encoding in the query\n", target,
             "a bad percent escape: 400");
      continue;
    }
    if (WalksATable(path)) {
      if (heavy_after > w->start + MasterHttp::kWalkBurst) {
        Expect(r.status == 503 && Header(r, "Retry-After") == "1", target,
               "a table walk while the walks' debt exceeds the burst: 503 + Retry-After");
        continue;
      }
      Expect(r.status != 503, target, "503 with the throttle open");
      heavy_after = std::max(heavy_after, w->start) + 5 * w->took;
    }
    CheckRoute(target, path, params, r);
  }
}

// ---------------------------------------------------------------- the server
const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

// metrics_server.h: the handler's reply plus Content-Length and Connection: close.
std::string Wire(const HttpReply& r, bool head) {
  std::string s = "HTTP/1.1 " + std::to_string(r.status) + " " + Reason(r.status) +
                  "\r\nContent-Type: " + r.content_type +
                  "\r\nContent-Length: " + std::to_string(r.body.size()) + "\r\n";
  for (const auto& h : r.headers) s += h.first + ": " + h.second + "\r\n";
  return s + "Connection: close\r\n\r\n" + (head ? "" : r.body);
}

// A well-formed HTTP/1.1 response: status line, header lines, the body Content-Length says.
void CheckWellFormed(const std::string& got, bool head) {
  if (got.rfind("HTTP/1.1 ", 0) != 0 || got.size() < 13 || !std::isdigit(got[9]) ||
      !std::isdigit(got[10]) || !std::isdigit(got[11]) || got[12] != ' ') {
    fuzz::Fail("MetricsServer: reply without a status line");
  }
  const size_t end = got.find("\r\n\r\n");
  if (end == std::string::npos) fuzz::Fail("MetricsServer: reply head not terminated");
  long length = -1;
  bool close = false;
  size_t pos = got.find("\r\n") + 2;
  while (pos < end + 2) {
    const size_t eol = got.find("\r\n", pos);
    const std::string line = got.substr(pos, eol - pos);
    const size_t colon = line.find(": ");
    if (colon == std::string::npos || colon == 0 || line.find('\n') != std::string::npos ||
        line.find('\r') != std::string::npos) {
      fuzz::Fail("MetricsServer: malformed header line");
    }
    if (line.compare(0, colon, "Content-Length") == 0) length = std::stol(line.substr(colon + 2));
    if (line == "Connection: close") close = true;
    pos = eol + 2;
  }
  if (length < 0 || !close) fuzz::Fail("MetricsServer: no Content-Length or Connection: close");
  const size_t body = got.size() - end - 4;
  if (body != (head ? 0 : static_cast<size_t>(length))) {
    fuzz::Fail("MetricsServer: body of %zu bytes, Content-Length %ld%s", body, length,
               head ? " (HEAD)" : "");
  }
}

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fuzz::Fail("socket: %s", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!fuzz::Connect(fd, &a, sizeof(a))) {
    fuzz::Fail("connect: %s", std::strerror(errno));
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

// What the server must answer `s`: `*reply` ("" for nothing), whether the handler runs, and
// whether bytes follow what it reads (then the reply may be cut by a reset).
void Model(const std::string& s, std::string* reply, bool* handled, bool* unread) {
  *reply = "";
  *handled = false;
  *unread = false;
  const size_t end = s.find("\r\n\r\n");
  HttpReply r;
  r.content_type = "text/plain";
  bool head = false;
  if (end == std::string::npos || end + 4 > MetricsServer::kMaxRequestBytes + 2048) {
    if (s.size() <= MetricsServer::kMaxRequestBytes) return;
    // The generated oversized stream has no "\r\n\r\n"; a line end, if any, is early.
    const bool line_done = s.find("\r\n") < 4096;
    r.status = line_done ? 431 : 414;
    r.body = std::string(line_done ? "request head" : "request line") + " over " +
             std::to_string(MetricsServer::kMaxRequestBytes) + " bytes\n";
    *unread = true;
  } else {
    *unread = s.size() > end + 4;
    const std::string line = s.substr(0, s.find("\r\n"));
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
    const std::string method = line.substr(0, sp1);
    if (method != "GET" && method != "HEAD") {
      r.status = 405;
      r.body = "only GET and HEAD\n";
    } else if (sp2 == std::string::npos || line[sp1 + 1] != '/') {
      r.status = 400;
      r.body = "malformed request line\n";
    } else {
      head = method == "HEAD";
      *handled = true;
      r = w->served->Serve(line.substr(sp1 + 1, sp2 - sp1 - 1));
    }
  }
  *reply = Wire(r, head);
}

void Served(fuzz::Reader& in) {
  const uint8_t b = in.U8();
  const size_t n = b % 3 + 1;
  std::vector<std::string> streams;
  for (size_t i = 0; i + 1 < n; ++i) streams.push_back(in.Bytes(in.U16()));
  streams.push_back(in.Rest());
  if (b & 0x80) {
    std::string& last = streams.back();
    size_t p;
    while ((p = last.find("\r\n\r\n")) != std::string::npos) last.erase(p, 1);
    if (last.size() >= 2 && last.compare(last.size() - 2, 2, "\r\n") == 0) last.pop_back();
    last.resize(MetricsServer::kMaxRequestBytes + 1 + (b & 0x7f) * 100, 'a');
  }
  const uint64_t calls_before = w->handler_calls.load();
  std::vector<int> fds;
  for (size_t i = 0; i < n; ++i) fds.push_back(Connect(w->server->port()));
  uint64_t want_calls = 0;
  for (size_t i = 0; i < n; ++i) {
    std::string got;
    if (!fuzz::Exchange(fds[i], streams[i], &got, 10000)) {
      fuzz::Fail("MetricsServer: connection %zu not closed within 10 s", i);
    }
    fuzz::CloseAbortive(fds[i]);
    std::string want;
    bool handled, unread;
    Model(streams[i], &want, &handled, &unread);
    if (handled) ++want_calls;
    const bool head = streams[i].rfind("HEAD ", 0) == 0;
    if (got == want) {
      if (!want.empty()) CheckWellFormed(got, head && handled);
      continue;
    }
    if (unread && want.compare(0, got.size(), got) == 0) continue;  // cut by a reset
    size_t d = 0;
    while (d < got.size() && d < want.size() && got[d] == want[d]) ++d;
    fuzz::Fail("MetricsServer: reply of %zu bytes, the model's %zu; first difference at %zu "
               "(got: %.80s)", got.size(), want.size(), d, got.c_str());
  }
  if (w->handler_calls.load() - calls_before != want_calls) {
    fuzz::Fail("MetricsServer called the handler %llu times, the model %llu",
               static_cast<unsigned long long>(w->handler_calls.load() - calls_before),
               static_cast<unsigned long long>(want_calls));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;
  Build();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Reader in(data, size);
  if (in.U8() & 1) {
    Served(in);
  } else {
    Direct(in);
  }
  return 0;
}
