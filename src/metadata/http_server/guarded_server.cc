#include "metadata/http_server/guarded_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstdio>
#include <functional>
#include <system_error>

namespace mooncake::http {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Waits up to timeout_ms for `events` on fd; false on timeout, error, or once `server` has
// been stopped (checked every 100 ms, so that stop() never waits out a slow client). Each
// 100 ms that passes lets the server shed (GuardedServer::Tick).
bool WaitFd(int fd, short events, int timeout_ms, GuardedServer* server) {
  pollfd p{fd, events, 0};
  const int64_t deadline = NowMs() + (timeout_ms < 0 ? 0 : timeout_ms);
  for (;;) {
    const int64_t left = deadline - NowMs();
    int slice = left < 0 ? 0 : static_cast<int>(left < 100 ? left : 100);
    int r = ::poll(&p, 1, slice);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
    if (r == 0) {
      if (left <= 0 || server->stopping()) return false;
      server->Tick();
    }
  }
}

void PeerOrLocal(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  int r = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len)
               : ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  ip.clear();
  port = 0;
  if (r != 0) return;
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

// A socket stream whose reads end at the request's deadlines: the head within head_timeout
// of BeginRequest, each read within read_timeout, the whole request within request_timeout.
// While it waits on the client its connection is marked so (Conn::on_client): only then may
// the server shed it.
class DeadlineStream final : public httplib::Stream {
 public:
  using Conn = GuardedServer::Conn;
  DeadlineStream(Conn& conn, const GuardLimits& limits, GuardedServer* server)
      : conn_(conn), fd_(conn.fd), limits_(limits), server_(server) {}

  // A request is due from now (its head within head_timeout_ms).
  void BeginRequest() {
    start_ms_ = NowMs();
    conn_.since_ms.store(start_ms_);
    match_ = 0;
    head_bytes_ = 0;
    head_done_ = false;
  }
  // Waits for the first byte of the request begun; false at its head deadline or a stop.
  bool AwaitRequest() { return Wait(POLLIN, ReadWaitMs()); }
  // Waits up to keep_alive_ms for the next request's first byte.
  bool AwaitNext() {
    conn_.since_ms.store(NowMs());
    return Wait(POLLIN, limits_.keep_alive_ms);
  }

  bool is_readable() const override { return Wait(POLLIN, ReadWaitMs()); }
  bool is_writable() const override { return Wait(POLLOUT, limits_.read_timeout_ms); }

