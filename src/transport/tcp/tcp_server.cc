#include "transport/tcp/tcp_server.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <vector>

#include "common/auth.h"
#include "transport/tcp/tcp_fence.h"
#include "transport/tcp/tcp_staging.h"
#include "transport/tcp/tcp_wire.h"

namespace mooncake::tcp {
namespace {

constexpr size_t kRxBufferSize = 256 << 10;
// Payloads at least this long are received straight into the destination.
constexpr size_t kDirectThreshold = 16 << 10;
// Device memory is staged through this many pinned buffers of this size per connection.
constexpr size_t kStagingBuffers = 4;
constexpr size_t kStagingChunk = 512 << 10;

// Held while a WRITE puts bytes into memory: a connection's apply_mu from Acquire to the end
// of its scope, or nothing for a connection that said no HELLO (no fence can name it). The
// analysis cannot follow a lock taken only sometimes, hence none in these two.
class ApplyLock {
 public:
  ApplyLock() = default;
  ApplyLock(const ApplyLock&) = delete;
  ApplyLock& operator=(const ApplyLock&) = delete;
  ~ApplyLock() MC_NO_THREAD_SAFETY_ANALYSIS {
    if (conn_ != nullptr) conn_->apply_mu.Unlock();
  }
  // Locks conn's apply_mu (when conn is set); FailedPrecondition once it was fenced (still
  // locked: the caller returns at once).
  Status Acquire(FenceTable::Conn* conn) MC_NO_THREAD_SAFETY_ANALYSIS {
    if (conn == nullptr) return Status::OK();
    conn->apply_mu.Lock();
    conn_ = conn;
    if (conn->fenced) {
      return Status::FailedPrecondition(
          "connection fenced: the initiator gave up on it and a newer connection said so");
    }
    return Status::OK();
  }

