#include "metadata/http_server/guarded_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <functional>
#include <optional>
#include <utility>
#include <system_error>

#include "common/net.h"

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

GuardedServer::GuardedServer(GuardLimits limits)
    : limits_(limits), admission_("HTTP metadata server", {SIZE_MAX, limits.max_per_address}) {
  new_task_queue = [this] {
    StartWorkers();
    return new FilingQueue(this);
  };
}

GuardedServer::~GuardedServer() { StopWorkers(); }

Result<int> GuardedServer::Bind(const std::string& host, int port) {
  // Not httplib's bind: its default socket options include SO_REUSEPORT, which lets a second
  // server share the port (and split the keys), and its backlog of 5 drops a crowd's SYNs
  // (each drop costs its client a 1 s retransmission).
  ListenOptions lo;
  lo.backlog = limits_.listen_backlog;
  auto listener = ListenTcp(host, port, lo);
  if (!listener.ok()) return listener.status();
  SetNoDelay(listener->fd.get());  // small replies: no Nagle / delayed-ACK stalls
  svr_sock_ = listener->fd.Release();
  return listener->port;
}

GuardCounters GuardedServer::counters() const {
  MutexLock lock(&mu_);
  const AdmissionCounters& a = admission_.counters();
  GuardCounters c;
  c.refused_address = a.refused_address;
  c.timed_out = a.deadline_closed;
  c.thread_failures = a.thread_failures;
  c.shed = a.evicted;
  return c;
}

void GuardedServer::NoteTimeout() {
  MutexLock lock(&mu_);
  admission_.Note(&AdmissionCounters::deadline_closed, "closed one past a request deadline");
}

void GuardedServer::StartWorkers() {
  MutexLock lock(&mu_);
  workers_stopping_ = false;
}

void GuardedServer::StopWorkers() {
  std::vector<std::thread> workers;
  {
    MutexLock lock(&mu_);
    workers_stopping_ = true;
    for (const Waiting& w : waiting_) {
      ::close(w.fd);
      ForgetLocked(w.ip, false);
    }
    waiting_.clear();
    for (Conn* c : served_) ::shutdown(c->fd, SHUT_RDWR);  // out of their waits at once
    workers.swap(workers_);
  }
  cv_.SignalAll();
  for (auto& t : workers) t.join();
}

void GuardedServer::ForgetLocked(const std::string& ip, bool served) {
  admission_.Remove(ip);
  if (!served) return;
  auto it = loads_.find(ip);
  if (it != loads_.end() && --it->second.served == 0) loads_.erase(it);
}

// Past max_connections waiting, the newest waiting one from the address with the most
// connections is closed.
void GuardedServer::DropWaitingLocked() {
  while (waiting_.size() > limits_.max_connections) {
    int64_t order = 0;  // the newest of equals
    auto drop = Admission::Victim(waiting_.begin(), waiting_.end(), [&](const Waiting& w) {
      mu_.AssertHeld();  // the lambda runs here, under mu_
      return std::optional<std::pair<size_t, int64_t>>({admission_.live(w.ip), order++});
    });
    ::close(drop->fd);
    ForgetLocked(drop->ip, false);
    waiting_.erase(drop);
    admission_.Note(&AdmissionCounters::evicted,
                    "closed a waiting one: " + std::to_string(limits_.max_connections) +
                        " were waiting already");
  }
}

// Frees a worker for each waiting connection no idle worker (or one already shed) will
// take: see the header for which connection is shed.
void GuardedServer::ShedLocked() {
  const size_t free = idle_workers_ + shed_pending_;
  if (waiting_.size() <= free) return;
  size_t need = waiting_.size() - free;
  const int64_t now = NowMs();
  // Rank: the address's served connections not yet shed, then the longest waiting.
  auto rank = [&](Conn* c) -> std::optional<std::pair<size_t, int64_t>> {
    mu_.AssertHeld();  // the lambda runs here, under mu_
    if (c->shed || !c->on_client.load()) return std::nullopt;
    const int64_t since = c->since_ms.load();
    if (now - since < limits_.shed_after_ms) return std::nullopt;
    const Load& l = loads_[c->ip];
    return std::make_pair(l.served - l.shedding, -since);
  };
  for (; need > 0; --need) {
    auto it = Admission::Victim(served_.begin(), served_.end(), rank);
    if (it == served_.end()) break;
    Conn* victim = *it;
    victim->shed = true;
    ++loads_[victim->ip].shedding;
    ++shed_pending_;
    admission_.Note(&AdmissionCounters::evicted,
                    "shed one slow or idle from " + victim->ip + " to free a worker");
    ::shutdown(victim->fd, SHUT_RDWR);  // its worker's wait ends; the socket is closed there
  }
}

void GuardedServer::Tick() {
  int64_t now = NowMs();
  int64_t last = last_tick_ms_.load();
  if (now - last < 100 || !last_tick_ms_.compare_exchange_strong(last, now)) return;
  MutexLock lock(&mu_);
  ShedLocked();
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  std::string ip;
  int port = 0;
  PeerOrLocal(sock, true, ip, port);
  {
    MutexLock lock(&mu_);
    bool refuse = workers_stopping_ || stopping();
    if (!refuse && admission_.Check(ip) == Admission::Cap::kAddress) {
      admission_.Note(&AdmissionCounters::refused_address,
                      "address " + ip + " holds " + std::to_string(limits_.max_per_address) +
                          " connections");
      refuse = true;
    }
    if (refuse) {
      ::close(sock);
      return false;
    }
    admission_.Add(ip);
    waiting_.push_back({sock, ip, NowMs()});
    DropWaitingLocked();
    if (waiting_.size() > idle_workers_ && workers_.size() < limits_.max_connections) {
      try {
        workers_.emplace_back([this] { Work(); });
        ++idle_workers_;  // counted idle from now: it cannot look before we unlock
      } catch (const std::system_error& e) {
        // The connection waits for a busy worker instead.
        admission_.Note(&AdmissionCounters::thread_failures,
                        std::string("cannot create a thread: ") + e.what());
      }
    }
    ShedLocked();
  }
  cv_.Signal();
  return true;
}

void GuardedServer::TakeWaitingLocked(Conn* conn) {
  auto pick = Admission::Victim(waiting_.begin(), waiting_.end(), [&](const Waiting& w) {
    mu_.AssertHeld();  // the lambda runs here, under mu_
    auto it = loads_.find(w.ip);
    return std::optional<int64_t>(-static_cast<int64_t>(it == loads_.end() ? 0 : it->second.served));
  });
  conn->fd = pick->fd;
  conn->ip = pick->ip;
  conn->since_ms.store(NowMs());
  waiting_.erase(pick);
  ++loads_[conn->ip].served;
  served_.insert(conn);
}

void GuardedServer::Work() {
  mu_.Lock();
  for (bool counted = true;; counted = false) {
    if (!counted) ++idle_workers_;
    while (!workers_stopping_ && waiting_.empty()) cv_.Wait(&mu_);
    --idle_workers_;
    if (workers_stopping_) break;  // StopWorkers closed the waiting ones
    Conn conn;
    TakeWaitingLocked(&conn);
    mu_.Unlock();
    Serve(conn);
    ::shutdown(conn.fd, SHUT_RDWR);
    mu_.Lock();
    served_.erase(&conn);  // before the close: a shed must never reach a reused fd
    if (conn.shed) {
      --shed_pending_;
      auto it = loads_.find(conn.ip);
      if (it != loads_.end()) --it->second.shedding;
    }
    ForgetLocked(conn.ip, true);
    ::close(conn.fd);
  }
  mu_.Unlock();
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
