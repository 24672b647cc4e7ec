#include "store/master/metrics_server.h"

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
  if (method != "GET" && method != "HEAD") return Text(405, "only GET and HEAD\n");
  if (sp2 == std::string::npos || line[sp1 + 1] != '/') {
    return Text(400, "malformed request line\n");
  }
  *head_only = method == "HEAD";
  try {
    return handler_(line.substr(sp1 + 1, sp2 - sp1 - 1));
  } catch (const std::exception& e) {  // never let a handler end the loop
    return Text(500, std::string("internal error: ") + e.what() + "\n");
  }
}

bool MetricsServer::OnRead(PollServer::Conn& c, Clock::time_point now) {
  if (c.in.find("\r\n\r\n") == std::string::npos && c.in.size() <= kMaxRequestBytes) {
    return true;  // the head is not complete yet
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
