// RpcClient: calls the master over its RPC wire (rpc_wire.h).
//
// Each call takes an idle connection from a small pool (or connects), sends the request,
// waits for the reply on the calling thread and gives the connection back: concurrent calls
// use concurrent connections, and no call waits for another thread. A connection that failed
// or timed out is closed, never reused (a late reply cannot be taken for another call's). A
// pooled connection is checked before it is used (one non-blocking peek: has the master
// closed it while it was idle?) and replaced by a new one if so; a call whose connection the
// master closed after that check is sent again on a new one only when it cannot have been
// acted on (its send failed, or the method changes nothing: Ping, ExistKey,
// GetReplicaList, GetStats).
// After a master restart the next call connects again (no backoff: a call fails only when
// the master does not answer it).
#pragma once

#include <google/protobuf/message_lite.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mooncake/status.h"
#include "store/rpc/rpc_wire.h"

namespace mooncake {
namespace store {

class RpcClient {
  struct Conn {
    int fd = -1;
    uint32_t seq = 0;
    int64_t timeout_ms = -1;  // SO_RCVTIMEO / SO_SNDTIMEO as set now
    std::string out;          // the request being sent
    std::string in;           // the reply; never shrinks below its first size (no refill)
  };

 public:
  // `address`: host:port, [ipv6]:port.
  // `peer`: what the server is, for messages ("the master", "the offload service of ...").
  explicit RpcClient(std::string address, size_t max_idle = 16,
                     std::string peer = "the master")
      : address_(std::move(address)), max_idle_(max_idle), peer_(std::move(peer)) {}
  ~RpcClient();
  RpcClient(const RpcClient&) = delete;
  RpcClient& operator=(const RpcClient&) = delete;

  // Sends `request` as `method` and parses the reply into *response, all within `timeout`.
  // Errors (with a message naming the master and what happened): Unavailable (cannot
  // connect, connection lost), DeadlineExceeded, InvalidArgument (the master refused the
  // request: too large, unknown method, not parseable), FailedPrecondition (the master is
  // not the HA leader, RpcStatus::kNotLeader: "the master at X is not the leader: <its
  // message>"; IsNotLeader says so; it did not act on the request), Internal (a reply that
  // is not this protocol or not the method's response).
  Status Call(MasterMethod method, const google::protobuf::MessageLite& request,
              google::protobuf::MessageLite* response, std::chrono::milliseconds timeout);

  // Call in two steps, so that a caller can send its next request before it waits for this
  // reply (each call on its own connection): Start sends, Finish waits for the reply and
  // parses it, with Call's errors and its one resend on a pooled connection the master had
  // closed. `request` must live until Finish. A PendingCall dropped unfinished closes its
  // connection (the reply must not reach another call).
  class PendingCall {
   public:
    PendingCall(PendingCall&& o) noexcept { *this = std::move(o); }
    PendingCall& operator=(PendingCall&& o) noexcept;
    ~PendingCall();

   private:
    friend class RpcClient;
    PendingCall() = default;
    void Abandon();  // closes the connection of a call never finished
    RpcClient* owner_ = nullptr;  // null once finished (or moved from)
    Conn conn_;
    MasterMethod method_{};
    const google::protobuf::MessageLite* request_ = nullptr;
    std::chrono::steady_clock::time_point start_, deadline_;
    bool reused_ = false;
    bool closed_ = false;  // the send found the connection closed
    bool arrived_ = false;  // the request's last send put all of its bytes on the wire
    Status sent_;
  };
  PendingCall Start(MasterMethod method, const google::protobuf::MessageLite& request,
                    std::chrono::milliseconds timeout);
  // `own_calls`: how many of the caller's calls are in flight, this one included (a lone
  // caller waits for its reply awake for a short while first; see RoundTrip).
  Status Finish(PendingCall* call, google::protobuf::MessageLite* response, int own_calls = 1);
  // After Finish failed: false when the request provably never reached the master whole
  // (no connection could be made, or a send failed before its last byte), so the master
  // cannot have acted on it; true otherwise (it may have).
  static bool MayHaveArrived(const PendingCall& call) { return call.arrived_; }

  const std::string& address() const { return address_; }

 private:
  Status Connect(Conn* c, std::chrono::steady_clock::time_point deadline);
  // A request on c (its seq the next of c's); then its reply into *response.
  // *all_sent: every byte of the request was sent (it may have reached the master).
  Status Send(Conn* c, MasterMethod method, const google::protobuf::MessageLite& request,
              std::chrono::steady_clock::time_point call_start,
              std::chrono::steady_clock::time_point deadline, bool* closed_before_reply,
              bool* all_sent);
  Status Receive(Conn* c, MasterMethod method, google::protobuf::MessageLite* response,
                 std::chrono::steady_clock::time_point deadline, bool spin,
                 bool* closed_before_reply);
  Status TimedOut(MasterMethod method) const;  // "did not answer within the RPC timeout"
  Conn Take();  // a pooled connection still open, or one with fd -1
  void Give(Conn c);

  const std::string address_;
  const size_t max_idle_;
  const std::string peer_;
  std::mutex mu_;
  std::vector<Conn> idle_;
  std::atomic<int> in_flight_{0};  // calls in progress
};

// Whether `s` is RpcClient's answer for a master that is not the HA leader (kNotLeader).
bool IsNotLeader(const Status& s);

}  // namespace store
}  // namespace mooncake
