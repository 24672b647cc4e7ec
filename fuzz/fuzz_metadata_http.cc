// Fuzzes the HTTP metadata server library (src/metadata/http_server/metadata_http_server.*,
// on its GuardedServer; the one mooncake_master embeds): a real MetadataHttpServer on loopback
// TCP (max_body_bytes 1024, max_total_bytes 2048), each request on a connection of its own.
//
// Input format: byte 0 bit 0 clear - the rest is the raw bytes of one connection (skipped
// when they contain "PUT": the table must stay the model's): a reply, if any, must start
// with an HTTP/1.x status line, and the server must still answer GET /health afterwards. Set - up to 16 requests, each a byte r and, for a PUT, a byte n
// and n bytes of value (n = 255: 1025 bytes, over max_body_bytes): r bits 0-2 the request
// {GET, PUT, DELETE, POST, PATCH /metadata, GET /health, PUT, GET}, bits 3-5 the key as sent
// {a, %61, rpc_meta_1, b+rpc_meta, (empty), (no key), +++, 200 x L}. Checked against a model
// of the table written from metadata_http_server.h: statuses (200 / 400 no key or a
// different rpc_meta value / 404 / 405 / 413 / 507) and GET's value; query values are
// percent-decoded ('+' a space) and trimmed. Every key is deleted at the end of an input.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <map>
#include <string>

#include "fuzz_common.h"
#include "metadata/http_server/metadata_http_server.h"

