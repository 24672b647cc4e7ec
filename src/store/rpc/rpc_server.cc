#include "store/rpc/rpc_server.h"
#include "store/rpc/rpc_server_internal.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace mooncake {
namespace store {

namespace rpc_internal {

// Logs at most one line a second per call site.
bool LogNow(std::atomic<int64_t>* last) {
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          Clock::now().time_since_epoch()).count();
  int64_t prev = last->load();
  return prev != now && last->compare_exchange_strong(prev, now);
}

std::string PeerOf(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return std::string(host) + ":" + serv;
}

}  // namespace rpc_internal

using namespace rpc_internal;  // NOLINT

RpcServer::RpcServer(Options options, Handler handler)
    : options_(std::move(options)), handler_(std::move(handler)) {}

RpcServer::~RpcServer() { Stop(); }

Status RpcServer::Start(const std::string& host, int port) {
  if (started_) return Status::FailedPrecondition("already started");
  if (options_.threads < 1) return Status::InvalidArgument("threads must be >= 1");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string h = (host.empty() || host == "0.0.0.0") ? "0.0.0.0" : host;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(h.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) return Status::InvalidArgument("cannot resolve '" + host + "': " + gai_strerror(rc));
  std::string error = "no address for '" + host + "'";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
      error = std::string(errno == EADDRINUSE ? "address in use" : std::strerror(errno));
      close(fd);
      continue;
    }
    listen_fd_ = fd;
    break;
  }
  freeaddrinfo(res);
  if (listen_fd_ < 0) return Status::Unavailable(error);
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  for (int i = 0; i < options_.threads; ++i) {
    auto loop = std::make_unique<Loop>();
    loop->ep = epoll_create1(EPOLL_CLOEXEC);
    loop->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (loop->ep < 0 || loop->wake < 0) {
      error = std::string("epoll: ") + std::strerror(errno);
      if (loop->ep >= 0) close(loop->ep);
      if (loop->wake >= 0) close(loop->wake);
      for (auto& l : loops_) {
        close(l->ep);
        close(l->wake);
      }
      loops_.clear();
      close(listen_fd_);
      listen_fd_ = -1;
      return Status::Internal(error);
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLEXCLUSIVE;
    ev.data.u64 = EventTag(listen_fd_, 0);
    epoll_ctl(loop->ep, EPOLL_CTL_ADD, listen_fd_, &ev);
    ev.events = EPOLLIN;
    ev.data.u64 = EventTag(loop->wake, 0);
    epoll_ctl(loop->ep, EPOLL_CTL_ADD, loop->wake, &ev);
    loop->scratch.resize(kReadChunk);
    loop->budget = options_.max_buffered_bytes / static_cast<size_t>(options_.threads);
    loops_.push_back(std::move(loop));
  }
  worker_ = std::make_unique<Worker>();
  worker_->thread = std::thread([this] { RunWorker(); });
  for (auto& l : loops_) {
    Loop* p = l.get();
    l->thread = std::thread([this, p] { RunLoop(p); });
  }
  started_ = true;
  return Status::OK();
}

void RpcServer::Stop() {
  if (!started_) return;
  started_ = false;
  stop_.store(true);
  {
    std::lock_guard<std::mutex> lock(worker_->mu);
  }
  worker_->cv.notify_all();
  worker_->thread.join();
  for (auto& l : loops_) {
    uint64_t one = 1;
    (void)!write(l->wake, &one, sizeof(one));
  }
  for (auto& l : loops_) {
    l->thread.join();
    for (auto& [fd, c] : l->conns) {
      buffered_ -= c->in.size();
      held_ -= c->held;
      close(fd);
    }
    open_ -= l->conns.size();
    l->conns.clear();
    close(l->ep);
    close(l->wake);
  }
  loops_.clear();
  close(listen_fd_);
  listen_fd_ = -1;
  if (spare_fd_ >= 0) close(spare_fd_);
  spare_fd_ = -1;
}

