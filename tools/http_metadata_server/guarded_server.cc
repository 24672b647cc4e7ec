#include "guarded_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <system_error>
#include <thread>
#include <vector>

namespace mooncake::http {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Waits up to timeout_ms for `events` on fd; false on timeout, error, or once `server` has
// been stopped (checked every 100 ms, so that stop() never waits out a slow client).
bool WaitFd(int fd, short events, int timeout_ms, const GuardedServer* server) {
  pollfd p{fd, events, 0};
  const int64_t deadline = NowMs() + (timeout_ms < 0 ? 0 : timeout_ms);
  for (;;) {
    const int64_t left = deadline - NowMs();
    int slice = left < 0 ? 0 : static_cast<int>(left < 100 ? left : 100);
    int r = ::poll(&p, 1, slice);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
    if (r == 0 && (left <= 0 || server->stopping())) return false;
  }
}

void Address(int fd, bool peer, std::string& ip, int& port) {
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

// A socket stream whose reads end at the request's deadlines: the head within head_timeout,
// each read within read_timeout, the whole request within request_timeout.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int fd, const GuardLimits& limits, GuardedServer* server)
      : fd_(fd), limits_(limits), server_(server) {}

  void BeginRequest() {
    start_ms_ = NowMs();
    match_ = 0;
    head_done_ = false;
  }

  bool is_readable() const override { return WaitFd(fd_, POLLIN, ReadWaitMs(), server_); }
  bool is_writable() const override {
    return WaitFd(fd_, POLLOUT, limits_.read_timeout_ms, server_);
  }

  ssize_t read(char* ptr, size_t size) override {
    if (!WaitFd(fd_, POLLIN, ReadWaitMs(), server_)) {
      if (!server_->stopping()) server_->NoteTimeout();
      return -1;
    }
    ssize_t n;
    do {
      n = ::recv(fd_, ptr, size, 0);
    } while (n < 0 && errno == EINTR);
    if (n > 0 && !head_done_) ScanHead(ptr, static_cast<size_t>(n));
    return n;
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!WaitFd(fd_, POLLOUT, limits_.read_timeout_ms, server_)) return -1;
    ssize_t n;
    do {
      n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Address(fd_, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Address(fd_, false, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  int ReadWaitMs() const {
    int64_t budget = head_done_ ? limits_.request_timeout_ms : limits_.head_timeout_ms;
    int64_t left = start_ms_ + budget - NowMs();
    if (left > limits_.read_timeout_ms) left = limits_.read_timeout_ms;
    return left < 0 ? 0 : static_cast<int>(left);
  }
  // Notices the blank line that ends the head ("\r\n\r\n"), across reads.
  void ScanHead(const char* p, size_t n) {
    static const char kEnd[] = "\r\n\r\n";
    for (size_t i = 0; i < n && !head_done_; ++i) {
      if (p[i] == kEnd[match_]) {
        if (++match_ == 4) head_done_ = true;
      } else {
        match_ = p[i] == '\r' ? 1 : 0;
      }
    }
  }

  const int fd_;
  const GuardLimits& limits_;
  GuardedServer* const server_;
  int64_t start_ms_ = 0;
  int match_ = 0;
  bool head_done_ = false;
};

// Grows a thread for each queued connection no idle thread can take, up to `max` threads.
class GrowingPool final : public httplib::TaskQueue {
 public:
  GrowingPool(size_t max, GuardedServer* server) : max_(max), server_(server) {}
  ~GrowingPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
    if (queue_.size() > idle_ && threads_.size() < max_) {
      try {
        threads_.emplace_back([this] { Work(); });
      } catch (const std::system_error&) {
        server_->NoteThreadFailure();  // the connection waits for a busy thread instead
      }
    }
    cv_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++idle_;
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        --idle_;
        if (queue_.empty()) return;  // stopping, nothing left
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  const size_t max_;
  GuardedServer* const server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace

GuardedServer::GuardedServer(GuardLimits limits) : limits_(limits) {
  new_task_queue = [this] { return new GrowingPool(limits_.max_connections, this); };
  // httplib's default socket options include SO_REUSEPORT, which lets a second server share
  // the port (and split the keys): without it, a port in use fails to bind.
  set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
}

GuardCounters GuardedServer::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

void GuardedServer::NoteTimeout() {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.timed_out;
  MaybeLog();
}

void GuardedServer::NoteThreadFailure() {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.thread_failures;
  MaybeLog();
}

void GuardedServer::MaybeLog() {
  uint64_t total = counters_.refused_address + counters_.timed_out + counters_.thread_failures;
  int64_t now = NowMs();
  if (total == logged_total_ || now - last_log_ms_ < 10000) return;
  std::fprintf(stderr,
               "mooncake_http_metadata_server: %llu connections refused (per-address cap %zu), "
               "%llu closed at a deadline, %llu without a thread, so far\n",
               static_cast<unsigned long long>(counters_.refused_address),
               limits_.max_per_address, static_cast<unsigned long long>(counters_.timed_out),
               static_cast<unsigned long long>(counters_.thread_failures));
  last_log_ms_ = now;
  logged_total_ = total;
}

bool GuardedServer::Admit(const std::string& ip) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t& n = per_address_[ip];
  if (n >= limits_.max_per_address) {
    ++counters_.refused_address;
    MaybeLog();
    return false;
  }
  ++n;
  return true;
}

void GuardedServer::Release(const std::string& ip) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = per_address_.find(ip);
  if (it != per_address_.end() && --it->second == 0) per_address_.erase(it);
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  std::string ip;
  int port = 0;
  Address(sock, true, ip, port);
  bool ret = false;
  if (Admit(ip)) {
    DeadlineStream stream(sock, limits_, this);
    const size_t max_requests = keep_alive_max_count_ ? keep_alive_max_count_ : 1;
    for (size_t i = 0; i < max_requests && !stopping(); ++i) {
      // The first request's head is due within head_timeout; the next within keep_alive.
      if (!WaitFd(sock, POLLIN, i == 0 ? limits_.head_timeout_ms : limits_.keep_alive_ms, this)) {
        if (i == 0 && !stopping()) NoteTimeout();
        break;
      }
      stream.BeginRequest();
      bool closed = false;
      ret = process_request(stream, i + 1 == max_requests, closed, nullptr);
      if (!ret || closed) break;
    }
    Release(ip);
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

}  // namespace mooncake::http
