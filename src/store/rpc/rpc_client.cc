#include "store/rpc/rpc_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mooncake {
namespace store {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kFirstRead = 64 << 10;
// How long a lone call polls for its reply before sleeping (RpcClient::RoundTrip).
constexpr std::chrono::microseconds kSpin{50};
// What a kNotLeader answer's message says after the master's address (IsNotLeader).
constexpr char kNotLeaderText[] = " is not the leader: ";

int64_t MsLeft(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
}

// host:port or [v6]:port -> (host, port); false when it is neither.
bool SplitAddress(const std::string& a, std::string* host, std::string* port) {
  if (!a.empty() && a[0] == '[') {
    size_t close = a.find(']');
    if (close == std::string::npos || close + 1 >= a.size() || a[close + 1] != ':') return false;
    *host = a.substr(1, close - 1);
    *port = a.substr(close + 2);
  } else {
    size_t colon = a.rfind(':');
    if (colon == std::string::npos || a.find(':') != colon) return false;
    *host = a.substr(0, colon);
    *port = a.substr(colon + 1);
  }
  if (host->empty() || port->empty()) return false;
  for (char ch : *port) {
    if (ch < '0' || ch > '9') return false;
  }
  return port->size() <= 5 && std::stoi(*port) > 0 && std::stoi(*port) <= 65535;
}

void SetTimeouts(int fd, int64_t ms) {
  if (ms < 1) ms = 1;
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

RpcClient::~RpcClient() {
  for (auto& c : idle_) close(c.fd);
}

RpcClient::Conn RpcClient::Take() {
  Conn c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.empty()) return Conn{};
    c = std::move(idle_.back());
    idle_.pop_back();
  }
  // A pooled connection the master closed while it was idle (a restart, or room made for
  // others at its connection cap) has its FIN (or reset) waiting: one non-blocking peek
  // sees it, and the call connects anew before it sends anything. An idle connection has
  // nothing to read; anything else (EOF, an error, stray bytes) retires it.
  char byte;
  const ssize_t n = recv(c.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return c;
  close(c.fd);
  return Conn{};
}

void RpcClient::Give(Conn c) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() >= max_idle_) {
    close(c.fd);
    return;
  }
  if (c.out.capacity() > (1u << 20)) std::string().swap(c.out);
  if (c.in.size() > (1u << 20)) std::string().swap(c.in);
  idle_.push_back(std::move(c));
}

Status RpcClient::Connect(Conn* c, Clock::time_point deadline) {
  std::string host, port;
  if (!SplitAddress(address_, &host, &port)) {
    return Status::InvalidArgument("master address '" + address_ +
                                   "' is not host:port (or [ipv6]:port)");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    return Status::Unavailable("cannot resolve " + peer_ + "'s host '" + host +
                               "': " + gai_strerror(rc));
  }
  std::string error = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int64_t left = MsLeft(deadline);
      r = left > 0 ? poll(&p, 1, static_cast<int>(left)) : 0;
      if (r == 0) {
        close(fd);
        freeaddrinfo(res);
        return Status::DeadlineExceeded("cannot connect to " + peer_ + " at " + address_ +
                                        " within the RPC timeout");
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      r = err == 0 ? 0 : -1;
      errno = err;
    }
    if (r != 0) {
      error = std::strerror(errno);
      close(fd);
      continue;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->fd = fd;
    break;
  }
  freeaddrinfo(res);
  if (c->fd < 0) {
    return Status::Unavailable("cannot connect to " + peer_ + " at " + address_ + ": " + error +
                               (peer_ == "the master" ? " (is mooncake_master running there?)" : ""));
  }
  return Status::OK();
}

Status RpcClient::TimedOut(MasterMethod method) const {
  return Status::DeadlineExceeded(peer_ + " at " + address_ + " did not answer " +
                                  MethodName(static_cast<uint16_t>(method)) +
                                  " within the RPC timeout");
}

