// MasterStub over the RPC wire: each StartName is RpcClient::Start of its method.
#include "store/client/master_stub.h"

#include "store/rpc/rpc_client.h"

namespace mooncake {
namespace store {

namespace {

class RpcPending final : public MasterStub::Pending {
 public:
  RpcPending(RpcClient* client, RpcClient::PendingCall call)
      : client_(client), call_(std::move(call)) {}
  Status Finish(google::protobuf::MessageLite* response, int own_calls) override {
    return client_->Finish(&call_, response, own_calls);
  }
  bool MayHaveArrived() const override { return RpcClient::MayHaveArrived(call_); }

 private:
  RpcClient* const client_;
  RpcClient::PendingCall call_;
};

class RpcMasterStub final : public MasterStub {
 public:
  RpcMasterStub(const std::string& address, std::chrono::milliseconds timeout)
      : client_(address), timeout_(timeout) {}

#define MC_X(Name, number, Req, Resp, resend)                                             \
  Reply<rpc::Resp> Start##Name(const rpc::Req& request) override {                        \
    return Reply<rpc::Resp>(std::make_unique<RpcPending>(                                 \
        &client_, client_.Start(MasterMethod::k##Name, request, timeout_)));              \
  }
  MC_MASTER_METHODS(MC_X)
#undef MC_X

  std::string address() const override { return client_.address(); }

 private:
  RpcClient client_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace

std::unique_ptr<MasterStub> MakeRpcMasterStub(const std::string& address,
                                              std::chrono::milliseconds timeout) {
  return std::make_unique<RpcMasterStub>(address, timeout);
}

}  // namespace store
}  // namespace mooncake
