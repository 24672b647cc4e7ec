// MeteredMasterStub: a MasterStub that counts and times the calls it passes to another one,
// into ClientMetrics' mooncake_client_rpc_count / _latency under upstream's rpc_name (a call
// with one key is upstream's single form, GetReplicaList; with several, its Batch form). As
// upstream: every call is counted when sent; its latency is observed when it is answered.
#pragma once

#include <memory>
#include <string>

#include "store/client/client_metrics.h"
#include "store/client/master_stub.h"

namespace mooncake {
namespace store {

class MeteredMasterStub : public MasterStub {
 public:
  // `metrics` must outlive this stub.
  MeteredMasterStub(std::shared_ptr<MasterStub> inner, ClientMetrics* metrics)
      : inner_(std::move(inner)), metrics_(metrics) {}

#define MC_X(Name, number, Req, Resp, resend) \
  Reply<rpc::Resp> Start##Name(const rpc::Req& request) override;
  MC_MASTER_METHODS(MC_X)
#undef MC_X
  std::string address() const override { return inner_->address(); }

 private:
  std::shared_ptr<MasterStub> inner_;
  ClientMetrics* const metrics_;
};

}  // namespace store
}  // namespace mooncake
