// TcpStream: one persistent initiator connection to a peer's data port, driven by its own
// thread as a small event loop (non-blocking socket + poll). Requests are pipelined: headers
// and payloads of many slices go out in one sendmsg, replies are matched in order, READ
// payloads are received straight into their destination.
//
// Failure handling:
// - connect failure, broken connection, malformed reply: every queued slice FAILED;
// - no byte sent or received for options.slice_timeout_ms while slices are outstanding:
//   every queued slice TIMEOUT, the connection is closed;
// - ADDR_REJECTED: that slice FAILED; the target closes the connection, so the slices behind
//   it (never executed by the target) are resent on a fresh connection.
// The next slices enqueued after a failure open a new connection.
//
// Fencing (tcp_fence.h), when the peer supports it: every connection starts with a HELLO;
// a connection given up on is reported to the peer's PeerFence, and every stream of the peer
// sends a FENCE before the requests it takes after that, so no byte of the abandoned
// connection lands after a later request completes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "common/thread_annotations.h"
#include "engine/transport.h"
#include "mooncake/options.h"
#include "transport/tcp/tcp_fence.h"
#include "transport/tcp/tcp_wire.h"

namespace mooncake::tcp {

class TcpStream {
 public:
  // `on_failure` (may be empty) is called after a connect failure or a broken connection
  // that failed outstanding slices. `segment`: the segment name the connection is meant to
  // reach (the authentication checks it, common/auth.h). `fence` (may be null: the peer
  // does not fence) is shared by the peer's streams.
  TcpStream(std::string host, uint16_t port, bool v2, const EngineOptions& options,
            std::function<void()> on_failure = {}, std::string segment = {},
            std::shared_ptr<PeerFence> fence = {});
  ~TcpStream();  // Stop()s
  TcpStream(const TcpStream&) = delete;
  TcpStream& operator=(const TcpStream&) = delete;

  // Thread-safe; never blocks on the network.
  void Enqueue(const Slice* slices, size_t count, uint64_t bytes) MC_EXCLUDES(mu_);
  // When the stream is idle (connected, nothing outstanding, its thread asleep), the calling
  // thread sends the slices and drives the connection itself, awake, for up to
  // options.tcp_spin_us: the replies (and READ payloads) that come by then are completed
  // here; what is left goes back to the stream's thread, which is woken for it. True: the
  // slices were taken; false: nothing done, the caller enqueues them.
  bool TryInline(const Slice* slices, size_t count, uint64_t bytes) MC_EXCLUDES(mu_);
  // Slices TryInline took: all completed on the caller's thread / some left to the thread.
  uint64_t inline_done() const { return inline_done_.load(std::memory_order_relaxed); }
  uint64_t inline_left() const { return inline_left_.load(std::memory_order_relaxed); }
  // Bytes queued or in flight; a hint for load balancing.
  uint64_t queued_bytes() const { return queued_bytes_.load(std::memory_order_relaxed); }
  // Fails every outstanding slice and joins the thread. Idempotent.
  void Stop();

 private:
  struct Entry {
    Slice slice;
    uint8_t header[kHeaderSize];
    bool completed = false;  // v1 WRITE or a FENCE: done once sent, no reply expected
    std::string control;     // a FENCE frame (header included) instead of a slice
    uint64_t wire_size() const {
      if (!control.empty()) return control.size();
      return kHeaderSize + (slice.opcode == TransferRequest::WRITE ? slice.length : 0);
    }
  };
  enum class RxState { kStatus, kPayload };
  using Clock = std::chrono::steady_clock;

  void Run() MC_EXCLUDES(mu_);
  bool TakeIncoming() MC_EXCLUDES(mu_);  // moves incoming_ into q_; false if nothing was there
  // Appends wire entries for `slices` to q_ (a FENCE first when the peer's fence moved).
  void Append(const Slice* slices, size_t count);
  // False when the peer closed (or wrote to) the connection while no one watched it.
  bool StillOpen() const;
  // Gives the connection back after TryInline; wakes the thread for what is left.
  void EndInline() MC_EXCLUDES(mu_);
  Status Connect();
  Status SendSome();
  Status ReceiveSome();
  Status ProcessBuffered();
  // Drops v1 WRITEs at the front that completed when sent (no reply comes for them).
  void PopCompletedFront();
  void CompleteFront(TransferStatusEnum result, const char* message);
  void FailAll(TransferStatusEnum result, const std::string& message);
  void ResetConnection();
  int PollTimeoutMs() const;

  const std::string host_;
  const uint16_t port_;
  const bool v2_;
  const EngineOptions options_;
  const std::string where_;  // "host:port" for messages
  const std::string segment_;
  const std::function<void()> on_failure_;
  const std::shared_ptr<PeerFence> fence_;

  Mutex mu_;
  CondVar cv_;  // the connection given back by a TryInline caller
  std::vector<Slice> incoming_ MC_GUARDED_BY(mu_);
  bool stopping_ MC_GUARDED_BY(mu_) = false;
  // The thread sleeps with nothing outstanding, not watching the socket: a caller may take
  // the connection (inline_) until it gives it back; meanwhile the thread leaves the
  // connection's state below alone.
  bool parked_ MC_GUARDED_BY(mu_) = false;
  bool inline_ MC_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> inline_done_{0}, inline_left_{0};
  std::atomic<bool> sleeping_{false};
  std::atomic<uint64_t> queued_bytes_{0};
  int wake_fd_ = -1;  // eventfd
  std::thread thread_;

  // Owned by the stream's thread, or by a TryInline caller while it holds inline_.
  bool unwatched_ = false;  // the connection sat idle with no one polling it
  UniqueFd fd_;
  uint64_t conn_id_ = 0;      // in the peer's fence session, while fd_ is open
  uint64_t fence_epoch_ = 0;  // the peer's fence epoch this stream has fenced up to
  std::deque<Entry> q_;        // sent or to send, in wire order
  size_t send_idx_ = 0;        // first entry not fully sent
  uint64_t send_off_ = 0;      // bytes of q_[send_idx_] already sent
  RxState rx_state_ = RxState::kStatus;
  uint64_t rx_payload_done_ = 0;
  uint64_t prefilled_ = 0;  // payload bytes a status+payload readv already placed
  std::vector<uint8_t> rx_;
  size_t rb_ = 0, re_ = 0;
  Clock::time_point last_progress_;
};

}  // namespace mooncake::tcp
