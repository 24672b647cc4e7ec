// One connection of RpcServer's loops: reads, the requests it carries (handled inline or
// handed to the worker), its replies, and its close (rpc_server.h for the bounds).
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "store/rpc/rpc_server.h"
#include "store/rpc/rpc_server_internal.h"

namespace mooncake {
namespace store {

using namespace rpc_internal;  // NOLINT

bool RpcServer::Finished(const Conn* c) const {
  return c->eof && !c->busy && !c->more && c->sent == c->out.size();
}

void RpcServer::Charge(Loop* loop, Conn* c) {
  const size_t held = c->in.size() + c->job_bytes;
  const size_t charge = held > kConnAllowance ? held - kConnAllowance : 0;
  loop->charged = loop->charged - c->charged + charge;
  c->charged = charge;
}

void RpcServer::Account(Conn* c) {
  const size_t held = c->in.capacity() + c->out.capacity();
  if (held == c->held) return;
  held_ += held - c->held;  // modulo 2^64: a decrease too
  c->held = held;
}

bool RpcServer::MakeRoom(Loop* loop, Conn* c, size_t n) {
  while (true) {
    const size_t held = c->in.size() + c->job_bytes + n;
    const size_t charge = held > kConnAllowance ? held - kConnAllowance : 0;
    if (charge == 0 || loop->charged - c->charged + charge <= loop->budget) return true;
    // Over the loop's budget: the connection holding the most goes (c, with n bytes more,
    // only when no other holds more). One on the worker is passed over: its request is out
    // of its buffer, and closing it would free nothing.
    Conn* hog = c;
    size_t most = held;
    for (auto& [fd, o] : loop->conns) {
      if (o.get() != c && !o->busy && o->in.size() > most) {
        hog = o.get();
        most = o->in.size();
      }
    }
    static std::atomic<int64_t> last{0};
    if (LogNow(&last)) {
      LOG(WARNING) << "master RPC: incomplete requests hold " << loop->budget
                   << " bytes beyond each connection's " << kConnAllowance
                   << " on a loop: closed the one holding the most (" << most << " bytes), "
                   << PeerOf(hog->fd);
    }
    ++dropped_;
    if (hog == c) return false;
    Close(loop, hog);
  }
}

bool RpcServer::OnReadable(Loop* loop, Conn* c) {
  bool ok = true;
  // At most kMaxReadPerTurn from one connection before the loop's others have their turn
  // (the socket stays readable: epoll reports it again).
  for (size_t taken = 0; taken < kMaxReadPerTurn;) {
    ssize_t n = read(c->fd, &loop->scratch[0], loop->scratch.size());
    if (n > 0) {
      const size_t got = static_cast<size_t>(n);
      if (!MakeRoom(loop, c, got)) {
        ok = false;
        break;
      }
      if (c->reserved == 0 && c->in.size() + got > kConnAllowance &&
          c->in.size() >= kFrameHeaderBytes) {
        // A large request under way (more than the allowance has come): its buffer takes the
        // announced size at once (virtual memory: pages are touched only as bytes arrive),
        // not by doubling, which copied 32 MiB on the loop to grow to 64 MiB. What a loop
        // reserves so, beyond what has come, is at most twice its budget (past that,
        // doubling again).
        FrameHeader h;
        if (DecodeHeader(c->in.data(), &h) == HeaderCheck::kOk) {
          const size_t whole = kFrameHeaderBytes + h.length;
          if (c->in.size() < whole && c->in.capacity() < whole &&
              loop->reserved + whole <= 2 * loop->budget) {
            c->in.reserve(whole);
            c->reserved = whole;
            loop->reserved += whole;
          }
        }
      }
      c->in.append(loop->scratch.data(), got);
      buffered_ += got;
      Charge(loop, c);
      taken += got;
      c->last_active = Clock::now();
      if (got < loop->scratch.size()) break;
      continue;
    }
    if (n == 0) {  // the client is done sending: answer what came, then close
      c->eof = true;
      break;
    }
    if (errno == EINTR) continue;
    ok = errno == EAGAIN || errno == EWOULDBLOCK;
    break;
  }
  Account(c);
  return ok;
}

bool RpcServer::Serve(Loop* loop, Conn* c) {
  size_t at = 0;
  size_t served = 0;
  bool ok = true;
  c->more = false;
  while (!c->busy && !c->close_after_flush) {
    if (c->in.size() - at < kFrameHeaderBytes) break;
    if (served == kMaxRequestsPerTurn || c->out.size() - c->sent >= kMaxGatheredReply ||
        at >= kMaxHandledPerTurn) {
      c->more = true;  // the rest in a later turn, after the loop's other connections
      break;
    }
    ++served;  // an incomplete request counted here ends the turn below anyway
    FrameHeader h;
    const HeaderCheck check = DecodeHeader(c->in.data() + at, &h);
    if (check != HeaderCheck::kOk) {
      ok = RefuseFrame(c, check, h, at);
      if (ok) at = c->in.size();  // a kTooLarge reply: nothing after it is read
      break;
    }
    if (c->in.size() - at - kFrameHeaderBytes < h.length) break;  // incomplete
    const char* payload = c->in.data() + at + kFrameHeaderBytes;
    if (options_.slow && options_.slow(h.method)) {
      HandOff(loop, c, h, payload);
      at += kFrameHeaderBytes + h.length;
      break;
    }
    const size_t base = c->out.size();
    c->out.resize(base + kFrameHeaderBytes);
    const uint64_t wakes = wakes_.load();
    RpcStatus st = handler_(h.method, payload, h.length, &c->out);
    if (st == kWaitForWake) {
      if (StartWaiting(loop, c, h, payload, base, wakes)) {
        at += kFrameHeaderBytes + h.length;
        break;
      }
      st = RpcStatus::kOk;  // "nothing now", at once (StartWaiting emptied the payload)
    }
    FrameHeader r{h.method, static_cast<uint16_t>(st), h.seq,
                  static_cast<uint32_t>(c->out.size() - base - kFrameHeaderBytes)};
    EncodeHeader(&c->out[base], r);
    at += kFrameHeaderBytes + h.length;
    if (options_.hold_position) {
      const uint64_t pos = options_.hold_position(h.method, st);
      if (pos != 0 && HoldInline(loop, c, h, base, pos)) break;
    }
  }
  EndTurn(loop, c, at);
  if (!ok) {
    Account(c);
    return false;
  }
  if (!Flush(c)) return false;
  if (c->close_after_flush && c->sent == c->out.size()) return false;
  return true;
}

bool RpcServer::RefuseFrame(Conn* c, HeaderCheck check, const FrameHeader& h, size_t at) {
  ++dropped_;
  if (check == HeaderCheck::kBadMagic) {
    static std::atomic<int64_t> last{0};
    if (LogNow(&last)) {
      LOG(WARNING) << "master RPC: " << PeerOf(c->fd) << " is "
                   << DescribeForeignBytes(c->in.data() + at, c->in.size() - at)
                   << ": connection closed";
    }
    return false;
  }
  static std::atomic<int64_t> last{0};  // kTooLarge
  if (LogNow(&last)) {
    LOG(WARNING) << "master RPC: " << PeerOf(c->fd) << " announced a request of " << h.length
                 << " bytes (limit " << kMaxMessageBytes << "): connection closed";
  }
  const std::string msg = "request of " + std::to_string(h.length) +
                          " bytes is over the limit of " + std::to_string(kMaxMessageBytes);
  const size_t base = c->out.size();
  c->out.resize(base + kFrameHeaderBytes);
  c->out += msg;
  FrameHeader r{h.method, static_cast<uint16_t>(RpcStatus::kTooLarge), h.seq,
                static_cast<uint32_t>(msg.size())};
  EncodeHeader(&c->out[base], r);
  c->close_after_flush = true;
  return true;
}

std::unique_ptr<RpcServer::Job> RpcServer::JobFor(Loop* loop, const Conn* c,
                                                  const FrameHeader& h) {
  auto job = std::make_unique<Job>();
  job->loop = loop;
  job->fd = c->fd;
  job->conn_id = c->id;
  job->method = h.method;
  job->seq = h.seq;
  return job;
}

bool RpcServer::HoldInline(Loop* loop, Conn* c, const FrameHeader& h, size_t base,
                           uint64_t pos) {
  auto job = JobFor(loop, c, h);
  job->reply.assign(c->out, base, std::string::npos);
  c->out.resize(base);
  // Set before Park: once parked, a release on another thread may deliver it at once (the
  // loop takes it only after this turn, on this thread).
  c->busy = true;
  c->job_bytes = h.length;  // charged until the reply goes, as for a request on the worker
  if (Park(pos, &job)) return true;
  c->busy = false;
  c->job_bytes = 0;
  c->out += job->reply;  // durable already (or failed): sent with the others
  return false;
}

void RpcServer::HandOff(Loop* loop, Conn* c, const FrameHeader& h, const char* payload) {
  auto job = JobFor(loop, c, h);
  job->payload.assign(payload, h.length);
  c->busy = true;
  c->job_bytes = h.length;  // still this connection's, charged until the reply comes
  {
    MutexLock l(&worker_->mu);
    worker_->jobs.push_back(std::move(job));
  }
  worker_->cv.Signal();
}

void RpcServer::EndTurn(Loop* loop, Conn* c, size_t at) {
  if (at > 0) {
    buffered_ -= at;
    c->in.erase(0, at);
    loop->reserved -= c->reserved;  // the request it was for is done
    c->reserved = 0;
    // Done with a large request: its buffer's capacity goes (what is left is at most 64 KiB,
    // copied once), so that an idle connection holds no memory of its largest request.
    if (c->in.capacity() > kKeepCapacity && c->in.size() <= kKeepCapacity / 4) {
      std::string(c->in).swap(c->in);
    }
    Charge(loop, c);
  }
  // Time spent with an incomplete request pending is summed (RpcServer::Victim); a request
  // that arrived whole in one read costs no clock read here.
  if (c->in.empty()) {
    if (c->partial_since != Clock::time_point::max()) {
      c->pending_total += Clock::now() - c->partial_since;
      c->partial_since = Clock::time_point::max();
    }
  } else if (at > 0 || c->partial_since == Clock::time_point::max()) {
    const auto now = Clock::now();  // a new request has begun
    if (c->partial_since != Clock::time_point::max()) c->pending_total += now - c->partial_since;
    c->partial_since = now;
  }
}

bool RpcServer::Flush(Conn* c) {
  while (c->sent < c->out.size()) {
    ssize_t n = send(c->fd, c->out.data() + c->sent, c->out.size() - c->sent, MSG_NOSIGNAL);
    if (n > 0) {
      c->sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;
  }
  if (!c->out.empty()) {
    c->out.clear();
    c->sent = 0;
    if (c->out.capacity() > kKeepCapacity) std::string().swap(c->out);
  }
  Account(c);
  return true;
}

void RpcServer::Rearm(Loop* loop, Conn* c) {
  uint32_t want;
  if (c->sent < c->out.size()) {
    want = EPOLLOUT;
  } else if (c->waiting) {
    want = EPOLLRDHUP;  // its client gone: answered now (EndWaiting), then closed
  } else if (c->busy || c->eof) {
    want = 0;  // errors only: a client gone meanwhile fails the reply's send
  } else if (c->more) {
    // Requests left from its turn: their next turn comes from the ready list, and nothing
    // more is read from this client meanwhile (its backlog waits in the socket, not here).
    want = 0;
  } else {
    want = EPOLLIN | EPOLLRDHUP;
  }
  if (c->more && !c->busy && c->sent == c->out.size() && !c->queued) {
    loop->ready.emplace_back(c->fd, c->id);
    c->queued = true;
  }
  if (want == c->events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = EventTag(c->fd, c->id);
  epoll_ctl(loop->ep, EPOLL_CTL_MOD, c->fd, &ev);
  c->events = want;
}

void RpcServer::Close(Loop* loop, Conn* c) {
  const int fd = c->fd;
  if (c->busy) DropWaiting(loop, c);
  buffered_ -= c->in.size();
  held_ -= c->held;
  loop->charged -= c->charged;
  loop->reserved -= c->reserved;
  epoll_ctl(loop->ep, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  --open_;
  loop->conns.erase(fd);  // destroys c
}


}  // namespace store
}  // namespace mooncake
