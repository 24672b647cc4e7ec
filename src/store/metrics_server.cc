#include "store/metrics_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <list>
#include <vector>

namespace mooncake {
namespace store {

namespace {

using Clock = std::chrono::steady_clock;

struct Conn {
  int fd;
  Clock::time_point deadline;
  std::string in;
  std::string out;  // the reply, once the request is complete
  size_t sent = 0;
};

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

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

MetricsServer::MetricsServer(std::function<std::string()> body)
    : handler_([body = std::move(body)](const std::string& target) {
        const std::string path = target.substr(0, target.find('?'));
        if (path != "/metrics") return Text(404, "only /metrics\n");
        HttpReply r = Text(200, body());
        r.content_type = "text/plain; version=0.0.4";
        return r;
      }) {}

std::string MetricsServer::Start(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) return "cannot resolve " + host + ": " + ::gai_strerror(rc);
  std::string error = "no address for " + host;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));  // never SO_REUSEPORT
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      listen_fd_ = fd;
      break;
    }
    error = std::string("bind/listen: ") + std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0) return error;
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6
                    ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                    : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  SetNonBlocking(listen_fd_);
  if (::pipe2(wake_fd_, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
    return std::string("pipe: ") + std::strerror(errno);
  }
  thread_ = std::thread([this] { Loop(); });
  return "";
}

void MetricsServer::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  char c = 1;
  (void)!::write(wake_fd_[1], &c, 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_fd_[0]);
  ::close(wake_fd_[1]);
  listen_fd_ = wake_fd_[0] = wake_fd_[1] = -1;
}

void MetricsServer::Loop() {
  std::list<Conn> conns;  // oldest first
  int spare = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // see EMFILE below
  std::vector<pollfd> fds;
  std::vector<std::list<Conn>::iterator> order;
  size_t pending = 0;  // bytes of the replies in `conns` (bounded by kMaxPendingReplyBytes)
  auto close_conn = [&](std::list<Conn>::iterator it) {
    ::close(it->fd);
    pending -= it->out.size();
    conns.erase(it);
  };
  while (!stop_) {
    fds.clear();
    order.clear();
    fds.push_back({wake_fd_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto it = conns.begin(); it != conns.end(); ++it) {
      fds.push_back({it->fd, static_cast<short>(it->out.empty() ? POLLIN : POLLOUT), 0});
      order.push_back(it);
    }
    const int n = ::poll(fds.data(), fds.size(), 100);
    if (n < 0 && errno != EINTR) break;
    const auto now = Clock::now();
    // Serve the connections that are ready; close the ones done, failed or late.
    for (size_t i = 0; i < order.size(); ++i) {
      auto it = order[i];
      const short ev = fds[i + 2].revents;
      bool close_it = false;
      if (ev & (POLLERR | POLLNVAL)) {
        close_it = true;
      } else if (it->out.empty() && (ev & (POLLIN | POLLHUP))) {
        char buf[2048];
        ssize_t r = ::recv(it->fd, buf, sizeof(buf), 0);
        if (r <= 0) {
          close_it = r == 0 || (errno != EAGAIN && errno != EINTR);
        } else {
          it->in.append(buf, static_cast<size_t>(r));
          const size_t end = it->in.find("\r\n\r\n");
          HttpReply reply;
          bool head_only = false;
          if (end == std::string::npos && it->in.size() > kMaxRequestBytes) {
            const bool line_done = it->in.find("\r\n") != std::string::npos;
            reply = line_done ? Text(431, "request head over " +
                                              std::to_string(kMaxRequestBytes) + " bytes\n")
                              : Text(414, "request line over " +
                                              std::to_string(kMaxRequestBytes) + " bytes\n");
          } else if (end != std::string::npos) {
            const std::string line = it->in.substr(0, it->in.find("\r\n"));
            const size_t sp1 = line.find(' ');
            const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
            const std::string method = line.substr(0, sp1);
            if (method != "GET" && method != "HEAD") {
              reply = Text(405, "only GET and HEAD\n");
            } else if (sp2 == std::string::npos || line[sp1 + 1] != '/') {
              reply = Text(400, "malformed request line\n");
            } else {
              head_only = method == "HEAD";
              try {
                reply = handler_(line.substr(sp1 + 1, sp2 - sp1 - 1));
              } catch (const std::exception& e) {  // never let a handler end the loop
                reply = Text(500, std::string("internal error: ") + e.what() + "\n");
              }
            }
          }
          if (end != std::string::npos || it->in.size() > kMaxRequestBytes) {
            it->out = Serialize(reply, head_only);
            if (pending + it->out.size() > kMaxPendingReplyBytes) {
              it->out = Serialize(Text(503, "too many replies waiting to be read; retry\n"),
                                  head_only);
            }
            pending += it->out.size();
            it->in.clear();
            it->in.shrink_to_fit();
            it->deadline = now + kReplyDeadline;
          }
        }
      } else if (!it->out.empty() && (ev & POLLOUT)) {
        ssize_t w = ::send(it->fd, it->out.data() + it->sent, it->out.size() - it->sent,
                           MSG_NOSIGNAL);
        if (w > 0) it->sent += static_cast<size_t>(w);
        close_it = (w < 0 && errno != EAGAIN && errno != EINTR) || it->sent == it->out.size();
      }
      if (!close_it && now > it->deadline) {
        close_it = true;
        ++dropped_;
      }
      if (close_it) close_conn(it);
    }
    if (fds[1].revents & POLLIN) {
      while (true) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE) {
            // Out of descriptors: make room by closing the oldest connection; with none,
            // refuse the pending one through the spare descriptor (else poll would spin).
            if (!conns.empty()) {
              close_conn(conns.begin());
              ++dropped_;
              continue;
            }
            if (spare >= 0) {
              ::close(spare);
              int fd2 = ::accept(listen_fd_, nullptr, nullptr);
              if (fd2 >= 0) ::close(fd2);
              spare = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
              ++dropped_;
            }
          }
          break;
        }
        if (conns.size() >= kMaxConnections) {
          close_conn(conns.begin());
          ++dropped_;
        }
        conns.push_back(Conn{fd, now + kRequestDeadline, {}, {}, 0});
      }
    }
  }
  for (auto& c : conns) ::close(c.fd);
  if (spare >= 0) ::close(spare);
}

}  // namespace store
}  // namespace mooncake
