// RpcServer: serves the master's RPC wire (rpc_wire.h) on a TCP port.
//
// Options::threads event loops (epoll), each owning the connections it accepted; a request is
// handled on its loop's thread as soon as its last byte arrives (no hand-off), except the
// methods Options::slow names, which one worker thread runs so that a long RemoveAll does not
// hold up the other connections of its loop. Bounds that keep idle, slow or hostile clients
// cheap (issue 28: each is per connection, and the one over it is the one refused):
//   - at most Options::max_connections open. Past that, room is made on the accepting loop:
//     first the connection that has kept an incomplete request pending the largest share of
//     its life (at least kAbuseAfter, 1 s, in all: one that keeps a byte of a header pending
//     and completes a request now and then to restart the deadline is that), else the one
//     idle the longest (no request in progress), else the new one is refused;
//   - a request's bytes are buffered as they arrive (a header announcing 64 MiB reserves
//     nothing; once 64 KiB of it has come, its buffer is sized to it at once, in virtual
//     memory, instead of doubling and copying on the loop thread, up to twice the loop's
//     budget reserved so in all); a request begun must be complete within Options::request_deadline (10 s),
//     its 16-byte header within Options::header_deadline (2 s);
//   - buffered request bytes: each connection may hold kConnAllowance (64 KiB: any ping or
//     small call) outside any budget; what connections hold beyond their allowance is
//     charged to their loop, at most Options::max_buffered_bytes / threads per loop. A read
//     that would pass its loop's budget closes the loop's connection holding the most
//     buffered bytes (the hog: the reader itself only when it is the largest), never a
//     small reader. So in total at most max_buffered_bytes + max_connections x 64 KiB
//     (defaults: 1 GiB + 256 MiB), and per connection 64 KiB + its loop's budget;
//   - a connection's buffers (the request bytes, the replies) keep at most kKeepCapacity
//     (256 KiB) of capacity once their request / reply is done: an idle connection holds
//     no memory of its largest request;
//   - a frame that is not this protocol, or announces more than kMaxMessageBytes, closes the
//     connection (the latter after a kTooLarge reply), with a log line;
//   - a connection's next request is not read until its reply is sent (a client that does not
//     read its replies holds one reply's memory, and stalls only itself);
//   - a connection's turn (what the loop does for it before the loop's other connections have
//     theirs) is at most 1 MiB read, and at most kMaxRequestsPerTurn (16) requests or one of
//     1 MiB or more handled: one that pipelines thousands, or streams 64 MiB requests, takes
//     turns with the other connections of its loop, and what it sent past its turn stays in
//     the socket until its next one. A small call waits for at most one turn of each other
//     connection of its loop (the handler's work on each request bounded by master_rpc.h).
// Held replies (the master's HA mode: "durable before acknowledged"). With
// Options::hold_position set, it is called on the handler's thread right after the handler
// returned (the loop's inline call, or the worker's) and answers the operation-log position
// the reply waits for (0: none). A reply whose position is above the durable one
// (ReleaseHeld's largest) is parked whole (its frame as produced) off the loop instead of
// being sent; ReleaseHeld(durable) hands every parked reply at or below `durable` to its
// loop (the worker's path: Loop::done, the loop's eventfd), which sends it on its thread, so
// no loop thread ever waits for durability. The decision to park and ReleaseHeld take one
// mutex (with the durable value and FailHeld's state), so a reply parked just as the
// durable value passes it is sent at once, never stranded. While its reply is parked a
// connection is busy, exactly as with a request on the worker: nothing more is read or
// served from it (its order is kept; the replies of its earlier pipelined requests go out
// first), its request's bytes stay charged to it, it is never the victim at the cap. So a
// held reply holds its connection: at most one is held per connection, at most
// max_connections in all (held replies count against no other bound). FailHeld replaces
// every parked reply, and every one that would be parked until ResetHeld, with a kNotLeader
// reply (same method and seq, payload its message): a client sees a failed call, never a
// false OK. A connection closed while its reply is held loses that reply at release; Stop()
// drops every held reply. A held connection keeps no deadline of its own, but a next request
// it has begun to send behind the held one still has Options::request_deadline (as behind a
// request on the worker): durability is expected well within it.
// Waiting requests (long polls: the master's OffloadFetch, src/store/master/master_rpc.cc).
// A handler with nothing to answer yet may return kWaitForWake after AskToWait(out, topic,
// wait): the request waits on its loop (no thread held, nothing sent) until WakeWaiting(topic)
// is called, when the handler runs again on the loop's thread (and may ask to wait again, its
// first deadline kept), or until its deadline (at most Options::max_wait), when the answer is
// kOk with an empty payload (the method's response with every field at its default: "nothing
// now"). A wake is never lost: WakeWaiting before the request waits (after its handler ran)
// still reruns it. While it waits its connection is busy, as with a request on the worker
// (one per connection, its bytes charged to it), but watched for its client's FIN (its
// request then answered "nothing", the connection then closed as usual) and, at the cap, a
// victim as an idle one (a client holding many connections waiting gains nothing); a
// connection closed meanwhile drops its waiting request. With max_wait zero, or from a slow method (the
// worker), kWaitForWake is answered at once as at the deadline.
// The victim choice at the cap is common/admission.h's (with the ranks above); the cap itself
// is counted across loops without a lock (open_connections()). The port is bound by ListenTcp
// (common/net.h), without SO_REUSEPORT: a port in use is refused.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mooncake/status.h"
#include "store/rpc/rpc_wire.h"

