#include "store/common/metrics_server.h"

#include <cctype>
#include <exception>

namespace mooncake {
namespace store {

namespace {

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

// The bytes of `r` on the wire; without the body for a HEAD.
std::string Serialize(const HttpReply& r, bool head_only) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + Reason(r.status) +
                    "\r\nContent-Type: " + r.content_type +
                    "\r\nContent-Length: " + std::to_string(r.body.size()) + "\r\n";
  for (const auto& h : r.headers) out += h.first + ": " + h.second + "\r\n";
  out += "Connection: close\r\n\r\n";
  if (!head_only) out += r.body;
  return out;
}

HttpReply Text(int status, std::string body) {
  HttpReply r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool IsWrite(const std::string& method) {
  return method == "PUT" || method == "POST" || method == "DELETE";
}

// The body's length from the head's headers (0 without Content-Length), or an error reply.
bool BodyLength(const std::string& head, size_t* len, HttpReply* error) {
  *len = 0;
  size_t at = head.find("\r\n");
  while (at != std::string::npos && at + 2 < head.size()) {
    const size_t end = head.find("\r\n", at + 2);
    const std::string line = head.substr(at + 2, end == std::string::npos ? std::string::npos
                                                                          : end - at - 2);
    at = end;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = Lower(line.substr(0, colon));
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t") + 1);
    if (name == "transfer-encoding") {
      *error = Text(411, "chunked bodies are not read: send Content-Length\n");
      return false;
    }
    if (name != "content-length") continue;
    if (value.empty() || value.size() > 12 ||
        value.find_first_not_of("0123456789") != std::string::npos) {
      *error = Text(400, "bad Content-Length\n");
      return false;
    }
    *len = std::stoull(value);
    if (*len > MetricsServer::kMaxBodyBytes) {
      *error = Text(413, "body over " + std::to_string(MetricsServer::kMaxBodyBytes) + " bytes\n");
      return false;
    }
  }
  return true;
}

}  // namespace

MetricsServer::MetricsServer(std::function<std::string()> body)
    : handler_([body = std::move(body)](const std::string& target) {
        const std::string path = target.substr(0, target.find('?'));
        if (path != "/metrics") return Text(404, "only /metrics\n");
        HttpReply r = Text(200, body());
        r.content_type = "text/plain; version=0.0.4";
        return r;
      }) {}

HttpReply MetricsServer::Answer(const std::string& in, bool* head_only) {
  if (in.find("\r\n\r\n") == std::string::npos) {
    const bool line_done = in.find("\r\n") != std::string::npos;
    return line_done
               ? Text(431, "request head over " + std::to_string(kMaxRequestBytes) + " bytes\n")
               : Text(414, "request line over " + std::to_string(kMaxRequestBytes) + " bytes\n");
  }
  const std::string line = in.substr(0, in.find("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  const std::string method = line.substr(0, sp1);
  const bool write = IsWrite(method) && write_handler_;
  if (method != "GET" && method != "HEAD" && !write) {
    return Text(405, write_handler_ ? "only GET, HEAD, PUT, POST and DELETE\n"
                                    : "only GET and HEAD\n");
  }
  if (sp2 == std::string::npos || line[sp1 + 1] != '/') {
    return Text(400, "malformed request line\n");
  }
  *head_only = method == "HEAD";
  try {
    if (write) {
      const size_t head_end = in.find("\r\n\r\n");
      size_t len = 0;
      HttpReply error;
      if (!BodyLength(in.substr(0, head_end), &len, &error)) return error;
      return write_handler_(method, line.substr(sp1 + 1, sp2 - sp1 - 1),
                            in.substr(head_end + 4, len));
    }
    return handler_(line.substr(sp1 + 1, sp2 - sp1 - 1));
  } catch (const std::exception& e) {  // never let a handler end the loop
    return Text(500, std::string("internal error: ") + e.what() + "\n");
  }
}

bool MetricsServer::OnRead(PollServer::Conn& c, Clock::time_point now) {
  const size_t head_end = c.in.find("\r\n\r\n");
  if (head_end == std::string::npos && c.in.size() <= kMaxRequestBytes) {
    return true;  // the head is not complete yet
  }
  if (head_end != std::string::npos && write_handler_ &&
      IsWrite(c.in.substr(0, c.in.find(' ')))) {
    size_t len = 0;
    HttpReply unused;
    // The whole body first (its length is bounded: a bad one is answered at once).
    if (BodyLength(c.in.substr(0, head_end), &len, &unused) && c.in.size() < head_end + 4 + len) {
      return true;
    }
  }
  bool head_only = false;
  const HttpReply reply = Answer(c.in, &head_only);
  c.out = Serialize(reply, head_only);
  if (pending_ + c.out.size() > kMaxPendingReplyBytes) {
    c.out = Serialize(Text(503, "too many replies waiting to be read; retry\n"), head_only);
  }
  pending_ += c.out.size();
  c.in.clear();
  c.in.shrink_to_fit();
  c.deadline = now + kReplyDeadline;
  return true;
}

}  // namespace store
}  // namespace mooncake
