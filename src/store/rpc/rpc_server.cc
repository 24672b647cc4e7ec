#include "store/rpc/rpc_server.h"
#include "store/rpc/rpc_server_internal.h"

#include "common/admission.h"
#include "common/net.h"

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
#include <optional>
#include <utility>
#include <cerrno>
#include <cstring>
#include <deque>
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
    : options_(std::move(options)),
      handler_(std::move(handler)),
      holds_(std::make_unique<Holds>()) {}

RpcServer::~RpcServer() { Stop(); }

Status RpcServer::Start(const std::string& host, int port) {
  if (started_) return Status::FailedPrecondition("already started");
  if (options_.threads < 1) return Status::InvalidArgument("threads must be >= 1");
  ListenOptions lo;
  lo.nonblocking = true;
  lo.any_is_ipv4 = true;  // "" and "0.0.0.0": every IPv4 address; "::" every address
  auto listener = ListenTcp(host, port, lo);
  if (!listener.ok()) return listener.status();
  listen_fd_ = listener->fd.Release();
  port_ = listener->port;
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::string error;
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
  {
    MutexLock lock(&holds_->mu);
    holds_->live = true;
  }
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
  {
    MutexLock lock(&worker_->mu);  // the worker is waiting, or sees stop_ before it waits
    stop_.store(true);
  }
  worker_->cv.SignalAll();
  worker_->thread.join();
  for (auto& l : loops_) {
    uint64_t one = 1;
    (void)!write(l->wake, &one, sizeof(one));
  }
  for (auto& l : loops_) l->thread.join();
  {
    // Nothing parks any more (the worker and the loops are gone); a release from now on
    // finds nothing and delivers nowhere.
    MutexLock lock(&holds_->mu);
    holds_->live = false;
    holds_->jobs.clear();
  }
  for (auto& l : loops_) {
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
  while (true) {
    std::unique_ptr<Job> job;
    {
      MutexLock lock(&w.mu);
      while (!stop_.load() && w.jobs.empty()) w.cv.Wait(&w.mu);
      if (stop_.load()) return;
      job = std::move(w.jobs.front());
      w.jobs.pop_front();
    }
    job->reply.assign(kFrameHeaderBytes, '\0');
    RpcStatus st = handler_(job->method, job->payload.data(), job->payload.size(), &job->reply);
    if (st == kWaitForWake) {  // no waiting here: "nothing now" at once
      st = RpcStatus::kOk;
      job->reply.resize(kFrameHeaderBytes);
    }
    FrameHeader h;
    h.method = job->method;
    h.status = static_cast<uint16_t>(st);
    h.seq = job->seq;
    h.length = static_cast<uint32_t>(job->reply.size() - kFrameHeaderBytes);
    EncodeHeader(&job->reply[0], h);
    if (options_.hold_position) {
      const uint64_t pos = options_.hold_position(job->method, st);
      if (pos != 0 && Park(pos, &job)) continue;
    }
    Deliver(std::move(job));
  }
}

void RpcServer::Deliver(std::unique_ptr<Job> job) {
  Loop* loop = job->loop;
  {
    MutexLock l(&loop->done_mu);
    loop->done.push_back(std::move(job));
  }
  uint64_t one = 1;
  (void)!write(loop->wake, &one, sizeof(one));
}

namespace {

// The frame of a reply that may not be acknowledged: same method and seq, kNotLeader.
void FailFrame(std::string* frame, uint16_t method, uint32_t seq, const std::string& message) {
  frame->assign(kFrameHeaderBytes, '\0');
  frame->append(message);
  EncodeHeader(&(*frame)[0], FrameHeader{method, static_cast<uint16_t>(RpcStatus::kNotLeader),
                                         seq, static_cast<uint32_t>(message.size())});
}

}  // namespace

bool RpcServer::Park(uint64_t pos, std::unique_ptr<Job>* job) {
  Holds& h = *holds_;
  MutexLock lock(&h.mu);
  if (pos <= h.durable) return false;  // durable already: sent as it is
  if (h.failed) {
    FailFrame(&(*job)->reply, (*job)->method, (*job)->seq, h.message);
    return false;
  }
  h.jobs.emplace(pos, std::move(*job));
  return true;
}

void RpcServer::ReleaseHeld(uint64_t durable) {
  Holds& h = *holds_;
  MutexLock lock(&h.mu);
  if (durable <= h.durable) return;
  h.durable = durable;
  auto end = h.jobs.upper_bound(durable);
  // Delivered under the mutex: Stop clears `live` under it before it destroys the loops.
  if (h.live) {
    for (auto it = h.jobs.begin(); it != end; ++it) Deliver(std::move(it->second));
  }
  h.jobs.erase(h.jobs.begin(), end);
}

void RpcServer::FailHeld(const std::string& message) {
  Holds& h = *holds_;
  MutexLock lock(&h.mu);
  h.failed = true;
  h.message = message;
  if (h.live) {
    for (auto& [pos, job] : h.jobs) {
      FailFrame(&job->reply, job->method, job->seq, message);
      Deliver(std::move(job));
    }
  }
  h.jobs.clear();
}

void RpcServer::ResetHeld(uint64_t durable) {
  Holds& h = *holds_;
  MutexLock lock(&h.mu);
  // Replies still held wait for positions of the old log, which the new one does not reach.
  const std::string message =
      h.failed ? h.message : "the operation log was reset before the reply was durable";
  if (h.live) {
    for (auto& [pos, job] : h.jobs) {
      FailFrame(&job->reply, job->method, job->seq, message);
      Deliver(std::move(job));
    }
  }
  h.jobs.clear();
  h.failed = false;
  h.message.clear();
  h.durable = durable;
}

size_t RpcServer::held_replies() const {
  MutexLock lock(&holds_->mu);
  return holds_->jobs.size();
}

void RpcServer::RunLoop(Loop* loop) {
  std::vector<epoll_event> events(256);
  auto last_sweep = Clock::now();
  while (!stop_.load()) {
    // Connections with requests left from their last turn: take new events without sleeping.
    const int wait_ms = WaitTimeoutMs(loop, loop->ready.empty() ? 500 : 0);
    int n = epoll_wait(loop->ep, events.data(), static_cast<int>(events.size()), wait_ms);
    if (stop_.load()) break;
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      const int fd = static_cast<int>(static_cast<uint32_t>(tag));
      if (fd == listen_fd_) {
        Accept(loop);
      } else if (fd == loop->wake) {
        TakeReplies(loop);
      } else {
        OnEvent(loop, tag, events[i].events);
      }
    }
    ServeReady(loop);
    RunWaiting(loop);
    const auto now = Clock::now();
    if (now - last_sweep >= std::chrono::milliseconds(500)) {
      last_sweep = now;
      CloseLate(loop, now);
    }
  }
}

