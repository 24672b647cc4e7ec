// MasterStub: the client's typed view of the master's RPCs (rpc_wire.h's MC_MASTER_METHODS),
// one virtual per RPC. The client calls the master only through it: MakeRpcMasterStub
// carries the calls over the RPC wire (RpcClient); tests put an in-process master behind
// it (store/testing/in_process_master.h), so that client tests need no master process and
// can make any call fail or answer as they choose.
//
// Each RPC is a pair: StartName sends the request and returns a Reply to finish later (so
// that a caller may send its next request before it waits: the pipelined gets and puts),
// and Name does both at once. A Status that is not OK says the call did not complete (the
// master did not answer, the connection failed, the reply was not the method's): the
// master may or may not have acted on it, unless the Reply's MayHaveArrived says the request
// never reached it whole, or the status is RpcClient's IsNotLeader (rpc_client.h: a master
// that is not the HA leader did nothing).
#pragma once

#include <google/protobuf/message_lite.h>

#include <chrono>
#include <memory>
#include <string>

#include "master.pb.h"
#include "mooncake/status.h"
#include "store/rpc/rpc_wire.h"

namespace mooncake {
namespace store {

class MasterStub {
 public:
  // One call sent and not yet answered.
  class Pending {
   public:
    virtual ~Pending() = default;
    // Waits for the reply and parses it into *response (the method's response type).
    // `own_calls`: the caller's calls in flight, this one included (a lone caller may wait
    // awake for a short while; see RpcClient::Finish).
    virtual Status Finish(google::protobuf::MessageLite* response, int own_calls) = 0;
    // After Finish failed: false when the request provably never reached the master whole
    // (no connection, or its send failed), so the master cannot have acted on it.
    virtual bool MayHaveArrived() const { return true; }
  };

  // The reply of a StartName: finish it once. Dropped unfinished, the call is abandoned
  // (its connection closed: a late reply reaches no other call).
  template <class Response>
  class Reply {
   public:
    explicit Reply(std::unique_ptr<Pending> p) : p_(std::move(p)) {}
    Status Finish(Response* response, int own_calls = 1) {
      return p_->Finish(response, own_calls);
    }
    bool MayHaveArrived() const { return p_->MayHaveArrived(); }
    // The call itself, for a stub that wraps another's (metered_master_stub.h).
    std::unique_ptr<Pending> TakePending() { return std::move(p_); }

   private:
    std::unique_ptr<Pending> p_;
  };

  virtual ~MasterStub() = default;

  // `request` must live until the reply is finished.
#define MC_X(Name, number, Req, Resp, resend)                                  \
  virtual Reply<rpc::Resp> Start##Name(const rpc::Req& request) = 0;           \
  Status Name(const rpc::Req& request, rpc::Resp* response) {                  \
    return Start##Name(request).Finish(response);                              \
  }
  MC_MASTER_METHODS(MC_X)
#undef MC_X

  // Where the master is, for messages ("127.0.0.1:50051", "in-process").
  virtual std::string address() const = 0;
};

// The master at `address` (host:port), each call bounded by `timeout`.
std::unique_ptr<MasterStub> MakeRpcMasterStub(const std::string& address,
                                              std::chrono::milliseconds timeout);

}  // namespace store
}  // namespace mooncake
