#include "store/real_client_server.h"

#include <fcntl.h>
#include <glog/logging.h>
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
  bool dummy = false;  // said the hello
  Clock::time_point deadline;
  std::string in;
};

}  // namespace

std::string RealClientServer::Start(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const bool any = host.empty() || host == "0.0.0.0";
  int rc = ::getaddrinfo(any ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) return "cannot resolve " + host + ": " + ::gai_strerror(rc);
  std::string error = "no address for " + host;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (any && a->ai_family != AF_INET) continue;
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));  // never SO_REUSEPORT
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      listen_fd_ = fd;
      break;
    }
    error = "bind/listen " + host + ":" + service + ": " + std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0) return error;
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  ::fcntl(listen_fd_, F_SETFL, ::fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
  if (::pipe2(wake_fd_, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
    return std::string("pipe: ") + std::strerror(errno);
  }
  thread_ = std::thread([this] { Loop(); });
  return "";
}

void RealClientServer::Stop() {
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

void RealClientServer::Loop() {
  std::list<Conn> conns;  // oldest first
  int spare = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // see EMFILE below
  std::vector<pollfd> fds;
  std::vector<std::list<Conn>::iterator> order;
  auto next_beat = Clock::now() + kHeartbeatInterval;
  auto close_conn = [&](std::list<Conn>::iterator it) {
    if (it->dummy) --dummies_;
    ::close(it->fd);
    conns.erase(it);
  };
  while (!stop_) {
    fds.clear();
    order.clear();
    fds.push_back({wake_fd_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto it = conns.begin(); it != conns.end(); ++it) {
      fds.push_back({it->fd, POLLIN, 0});
      order.push_back(it);
    }
    const int n = ::poll(fds.data(), fds.size(), 100);
    if (n < 0 && errno != EINTR) {
      LOG(ERROR) << "real client server: poll: " << std::strerror(errno);
      break;
    }
    const auto now = Clock::now();
    const bool beat = now >= next_beat;
    if (beat) next_beat = now + kHeartbeatInterval;
    for (size_t i = 0; i < order.size(); ++i) {
      auto it = order[i];
      const short ev = fds[i + 2].revents;
      bool close_it = (ev & (POLLERR | POLLNVAL)) != 0;
      if (!close_it && (ev & (POLLIN | POLLHUP))) {
        char buf[4096];
        ssize_t r = ::recv(it->fd, buf, sizeof(buf), 0);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
          close_it = true;
        } else if (r > 0 && !it->dummy) {
          it->in.append(buf, static_cast<size_t>(r));
          const size_t nl = it->in.find('\n');
          if (nl == std::string::npos) {
            close_it = it->in.size() > kMaxHelloBytes;
          } else if (it->in.compare(0, nl + 1, kDummyHello) != 0) {
            close_it = true;
          } else {
            // The config line fits a fresh socket's send buffer; a short send means the
            // connection is unusable.
            ssize_t w = ::send(it->fd, config_line_.data(), config_line_.size(),
                               MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w == static_cast<ssize_t>(config_line_.size())) {
              it->dummy = true;
              it->in.clear();
              it->in.shrink_to_fit();
              ++dummies_;
            } else {
              close_it = true;
            }
          }
          if (close_it) ++refused_;
        }  // a dummy's bytes after the hello are dropped
      }
      if (!close_it && !it->dummy && now > it->deadline) {
        close_it = true;
        ++refused_;
      }
      if (!close_it && it->dummy && beat) {
        ssize_t w = ::send(it->fd, "\n", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        close_it = w < 0 && errno != EAGAIN && errno != EINTR;
      }
      if (close_it) close_conn(it);
    }
    if (fds[1].revents & POLLIN) {
      while (true) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if ((errno == EMFILE || errno == ENFILE) && spare >= 0) {
            // Out of descriptors: refuse the pending one through the spare descriptor (else
            // poll would report it again at once).
            ::close(spare);
            int fd2 = ::accept(listen_fd_, nullptr, nullptr);
            if (fd2 >= 0) ::close(fd2);
            spare = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
            ++refused_;
          }
          break;
        }
        if (conns.size() >= kMaxConnections) {
          auto victim = conns.begin();
          while (victim != conns.end() && victim->dummy) ++victim;
          ++refused_;
          if (victim == conns.end()) {
            ::close(fd);
            continue;
          }
          close_conn(victim);
        }
        conns.push_back(Conn{fd, false, now + kHelloDeadline, {}});
      }
    }
  }
  for (auto& c : conns) ::close(c.fd);
  dummies_ = 0;
  if (spare >= 0) ::close(spare);
}

}  // namespace store
}  // namespace mooncake
