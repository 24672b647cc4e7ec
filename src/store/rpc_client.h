// RpcClient: calls the master over its RPC wire (rpc_wire.h).
//
// Each call takes an idle connection from a small pool (or connects), sends the request,
// waits for the reply on the calling thread and gives the connection back: concurrent calls
// use concurrent connections, and no call waits for another thread. A connection that failed
// or timed out is closed, never reused (a late reply cannot be taken for another call's); a
// call on a pooled connection the master had closed while idle is sent again on a new one.
// After a master restart the next call connects again (no backoff: a call fails only when
// the master does not answer it).
#pragma once

#include <google/protobuf/message_lite.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "mooncake/status.h"
#include "store/rpc_wire.h"

namespace mooncake {
namespace store {

class RpcClient {
 public:
  // `address`: host:port, [ipv6]:port.
  explicit RpcClient(std::string address, size_t max_idle = 16)
      : address_(std::move(address)), max_idle_(max_idle) {}
  ~RpcClient();
  RpcClient(const RpcClient&) = delete;
  RpcClient& operator=(const RpcClient&) = delete;

  // Sends `request` as `method` and parses the reply into *response, all within `timeout`.
  // Errors (with a message naming the master and what happened): Unavailable (cannot
  // connect, connection lost), DeadlineExceeded, InvalidArgument (the master refused the
  // request: too large, unknown method, not parseable), Internal (a reply that is not this
  // protocol or not the method's response).
  Status Call(MasterMethod method, const google::protobuf::MessageLite& request,
              google::protobuf::MessageLite* response, std::chrono::milliseconds timeout);

  const std::string& address() const { return address_; }

 private:
  struct Conn {
    int fd = -1;
    uint32_t seq = 0;
    int64_t timeout_ms = -1;  // SO_RCVTIMEO / SO_SNDTIMEO as set now
    std::string out;          // the request being sent
    std::string in;           // the reply; never shrinks below its first size (no refill)
  };
  Status Connect(Conn* c, std::chrono::steady_clock::time_point deadline);
  Status RoundTrip(Conn* c, MasterMethod method, const google::protobuf::MessageLite& request,
                   google::protobuf::MessageLite* response,
                   std::chrono::steady_clock::time_point call_start,
                   std::chrono::steady_clock::time_point deadline, bool* closed_before_reply);
  Conn Take();
  void Give(Conn c);

  const std::string address_;
  const size_t max_idle_;
  std::mutex mu_;
  std::vector<Conn> idle_;
  std::atomic<int> in_flight_{0};  // calls in progress
};

}  // namespace store
}  // namespace mooncake