namespace {

using mooncake::http::MetadataHttpServer;
using mooncake::http::MetadataServerOptions;

constexpr size_t kMaxBody = 1024;
constexpr size_t kMaxTotal = 2048;
MetadataHttpServer* g_server = nullptr;

int Connect() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fuzz::Fail("socket: %s", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(g_server->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!fuzz::Connect(fd, &a, sizeof(a))) {
    fuzz::Fail("connect: %s", std::strerror(errno));
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

// Sends `req`, reads until the server closes; the reply's bytes.
std::string Roundtrip(const std::string& req) {
  int fd = Connect();
  std::string got;
  if (!fuzz::Exchange(fd, req, &got, 15000)) fuzz::Fail("metadata server: no close in 15 s");
  fuzz::CloseAbortive(fd);
  return got;
}

// The status of a reply ("HTTP/1.x NNN ..."), or -1.
int Status(const std::string& got) {
  if (got.size() < 12 || got.compare(0, 7, "HTTP/1.") != 0 || got[8] != ' ' ||
      !std::isdigit(got[9]) || !std::isdigit(got[10]) || !std::isdigit(got[11])) {
    return -1;
  }
  return std::stoi(got.substr(9, 3));
}

std::string Body(const std::string& got) {
  const size_t end = got.find("\r\n\r\n");
  return end == std::string::npos ? "" : got.substr(end + 4);
}

std::string Request(const std::string& method, const std::string& target,
                    const std::string& body, bool with_body) {
  std::string r = method + " " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
  if (with_body) r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "\r\n" + body;
}

void CheckHealth(const char* after) {
  const std::string got = Roundtrip(Request("GET", "/health", "", false));
  if (Status(got) != 200 || Body(got) != "OK") {
    fuzz::Fail("metadata server: GET /health not 200 OK after %s", after);
  }
}

struct Model {
  std::map<std::string, std::string> table;
  size_t total = 0;
};

void Structured(fuzz::Reader& in) {
  static const char* kSent[] = {"a", "%61", "rpc_meta_1", "b+rpc_meta", "", nullptr, "+++",
                                nullptr};
  static const char* kKey[] = {"a", "a", "rpc_meta_1", "b rpc_meta", "", "", "",
                               nullptr};
  const std::string long_key(200, 'L');
  Model m;
  for (int i = 0; i < 16 && !in.empty(); ++i) {
    const uint8_t r = in.U8();
    const int op = r & 7;
    const int k = (r >> 3) & 7;
    std::string target = "/metadata";
    std::string key;
    if (k == 7) {
      target += "?key=" + long_key;
      key = long_key;
    } else if (kSent[k] != nullptr) {
      target += std::string("?key=") + kSent[k];
      key = kKey[k];
    }
    std::string method, body;
    bool put = false;
    switch (op) {
      case 0: case 7: method = "GET"; break;
      case 1: case 6: method = "PUT"; put = true; break;
      case 2: method = "DELETE"; break;
      case 3: method = "POST"; break;
      case 4: method = "PATCH"; break;
      default: method = "GET"; target = "/health"; break;
    }
    if (put) {
      const size_t n = in.U8();
      body = n == 255 ? std::string(kMaxBody + 1, 'v') : in.Bytes(n);
    }
    const std::string got = Roundtrip(Request(method, target, body, put || op == 3 || op == 4));
    const int status = Status(got);
    int want;
    std::string want_body;
    bool check_body = false;
    if (target == "/health") {
      want = 200;
      want_body = "OK";
      check_body = true;
    } else if (op == 3 || op == 4) {
      want = 405;
    } else if (put && body.size() > kMaxBody) {
      want = 413;
    } else if (key.empty()) {
      want = 400;
    } else if (put) {
      auto it = m.table.find(key);
      if (it != m.table.end() && key.find("rpc_meta") != std::string::npos) {
        want = it->second == body ? 200 : 400;
      } else {
        const size_t old = it == m.table.end() ? 0 : key.size() + it->second.size();
        const size_t total = m.total - old + key.size() + body.size();
        if (total > kMaxTotal) {
          want = 507;
        } else {
          want = 200;
          m.total = total;
          m.table[key] = body;
        }
      }
    } else if (method == "GET") {
      auto it = m.table.find(key);
      want = it == m.table.end() ? 404 : 200;
      if (it != m.table.end()) {
        want_body = it->second;
        check_body = true;
      }
    } else {  // DELETE
      auto it = m.table.find(key);
      want = it == m.table.end() ? 404 : 200;
      if (it != m.table.end()) {
        m.total -= key.size() + it->second.size();
        m.table.erase(it);
      }
    }
    if (status != want) {
      fuzz::Fail("metadata server: %s %.60s (body %zu bytes) answered %d, the model %d",
                 method.c_str(), target.c_str(), body.size(), status, want);
    }
    if (check_body && Body(got) != want_body) {
      fuzz::Fail("metadata server: %s %.60s: value differs", method.c_str(), target.c_str());
    }
  }
  for (const auto& [key, value] : m.table) {
    const std::string sent = key == "b rpc_meta" ? "b+rpc_meta" : key;
    if (Status(Roundtrip(Request("DELETE", "/metadata?key=" + sent, "", false))) != 200) {
      fuzz::Fail("metadata server: DELETE of a stored key not 200");
    }
  }
}

void Raw(fuzz::Reader& in) {
  const std::string bytes = in.Rest();
  // A PUT would store keys the structured mode's model does not know (and fill the table).
  if (bytes.find("PUT") != std::string::npos) return;
  const std::string got = Roundtrip(bytes);
  if (!got.empty() && Status(got) < 0) {
    fuzz::Fail("metadata server: a reply without an HTTP status line (%zu bytes)", got.size());
  }
  CheckHealth("raw bytes");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  MetadataServerOptions o;
  o.max_body_bytes = kMaxBody;
  o.max_total_bytes = kMaxTotal;
  static MetadataHttpServer server(o);
  const mooncake::Status started = server.Start("127.0.0.1", 0);
  const std::string err = started.ok() ? "" : started.message();
  if (!started.ok()) fuzz::Fail("MetadataHttpServer::Start: %s", err.c_str());
  g_server = &server;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Reader in(data, size);
  if (in.U8() & 1) {
    Structured(in);
  } else {
    Raw(in);
  }
  return 0;
}
