// InProcessMaster: a MasterService in the test's own process behind the client's MasterStub
// (StoreClientOptions.master), so that client tests need no master process. Each call is
// served as the RPC server would serve it (the request serialized, ServeMasterRpc, the
// response parsed), unless the test set a hook for its method: on_Name(request, response)
// answers in the master's place, and may call ServeName to ask the real one first. Calls
// are counted per method (calls(MasterMethod::kName)).
//
// Set hooks before the client makes the calls they are for (they are read without a lock).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "store/client/master_stub.h"
#include "store/master/master_rpc.h"
#include "store/master/master_service.h"

namespace mooncake {
namespace store {
namespace testing {

class InProcessMaster : public MasterStub {
 public:
  explicit InProcessMaster(MasterConfig config = {},
                           MasterService::NowFn now = &MasterService::Clock::now)
      : service_(config, std::move(now)) {}

  MasterService& service() { return service_; }
  int calls(MasterMethod m) const { return calls_[static_cast<int>(m)].load(); }
  std::string address() const override { return "in-process"; }

#define MC_X(Name, number, Req, Resp, resend)                                       \
  std::function<Status(const rpc::Req&, rpc::Resp*)> on_##Name;                     \
  Status Serve##Name(const rpc::Req& request, rpc::Resp* response) {                \
    return Serve(MasterMethod::k##Name, request, response);                         \
  }                                                                                 \
  Reply<rpc::Resp> Start##Name(const rpc::Req& request) override {                  \
    ++calls_[number];                                                               \
    auto done = std::make_unique<Answered<rpc::Resp>>();                            \
    done->status = on_##Name ? on_##Name(request, &done->response)                  \
                             : Serve##Name(request, &done->response);               \
    return Reply<rpc::Resp>(std::move(done));                                       \
  }
  MC_MASTER_METHODS(MC_X)
#undef MC_X

 private:
  // A call answered when it was started (the master acts on a request when it arrives).
  template <class Resp>
  struct Answered final : Pending {
    Status status;
    Resp response;
    Status Finish(google::protobuf::MessageLite* out, int) override {
      if (status.ok()) static_cast<Resp*>(out)->CopyFrom(response);
      return status;
    }
  };

  Status Serve(MasterMethod method, const google::protobuf::MessageLite& request,
               google::protobuf::MessageLite* response) {
    const std::string in = request.SerializeAsString();
    std::string out;
    RpcStatus s = ServeMasterRpc(&service_, static_cast<uint16_t>(method), in.data(), in.size(),
                                 &out);
    if (s != RpcStatus::kOk) return Status::InvalidArgument("the master refused it: " + out);
    if (!response->ParseFromString(out)) return Status::Internal("unparseable response");
    return Status::OK();
  }

  MasterService service_;
  std::atomic<int> calls_[kMaxMethod + 1] = {};
};

}  // namespace testing
}  // namespace store
}  // namespace mooncake
