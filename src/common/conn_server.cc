#include "common/conn_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <cerrno>
#include <system_error>

namespace mooncake {
namespace {

thread_local std::atomic<bool>* tls_established = nullptr;

// The remote "address" a per-address cap counts: the IP for TCP, the uid for unix sockets.
std::string RemoteAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
    return buf;
  }
  if (ss.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof(buf));
    return buf;
  }
  if (ss.ss_family == AF_UNIX) {
    ucred cred{};
    socklen_t clen = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0) {
      return "uid " + std::to_string(cred.uid);
    }
  }
  return "?";
}

}  // namespace

ConnServer::ConnServer(std::string name, ConnLimits limits, ServeFn serve, AcceptFn on_accept)
    : name_(std::move(name)),
      limits_(limits),
      serve_(std::move(serve)),
      on_accept_(std::move(on_accept)),
      admission_(name_, {limits.max_connections, limits.max_per_address}) {}

ConnServer::~ConnServer() { Stop(); }

void ConnServer::MarkEstablished() {
  if (tls_established != nullptr) tls_established->store(true);
}

bool ConnServer::WaitForBytes(int fd, size_t n, int timeout_ms) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string peek(n, '\0');
  for (;;) {
    ssize_t got = ::recv(fd, peek.data(), n, MSG_PEEK | MSG_DONTWAIT);
    if (got >= static_cast<ssize_t>(n)) return true;
    if (got == 0) return false;  // EOF
    if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    end - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) return false;
    // A partial frame leaves the socket readable: then wait for the peer's EOF (which ends
    // it) in short steps for more, not in a busy loop.
    pollfd p{fd, static_cast<short>(got > 0 ? POLLRDHUP : POLLIN), 0};
    int r = ::poll(&p, 1, got > 0 ? static_cast<int>(std::min<long>(left, 10)) : static_cast<int>(left));
    if (r < 0 && errno != EINTR) return false;
    if (r > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
      return ::recv(fd, peek.data(), n, MSG_PEEK | MSG_DONTWAIT) >= static_cast<ssize_t>(n);
    }
  }
}

Status ConnServer::Start(UniqueFd listen_fd) {
  if (::pipe2(wake_fd_, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
  listen_fd_ = std::move(listen_fd);
  try {
    acceptor_ = std::thread([this] { AcceptLoop(); });
  } catch (const std::system_error& e) {
    return Status::Unavailable(name_ + ": cannot create the accept thread: " + e.what());
  }
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
    MutexLock lock(&mu_);
    for (auto& c : conns_) {
      ::shutdown(c->fd, SHUT_RDWR);
      if (!c->evicted) admission_.Remove(c->address);
    }
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
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& c : conns_) n += c->done.load() ? 0 : 1;
  return n;
}

ConnCounters ConnServer::counters() const {
  MutexLock lock(&mu_);
  ConnCounters c;
  static_cast<AdmissionCounters&>(c) = admission_.counters();
  c.accepted = accepted_.load();
  return c;
}

void ConnServer::ReapFinishedLocked() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    if ((*it)->done.load()) {
      (*it)->thread.join();
      ::close((*it)->fd);
      if (!(*it)->evicted) admission_.Remove((*it)->address);
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

void ConnServer::ShutDownLocked(Conn* c, uint64_t AdmissionCounters::*why, const char* what) {
  ::shutdown(c->fd, SHUT_RDWR);  // its serve function sees EOF and returns
  c->evicted = true;
  admission_.Remove(c->address);
  admission_.Note(why, what);
}

bool ConnServer::EvictOneLocked(const std::string* address) {
  if (limits_.first_frame_timeout_ms <= 0) return false;  // the server marks nothing
  auto victim = Admission::Victim(
      conns_.begin(), conns_.end(),
      [address](const std::unique_ptr<Conn>& c) -> std::optional<int64_t> {
        if (c->evicted || c->done.load() || c->established.load()) return std::nullopt;
        if (address != nullptr && c->address != *address) return std::nullopt;
        return -c->accepted_at.time_since_epoch().count();  // the oldest
      });
  if (victim == conns_.end()) return false;
  ShutDownLocked(victim->get(), &AdmissionCounters::evicted,
                 "evicted one that had sent no first frame, to make room");
  return true;
}

void ConnServer::EnforceDeadlinesLocked() {
  if (limits_.first_frame_timeout_ms <= 0) return;
  auto cutoff = std::chrono::steady_clock::now() -
                std::chrono::milliseconds(limits_.first_frame_timeout_ms);
  for (const auto& c : conns_) {
    if (c->evicted || c->done.load() || c->established.load() || c->accepted_at > cutoff) continue;
    ShutDownLocked(c.get(), &AdmissionCounters::deadline_closed,
                   "closed one that sent no first frame in time");
  }
}

void ConnServer::Admit(int fd) {
  std::string address = RemoteAddress(fd);
  MutexLock lock(&mu_);
  ReapFinishedLocked();
  // At a cap, the oldest connection not established (of this address, for its cap) makes
  // room; with none, the new one is refused.
  for (Admission::Cap cap; (cap = admission_.Check(address)) != Admission::Cap::kNone;) {
    const bool per_address = cap == Admission::Cap::kAddress;
    if (EvictOneLocked(per_address ? &address : nullptr)) continue;
    if (per_address) {
      admission_.Note(&AdmissionCounters::refused_address,
                      "address " + address + " holds " +
                          std::to_string(limits_.max_per_address) + " connections");
    } else {
      admission_.Note(&AdmissionCounters::refused_full,
                      std::to_string(limits_.max_connections) + " connections open");
    }
    ::close(fd);
    return;
  }
  if (on_accept_) on_accept_(fd);
  auto conn = std::make_unique<Conn>();
  conn->fd = fd;
  conn->address = std::move(address);
  conn->accepted_at = std::chrono::steady_clock::now();
  if (!StartThread(conn.get())) {
    ::close(fd);
    return;
  }
  admission_.Add(conn->address);
  conns_.push_back(std::move(conn));
  accepted_.fetch_add(1);
}

bool ConnServer::StartThread(Conn* conn) {
  try {
    if (fail_threads_for_test_.load() > 0) {
      fail_threads_for_test_.fetch_sub(1);
      throw std::system_error(EAGAIN, std::generic_category(), "test: no thread");
    }
    conn->thread = std::thread([this, conn] {
      tls_established = &conn->established;
      serve_(conn->fd);
      tls_established = nullptr;
      ::shutdown(conn->fd, SHUT_RDWR);
      conn->done.store(true);
    });
  } catch (const std::system_error& e) {
    admission_.Note(&AdmissionCounters::thread_failures,
                    std::string("cannot create a thread: ") + e.what());
    return false;
  }
  return true;
}

void ConnServer::AcceptLoop() {
  pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
  int tick = 1000;
  if (limits_.first_frame_timeout_ms > 0) {
    tick = std::max(10, std::min(250, limits_.first_frame_timeout_ms / 4));
  }
  while (!stopping_.load()) {
    int r = ::poll(fds, 2, tick);
    {
      MutexLock lock(&mu_);
      ReapFinishedLocked();
      EnforceDeadlinesLocked();
    }
    if (r < 0 && errno == EINTR) continue;
    if (fds[1].revents) break;
    if (r <= 0 || !(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) ::usleep(10000);  // let connections close
      continue;
    }
    Admit(fd);
  }
}

}  // namespace mooncake