void RpcServer::RunWorker() {
  Worker& w = *worker_;
  std::unique_lock<std::mutex> lock(w.mu);
  while (true) {
    w.cv.wait(lock, [&] { return stop_.load() || !w.jobs.empty(); });
    if (stop_.load()) return;
    std::unique_ptr<Job> job = std::move(w.jobs.front());
    w.jobs.pop_front();
    lock.unlock();
    job->reply.assign(kFrameHeaderBytes, '\0');
    RpcStatus st = handler_(job->method, job->payload.data(), job->payload.size(), &job->reply);
    FrameHeader h;
    h.method = job->method;
    h.status = static_cast<uint16_t>(st);
    h.seq = job->seq;
    h.length = static_cast<uint32_t>(job->reply.size() - kFrameHeaderBytes);
    EncodeHeader(&job->reply[0], h);
    Loop* loop = job->loop;
    {
      std::lock_guard<std::mutex> l(loop->done_mu);
      loop->done.push_back(std::move(job));
    }
    uint64_t one = 1;
    (void)!write(loop->wake, &one, sizeof(one));
    lock.lock();
  }
}

void RpcServer::RunLoop(Loop* loop) {
  std::vector<epoll_event> events(256);
  auto last_sweep = Clock::now();
  while (!stop_.load()) {
    // Connections with requests left from their last turn: take new events without sleeping.
    const int wait_ms = loop->ready.empty() ? 500 : 0;
    int n = epoll_wait(loop->ep, events.data(), static_cast<int>(events.size()), wait_ms);
    if (stop_.load()) break;
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      const int fd = static_cast<int>(static_cast<uint32_t>(tag));
      if (fd == listen_fd_) {
        Accept(loop);
        continue;
      }
      if (fd == loop->wake) {
        uint64_t v;
        (void)!read(loop->wake, &v, sizeof(v));
        std::vector<std::unique_ptr<Job>> done;
        {
          std::lock_guard<std::mutex> l(loop->done_mu);
          done.swap(loop->done);
        }
        for (auto& job : done) {
          auto it = loop->conns.find(job->fd);
          if (it == loop->conns.end() || it->second->id != job->conn_id) continue;  // gone
          Conn* c = it->second.get();
          c->busy = false;
          c->job_bytes = 0;
          Charge(loop, c);
          c->out = std::move(job->reply);
          c->sent = 0;
          Account(c);
          c->last_active = Clock::now();
          if (!Flush(c) || !Serve(loop, c) || Finished(c)) {
            Close(loop, c);
            continue;
          }
          Rearm(loop, c);
        }
        continue;
      }
      auto it = loop->conns.find(fd);
      // Gone, or closed earlier in this batch (room, a hog) and its fd taken by a new one.
      if (it == loop->conns.end() || EventTag(fd, it->second->id) != tag) continue;
      Conn* c = it->second.get();
      const uint32_t ev = events[i].events;
      bool ok = true;
      if (ev & (EPOLLERR | EPOLLHUP)) {
        ok = false;  // both directions gone: no reply can reach the client
      } else {
        if (ev & EPOLLOUT) ok = Flush(c) && Serve(loop, c);
        if (ok && (ev & (EPOLLIN | EPOLLRDHUP)) && !c->busy && !c->eof && !c->more &&
            c->sent == c->out.size()) {
          ok = OnReadable(loop, c) && Serve(loop, c);
        }
      }
      if (!ok || Finished(c)) {
        Close(loop, c);
        continue;
      }
      Rearm(loop, c);
    }
    ServeReady(loop);
    const auto now = Clock::now();
    if (now - last_sweep >= std::chrono::milliseconds(500)) {
      last_sweep = now;
      std::vector<Conn*> late;
      for (auto& [fd, c] : loop->conns) {
        if (c->partial_since == Clock::time_point::max()) continue;
        const auto pending = now - c->partial_since;
        // The header's deadline only while the loop reads from it (not while its request is
        // on the worker or its replies wait: its next bytes then wait in its socket).
        const bool reading = !c->busy && !c->more && c->sent == c->out.size();
        if (pending > options_.request_deadline ||
            (reading && c->in.size() < kFrameHeaderBytes && pending > options_.header_deadline)) {
          late.push_back(c.get());
        }
      }
      for (Conn* c : late) {
        static std::atomic<int64_t> last{0};
        if (LogNow(&last)) {
          const bool header = c->in.size() < kFrameHeaderBytes;
          LOG(WARNING) << "master RPC: " << PeerOf(c->fd) << " did not complete a request"
                       << (header ? "'s header" : "") << " within "
                       << (header ? options_.header_deadline : options_.request_deadline).count()
                       << " ms: connection closed";
        }
        ++dropped_;
        Close(loop, c);
      }
    }
  }
}