namespace mooncake {
namespace store {

class RpcServer {
 public:
  // Handles one request: the payload is [data, data + n); appends the response's payload to
  // *out (kOk) or a message saying what was wrong (any other status). Called on loop threads
  // (and the worker) concurrently: it must be thread-safe.
  using Handler =
      std::function<RpcStatus(uint16_t method, const char* data, size_t n, std::string* out)>;

  struct Options {
    int threads = 2;
    size_t max_connections = 4096;
    std::chrono::milliseconds request_deadline{10000};
    std::chrono::milliseconds header_deadline{2000};  // an incomplete 16-byte header
    size_t max_buffered_bytes = 1ull << 30;
    std::function<bool(uint16_t method)> slow;  // run on the worker thread
    // Called on the handler's thread right after the handler returned (loop or worker): the
    // log position the reply waits for (0: send it now). Null: replies are never held.
    std::function<uint64_t(uint16_t method, RpcStatus status)> hold_position;
    // The longest a request may wait for WakeWaiting (the header comment); 0: none waits.
    std::chrono::milliseconds max_wait{0};
  };

  // A handler's answer "nothing yet" (never on the wire): *out holds AskToWait's words.
  static constexpr RpcStatus kWaitForWake = static_cast<RpcStatus>(0xffff);
  // Writes into *out (which must hold nothing of this request's yet) that the request waits
  // for WakeWaiting(topic), at most `wait` (and Options::max_wait); return kWaitForWake.
  static void AskToWait(std::string* out, const std::string& topic,
                        std::chrono::milliseconds wait);

  RpcServer(Options options, Handler handler);
  ~RpcServer();
  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;

  // Binds host:port (port 0: any free one; host "0.0.0.0" or "" every IPv4 address, "::"
  // every address) and starts the loops; an error says why not (a port in use: Unavailable,
  // "cannot listen on HOST:PORT: ... (the port is in use)").
  Status Start(const std::string& host, int port);
  // Closes every connection and joins the threads. Idempotent.
  void Stop();
  int port() const { return port_; }

  // Connections closed by the bounds above (deadline, room, buffer budget, bad frames).
  uint64_t dropped() const { return dropped_.load(); }
  size_t open_connections() const { return open_.load(); }
  // Request bytes buffered (of all connections), and the capacity of all connections'
  // buffers (requests and replies): the memory the bounds above are about.
  size_t buffered_bytes() const { return buffered_.load(); }
  size_t buffer_capacity() const { return held_.load(); }

  // Held replies (the header comment). Thread-safe, callable from any thread, cheap.
  // Every held reply whose position <= durable is sent; from now on positions <= durable are
  // not held at all. durable only grows (a smaller value is ignored).
  void ReleaseHeld(uint64_t durable);
  // Every held reply, and every reply held from now on until ResetHeld, is replaced by a
  // reply with RpcStatus::kNotLeader whose payload is `message` (the client sees a failed
  // call, never a false OK). Replies at positions <= the durable value are sent as they are.
  void FailHeld(const std::string& message);
  // Ends FailHeld's state: positions start again from `durable` (a new log; it may be
  // smaller than the old durable value). A reply still held then (ResetHeld without FailHeld)
  // belongs to the old log: it fails as FailHeld's would.
  void ResetHeld(uint64_t durable);
  size_t held_replies() const;  // replies held now

