#include "transport/tcp/tcp_stream.h"

#include <glog/logging.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>

#include "common/auth.h"

namespace mooncake::tcp {
namespace {

constexpr size_t kRxBufferSize = 256 << 10;
constexpr size_t kDirectThreshold = 16 << 10;
constexpr int kMaxIov = 256;
constexpr uint64_t kMaxSendBytes = 16 << 20;

}  // namespace

TcpStream::TcpStream(std::string host, uint16_t port, bool v2, const EngineOptions& options,
                     std::function<void()> on_failure, std::string segment,
                     std::shared_ptr<PeerFence> fence)
    : host_(std::move(host)),
      port_(port),
      v2_(v2),
      options_(options),
      where_(HostPort{host_, port_, true}.ToString()),
      segment_(std::move(segment)),
      on_failure_(std::move(on_failure)),
      fence_(std::move(fence)),
      rx_(kRxBufferSize) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  thread_ = std::thread([this] { Run(); });
}

TcpStream::~TcpStream() { Stop(); }

void TcpStream::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  ::close(wake_fd_);
  wake_fd_ = -1;
}

void TcpStream::Enqueue(const Slice* slices, size_t count, uint64_t bytes) {
  queued_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  {
    MutexLock lock(&mu_);
    if (stopping_) {
      for (size_t i = 0; i < count; ++i) {
        queued_bytes_.fetch_sub(slices[i].length, std::memory_order_relaxed);
        slices[i].Done(FAILED, 0, "the connection to the peer was closed (engine stopping or peer descriptor changed)");
      }
      return;
    }
    incoming_.insert(incoming_.end(), slices, slices + count);
  }
  if (sleeping_.load()) {
    uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
}

bool TcpStream::TakeIncoming() {
  std::vector<Slice> batch;
  {
    MutexLock lock(&mu_);
    if (incoming_.empty()) return false;
    batch.swap(incoming_);
  }
  Append(batch.data(), batch.size());
  return true;
}

void TcpStream::Append(const Slice* slices, size_t count) {
  if (q_.empty()) last_progress_ = Clock::now();
  if (fence_ && fd_.valid() && fence_->epoch() != fence_epoch_) {
    // A connection to this peer was given up on since this stream last fenced: what is taken
    // now must not be applied before the target has stopped that connection.
    Entry& e = q_.emplace_back();
    e.control = EncodeControl(fence_->Snapshot(kOpFence, &fence_epoch_), v2_);
  }
  for (size_t i = 0; i < count; ++i) {
    const Slice& s = slices[i];
    Entry& e = q_.emplace_back();
    e.slice = s;
    Header h;
    h.size = s.length;
    h.addr = s.remote;
    h.op = s.opcode == TransferRequest::WRITE ? kOpWrite : kOpRead;
    h.v2 = v2_;
    EncodeHeader(h, e.header);
  }
}

bool TcpStream::StillOpen() const {
  char b;
  ssize_t n = ::recv(fd_.get(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

bool TcpStream::TryInline(const Slice* slices, size_t count, uint64_t bytes) {
  if (options_.tcp_spin_us <= 0 || count == 0) return false;
  {
    MutexLock lock(&mu_);
    if (stopping_ || !parked_ || inline_ || !incoming_.empty()) return false;
    inline_ = true;  // the connection is ours until EndInline
  }
  if (!fd_.valid() || !q_.empty() || (unwatched_ && !StillOpen())) {
    EndInline();  // connecting, or a connection closed while idle: the thread's work
    return false;
  }
  queued_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  Append(slices, count);
  const auto end = Clock::now() + std::chrono::microseconds(options_.tcp_spin_us);
  for (;;) {
    Status s;
    if (send_idx_ < q_.size()) s = SendSome();
    if (s.ok()) s = ReceiveSome();
    if (!s.ok()) {
      LOG(WARNING) << "TcpTransport: " << s.ToString();
      if (on_failure_) on_failure_();
      FailAll(FAILED, s.ToString());
      break;
    }
    // Done, or reset after a rejection (what follows is resent on a new connection by the
    // thread), or out of time.
    if (q_.empty() || !fd_.valid() || Clock::now() >= end) break;
    ::sched_yield();  // a thread with work here (the target's, on few cores) goes first
  }
  (q_.empty() ? inline_done_ : inline_left_).fetch_add(1, std::memory_order_relaxed);
  EndInline();
  return true;
}

void TcpStream::EndInline() {
  const bool left = !q_.empty();  // still ours: read before giving it back
  // Idle again, no one watches it; with requests outstanding the thread does (bytes there
  // are theirs, not a sign of a closed connection).
  unwatched_ = !left && fd_.valid();
  {
    MutexLock lock(&mu_);
    inline_ = false;
    if (left) parked_ = false;  // the thread's now: no other caller may send before it
    cv_.SignalAll();            // a thread woken meanwhile waits for the connection
  }
  if (left && sleeping_.load()) {
    uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
}

Status TcpStream::Connect() {
  auto fd = ConnectTcp(host_, port_, options_.tcp_connect_timeout_ms);
  if (!fd.ok()) return fd.status();
  MC_RETURN_IF_ERROR(Authenticator(options_.auth_secret)
                         .Answer(fd->get(), "tcp-data", segment_, options_.handshake_io_timeout_ms)
                         .WithContext(where_));
  if (fence_) {
    // HELLO first, carrying the current fence: nothing sent on this connection is applied
    // before the connections given up on so far have stopped.
    uint64_t id = fence_->Connected();
    ControlFrame hello = fence_->Snapshot(kOpHello, &fence_epoch_);
    hello.conn_id = id;
    std::string frame = EncodeControl(hello, v2_);
    Status s = WriteFull(fd->get(), frame.data(), frame.size(), options_.handshake_io_timeout_ms);
    if (!s.ok()) {
      fence_->Abandoned(id);
      return s.WithContext("hello to " + where_);
    }
    conn_id_ = id;
  }
  fd_ = std::move(fd).value();
  SetNonBlocking(fd_.get(), true);
  // Socket buffers stay under kernel autotuning: fixed sizes measured slower on loopback.
  last_progress_ = Clock::now();
  return Status::OK();
}

void TcpStream::ResetConnection() {
  if (fence_ && conn_id_ != 0) fence_->Abandoned(conn_id_);
  conn_id_ = 0;
  // Fences still queued were for that connection; the next one's HELLO carries a fresh one.
  for (auto it = q_.begin(); it != q_.end();) {
    it = it->control.empty() ? it + 1 : q_.erase(it);
  }
  fd_.Reset();
  send_idx_ = 0;
  send_off_ = 0;
  rx_state_ = RxState::kStatus;
  rx_payload_done_ = 0;
  prefilled_ = 0;
  rb_ = re_ = 0;
}

void TcpStream::CompleteFront(TransferStatusEnum result, const char* message) {
  Entry& e = q_.front();
  queued_bytes_.fetch_sub(e.slice.length, std::memory_order_relaxed);
  e.slice.Done(result, result == COMPLETED ? e.slice.length : 0, message);
  q_.pop_front();
  if (send_idx_ > 0) {
    --send_idx_;
  } else {
    send_off_ = 0;
  }
}

void TcpStream::FailAll(TransferStatusEnum result, const std::string& message) {
  std::string msg = message;
  for (Entry& e : q_) {
    if (e.completed || !e.control.empty()) continue;
    queued_bytes_.fetch_sub(e.slice.length, std::memory_order_relaxed);
    e.slice.Done(result, 0, msg.c_str());
  }
  q_.clear();
  ResetConnection();
}

Status TcpStream::SendSome() {
  for (int round = 0; round < 8 && send_idx_ < q_.size(); ++round) {
    iovec iov[kMaxIov];
    int n = 0;
    uint64_t total = 0;
    for (size_t i = send_idx_; i < q_.size() && n + 2 <= kMaxIov && total < kMaxSendBytes; ++i) {
      Entry& e = q_[i];
      uint64_t off = i == send_idx_ ? send_off_ : 0;
      if (!e.control.empty()) {
        iov[n++] = {e.control.data() + off, e.control.size() - off};
        total += e.control.size() - off;
        continue;
      }
      if (off < kHeaderSize) {
        iov[n++] = {e.header + off, kHeaderSize - off};
        total += kHeaderSize - off;
        off = kHeaderSize;
      }
      if (e.slice.opcode == TransferRequest::WRITE) {
        uint64_t done = off - kHeaderSize;
        iov[n++] = {reinterpret_cast<uint8_t*>(e.slice.local) + done, e.slice.length - done};
        total += e.slice.length - done;
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t sent = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return Status::OK();
      return ErrnoStatus("send to " + where_, errno);
    }
    last_progress_ = Clock::now();
    uint64_t left = static_cast<uint64_t>(sent);
    while (left > 0) {
      Entry& e = q_[send_idx_];
      uint64_t rest = e.wire_size() - send_off_;
      if (left < rest) {
        send_off_ += left;
        break;
      }
      left -= rest;
      send_off_ = 0;
      ++send_idx_;
      if (!e.control.empty()) {
        e.completed = true;  // no reply to a FENCE
      } else if (!v2_ && e.slice.opcode == TransferRequest::WRITE) {
        // v1 has no acknowledgement: a WRITE is done once its last byte is sent.
        e.completed = true;
        queued_bytes_.fetch_sub(e.slice.length, std::memory_order_relaxed);
        e.slice.Done(COMPLETED, e.slice.length);
      }
    }
    if (static_cast<uint64_t>(sent) < total) return Status::OK();  // socket buffer full
  }
  return Status::OK();
}

Status TcpStream::ReceiveSome() {
  for (int round = 0; round < 16; ++round) {
    ssize_t got;
    enum { kBuffer, kDirect, kStatusAndPayload } how = kBuffer;
    PopCompletedFront();
    if (rb_ == re_ && !q_.empty() && q_.front().slice.opcode == TransferRequest::READ) {
      const Entry& front = q_.front();
      const Slice& s = front.slice;
      bool large = s.length - rx_payload_done_ >= kDirectThreshold;
      if (rx_state_ == RxState::kPayload && large) {
        how = kDirect;
      } else if (rx_state_ == RxState::kStatus && v2_ && large && send_idx_ > 0) {
        how = kStatusAndPayload;  // one readv: status frame, then the payload in place
      }
    }
    if (how == kDirect) {
      const Slice& s = q_.front().slice;
      got = ::recv(fd_.get(), reinterpret_cast<uint8_t*>(s.local) + rx_payload_done_,
                   s.length - rx_payload_done_, MSG_DONTWAIT);
    } else if (how == kStatusAndPayload) {
      const Slice& s = q_.front().slice;
      rb_ = re_ = 0;
      iovec iov[2] = {{rx_.data(), kStatusSize}, {reinterpret_cast<void*>(s.local), s.length}};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = 2;
      got = ::recvmsg(fd_.get(), &msg, MSG_DONTWAIT);
    } else {
      if (rb_ == re_) rb_ = re_ = 0;
      if (re_ == rx_.size()) {
        std::memmove(rx_.data(), rx_.data() + rb_, re_ - rb_);
        re_ -= rb_;
        rb_ = 0;
      }
      got = ::recv(fd_.get(), rx_.data() + re_, rx_.size() - re_, MSG_DONTWAIT);
    }
    if (got == 0) {
      return Status::Unavailable("connection to " + where_ + " closed by the peer");
    }
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return Status::OK();
      return ErrnoStatus("recv from " + where_, errno);
    }
    last_progress_ = Clock::now();
    if (how == kDirect) {
      rx_payload_done_ += static_cast<uint64_t>(got);
      if (rx_payload_done_ == q_.front().slice.length) {
        rx_state_ = RxState::kStatus;
        rx_payload_done_ = 0;
        CompleteFront(COMPLETED, nullptr);
      }
    } else if (how == kStatusAndPayload) {
      re_ = std::min<size_t>(static_cast<size_t>(got), kStatusSize);
      prefilled_ = static_cast<uint64_t>(got) - re_;
    } else {
      re_ += static_cast<size_t>(got);
    }
    MC_RETURN_IF_ERROR(ProcessBuffered());
    if (!fd_.valid()) return Status::OK();  // reset after a rejection; resend from the top
  }
  return Status::OK();
}

void TcpStream::PopCompletedFront() {
  while (!q_.empty() && q_.front().completed) {
    q_.pop_front();
    if (send_idx_ > 0) --send_idx_;
  }
}

Status TcpStream::ProcessBuffered() {
  for (;;) {
    PopCompletedFront();
    size_t have = re_ - rb_;
    if (q_.empty()) {
      if (have > 0) return Status::DataLoss("unexpected bytes from " + where_);
      return Status::OK();
    }
    Entry& front = q_.front();
    if (rx_state_ == RxState::kStatus) {
      if (!v2_) {
        // v1: only READs get a reply, and it is the bare payload.
        rx_state_ = RxState::kPayload;
        rx_payload_done_ = 0;
        continue;
      }
      if (have < kStatusSize) return Status::OK();
      uint64_t wire;
      std::memcpy(&wire, rx_.data() + rb_, kStatusSize);
      rb_ += kStatusSize;
      uint32_t code = 0;
      if (!DecodeStatus(wire, &code)) {
        return Status::DataLoss("status frame from " + where_ + " has a wrong magic");
      }
      if (code != kStatusOk && prefilled_ != 0) {
        return Status::DataLoss("payload from " + where_ + " after a rejection");
      }
      if (code != kStatusOk) {
        std::ostringstream os;
        os << where_ << " rejected range 0x" << std::hex << front.slice.remote << std::dec
           << " + " << front.slice.length
           << ": not within memory it registered for remote access";
        std::string msg = os.str();
        LOG(WARNING) << msg;
        // The range was in the peer's descriptor: the descriptor is stale (the memory was
        // unregistered, or another engine now listens on its data port). Dropped before the
        // request fails, so that a retry fetches it anew.
        if (on_failure_) on_failure_();
        CompleteFront(FAILED, msg.c_str());
        // The target closes after a rejection and never ran what follows: resend it.
        ResetConnection();
        return Status::OK();
      }
      if (send_idx_ == 0) {
        return Status::DataLoss("status frame from " + where_ + " before the request was sent");
      }
      if (front.slice.opcode == TransferRequest::WRITE) {
        CompleteFront(COMPLETED, nullptr);
        continue;
      }
      rx_state_ = RxState::kPayload;
      rx_payload_done_ = prefilled_;
      prefilled_ = 0;
      continue;
    }
    // kPayload
    uint64_t want = front.slice.length - rx_payload_done_;
    uint64_t take = std::min<uint64_t>(want, have);
    if (take == 0 && want != 0) return Status::OK();
    std::memcpy(reinterpret_cast<uint8_t*>(front.slice.local) + rx_payload_done_,
                rx_.data() + rb_, take);
    rb_ += take;
    rx_payload_done_ += take;
    if (rx_payload_done_ < front.slice.length) return Status::OK();
    rx_state_ = RxState::kStatus;
    CompleteFront(COMPLETED, nullptr);
  }
}

int TcpStream::PollTimeoutMs() const {
  if (q_.empty()) return -1;
  auto deadline = last_progress_ + std::chrono::milliseconds(options_.slice_timeout_ms);
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count()) + 1;
}

void TcpStream::Run() {
  for (;;) {
    TakeIncoming();
    {
      MutexLock lock(&mu_);
      if (stopping_) break;
    }
    if (!q_.empty() && fd_.valid() && unwatched_) {
      // It sat idle unwatched: a peer that closed it meanwhile gets a new connection rather
      // than these requests failing on the old one.
      unwatched_ = false;
      if (!StillOpen()) ResetConnection();
    }
    if (!q_.empty() && !fd_.valid()) {
      Status s = Connect();
      if (!s.ok()) {
        LOG(WARNING) << "TcpTransport: " << s.ToString();
        if (on_failure_) on_failure_();
        FailAll(FAILED, s.ToString());
        continue;
      }
    }
    if (fd_.valid() && send_idx_ < q_.size()) {
      Status s = SendSome();
      if (!s.ok()) {
        LOG(WARNING) << "TcpTransport: " << s.ToString();
        if (on_failure_) on_failure_();
        FailAll(FAILED, s.ToString());
        continue;
      }
    }
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {fd_.get(), POLLIN, 0}};
    if (send_idx_ < q_.size()) fds[1].events |= POLLOUT;
    // Nothing outstanding: the socket is not watched, so that a submitting thread may use the
    // connection meanwhile (TryInline) without waking this one; a connection the peer closed
    // meanwhile is found when it is next used (StillOpen).
    const bool idle = q_.empty();
    int nfds = fd_.valid() && !idle ? 2 : 1;
    if (idle && fd_.valid()) unwatched_ = true;
    const int timeout_ms = PollTimeoutMs();  // reads q_: before a caller may take it
    sleeping_.store(true);
    {
      MutexLock lock(&mu_);
      if (!incoming_.empty() || stopping_) {
        sleeping_.store(false);
        continue;
      }
      parked_ = idle;
    }
    int r = ::poll(fds, nfds, timeout_ms);
    sleeping_.store(false);
    if (idle) {
      MutexLock lock(&mu_);
      parked_ = false;
      while (inline_) cv_.Wait(&mu_);
    }
    if (r < 0 && errno != EINTR) {
      LOG(ERROR) << "TcpTransport: poll: " << std::strerror(errno);
      continue;
    }
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      (void)!::read(wake_fd_, &v, sizeof(v));
    }
    if (nfds == 2 && (fds[1].revents & (POLLIN | POLLERR | POLLHUP))) {
      Status s = ReceiveSome();
      if (!s.ok()) {
        bool had_work = !q_.empty();
        if (had_work) LOG(WARNING) << "TcpTransport: " << s.ToString();
        if (had_work && on_failure_) on_failure_();
        FailAll(FAILED, s.ToString());
        continue;
      }
    }
    if (!q_.empty() && PollTimeoutMs() == 0) {
      std::string msg = "no progress on the connection to " + where_ + " for " +
                        std::to_string(options_.slice_timeout_ms) + " ms (MC_SLICE_TIMEOUT)";
      LOG(WARNING) << "TcpTransport: " << msg;
      FailAll(TIMEOUT, msg);
    }
  }
  FailAll(FAILED, "engine is shutting down");
}

}  // namespace mooncake::tcp
