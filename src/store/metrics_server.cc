#include "store/metrics_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

std::string Reply(int status, const char* reason, const std::string& type,
                  const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         body;
}

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

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
          if (end == std::string::npos && it->in.size() > kMaxRequestBytes) {
            it->out = Reply(431, "Request Header Fields Too Large", "text/plain",
                            "request over 8192 bytes\n");
          } else if (end != std::string::npos) {
            const std::string line = it->in.substr(0, it->in.find("\r\n"));
            if (line.rfind("GET ", 0) != 0 && line.rfind("HEAD ", 0) != 0) {
              it->out = Reply(405, "Method Not Allowed", "text/plain", "only GET /metrics\n");
            } else {
              const size_t sp = line.find(' ');
              const std::string path = line.substr(sp + 1, line.find(' ', sp + 1) - sp - 1);
              it->out = path == "/metrics" || path.rfind("/metrics?", 0) == 0
                            ? Reply(200, "OK", "text/plain; version=0.0.4", body_())
                            : Reply(404, "Not Found", "text/plain", "only /metrics\n");
            }
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
      if (close_it) {
        ::close(it->fd);
        conns.erase(it);
      }
    }
    if (fds[1].revents & POLLIN) {
      while (true) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE) {
            // Out of descriptors: make room by closing the oldest connection; with none,
            // refuse the pending one through the spare descriptor (else poll would spin).
            if (!conns.empty()) {
              ::close(conns.front().fd);
              conns.pop_front();
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
          ::close(conns.front().fd);
          conns.pop_front();
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