  // Reruns the handlers of the requests waiting on `topic` (the header comment). Thread-safe,
  // cheap: no lock shared with the loops' handlers (a lock per loop, briefly).
  void WakeWaiting(const std::string& topic);
  size_t waiting_requests() const { return waiting_.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Conn;
  struct Loop;
  struct Job;
  void RunLoop(Loop* loop);
  // RunLoop's parts: the worker's replies; one connection's epoll event; the sweep that
  // closes connections past their deadlines.
  void TakeReplies(Loop* loop);
  // A reply (the worker's, a released one, a waiting request's) to its connection, if it is
  // still open: sent, and the connection's next requests served.
  void Answer(Loop* loop, std::unique_ptr<Job> job);
  // Waiting requests (rpc_server_wait.cc): the one c's handler just asked to wait (false: it
  // is answered now, at base in c->out); the loop's turn for them (woken: rerun; past their
  // deadline: answered); the epoll timeout their deadlines allow; a closed connection's.
  bool StartWaiting(Loop* loop, Conn* c, const FrameHeader& h, const char* payload,
                    size_t base, uint64_t wakes_before);
  void RunWaiting(Loop* loop);
  int WaitTimeoutMs(Loop* loop, int wait_ms) const;
  void DropWaiting(Loop* loop, const Conn* c);
  // c's waiting request answered now with "nothing" (its client half-closed or closed).
  void EndWaiting(Loop* loop, Conn* c);
  void OnEvent(Loop* loop, uint64_t tag, uint32_t events);
  void CloseLate(Loop* loop, Clock::time_point now);
  void RunWorker();
  // A reply whose handler ran with hold position pos: true when it is parked (*job taken),
  // false when it is to be sent now (its frame rewritten to kNotLeader in FailHeld's state).
  bool Park(uint64_t pos, std::unique_ptr<Job>* job);
  // A reply to its loop (Loop::done, then TakeReplies on the loop's thread).
  static void Deliver(std::unique_ptr<Job> job);
  void Accept(Loop* loop);
  // Reads what is there; false when the connection is to be closed.
  bool OnReadable(Loop* loop, Conn* c);
  // Before c buffers n more bytes: closes the loop's hogs until its budget has room; false
  // when c is the hog (to be closed).
  bool MakeRoom(Loop* loop, Conn* c, size_t n);
  // At the cap: the connection to close for a new one (nullptr: none may go); *abuser: it
  // is one that kept requests pending, not an idle one.
  Conn* Victim(Loop* loop, bool* abuser);
  void Charge(Loop* loop, Conn* c);  // c's bytes beyond its allowance, to its loop's budget
  void Account(Conn* c);              // c's buffers' capacity, to held_
  // Handles the complete requests buffered (until one needs the worker or a reply is left
  // unsent); false when the connection is to be closed.
  bool Serve(Loop* loop, Conn* c);
  // Serve's parts: a frame that is not this protocol (false: close) or too large (true: the
  // kTooLarge reply queued, the connection closes once it is sent); a slow method's request
  // to the worker; the bytes handled dropped and the pending time accounted.
  bool RefuseFrame(Conn* c, HeaderCheck check, const FrameHeader& h, size_t at);
  void HandOff(Loop* loop, Conn* c, const FrameHeader& h, const char* payload);
  // A job for c's request h (its payload, if any, copied by the caller).
  static std::unique_ptr<Job> JobFor(Loop* loop, const Conn* c, const FrameHeader& h);
  // The reply just appended to c->out at base, held at pos: true when it is parked (taken
  // out of c->out, c busy until it is released), false when it stays to be sent now.
  bool HoldInline(Loop* loop, Conn* c, const FrameHeader& h, size_t base, uint64_t pos);
  void EndTurn(Loop* loop, Conn* c, size_t at);
  // Gives the connections on the loop's ready list their next turn (Serve's budget).
  void ServeReady(Loop* loop);
  bool Flush(Conn* c);  // false: the connection failed
  void Rearm(Loop* loop, Conn* c);
  void Close(Loop* loop, Conn* c);
  // Whether c has nothing left to do (its client sent FIN, every reply is sent).
  bool Finished(const Conn* c) const;

  const Options options_;
  const Handler handler_;
  int listen_fd_ = -1;
  int spare_fd_ = -1;  // given up to take a connection when descriptors run out
  int port_ = 0;
  std::vector<std::unique_ptr<Loop>> loops_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<size_t> open_{0};
  std::atomic<size_t> buffered_{0};
  std::atomic<size_t> held_{0};
  std::atomic<uint64_t> next_id_{1};
  std::atomic<size_t> waiting_{0};  // requests waiting, on every loop
  std::atomic<uint64_t> wakes_{0};  // WakeWaiting calls
  struct Worker;
  std::unique_ptr<Worker> worker_;
  struct Holds;
  const std::unique_ptr<Holds> holds_;  // held replies, the durable value, FailHeld's state
  bool started_ = false;
};

}  // namespace store
}  // namespace mooncake