void RpcServer::ServeReady(Loop* loop) {
  if (loop->ready.empty()) return;
  std::vector<std::pair<int, uint64_t>> turn;
  turn.swap(loop->ready);
  for (const auto& [fd, id] : turn) {
    auto it = loop->conns.find(fd);
    if (it == loop->conns.end() || it->second->id != id) continue;  // closed meanwhile
    Conn* c = it->second.get();
    c->queued = false;
    if (c->more && !c->busy && c->sent == c->out.size() && !Serve(loop, c)) {
      Close(loop, c);
      continue;
    }
    if (Finished(c)) {
      Close(loop, c);
      continue;
    }
    Rearm(loop, c);
  }
}

void RpcServer::Accept(Loop* loop) {
  while (true) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno == EMFILE || errno == ENFILE) {
        static std::atomic<int64_t> last{0};
        if (LogNow(&last)) {
          LOG(WARNING) << "master RPC: out of file descriptors (" << open_.load()
                       << " connections open): raise `ulimit -n`";
        }
        // Take the pending connection through the spare descriptor and close it, so that
        // the level-triggered listener does not spin while descriptors are short.
        ++dropped_;
        if (spare_fd_ >= 0) {
          close(spare_fd_);
          int lost = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
          if (lost >= 0) close(lost);
          spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
        }
        return;
      }
      return;  // EAGAIN: none left (or another loop took it)
    }
    if (open_.load() >= options_.max_connections) {
      // Room from this loop's connections (Victim), else refuse the new one.
      bool abuser = false;
      Conn* victim = Victim(loop, &abuser);
      if (victim) Close(loop, victim);
      ++dropped_;
      static std::atomic<int64_t> last{0};
      if (LogNow(&last)) {
        LOG(WARNING) << "master RPC: " << options_.max_connections << " connections open: "
                     << (victim == nullptr ? "refused a new one"
                         : abuser          ? "closed one that keeps a request pending"
                                           : "closed the one idle the longest");
      }
      if (!victim) {
        close(fd);
        continue;
      }
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->id = next_id_++;
    c->last_active = Clock::now();
    c->created = c->last_active;
    c->events = EPOLLIN | EPOLLRDHUP;
    epoll_event ev{};
    ev.events = c->events;
    ev.data.u64 = EventTag(fd, c->id);
    if (epoll_ctl(loop->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd);
      continue;
    }
    ++open_;
    Account(c.get());
    loop->conns[fd] = std::move(c);
  }
}

RpcServer::Conn* RpcServer::Victim(Loop* loop, bool* abuser_chosen) {
  const auto now = Clock::now();
  Conn* abuser = nullptr;
  double worst = 0;  // the share of its life an abuser kept a request pending
  Conn* oldest = nullptr;
  for (auto& [cfd, c] : loop->conns) {
    if (c->busy) continue;  // its request is on the worker: nothing to gain
    auto pending = c->pending_total;
    if (c->partial_since != Clock::time_point::max()) pending += now - c->partial_since;
    if (pending >= kAbuseAfter) {
      const double share = std::chrono::duration<double>(pending).count() /
                           std::max(1e-3, std::chrono::duration<double>(now - c->created).count());
      if (share > worst) {
        worst = share;
        abuser = c.get();
      }
    }
    if (!c->in.empty() || c->sent != c->out.size()) continue;
    if (!oldest || c->last_active < oldest->last_active) oldest = c.get();
  }
  *abuser_chosen = abuser != nullptr;
  return abuser ? abuser : oldest;
}



}  // namespace store
}  // namespace mooncake