 private:
  FenceTable::Conn* conn_ = nullptr;
};

// One accepted connection. Owns nothing but its buffers; the fd belongs to the server.
class Session {
 public:
  Session(int fd, MemoryRegistry* registry, FenceTable* fences, int timeout_ms)
      : fd_(fd),
        registry_(registry),
        fences_(fences),
        timeout_ms_(timeout_ms),
        rx_(new uint8_t[kRxBufferSize]) {
    tx_iov_.reserve(kMaxQueuedIov);
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  ~Session() {
    ReleasePins();
    if (conn_) fences_->Unregister(*conn_);
  }

  // Serves requests until EOF, a protocol error, a rejected range or a timeout; replies
  // still queued then go out before the connection closes.
  void Run() {
    Serve();
    (void)FlushStatuses();
  }

 private:
  void Serve() {
    for (;;) {
      Status s = FillAtLeast(kHeaderSize, /*idle=*/buffered() == 0);
      if (!s.ok()) {
        if (!s.IsUnavailable() || buffered() != 0) LOG(WARNING) << "TcpServer: " << s.ToString();
        return;
      }
      Header h;
      bool known = DecodeHeader(rx_.get() + rb_, &h);
      uint8_t control = known ? 0 : ControlOpcode(rx_.get() + rb_);
      rb_ += kHeaderSize;
      bool first = frames_++ == 0;
      if (control != 0) {
        s = HandleControl(control, h.size, first);
        if (!s.ok()) {
          LOG(WARNING) << "TcpServer: " << s.ToString() << "; closing connection";
          return;
        }
        continue;
      }
      if (!known) {
        LOG(WARNING) << "TcpServer: unknown opcode in request header; closing connection";
        return;
      }
      // After a large WRITE the next one is likely large too: then read headers alone, so
      // that payloads land straight in their destination instead of in rx_.
      exact_reads_ = h.op == kOpWrite && h.size >= kDirectThreshold;
      MemoryRegion* region = registry_->Pin(h.addr, h.size, /*remote_only=*/true);
      if (region == nullptr) {
        std::ostringstream os;
        os << "TcpServer: remote-supplied range 0x" << std::hex << h.addr << std::dec << " + "
           << h.size << " is not within any buffer registered for remote access; rejecting";
        LOG(WARNING) << os.str();
        if (h.v2) {
          QueueStatus(kStatusAddrRejected);
          if (FlushStatuses().ok()) DrainBeforeClose();
        }
        return;
      }
      if (region->device >= 0) {
        s = h.op == kOpWrite ? ApplyDeviceWrite(h, region->device)
                             : ServeDeviceRead(h, region->device);
        MemoryRegistry::Unpin(region);
      } else if (h.op == kOpWrite) {
        s = ApplyWrite(h);
        MemoryRegistry::Unpin(region);
      } else {
        s = ServeRead(h, region);  // unpinned once the payload is sent
      }
      if (!s.ok()) {
        LOG(WARNING) << "TcpServer: " << (h.op == kOpWrite ? "write" : "read") << " of "
                     << h.size << " bytes: " << s.ToString();
        return;
      }
    }
  }

  size_t buffered() const { return re_ - rb_; }

  // HELLO (first frame only) and FENCE frames (tcp_fence.h). A fence returns once no
  // connection it names can apply another byte, so what follows it here comes after.
  Status HandleControl(uint8_t op, uint64_t len, bool first) {
    if (len > kMaxControlBody) {
      return Status::DataLoss("fence frame of " + std::to_string(len) + " bytes (at most " +
                              std::to_string(kMaxControlBody) + ")");
    }
    MC_RETURN_IF_ERROR(FillAtLeast(static_cast<size_t>(len), false));
    auto frame = DecodeControlBody(op, rx_.get() + rb_, static_cast<size_t>(len));
    rb_ += static_cast<size_t>(len);
    if (!frame.ok()) return frame.status();
    if (op == kOpHello) {
      if (!first) return Status::DataLoss("HELLO frame after the first frame of a connection");
      auto conn = std::make_shared<FenceTable::Conn>();
      conn->fd = fd_;
      conn->session = frame->session;
      conn->id = frame->conn_id;
      MC_RETURN_IF_ERROR(fences_->Register(conn));
      conn_ = std::move(conn);
    } else if (!conn_ || frame->session != conn_->session) {
      return Status::DataLoss("FENCE frame on a connection that did not say HELLO for its session");
    }
    // Replies queued so far go out first: they answer requests the fence does not concern.
    MC_RETURN_IF_ERROR(FlushStatuses());
    fences_->Fence(*frame, conn_.get());
    return Status::OK();
  }


  Status ApplyWrite(const Header& h) {
    // A READ queued before this WRITE must return the memory as it was: send it first.
    if (!tx_pins_.empty()) MC_RETURN_IF_ERROR(FlushStatuses());
    ApplyLock applying;
    MC_RETURN_IF_ERROR(applying.Acquire(conn_.get()));
    auto* dst = reinterpret_cast<uint8_t*>(h.addr);
    size_t have = std::min<uint64_t>(buffered(), h.size);
    std::memcpy(dst, rx_.get() + rb_, have);
    rb_ += have;
    size_t left = h.size - have;
    if (left >= kDirectThreshold) {
      MC_RETURN_IF_ERROR(RecvDirect(dst + have, left));
    } else if (left > 0) {
      MC_RETURN_IF_ERROR(FillAtLeast(left, false));
      std::memcpy(dst + have, rx_.get() + rb_, left);
      rb_ += left;
    }
    if (h.v2) {
      QueueStatus(kStatusOk);
      queued_bytes_ += h.size;
    }
    return MaybeFlush();
  }

  Result<BounceRing*> Staging(int device) {
    if (!staging_ || staging_->device() != device) {
      staging_.reset();
      auto ring = BounceRing::Create(device, kStagingBuffers, kStagingChunk);
      if (!ring.ok()) return ring.status().WithContext("stage device memory");
      staging_ = std::move(ring).value();
    }
    return staging_.get();
  }

  // A WRITE into device memory: chunks are received into pinned buffers, each copied to the
  // device while the next is received. The status goes out once every copy has finished.
  Status ApplyDeviceWrite(const Header& h, int device) {
    if (!tx_pins_.empty()) MC_RETURN_IF_ERROR(FlushStatuses());
    ApplyLock applying;
    MC_RETURN_IF_ERROR(applying.Acquire(conn_.get()));
    MC_ASSIGN_OR_RETURN(BounceRing * ring, Staging(device));
    auto* dst = reinterpret_cast<uint8_t*>(h.addr);
    std::vector<bool> busy(ring->count(), false);
    Status copy_error;
    size_t slot = 0;
    for (uint64_t off = 0; off < h.size; off += ring->size(), slot = (slot + 1) % ring->count()) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(ring->size(), h.size - off));
      if (busy[slot] && copy_error.ok()) copy_error = ring->Wait(slot);
      uint8_t* buf = ring->buffer(slot);
      size_t have = std::min(buffered(), n);
      std::memcpy(buf, rx_.get() + rb_, have);
      rb_ += have;
      if (n > have) MC_RETURN_IF_ERROR(RecvDirect(buf + have, n - have));
      if (copy_error.ok()) copy_error = ring->CopyAsync(slot, dst + off, buf, n);
      busy[slot] = true;
    }
    for (size_t i = 0; i < ring->count(); ++i) {
      Status w = busy[i] ? ring->Wait(i) : Status::OK();
      if (copy_error.ok()) copy_error = w;
    }
    // The payload was consumed, but the bytes did not land: no v2 code says so, so the
    // connection closes and the initiator fails what it has outstanding.
    MC_RETURN_IF_ERROR(copy_error.WithContext("copy to device memory"));
    if (h.v2) {
      QueueStatus(kStatusOk);
      queued_bytes_ += h.size;
    }
    return MaybeFlush();
  }