Status RpcClient::Send(Conn* c, MasterMethod method, const google::protobuf::MessageLite& request,
                       Clock::time_point call_start, Clock::time_point deadline,
                       bool* closed_before_reply, bool* all_sent) {
  *all_sent = false;
  const size_t size = request.ByteSizeLong();
  if (size > static_cast<size_t>(kMaxMessageBytes)) {
    return Status::InvalidArgument(std::string(MethodName(static_cast<uint16_t>(method))) +
                                   " request of " + std::to_string(size) +
                                   " bytes is over the limit of " +
                                   std::to_string(kMaxMessageBytes));
  }
  const uint32_t seq = ++c->seq;
  c->out.resize(kFrameHeaderBytes + size);
  EncodeHeader(&c->out[0], FrameHeader{static_cast<uint16_t>(method), 0, seq,
                                       static_cast<uint32_t>(size)});
  request.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(&c->out[kFrameHeaderBytes]));
  auto who = [&] { return peer_ + " at " + address_; };  // error paths only
  auto timed_out = [&] { return TimedOut(method); };
  const int64_t left = MsLeft(deadline);
  if (left <= 0) return timed_out();
  // Each send / recv waits at most the call's timeout (set once per connection and timeout,
  // not per call: two syscalls less); the deadline is checked after each.
  const int64_t whole = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - call_start).count();
  if (c->timeout_ms != whole) {
    SetTimeouts(c->fd, whole);
    c->timeout_ms = whole;
  }
  for (size_t off = 0; off < c->out.size();) {
    ssize_t n = send(c->fd, c->out.data() + off, c->out.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return timed_out();
    *closed_before_reply = errno == EPIPE || errno == ECONNRESET;
    return Status::Unavailable(who() + ": connection lost (" + std::strerror(errno) + ")");
  }
  *all_sent = true;
  return MsLeft(deadline) <= 0 ? timed_out() : Status::OK();
}

