#include "fault_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <regex>
#include <vector>

namespace mc_failure {
namespace {

using Clock = std::chrono::steady_clock;

int ListenLoopback(uint16_t* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 1024) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

int ConnectTo(const std::string& host, uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

void ResetAndClose(int fd) {
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  ::close(fd);
}

bool WaitFd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

bool ReadN(int fd, void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    if (!WaitFd(fd, POLLIN, deadline)) return false;
    ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got == 0) return false;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return false;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool WriteN(int fd, const void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (put < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN || !WaitFd(fd, POLLOUT, deadline)) return false;
      continue;
    }
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

}  // namespace

// ------------------------------------------------------------------------------------------
// FaultProxy

FaultProxy::FaultProxy(std::string target_host, uint16_t target_port)
    : host_(std::move(target_host)), target_port_(target_port) {}

FaultProxy::~FaultProxy() { Stop(); }

bool FaultProxy::Start() {
  listen_fd_ = ListenLoopback(&port_);
  if (listen_fd_ < 0 || ::pipe2(wake_, O_CLOEXEC) != 0) return false;
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return true;
}

void FaultProxy::Stop() {
  if (stop_.exchange(true)) return;
  if (wake_[1] >= 0) {
    char c = 0;
    (void)!::write(wake_[1], &c, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  std::list<std::unique_ptr<Conn>> conns;
  {
    std::lock_guard lock(mu_);
    for (auto& c : conns_) {
      if (c->running.load() > 0) Abort(c.get());
    }
    conns.swap(conns_);
  }
  for (auto& c : conns) {
    if (c->up.joinable()) c->up.join();
    if (c->down.joinable()) c->down.join();
  }
  for (int& fd : wake_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void FaultProxy::CutAfter(Direction dir, uint64_t bytes) {
  std::lock_guard lock(mu_);
  cut_left_[dir] = static_cast<int64_t>(bytes);
}

bool FaultProxy::cut_pending() const {
  std::lock_guard lock(mu_);
  return cut_left_[0] >= 0 || cut_left_[1] >= 0;
}

void FaultProxy::FreezeExisting() {
  std::lock_guard lock(mu_);
  for (auto& c : conns_) c->frozen.store(true);
}

void FaultProxy::ThawAll() {
  std::lock_guard lock(mu_);
  for (auto& c : conns_) c->frozen.store(false);
}

std::chrono::steady_clock::time_point FaultProxy::last_cut() const {
  std::lock_guard lock(mu_);
  return last_cut_;
}

void FaultProxy::CutAll() {
  std::lock_guard lock(mu_);
  for (auto& c : conns_) {
    if (c->running.load() > 0 && !c->dead.load()) {
      last_cut_ = Clock::now();
      cuts_.fetch_add(1);
      Abort(c.get());
    }
  }
}

// REQUIRES: the sockets are still open (a pump of `c` is running, or mu_ is held and
// running > 0).
void FaultProxy::Abort(Conn* c) {
  if (c->dead.exchange(true)) return;
  linger l{1, 0};
  ::setsockopt(c->a, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  ::setsockopt(c->b, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  // Wakes both pumps without sending anything; the last one out closes, which sends RST.
  ::shutdown(c->a, SHUT_RD);
  ::shutdown(c->b, SHUT_RD);
}

void FaultProxy::ReapLocked(bool all) {
  for (auto it = conns_.begin(); it != conns_.end();) {
    if (all || (*it)->running.load() == 0) {
      if ((*it)->up.joinable()) (*it)->up.join();
      if ((*it)->down.joinable()) (*it)->down.join();
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

void FaultProxy::AcceptLoop() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
  while (!stop_.load()) {
    int r = ::poll(fds, 2, 100);
    {
      std::lock_guard lock(mu_);
      ReapLocked(false);
    }
    if (r < 0 && errno == EINTR) continue;
    if (fds[1].revents) break;
    if (r <= 0 || !(fds[0].revents & POLLIN)) continue;
    int a = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (a < 0) continue;
    connections_.fetch_add(1);
    if (refuse_.load()) {
      ResetAndClose(a);
      continue;
    }
    int b = ConnectTo(host_, target_port_);
    if (b < 0) {
      ResetAndClose(a);
      continue;
    }
    int one = 1;
    ::setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto conn = std::make_unique<Conn>();
    conn->a = a;
    conn->b = b;
    conn->running.store(2);
    Conn* raw = conn.get();
    std::lock_guard lock(mu_);
    conn->up = std::thread([this, raw] { Pump(raw, kToTarget); });
    conn->down = std::thread([this, raw] { Pump(raw, kToInitiator); });
    conns_.push_back(std::move(conn));
  }
}

void FaultProxy::Pump(Conn* c, Direction dir) {
  const int src = dir == kToTarget ? c->a : c->b;
  const int dst = dir == kToTarget ? c->b : c->a;
  std::vector<uint8_t> buf(256 << 10);
  auto alive = [&] { return !stop_.load() && !c->dead.load(); };
  auto nap = [&](int ms) {
    auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (alive() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  while (alive()) {
    if (stalled_.load() || c->frozen.load()) {
      nap(2);
      continue;
    }
    pollfd p{src, POLLIN, 0};
    int r = ::poll(&p, 1, 20);
    if (r <= 0) continue;
    size_t want = buf.size();
    uint64_t rate = rate_.load();
    if (rate > 0) want = std::max<size_t>(1, std::min<size_t>(want, rate / 50));
    ssize_t n = ::recv(src, buf.data(), want, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      Abort(c);
      break;
    }
    if (n == 0) {
      if (!c->dead.load()) ::shutdown(dst, SHUT_WR);  // pass the FIN on; the other way goes on
      break;
    }
    bool cut = false;
    {
      std::lock_guard lock(mu_);
      if (cut_left_[dir] >= 0) {
        if (n >= cut_left_[dir]) {
          n = cut_left_[dir];
          cut = true;
          cut_left_[dir] = -1;
        } else {
          cut_left_[dir] -= n;
        }
      }
    }
    if (int d = delay_ms_.load(); d > 0) nap(d);
    while (alive() && (stalled_.load() || c->frozen.load())) nap(2);
    size_t off = 0;
    while (alive() && off < static_cast<size_t>(n)) {
      ssize_t put = ::send(dst, buf.data() + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (put < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN) {
          Abort(c);
          break;
        }
        pollfd q{dst, POLLOUT, 0};
        ::poll(&q, 1, 20);
        continue;
      }
      off += static_cast<size_t>(put);
      bytes_[dir].fetch_add(static_cast<uint64_t>(put));
    }
    if (cut) {
      {
        std::lock_guard lock(mu_);
        last_cut_ = Clock::now();
      }
      cuts_.fetch_add(1);
      Abort(c);
      break;
    }
    if (rate > 0) nap(static_cast<int>(static_cast<uint64_t>(n) * 1000 / rate));
  }
  std::lock_guard lock(mu_);
  if (c->running.fetch_sub(1) == 1) {
    ::close(c->a);
    ::close(c->b);
  }
}

// ------------------------------------------------------------------------------------------
// HandshakeProxy

std::string RewriteDescriptor(const std::string& json, uint16_t port) {
  static const std::regex kPort(R"re("tcp_data_port"\s*:\s*[0-9]+)re");
  static const std::regex kHost(R"re("tcp_data_host"\s*:\s*"[^"]*")re");
  static const std::regex kShm(R"re("mc_shm_path"\s*:\s*"[^"]*")re");
  std::string out = std::regex_replace(json, kPort, "\"tcp_data_port\":" + std::to_string(port));
  out = std::regex_replace(out, kHost, "\"tcp_data_host\":\"127.0.0.1\"");
  return std::regex_replace(out, kShm, "\"mc_shm_path\":\"\"");
}

std::string FetchDescriptor(const std::string& host, uint16_t rpc_port) {
  int fd = ConnectTo(host, rpc_port);
  if (fd < 0) return "";
  auto deadline = Clock::now() + std::chrono::seconds(10);
  const char request[] = {3, 0, 0, 0, 0, 0, 0, 0, 1, '{', '}'};
  uint64_t len = 0;
  std::string body;
  bool ok = WriteN(fd, request, sizeof(request), deadline) && ReadN(fd, &len, 8, deadline) &&
            len > 1 && len <= (64u << 20);
  if (ok) {
    body.resize(len);
    ok = ReadN(fd, body.data(), len, deadline) && body[0] == 1;
  }
  ::close(fd);
  return ok ? body.substr(1) : std::string();
}

int FetchTcpDataPort(const std::string& host, uint16_t rpc_port) {
  const std::string body = FetchDescriptor(host, rpc_port);
  static const std::regex kPort(R"re("tcp_data_port"\s*:\s*([0-9]+))re");
  std::smatch m;
  if (!std::regex_search(body, m, kPort)) return -1;
  return std::stoi(m[1].str());
}

HandshakeProxy::HandshakeProxy(std::string target_host, uint16_t target_rpc_port,
                               uint16_t data_port)
    : host_(std::move(target_host)), target_port_(target_rpc_port), data_port_(data_port) {}

HandshakeProxy::~HandshakeProxy() { Stop(); }

bool HandshakeProxy::Start() {
  listen_fd_ = ListenLoopback(&port_);
  if (listen_fd_ < 0 || ::pipe2(wake_, O_CLOEXEC) != 0) return false;
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return true;
}

void HandshakeProxy::Stop() {
  if (stop_.exchange(true)) return;
  if (wake_[1] >= 0) {
    char c = 0;
    (void)!::write(wake_[1], &c, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  std::list<std::thread> workers;
  {
    std::lock_guard lock(mu_);
    workers.swap(workers_);
  }
  for (auto& t : workers) t.join();
  for (int& fd : wake_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void HandshakeProxy::AcceptLoop() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
  while (!stop_.load()) {
    int r = ::poll(fds, 2, 100);
    if (r < 0 && errno == EINTR) continue;
    if (fds[1].revents) break;
    if (r <= 0 || !(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard lock(mu_);
    workers_.emplace_back([this, fd] { Serve(fd); });
  }
}

void HandshakeProxy::Serve(int fd) {
  auto deadline = Clock::now() + std::chrono::seconds(10);
  uint64_t len = 0;
  std::string body;
  int up = -1;
  bool ok = ReadN(fd, &len, 8, deadline) && len > 0 && len <= (64u << 20);
  if (ok) {
    body.resize(len);
    ok = ReadN(fd, body.data(), len, deadline);
  }
  if (ok) {
    up = ConnectTo(host_, target_port_);
    ok = up >= 0 && WriteN(up, &len, 8, deadline) && WriteN(up, body.data(), len, deadline);
  }
  if (ok) ok = ReadN(up, &len, 8, deadline) && len > 0 && len <= (64u << 20);
  if (ok) {
    body.assign(len, '\0');
    ok = ReadN(up, body.data(), len, deadline);
  }
  if (ok) {
    if (body[0] == 1) {  // Metadata reply: type byte, then the descriptor JSON
      body = std::string(1, '\x01') + RewriteDescriptor(body.substr(1), data_port_);
      len = body.size();
      rewrites_.fetch_add(1);
    }
    ok = WriteN(fd, &len, 8, deadline) && WriteN(fd, body.data(), len, deadline);
  }
  if (up >= 0) ::close(up);
  ::shutdown(fd, SHUT_WR);
  char sink[256];
  auto drain = Clock::now() + std::chrono::seconds(1);
  while (WaitFd(fd, POLLIN, drain) && ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
  }
  ::close(fd);
}

}  // namespace mc_failure