  // A READ of device memory: chunks are copied into pinned buffers ahead of the socket, and
  // each is sent while the following ones copy.
  Status ServeDeviceRead(const Header& h, int device) {
    MC_ASSIGN_OR_RETURN(BounceRing * ring, Staging(device));
    const auto* src = reinterpret_cast<const uint8_t*>(h.addr);
    const size_t k = ring->count(), chunk = ring->size();
    const uint64_t chunks = (h.size + chunk - 1) / chunk;
    auto issue = [&](uint64_t c) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, h.size - c * chunk));
      return ring->CopyAsync(c % k, ring->buffer(c % k), src + c * chunk, n);
    };
    for (uint64_t c = 0; c < chunks && c < k; ++c) {
      MC_RETURN_IF_ERROR(issue(c).WithContext("copy from device memory"));
    }
    if (h.v2) QueueStatus(kStatusOk);
    for (uint64_t c = 0; c < chunks; ++c) {
      Status copied = ring->Wait(c % k);
      if (!copied.ok()) {
        for (uint64_t d = c + 1; d < chunks && d < c + k; ++d) (void)ring->Wait(d % k);
        return copied.WithContext("copy from device memory");
      }
      size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, h.size - c * chunk));
      tx_iov_.push_back({ring->buffer(c % k), n});
      Status sent = FlushStatuses();  // queued replies, then this chunk
      if (sent.ok() && c + k < chunks) sent = issue(c + k).WithContext("copy from device memory");
      if (!sent.ok()) {
        for (uint64_t d = c + 1; d < chunks && d < c + k; ++d) (void)ring->Wait(d % k);
        return sent;
      }
    }
    return Status::OK();
  }

  // Queues the status and the payload; they go out with the other queued responses.
  Status ServeRead(const Header& h, MemoryRegion* region) {
    if (h.v2) QueueStatus(kStatusOk);
    tx_iov_.push_back({reinterpret_cast<void*>(h.addr), h.size});
    tx_pins_.push_back(region);
    queued_bytes_ += h.size;
    return MaybeFlush();
  }

  void QueueStatus(uint32_t code) {
    status_slots_[nstatus_] = EncodeStatus(code);
    tx_iov_.push_back({&status_slots_[nstatus_], kStatusSize});
    ++nstatus_;
  }

  // Responses go out when the connection would block, or at these bounds so that a
  // streaming initiator still sees completions.
  Status MaybeFlush() {
    if (nstatus_ >= 256 || tx_iov_.size() + 2 >= kMaxQueuedIov || queued_bytes_ >= (8u << 20)) {
      return FlushStatuses();
    }
    return Status::OK();
  }

  void ReleasePins() {
    for (MemoryRegion* r : tx_pins_) MemoryRegistry::Unpin(r);
    tx_pins_.clear();
  }

  // After a rejection: stop sending and discard what the initiator already pipelined (for a
  // bounded time), so that closing does not reset the connection before the initiator has
  // read the ADDR_REJECTED frame; it then knows which request failed and resends the rest.
  void DrainBeforeClose() {
    ::shutdown(fd_, SHUT_WR);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      ssize_t n = ::recv(fd_, rx_.get(), kRxBufferSize, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;
    }
  }

  // Sends every queued response (statuses and READ payloads, in request order).
  Status FlushStatuses() {
    if (tx_iov_.empty()) return Status::OK();
    Status s = SendAll(tx_iov_.data(), static_cast<int>(tx_iov_.size()));
    tx_iov_.clear();
    nstatus_ = 0;
    queued_bytes_ = 0;
    ReleasePins();
    return s;
  }

  // Waits for the socket; when idle (between requests) there is no deadline.
  Status Wait(short events, bool idle) {
    pollfd p{fd_, events, 0};
    for (;;) {
      int r = ::poll(&p, 1, idle ? -1 : timeout_ms_);
      if (r > 0) return Status::OK();
      if (r == 0) {
        return Status::DeadlineExceeded("peer made no progress for " +
                                        std::to_string(timeout_ms_) + " ms");
      }
      if (errno != EINTR) return ErrnoStatus("poll", errno);
    }
  }

  // Ensures `n` bytes (n <= kRxBufferSize) are buffered. Flushes pending statuses before it
  // would block, so that replies to a pipelined burst go out in one send.
  Status FillAtLeast(size_t n, bool idle) {
    if (buffered() >= n) return Status::OK();
    if (rb_ > 0) {
      std::memmove(rx_.get(), rx_.get() + rb_, buffered());
      re_ -= rb_;
      rb_ = 0;
    }
    while (buffered() < n) {
      size_t want = exact_reads_ ? n - buffered() : kRxBufferSize - re_;
      ssize_t got = ::recv(fd_, rx_.get() + re_, want, MSG_DONTWAIT);
      if (got > 0) {
        re_ += static_cast<size_t>(got);
        continue;
      }
      if (got == 0) return Status::Unavailable("connection closed by peer");
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return ErrnoStatus("recv", errno);
      MC_RETURN_IF_ERROR(FlushStatuses());
      MC_RETURN_IF_ERROR(Wait(POLLIN, idle && buffered() == 0));
    }
    return Status::OK();
  }

  // Receives a whole payload into place: first what is already there; if it must wait, it
  // flushes pending statuses and then blocks (MSG_WAITALL: one wake-up when it is all
  // there). SO_RCVTIMEO bounds a stall.
  Status RecvDirect(uint8_t* dst, size_t len) {
    ssize_t now = ::recv(fd_, dst, len, MSG_DONTWAIT);
    if (now > 0) {
      dst += now;
      len -= static_cast<size_t>(now);
    } else if (now == 0) {
      return Status::Unavailable("connection closed in the middle of a payload");
    }
    if (len > 0) MC_RETURN_IF_ERROR(FlushStatuses());
    while (len > 0) {
      ssize_t got = ::recv(fd_, dst, len, MSG_WAITALL);
      if (got > 0) {
        dst += got;
        len -= static_cast<size_t>(got);
        continue;
      }
      if (got == 0) return Status::Unavailable("connection closed in the middle of a payload");
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        return Status::DeadlineExceeded("peer made no progress for " +
                                        std::to_string(timeout_ms_) + " ms");
      }
      return ErrnoStatus("recv", errno);
    }
    return Status::OK();
  }

  Status SendAll(iovec* iov, int n) {
    while (n > 0) {
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      ssize_t sent = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN) return ErrnoStatus("send", errno);
        MC_RETURN_IF_ERROR(Wait(POLLOUT, false));
        continue;
      }
      size_t left = static_cast<size_t>(sent);
      while (n > 0 && left >= iov->iov_len) {
        left -= iov->iov_len;
        ++iov;
        --n;
      }
      if (n > 0) {
        iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + left;
        iov->iov_len -= left;
      }
    }
    return Status::OK();
  }

  const int fd_;
  MemoryRegistry* const registry_;
  FenceTable* const fences_;
  std::shared_ptr<FenceTable::Conn> conn_;  // after a HELLO
  uint64_t frames_ = 0;
  const int timeout_ms_;
  std::unique_ptr<uint8_t[]> rx_;
  size_t rb_ = 0, re_ = 0;
  bool exact_reads_ = false;
  // Queued responses: iovecs over status_slots_ and READ payloads (pinned in tx_pins_).
  static constexpr size_t kMaxQueuedStatuses = 257;  // flushed at 256
  static constexpr size_t kMaxQueuedIov = 1000;
  uint64_t status_slots_[kMaxQueuedStatuses];
  size_t nstatus_ = 0;
  std::vector<iovec> tx_iov_;
  std::vector<MemoryRegion*> tx_pins_;
  uint64_t queued_bytes_ = 0;
  std::unique_ptr<BounceRing> staging_;  // created at the first device-memory request
};

}  // namespace

