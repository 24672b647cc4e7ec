#include "store/common/poll_server.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

namespace mooncake {
namespace store {

Status PollServer::Start(const std::string& host, int port) {
  ListenOptions lo;
  lo.nonblocking = true;
  lo.any_is_ipv4 = options_.any_is_ipv4;
  auto listener = ListenTcp(host, port, lo);
  if (!listener.ok()) return listener.status();
  if (::pipe2(wake_fd_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Status::Internal(std::string("pipe: ") + std::strerror(errno));
  }
  listen_fd_ = std::move(listener->fd);
  port_ = listener->port;
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

void PollServer::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  char c = 1;
  (void)!::write(wake_fd_[1], &c, 1);
  thread_.join();
  listen_fd_.Reset();
  ::close(wake_fd_[0]);
  ::close(wake_fd_[1]);
  wake_fd_[0] = wake_fd_[1] = -1;
}

void PollServer::CloseConn(ConnList::iterator it) {
  handler_->OnClose(*it);
  ::close(it->fd);
  conns_.erase(it);
  admission_.Remove("");
}

void PollServer::Loop() {
  spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // see OutOfDescriptors
  while (!stop_) {
    fds_.clear();
    order_.clear();
    fds_.push_back({wake_fd_[0], POLLIN, 0});
    fds_.push_back({listen_fd_.get(), POLLIN, 0});
    for (auto it = conns_.begin(); it != conns_.end(); ++it) {
      fds_.push_back({it->fd, static_cast<short>(it->out.empty() ? POLLIN : POLLOUT), 0});
      order_.push_back(it);
    }
    const int n = ::poll(fds_.data(), fds_.size(), 100);
    if (n < 0 && errno != EINTR) {
      LOG(ERROR) << options_.name << ": poll: " << std::strerror(errno);
      break;
    }
    const auto now = Clock::now();
    handler_->OnTurn(now);
    // Serve the connections that are ready; close the ones done, failed or late.
    for (size_t i = 0; i < order_.size(); ++i) {
      if (!ServeConn(*order_[i], fds_[i + 2].revents, now)) CloseConn(order_[i]);
    }
    if (fds_[1].revents & POLLIN) AcceptAll(now);
  }
  while (!conns_.empty()) CloseConn(conns_.begin());
  if (spare_ >= 0) ::close(spare_);
  spare_ = -1;
}

bool PollServer::ServeConn(Conn& c, short ev, Clock::time_point now) {
  bool close_it = false;
  if (ev & (POLLERR | POLLNVAL)) {
    close_it = true;
  } else if (c.out.empty() && (ev & (POLLIN | POLLHUP))) {
    char buf[kReadChunk];
    ssize_t r = ::recv(c.fd, buf, sizeof(buf), 0);
    if (r <= 0) {
      close_it = r == 0 || (errno != EAGAIN && errno != EINTR);
    } else {
      c.in.append(buf, static_cast<size_t>(r));
      close_it = !handler_->OnRead(c, now);
    }
  } else if (!c.out.empty() && (ev & POLLOUT)) {
    ssize_t w = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (w > 0) c.sent += static_cast<size_t>(w);
    close_it = (w < 0 && errno != EAGAIN && errno != EINTR) || c.sent == c.out.size();
  }
  if (!close_it && now > c.deadline) {
    close_it = true;
    ++dropped_;
  }
  return !close_it && handler_->OnVisit(c, now);
}

// The oldest connection that is not pinned goes first (Admission::Victim's first of equals).
static std::optional<int> Unpinned(const PollServer::Conn& c) {
  return c.pinned ? std::nullopt : std::optional<int>(0);
}

bool PollServer::OutOfDescriptors() {
  if (options_.evict_when_out_of_fds) {
    auto victim = Admission::Victim(conns_.begin(), conns_.end(), Unpinned);
    if (victim != conns_.end()) {
      CloseConn(victim);
      ++dropped_;
      return true;
    }
  }
  if (spare_ >= 0) {
    ::close(spare_);
    int fd = ::accept(listen_fd_.get(), nullptr, nullptr);
    if (fd >= 0) ::close(fd);
    spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    ++dropped_;
  }
  return false;
}

void PollServer::AcceptAll(Clock::time_point now) {
  while (true) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if ((errno == EMFILE || errno == ENFILE) && OutOfDescriptors()) continue;
      return;
    }
    if (admission_.Check("") != Admission::Cap::kNone) {
      auto victim = Admission::Victim(conns_.begin(), conns_.end(), Unpinned);
      ++dropped_;
      if (victim == conns_.end()) {
        ::close(fd);
        continue;
      }
      CloseConn(victim);
    }
    Conn c;
    c.fd = fd;
    c.deadline = now + options_.first_deadline;
    conns_.push_back(std::move(c));
    admission_.Add("");
  }
}

}  // namespace store
}  // namespace mooncake
