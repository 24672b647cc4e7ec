#include "store/master_rpc.h"

#include <algorithm>

#include <google/protobuf/arena.h>

#include "master.pb.h"

namespace mooncake {
namespace store {

namespace {

// The request parsed on `arena` (a batch's keys cost no malloc / free each), or nullptr
// after appending what was wrong to *out.
template <class Req>
const Req* ParseOnArena(const char* data, size_t n, std::string* out, const char* name,
                        google::protobuf::Arena* arena) {
  Req* req = google::protobuf::Arena::CreateMessage<Req>(arena);
  if (n > static_cast<size_t>(INT32_MAX) || !req->ParseFromArray(data, static_cast<int>(n))) {
    out->append(std::string("the payload is not a ") + name + " request");
    return nullptr;
  }
  return req;
}

// An arena whose first block fits a request of n bytes and its reply (a parsed message
// takes a few times its wire size).
google::protobuf::ArenaOptions ArenaFor(size_t n) {
  google::protobuf::ArenaOptions options;
  options.start_block_size = std::min<size_t>(4096 + 8 * n, 4 << 20);
  options.max_block_size = 4 << 20;
  return options;
}

template <class Req, class Resp>
RpcStatus Serve(const char* data, size_t n, std::string* out, const char* name,
                Resp (*call)(MasterService*, const Req&), MasterService* m) {
  google::protobuf::Arena arena(ArenaFor(n));
  const Req* req = ParseOnArena<Req>(data, n, out, name, &arena);
  if (req == nullptr) return RpcStatus::kBadRequest;
  call(m, *req).AppendToString(out);
  return RpcStatus::kOk;
}

// PutStart / GetReplicaList: the response too on the arena (a result and a replica per key:
// no malloc / free each).
template <class Req, class Resp>
RpcStatus ServeInto(const char* data, size_t n, std::string* out, const char* name,
                    void (MasterService::*into)(const Req&, Resp*), MasterService* m) {
  google::protobuf::Arena arena(ArenaFor(n));
  const Req* req = ParseOnArena<Req>(data, n, out, name, &arena);
  if (req == nullptr) return RpcStatus::kBadRequest;
  Resp& resp = *google::protobuf::Arena::CreateMessage<Resp>(&arena);
  (m->*into)(*req, &resp);
  resp.AppendToString(out);
  return RpcStatus::kOk;
}

#define MC_METHOD(Name, Req)                                                             \
  case MasterMethod::k##Name:                                                            \
    return Serve<rpc::Req>(data, n, out, #Name,                                          \
                           +[](MasterService* s, const rpc::Req& q) { return s->Name(q); }, \
                           master)

}  // namespace

RpcStatus ServeMasterRpc(MasterService* master, uint16_t method, const char* data, size_t n,
                         std::string* out) {
  switch (static_cast<MasterMethod>(method)) {
    MC_METHOD(Ping, PingRequest);
    MC_METHOD(MountSegment, MountSegmentRequest);
    MC_METHOD(UnmountSegment, UnmountSegmentRequest);
    case MasterMethod::kPutStart:
      return ServeInto(data, n, out, "PutStart", &MasterService::PutStartInto, master);
    MC_METHOD(PutEnd, KeysRequest);
    MC_METHOD(PutRevoke, KeysRequest);
    case MasterMethod::kGetReplicaList:
      return ServeInto(data, n, out, "GetReplicaList", &MasterService::GetReplicaListInto,
                       master);
    MC_METHOD(ExistKey, KeysRequest);
    MC_METHOD(Remove, KeysRequest);
    MC_METHOD(RemoveByRegex, RemoveByRegexRequest);
    MC_METHOD(RemoveAll, KeysRequest);
    MC_METHOD(ReplicaClear, ReplicaClearRequest);
    case MasterMethod::kGetStats:
      return Serve<rpc::StatsRequest>(
          data, n, out, "GetStats",
          +[](MasterService* s, const rpc::StatsRequest&) { return s->GetStats(); }, master);
  }
  out->append("unknown method " + std::to_string(method) +
              " (this master knows 1.." + std::to_string(kMaxMethod) +
              ": is the client newer than the master?)");
  return RpcStatus::kUnknownMethod;
}

#undef MC_METHOD

bool IsSlowMasterMethod(uint16_t method) {
  return method == static_cast<uint16_t>(MasterMethod::kRemoveAll) ||
         method == static_cast<uint16_t>(MasterMethod::kRemoveByRegex);
}

}  // namespace store
}  // namespace mooncake