void RpcServer::TakeReplies(Loop* loop) {
  uint64_t v;
  (void)!read(loop->wake, &v, sizeof(v));
  std::vector<std::unique_ptr<Job>> done;
  {
    MutexLock l(&loop->done_mu);
    done.swap(loop->done);
  }
  for (auto& job : done) Answer(loop, std::move(job));
}

void RpcServer::Answer(Loop* loop, std::unique_ptr<Job> job) {
  auto it = loop->conns.find(job->fd);
  if (it == loop->conns.end() || it->second->id != job->conn_id) return;  // gone
  Conn* c = it->second.get();
  c->busy = false;
  c->waiting = false;
  c->job_bytes = 0;
  Charge(loop, c);
  if (c->sent == c->out.size()) {
    c->out = std::move(job->reply);
  } else {
    // Replies of its earlier requests are still unsent (the socket did not take them all):
    // this one goes after them.
    c->out.erase(0, c->sent);
    c->out += job->reply;
  }
  c->sent = 0;
  Account(c);
  c->last_active = Clock::now();
  if (!Flush(c) || !Serve(loop, c) || Finished(c)) {
    Close(loop, c);
    return;
  }
  Rearm(loop, c);
}

void RpcServer::OnEvent(Loop* loop, uint64_t tag, uint32_t ev) {
  const int fd = static_cast<int>(static_cast<uint32_t>(tag));
  auto it = loop->conns.find(fd);
  // Gone, or closed earlier in this batch (room, a hog) and its fd taken by a new one.
  if (it == loop->conns.end() || EventTag(fd, it->second->id) != tag) return;
  Conn* c = it->second.get();
  if (c->waiting && (ev & EPOLLRDHUP) && !(ev & (EPOLLERR | EPOLLHUP))) {
    EndWaiting(loop, c);  // c may be closed after this
    return;
  }
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
    return;
  }
  Rearm(loop, c);
}

void RpcServer::CloseLate(Loop* loop, Clock::time_point now) {
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
  // Rank: (1, the share of its life it kept a request pending) for one that did so for at
  // least kAbuseAfter, else (0, -last_active) for an idle one; one with its request on the
  // worker never goes (nothing to gain).
  using Rank = std::pair<int, double>;
  auto rank = [&](const auto& entry) -> std::optional<Rank> {
    const Conn& c = *entry.second;
    if (c.waiting) {  // as an idle one: closing it loses nothing
      return Rank{0, -std::chrono::duration<double>(c.last_active.time_since_epoch()).count()};
    }
    if (c.busy) return std::nullopt;
    auto pending = c.pending_total;
    if (c.partial_since != Clock::time_point::max()) pending += now - c.partial_since;
    if (pending >= kAbuseAfter) {
      const double life = std::chrono::duration<double>(now - c.created).count();
      return Rank{1, std::chrono::duration<double>(pending).count() / std::max(1e-3, life)};
    }
    if (!c.in.empty() || c.sent != c.out.size()) return std::nullopt;
    return Rank{0, -std::chrono::duration<double>(c.last_active.time_since_epoch()).count()};
  };
  auto victim = Admission::Victim(loop->conns.begin(), loop->conns.end(), rank);
  if (victim == loop->conns.end()) return nullptr;
  *abuser_chosen = rank(*victim)->first == 1;
  return victim->second.get();
}

}  // namespace store
}  // namespace mooncake