TcpServer::TcpServer(const EngineOptions& options, MemoryRegistry* registry,
                     std::string segment_name, std::string instance)
    : options_(options),
      registry_(registry),
      segment_name_(std::move(segment_name)),
      instance_(std::move(instance)),
      server_("TcpServer",
              ConnLimits{options.data_max_connections, options.data_max_per_address,
                         options.first_frame_timeout_ms},
              [this](int fd) { ServeConnection(fd); }, [](int fd) { SetNoDelay(fd); }) {}

TcpServer::~TcpServer() { Stop(); }

Status TcpServer::Start(UniqueFd listen_fd) { return server_.Start(std::move(listen_fd)); }

void TcpServer::Stop() { server_.Stop(); }

void TcpServer::ServeConnection(int fd) {
  Status auth = Authenticator(options_.auth_secret)
                    .Challenge(fd, "tcp-data", Authenticator::OwnNames(segment_name_, instance_),
                               options_.first_frame_timeout_ms);
  if (!auth.ok()) {
    LOG_EVERY_T(WARNING, 10) << "TcpServer: refused a connection: " << auth.ToString();
    return;
  }
  // A connection counts as established at its first complete request header (initiators
  // connect when they have a request); until then ConnServer's deadline and eviction apply.
  if (!ConnServer::WaitForBytes(fd, kHeaderSize, options_.first_frame_timeout_ms)) return;
  ConnServer::MarkEstablished();
  Session(fd, registry_, &fences_, options_.slice_timeout_ms).Run();
}

}  // namespace mooncake::tcp