Status RpcClient::Receive(Conn* c, MasterMethod method, google::protobuf::MessageLite* response,
                          Clock::time_point deadline, bool spin, bool* closed_before_reply) {
  const uint32_t seq = c->seq;
  auto who = [&] { return peer_ + " at " + address_; };  // error paths only
  auto timed_out = [&] { return TimedOut(method); };
  // The reply: its header, then its payload (usually in the same read).
  if (c->in.size() < kFrameHeaderBytes + kFirstRead) c->in.resize(kFrameHeaderBytes + kFirstRead);
  size_t got = 0, need = kFrameHeaderBytes;
  FrameHeader h;
  bool have_header = false;
  // A lone call (no other of this client in flight but the caller's own) waits for its reply
  // awake for a short while first: a sleeping thread's wake-up (tens of µs on a VM) would
  // otherwise be most of a round trip whose master side takes a few µs. With other calls in
  // flight the CPU is theirs, and the call sleeps at once; while it polls it yields the core
  // to any other runnable task.
  if (spin) {
    const auto until = Clock::now() + kSpin;
    do {
      ssize_t n = recv(c->fd, &c->in[0], c->in.size(), MSG_DONTWAIT | MSG_PEEK);
      if (n != 0 && !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) break;
      if (n == 0) break;
      // Give the core to whatever else is runnable on it (none: back at once): on a busy
      // machine a spinning caller took the cores from other processes (16 client processes
      // on 2 cores: 236-316k ops/s spinning plainly, 360-423k yielding; one client the same).
      sched_yield();
    } while (Clock::now() < until);
  }
  while (got < need) {
    ssize_t n = recv(c->fd, &c->in[got], c->in.size() - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
      if (!have_header && got >= kFrameHeaderBytes) {
        HeaderCheck check = DecodeHeader(c->in.data(), &h);
        if (check == HeaderCheck::kBadMagic) {
          return Status::Internal(who() + " does not speak this Store's RPC protocol: it looks like " +
                                  DescribeForeignBytes(c->in.data(), got));
        }
        if (check == HeaderCheck::kTooLarge || h.seq != seq ||
            h.method != static_cast<uint16_t>(method)) {
          return Status::Internal(who() + " sent a malformed reply");
        }
        have_header = true;
        need = kFrameHeaderBytes + h.length;
        if (c->in.size() < need) c->in.resize(need);
      }
      if (got < need) {
        // A reply in pieces (large, or a master that trickles): the next wait is what is
        // left of the call's time, so the call never outlasts its timeout.
        const int64_t rest = MsLeft(deadline);
        if (rest <= 0) return timed_out();
        SetTimeouts(c->fd, rest);
        c->timeout_ms = -1;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return timed_out();
    *closed_before_reply = got == 0 && (n == 0 || errno == ECONNRESET);
    return Status::Unavailable(who() + ": connection lost while waiting for the reply to " +
                               MethodName(static_cast<uint16_t>(method)) +
                               (n == 0 ? (" (closed by " + peer_ + ")")
                                       : " (" + std::string(std::strerror(errno)) + ")"));
  }
  if (got != need) return Status::Internal(who() + " sent more than one reply");
  const char* payload = c->in.data() + kFrameHeaderBytes;
  if (h.status == static_cast<uint16_t>(RpcStatus::kNotLeader)) {
    return Status::FailedPrecondition(who() + kNotLeaderText +
                                      std::string(payload, std::min<size_t>(h.length, 4096)));
  }
  if (h.status != static_cast<uint16_t>(RpcStatus::kOk)) {
    return Status::InvalidArgument(who() + " refused " + MethodName(h.method) + ": " +
                                   std::string(payload, h.length));
  }
  if (!response->ParseFromArray(payload, static_cast<int>(h.length))) {
    return Status::Internal(who() + " sent a reply to " + MethodName(h.method) +
                            " that does not parse");
  }
  return Status::OK();
}

Status RpcClient::Call(MasterMethod method, const google::protobuf::MessageLite& request,
                       google::protobuf::MessageLite* response,
                       std::chrono::milliseconds timeout) {
  PendingCall call = Start(method, request, timeout);
  return Finish(&call, response);
}

RpcClient::PendingCall RpcClient::Start(MasterMethod method,
                                        const google::protobuf::MessageLite& request,
                                        std::chrono::milliseconds timeout) {
  PendingCall p;
  p.owner_ = this;
  in_flight_.fetch_add(1, std::memory_order_relaxed);
  p.method_ = method;
  p.request_ = &request;
  p.start_ = Clock::now();
  p.deadline_ = p.start_ + timeout;
  p.conn_ = Take();
  p.reused_ = p.conn_.fd >= 0;
  if (!p.reused_) p.sent_ = Connect(&p.conn_, p.deadline_);
  if (p.sent_.ok()) {
    p.sent_ = Send(&p.conn_, method, request, p.start_, p.deadline_, &p.closed_, &p.arrived_);
  }
  return p;
}

Status RpcClient::Finish(PendingCall* p, google::protobuf::MessageLite* response,
                         int own_calls) {
  Conn* c = &p->conn_;
  bool closed_before_reply = p->closed_;
  Status s = p->sent_;
  if (s.ok()) {
    const bool spin = in_flight_.load(std::memory_order_relaxed) <= own_calls;
    s = Receive(c, p->method_, response, p->deadline_, spin, &closed_before_reply);
  }
  // A pooled connection the master closed while it was idle is found before the send (Take),
  // but the master may close it between that check and the request's arrival: the call
  // then fails with no byte of a reply. The request is sent once more on a new connection
  // when it cannot have been acted on: its send failed (so the master never had all of
  // it), or the method changes nothing (MayResend). A PutStart, Remove, ... whose bytes
  // all went out is not resent: a master that read it and then went away may have done it.
  // Any other failure is the call's.
  if (!s.ok() && p->reused_ && closed_before_reply &&
      (p->closed_ || store::MayResend(p->method_))) {
    if (c->fd >= 0) close(c->fd);
    *c = Conn{};
    s = Connect(c, p->deadline_);
    bool ignored = false;
    bool whole = false;
    if (s.ok()) s = Send(c, p->method_, *p->request_, p->start_, p->deadline_, &ignored, &whole);
    p->arrived_ = p->arrived_ || whole;
    if (s.ok()) s = Receive(c, p->method_, response, p->deadline_, false, &ignored);
  }
  if (s.ok()) {
    Give(std::move(*c));
  } else if (c->fd >= 0) {
    close(c->fd);  // a late reply must not reach another call
  }
  *c = Conn{};
  p->owner_ = nullptr;
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  return s;
}

RpcClient::PendingCall& RpcClient::PendingCall::operator=(PendingCall&& o) noexcept {
  if (this == &o) return *this;
  Abandon();
  owner_ = o.owner_;
  conn_ = std::move(o.conn_);
  o.conn_ = Conn{};
  method_ = o.method_;
  request_ = o.request_;
  start_ = o.start_;
  deadline_ = o.deadline_;
  reused_ = o.reused_;
  closed_ = o.closed_;
  arrived_ = o.arrived_;
  sent_ = o.sent_;
  o.owner_ = nullptr;
  return *this;
}

RpcClient::PendingCall::~PendingCall() { Abandon(); }

void RpcClient::PendingCall::Abandon() {
  if (owner_ == nullptr) return;
  if (conn_.fd >= 0) close(conn_.fd);
  conn_ = Conn{};
  owner_->in_flight_.fetch_sub(1, std::memory_order_relaxed);
  owner_ = nullptr;
}

bool IsNotLeader(const Status& s) {
  return s.IsFailedPrecondition() && s.message().find(kNotLeaderText) != std::string::npos;
}

}  // namespace store
}  // namespace mooncake