  ssize_t read(char* ptr, size_t size) override {
    // A passed deadline ends the request even while bytes keep coming (a poll would still
    // find them ready): the head and the request are bounded in time, not only per read.
    if (DeadlinePassed() || !Wait(POLLIN, ReadWaitMs())) {
      if (!server_->stopping()) server_->NoteTimeout();
      return -1;
    }
    if (!head_done_ && size > limits_.max_head_bytes - head_bytes_) {
      size = limits_.max_head_bytes - head_bytes_;
      if (size == 0) return -1;  // a head past max_head_bytes (cpp-httplib counts no lines)
    }
    ssize_t n;
    do {
      n = ::recv(fd_, ptr, size, 0);
    } while (n < 0 && errno == EINTR);
    if (n > 0 && !head_done_) ScanHead(ptr, static_cast<size_t>(n));
    return n;
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!Wait(POLLOUT, limits_.read_timeout_ms)) return -1;
    ssize_t n;
    do {
      n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    PeerOrLocal(fd_, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    PeerOrLocal(fd_, false, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  bool Wait(short events, int timeout_ms) const {
    conn_.on_client.store(true);
    bool ok = WaitFd(fd_, events, timeout_ms, server_);
    conn_.on_client.store(false);
    return ok;
  }
  int64_t Deadline() const {
    return start_ms_ + (head_done_ ? limits_.request_timeout_ms : limits_.head_timeout_ms);
  }
  bool DeadlinePassed() const { return NowMs() >= Deadline(); }
  int ReadWaitMs() const {
    int64_t left = Deadline() - NowMs();
    if (left > limits_.read_timeout_ms) left = limits_.read_timeout_ms;
    return left < 0 ? 0 : static_cast<int>(left);
  }
  // Notices the blank line that ends the head ("\r\n\r\n"), across reads.
  void ScanHead(const char* p, size_t n) {
    static const char kEnd[] = "\r\n\r\n";
    head_bytes_ += n;  // bytes past the head's end in this read count too (bounded by size)
    for (size_t i = 0; i < n && !head_done_; ++i) {
      if (p[i] == kEnd[match_]) {
        if (++match_ == 4) head_done_ = true;
      } else {
        match_ = p[i] == '\r' ? 1 : 0;
      }
    }
  }

  Conn& conn_;
  const int fd_;
  const GuardLimits& limits_;
  GuardedServer* const server_;
  int64_t start_ms_ = 0;
  int match_ = 0;
  size_t head_bytes_ = 0;
  bool head_done_ = false;
};

// httplib's accept loop hands each accepted socket to enqueue(): this queue runs it at once,
// on the accepting thread, where GuardedServer::process_and_close_socket only files the
// connection for a worker. shutdown() (the loop has ended) ends the workers.
class FilingQueue final : public httplib::TaskQueue {
 public:
  explicit FilingQueue(GuardedServer* server) : server_(server) {}
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override { server_->StopWorkers(); }

 private:
  GuardedServer* const server_;
};

}  // namespace

GuardedServer::GuardedServer(GuardLimits limits) : limits_(limits) {
  new_task_queue = [this] {
    StartWorkers();
    return new FilingQueue(this);
  };
  // httplib's default socket options include SO_REUSEPORT, which lets a second server share
  // the port (and split the keys): without it, a port in use fails to bind.
  set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
}

GuardedServer::~GuardedServer() { StopWorkers(); }

GuardCounters GuardedServer::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

void GuardedServer::NoteTimeout() {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.timed_out;
  MaybeLogLocked();
}

void GuardedServer::MaybeLogLocked() {
  uint64_t total = counters_.refused_address + counters_.timed_out + counters_.thread_failures +
                   counters_.shed;
  int64_t now = NowMs();
  if (total == logged_total_ || now - last_log_ms_ < 10000) return;
  std::fprintf(stderr,
               "mooncake_http_metadata_server: %llu connections refused (per-address cap %zu), "
               "%llu shed (slow or idle while the server was full), %llu closed at a deadline, "
               "%llu without a thread, so far\n",
               static_cast<unsigned long long>(counters_.refused_address),
               limits_.max_per_address, static_cast<unsigned long long>(counters_.shed),
               static_cast<unsigned long long>(counters_.timed_out),
               static_cast<unsigned long long>(counters_.thread_failures));
  last_log_ms_ = now;
  logged_total_ = total;
}

void GuardedServer::StartWorkers() {
  // cpp-httplib listens with a backlog of 5: a crowd connecting at once overflows it, and
  // every SYN dropped costs its client a 1 s retransmission. Listening again resizes it.
  const socket_t sock = svr_sock_;
  if (sock != INVALID_SOCKET) ::listen(sock, limits_.listen_backlog);
  std::lock_guard<std::mutex> lock(mu_);
  workers_stopping_ = false;
}

void GuardedServer::StopWorkers() {
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    workers_stopping_ = true;
    for (const Waiting& w : waiting_) {
      ::close(w.fd);
      ForgetLocked(w.ip, false);
    }
    waiting_.clear();
    for (Conn* c : served_) ::shutdown(c->fd, SHUT_RDWR);  // out of their waits at once
    workers.swap(workers_);
  }
  cv_.notify_all();
  for (auto& t : workers) t.join();
}

void GuardedServer::ForgetLocked(const std::string& ip, bool served) {
  auto it = addresses_.find(ip);
  if (it == addresses_.end()) return;
  if (served) --it->second.served;
  if (--it->second.total == 0) addresses_.erase(it);
}

// Past max_connections waiting, the newest waiting one from the address with the most
// connections is closed.
void GuardedServer::DropWaitingLocked() {
  while (waiting_.size() > limits_.max_connections) {
    auto drop = waiting_.end();
    size_t most = 0;
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      size_t total = addresses_[it->ip].total;
      if (drop == waiting_.end() || total >= most) {
        drop = it;
        most = total;
      }
    }
    ::close(drop->fd);
    ForgetLocked(drop->ip, false);
    waiting_.erase(drop);
    ++counters_.shed;
  }
}

// Frees a worker for each waiting connection no idle worker (or one already shed) will
// take: see the header for which connection is shed.
void GuardedServer::ShedLocked() {
  const size_t free = idle_workers_ + shed_pending_;
  if (waiting_.size() <= free) return;
  size_t need = waiting_.size() - free;
  const int64_t now = NowMs();
  for (; need > 0; --need) {
    Conn* victim = nullptr;
    size_t victim_load = 0;
    int64_t victim_since = 0;
    for (Conn* c : served_) {
      if (c->shed || !c->on_client.load()) continue;
      const int64_t since = c->since_ms.load();
      if (now - since < limits_.shed_after_ms) continue;
      const PerAddress& a = addresses_[c->ip];
      const size_t load = a.served - a.shedding;
      if (victim == nullptr || load > victim_load ||
          (load == victim_load && since < victim_since)) {
        victim = c;
        victim_load = load;
        victim_since = since;
      }
    }
    if (victim == nullptr) break;
    victim->shed = true;
    ++addresses_[victim->ip].shedding;
    ++shed_pending_;
    ++counters_.shed;
    ::shutdown(victim->fd, SHUT_RDWR);  // its worker's wait ends; the socket is closed there
  }
  MaybeLogLocked();
}

void GuardedServer::Tick() {
  int64_t now = NowMs();
  int64_t last = last_tick_ms_.load();
  if (now - last < 100 || !last_tick_ms_.compare_exchange_strong(last, now)) return;
  std::lock_guard<std::mutex> lock(mu_);
  ShedLocked();
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  std::string ip;
  int port = 0;
  PeerOrLocal(sock, true, ip, port);
  std::unique_lock<std::mutex> lock(mu_);
  if (workers_stopping_ || stopping()) {
    lock.unlock();
    ::close(sock);
    return false;
  }
  PerAddress& a = addresses_[ip];
  if (a.total >= limits_.max_per_address) {
    ++counters_.refused_address;
    MaybeLogLocked();
    lock.unlock();
    ::close(sock);
    return false;
  }
  ++a.total;
  waiting_.push_back({sock, ip, NowMs()});
  DropWaitingLocked();
  if (waiting_.size() > idle_workers_ && workers_.size() < limits_.max_connections) {
    try {
      workers_.emplace_back([this] { Work(); });
      ++idle_workers_;  // counted idle from now: it cannot look before we unlock
    } catch (const std::system_error&) {
      ++counters_.thread_failures;  // the connection waits for a busy worker instead
      MaybeLogLocked();
    }
  }
  ShedLocked();
  lock.unlock();
  cv_.notify_one();
  return true;
}

void GuardedServer::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (bool counted = true;; counted = false) {
    if (!counted) ++idle_workers_;
    cv_.wait(lock, [this] { return workers_stopping_ || !waiting_.empty(); });
    --idle_workers_;
    if (workers_stopping_) return;  // StopWorkers closed the waiting ones
    // The waiting connection whose address has the fewest served, then the oldest.
    auto pick = waiting_.begin();
    size_t fewest = addresses_[pick->ip].served;
    for (auto it = waiting_.begin() + 1; it != waiting_.end(); ++it) {
      size_t served = addresses_[it->ip].served;
      if (served < fewest) {
        pick = it;
        fewest = served;
      }
    }
    Conn conn;
    conn.fd = pick->fd;
    conn.ip = pick->ip;
    conn.since_ms.store(NowMs());
    waiting_.erase(pick);
    ++addresses_[conn.ip].served;
    served_.insert(&conn);
    lock.unlock();
    Serve(conn);
    ::shutdown(conn.fd, SHUT_RDWR);
    lock.lock();
    served_.erase(&conn);  // before the close: a shed must never reach a reused fd
    if (conn.shed) {
      --shed_pending_;
      auto it = addresses_.find(conn.ip);
      if (it != addresses_.end()) --it->second.shedding;
    }
    ForgetLocked(conn.ip, true);
    ::close(conn.fd);
  }
}

void GuardedServer::Serve(Conn& conn) {
  DeadlineStream stream(conn, limits_, this);
  const size_t max_requests = keep_alive_max_count_ ? keep_alive_max_count_ : 1;
  for (size_t i = 0; i < max_requests && !stopping(); ++i) {
    // The first request's head is due within head_timeout of now (its first byte included);
    // the next one's first byte within keep_alive, and its head within head_timeout of it.
    if (i == 0) {
      stream.BeginRequest();
      if (!stream.AwaitRequest()) {
        if (!stopping()) NoteTimeout();
        break;
      }
    } else {
      if (!stream.AwaitNext()) break;
      stream.BeginRequest();
    }
    bool closed = false;
    bool ok = process_request(stream, i + 1 == max_requests, closed, nullptr);
    if (!ok || closed) break;
  }
}

}  // namespace mooncake::http
