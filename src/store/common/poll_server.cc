#include "store/common/poll_server.h"

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

Status PollServer::Start(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const bool any = host.empty() || (options_.any_is_ipv4 && host == "0.0.0.0");
  int rc = ::getaddrinfo(any ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) return Status::InvalidArgument("cannot resolve " + host + ": " + ::gai_strerror(rc));
  std::string error = "no address for " + host;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (any && options_.any_is_ipv4 && a->ai_family != AF_INET) continue;
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
  if (listen_fd_ < 0) return Status::Unavailable(error);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  ::fcntl(listen_fd_, F_SETFL, ::fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
  if (::pipe2(wake_fd_, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
    return Status::Internal(std::string("pipe: ") + std::strerror(errno));
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

void PollServer::Stop() {
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

void PollServer::Loop() {
  std::list<Conn> conns;  // oldest first
  int spare = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // see EMFILE below
  std::vector<pollfd> fds;
  std::vector<std::list<Conn>::iterator> order;
  auto close_conn = [&](std::list<Conn>::iterator it) {
    handler_->OnClose(*it);
    ::close(it->fd);
    conns.erase(it);
  };
  auto oldest_unpinned = [&] {
    auto it = conns.begin();
    while (it != conns.end() && it->pinned) ++it;
    return it;
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
    if (n < 0 && errno != EINTR) {
      LOG(ERROR) << options_.name << ": poll: " << std::strerror(errno);
      break;
    }
    const auto now = Clock::now();
    handler_->OnTurn(now);
    // Serve the connections that are ready; close the ones done, failed or late.
    for (size_t i = 0; i < order.size(); ++i) {
      auto it = order[i];
      const short ev = fds[i + 2].revents;
      bool close_it = false;
      if (ev & (POLLERR | POLLNVAL)) {
        close_it = true;
      } else if (it->out.empty() && (ev & (POLLIN | POLLHUP))) {
        char buf[kReadChunk];
        ssize_t r = ::recv(it->fd, buf, sizeof(buf), 0);
        if (r <= 0) {
          close_it = r == 0 || (errno != EAGAIN && errno != EINTR);
        } else {
          it->in.append(buf, static_cast<size_t>(r));
          close_it = !handler_->OnRead(*it, now);
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
      if (!close_it) close_it = !handler_->OnVisit(*it, now);
      if (close_it) close_conn(it);
    }
    if (fds[1].revents & POLLIN) {
      while (true) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE) {
            if (options_.evict_when_out_of_fds) {
              auto victim = oldest_unpinned();
              if (victim != conns.end()) {
                close_conn(victim);
                ++dropped_;
                continue;
              }
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
        if (conns.size() >= options_.max_connections) {
          auto victim = oldest_unpinned();
          ++dropped_;
          if (victim == conns.end()) {
            ::close(fd);
            continue;
          }
          close_conn(victim);
        }
        Conn c;
        c.fd = fd;
        c.deadline = now + options_.first_deadline;
        conns.push_back(std::move(c));
      }
    }
  }
  while (!conns.empty()) close_conn(conns.begin());
  if (spare >= 0) ::close(spare);
}

}  // namespace store
}  // namespace mooncake
