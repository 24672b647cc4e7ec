#include "common/conn_server.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace mooncake {

ConnServer::ConnServer(std::string name, size_t max_connections, ServeFn serve,
                       AcceptFn on_accept)
    : name_(std::move(name)),
      max_connections_(max_connections),
      serve_(std::move(serve)),
      on_accept_(std::move(on_accept)) {}

ConnServer::~ConnServer() { Stop(); }

Status ConnServer::Start(UniqueFd listen_fd) {
  if (::pipe2(wake_fd_, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
  listen_fd_ = std::move(listen_fd);
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return Status::OK();
}

void ConnServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (wake_fd_[1] >= 0) {
    char c = 0;
    (void)!::write(wake_fd_[1], &c, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  std::list<std::unique_ptr<Conn>> conns;
  {
    std::lock_guard lock(mu_);
    for (auto& c : conns_) ::shutdown(c->fd, SHUT_RDWR);
    conns.swap(conns_);
  }
  for (auto& c : conns) {
    c->thread.join();
    ::close(c->fd);
  }
  for (int& fd : wake_fd_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  listen_fd_.Reset();
}

size_t ConnServer::active() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& c : conns_) n += c->done.load() ? 0 : 1;
  return n;
}

void ConnServer::ReapFinishedLocked() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    if ((*it)->done.load()) {
      (*it)->thread.join();
      ::close((*it)->fd);
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

void ConnServer::AcceptLoop() {
  pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
  while (!stopping_.load()) {
    int r = ::poll(fds, 2, 1000);
    {
      std::lock_guard lock(mu_);
      ReapFinishedLocked();
    }
    if (r < 0 && errno == EINTR) continue;
    if (fds[1].revents) break;
    if (r <= 0 || !(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) ::usleep(10000);  // let connections close
      continue;
    }
    std::lock_guard lock(mu_);
    if (conns_.size() >= max_connections_) {
      LOG(WARNING) << name_ << ": " << max_connections_ << " connections open; refusing another";
      ::close(fd);
      continue;
    }
    if (on_accept_) on_accept_(fd);
    auto conn = std::make_unique<Conn>();
    conn->fd = fd;
    Conn* raw = conn.get();
    conn->thread = std::thread([this, raw] {
      serve_(raw->fd);
      ::shutdown(raw->fd, SHUT_RDWR);
      raw->done.store(true);
    });
    conns_.push_back(std::move(conn));
    accepted_.fetch_add(1);
  }
}

}  // namespace mooncake
