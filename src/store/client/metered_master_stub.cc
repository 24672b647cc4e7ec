#include "store/client/metered_master_stub.h"

#include <chrono>

namespace mooncake {
namespace store {

namespace {

using Clock = std::chrono::steady_clock;

// A reply whose Finish observes the call's latency when the master answered.
class Timed final : public MasterStub::Pending {
 public:
  Timed(std::unique_ptr<MasterStub::Pending> inner, ClientMetrics* m, int index)
      : inner_(std::move(inner)), metrics_(m), index_(index) {}
  Status Finish(google::protobuf::MessageLite* response, int own_calls) override {
    Status s = inner_->Finish(response, own_calls);
    if (s.ok()) {
      metrics_->ObserveRpc(index_, std::chrono::duration_cast<std::chrono::microseconds>(
                                       Clock::now() - start_)
                                       .count());
    }
    return s;
  }
  bool MayHaveArrived() const override { return inner_->MayHaveArrived(); }

 private:
  std::unique_ptr<MasterStub::Pending> inner_;
  ClientMetrics* const metrics_;
  const int index_;
  const Clock::time_point start_ = Clock::now();
};

const char* NameOf(const char* single, const char* batch, int keys) {
  return keys > 1 ? batch : single;
}

// Upstream's rpc_name of each call.
const char* RpcName(const rpc::PingRequest&) { return "Ping"; }
const char* RpcName(const rpc::MountSegmentRequest& r) {
  return r.remount() ? "ReMountSegment" : "MountSegment";
}
const char* RpcName(const rpc::UnmountSegmentRequest&) { return "UnmountSegment"; }
const char* RpcName(const rpc::PutStartRequest& r) {
  return r.upsert() ? NameOf("UpsertStart", "BatchUpsertStart", r.items_size())
                    : NameOf("PutStart", "BatchPutStart", r.items_size());
}
const char* RpcName(const rpc::RemoveByRegexRequest&) { return "RemoveByRegex"; }
const char* RpcName(const rpc::ReplicaClearRequest&) { return "BatchReplicaClear"; }
const char* RpcName(const rpc::StatsRequest&) { return "GetStats"; }
const char* RpcName(const rpc::ReplicaTaskRequest& r) {
  return r.type() == 1 ? "CreateMoveTask" : "CreateCopyTask";
}
const char* RpcName(const rpc::QueryTaskRequest&) { return "QueryTask"; }
const char* RpcName(const rpc::FetchTasksRequest&) { return "FetchTasks"; }
const char* RpcName(const rpc::FinishTaskRequest&) { return "MarkTaskToComplete"; }
// The disk tier's calls, by upstream's names for its counterparts.
const char* RpcName(const rpc::MountLocalDiskRequest&) { return "MountLocalDiskSegment"; }
const char* RpcName(const rpc::OffloadFetchRequest&) { return "OffloadObjectHeartbeat"; }
const char* RpcName(const rpc::OffloadDoneRequest&) { return "NotifyOffloadSuccess"; }
const char* RpcName(const rpc::EvictDiskRequest&) { return "BatchEvictDiskReplica"; }

// KeysRequest serves several methods: named by the method.
const char* KeysName(MasterMethod m, const rpc::KeysRequest& r) {
  const int n = r.keys_size();
  switch (m) {
    case MasterMethod::kPutEnd: return NameOf("PutEnd", "BatchPutEnd", n);
    case MasterMethod::kPutRevoke: return NameOf("PutRevoke", "BatchPutRevoke", n);
    case MasterMethod::kGetReplicaList: return NameOf("GetReplicaList", "BatchGetReplicaList", n);
    case MasterMethod::kExistKey: return NameOf("ExistKey", "BatchExistKey", n);
    case MasterMethod::kRemove: return NameOf("Remove", "BatchRemove", n);
    case MasterMethod::kRemoveAll: return "RemoveAll";
    default: return "";
  }
}

template <class Req>
const char* NameFor(MasterMethod, const Req& r) {
  return RpcName(r);
}
template <>
const char* NameFor(MasterMethod m, const rpc::KeysRequest& r) {
  return KeysName(m, r);
}

}  // namespace

#define MC_X(Name, number, Req, Resp, resend)                                              \
  MasterStub::Reply<rpc::Resp> MeteredMasterStub::Start##Name(const rpc::Req& request) {   \
    const int index = ClientMetrics::RpcIndex(NameFor(MasterMethod::k##Name, request));    \
    metrics_->CountRpc(index);                                                             \
    return Reply<rpc::Resp>(std::make_unique<Timed>(                                       \
        inner_->Start##Name(request).TakePending(), metrics_, index));                     \
  }
MC_MASTER_METHODS(MC_X)
#undef MC_X

}  // namespace store
}  // namespace mooncake
