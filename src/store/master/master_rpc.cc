#include "store/master/master_rpc.h"

#include <google/protobuf/arena.h>
#include <google/protobuf/io/coded_stream.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "master.pb.h"
#include "mooncake/store/error_code.h"
#include "store/rpc/rpc_server.h"

namespace mooncake {
namespace store {

namespace {

// The request parsed on `arena` (a batch's keys cost no malloc / free each), or nullptr
// after appending what was wrong to *out.
template <class Req>
Req* ParseOnArena(const char* data, size_t n, std::string* out, const char* name,
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

// Strict multi-tenant mode: the request's keys become its tenant's (MasterService::
// ScopeRequest); "" or why its tenant_id is not acceptable. Requests without keys or a tenant
// (NotScoped) pass as they are.
struct NotScoped {};
template <class Req>
NotScoped Scope(MasterService*, Req*) {
  return {};
}
std::string Scope(MasterService* m, rpc::KeysRequest* req) { return m->ScopeRequest(req); }
std::string Scope(MasterService* m, rpc::PutStartRequest* req) { return m->ScopeRequest(req); }
std::string Scope(MasterService* m, rpc::RemoveByRegexRequest* req) { return m->ScopeRequest(req); }
std::string Scope(MasterService* m, rpc::ReplicaClearRequest* req) { return m->ScopeRequest(req); }
std::string Scope(MasterService* m, rpc::ReplicaTaskRequest* req) { return m->ScopeRequest(req); }
std::string Scope(MasterService* m, rpc::QueryTaskRequest* req) { return m->ScopeRequest(req); }
// The method's response refusing the request as a whole, appended to *out.
template <class Resp>
void AppendRefusal(const std::string& problem, std::string* out) {
  Resp refused;
  refused.set_code(ToInt(ErrorCode::INVALID_PARAMS));
  refused.set_message(problem);
  refused.AppendToString(out);
}
template <class Resp>
void Unscope(MasterService*, Resp*) {}
void Unscope(MasterService* m, rpc::ReplicaClearResponse* resp) { m->UnscopeReply(resp); }

template <class Req, class Resp>
RpcStatus Serve(const char* data, size_t n, std::string* out, const char* name,
                Resp (*call)(MasterService*, const Req&), MasterService* m) {
  google::protobuf::Arena arena(ArenaFor(n));
  Req* req = ParseOnArena<Req>(data, n, out, name, &arena);
  if (req == nullptr) return RpcStatus::kBadRequest;
  if constexpr (!std::is_same_v<decltype(Scope(m, req)), NotScoped>) {
    if (const std::string problem = Scope(m, req); !problem.empty()) {
      AppendRefusal<Resp>(problem, out);
      return RpcStatus::kOk;
    }
  }
  Resp resp = call(m, *req);
  Unscope(m, &resp);
  resp.AppendToString(out);
  return RpcStatus::kOk;
}

// PutStart / GetReplicaList: the response too on the arena (a result and a replica per key:
// no malloc / free each).
template <class Req, class Resp>
RpcStatus ServeInto(const char* data, size_t n, std::string* out, const char* name,
                    void (MasterService::*into)(const Req&, Resp*), MasterService* m) {
  google::protobuf::Arena arena(ArenaFor(n));
  Req* req = ParseOnArena<Req>(data, n, out, name, &arena);
  if (req == nullptr) return RpcStatus::kBadRequest;
  if constexpr (!std::is_same_v<decltype(Scope(m, req)), NotScoped>) {
    if (const std::string problem = Scope(m, req); !problem.empty()) {
      AppendRefusal<Resp>(problem, out);
      return RpcStatus::kOk;
    }
  }
  Resp& resp = *google::protobuf::Arena::CreateMessage<Resp>(&arena);
  (m->*into)(*req, &resp);
  resp.AppendToString(out);
  return RpcStatus::kOk;
}

// OffloadFetch: with nothing to send and the request willing to wait, the call waits on the
// server for the client's disk to get work (MasterService::SetDiskWorkWaker wakes it).
RpcStatus ServeOffloadFetch(const char* data, size_t n, std::string* out, MasterService* m) {
  google::protobuf::Arena arena(ArenaFor(n));
  auto* req = ParseOnArena<rpc::OffloadFetchRequest>(data, n, out, "OffloadFetch", &arena);
  if (req == nullptr) return RpcStatus::kBadRequest;
  if (req->end_wait()) {  // a closing client: nothing fetched (its writer may still run)
    m->EndDiskWait(req->client_id());
    rpc::OffloadFetchResponse done;
    done.set_code(ToInt(ErrorCode::OK));
    done.AppendToString(out);
    return RpcStatus::kOk;
  }
  const rpc::OffloadFetchResponse resp = m->OffloadFetch(*req);
  if (req->wait_ms() > 0 && resp.code() == 0 && resp.items_size() == 0 &&
      resp.removals_size() == 0 && resp.promotions_size() == 0 && !resp.disk_unknown() &&
      m->MayWaitForDiskWork(req->client_id())) {
    RpcServer::AskToWait(out, req->client_id(), std::chrono::milliseconds(req->wait_ms()));
    return RpcServer::kWaitForWake;
  }
  resp.AppendToString(out);
  return RpcStatus::kOk;
}

#define MC_METHOD(Name, Req)                                                             \
  case MasterMethod::k##Name:                                                            \
    return Serve<rpc::Req>(data, n, out, #Name,                                          \
                           +[](MasterService* s, const rpc::Req& q) { return s->Name(q); }, \
                           master)

// The method's handling, the request not yet looked at.
RpcStatus Dispatch(MasterService* master, uint16_t method, const char* data, size_t n,
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
    MC_METHOD(CreateReplicaTask, ReplicaTaskRequest);
    MC_METHOD(QueryTask, QueryTaskRequest);
    MC_METHOD(FetchTasks, FetchTasksRequest);
    MC_METHOD(FinishTask, FinishTaskRequest);
    MC_METHOD(MountLocalDisk, MountLocalDiskRequest);
    case MasterMethod::kOffloadFetch:
      return ServeOffloadFetch(data, n, out, master);
    MC_METHOD(OffloadDone, OffloadDoneRequest);
    MC_METHOD(EvictDisk, EvictDiskRequest);
    case MasterMethod::kOffloadRead:
    case MasterMethod::kOffloadRelease:
      break;  // a client's offload service's, not the master's
  }
  out->append("unknown method " + std::to_string(method) +
              " (this master knows 1.." + std::to_string(kMaxMethod) +
              ": is the client newer than the master?)");
  return RpcStatus::kUnknownMethod;
}

#undef MC_METHOD

// --- The shape of a request, before it is parsed ---

// What a field of a message is to the walk.
enum class Count : uint8_t { kNone, kItems, kLeaseIds, kPreferred };
struct Schema;
struct Rule {
  uint32_t number;
  Count count;
  bool fixed64;          // a repeated fixed64 (packed or not)
  const Schema* nested;  // a message field walked into (nullptr: a string, bytes or scalar)
};
struct Schema {
  const Rule* rules;
  size_t n;
};

constexpr Schema kPlain{nullptr, 0};  // a message with no repeated field walked into
constexpr Rule kReplicateConfigRules[] = {{4, Count::kPreferred, false, nullptr}};
constexpr Schema kReplicateConfig{kReplicateConfigRules, 1};
constexpr Rule kPutStartRules[] = {{2, Count::kItems, false, &kPlain},
                                   {3, Count::kNone, false, &kReplicateConfig}};
constexpr Schema kPutStartRequest{kPutStartRules, 2};
constexpr Rule kKeysRules[] = {{2, Count::kItems, false, nullptr},
                               {4, Count::kLeaseIds, true, nullptr}};
constexpr Schema kKeysRequest{kKeysRules, 2};
constexpr Rule kReplicaClearRules[] = {{2, Count::kItems, false, nullptr}};
constexpr Schema kReplicaClearRequest{kReplicaClearRules, 1};
// OffloadDoneRequest.items, EvictDiskRequest.keys: batches (field 2), as ReplicaClear's.
constexpr Rule kOffloadDoneRules[] = {{2, Count::kItems, false, &kPlain}};
constexpr Schema kOffloadDoneRequest{kOffloadDoneRules, 1};

const Schema* SchemaOf(uint16_t method) {
  switch (static_cast<MasterMethod>(method)) {
    case MasterMethod::kPutStart: return &kPutStartRequest;
    case MasterMethod::kPutEnd:
    case MasterMethod::kPutRevoke:
    case MasterMethod::kGetReplicaList:
    case MasterMethod::kExistKey:
    case MasterMethod::kRemove:
    case MasterMethod::kRemoveAll: return &kKeysRequest;
    case MasterMethod::kReplicaClear:
    case MasterMethod::kEvictDisk: return &kReplicaClearRequest;
    case MasterMethod::kOffloadDone: return &kOffloadDoneRequest;
    default: return &kPlain;
  }
}

// Walks the wire format as protobuf's parser reads it (the same fields counted, the same
// encodings refused), allocating nothing: a length-delimited field is skipped by its length,
// except the message fields the schema walks into.
class Scanner {
 public:
  explicit Scanner(RequestShape* shape) : s_(shape) {}

  // The fields up to the stream's limit, or up to the END_GROUP tag `end` when it is not 0;
  // false once the walk stops (malformed or a bound passed).
  bool Walk(google::protobuf::io::CodedInputStream* in, const Schema& schema, uint32_t end,
            int depth) {
    while (true) {
      const uint32_t tag = in->ReadTag();
      if (tag == 0) {  // the limit, or a tag that is 0 or not a varint
        if (end == 0 && in->BytesUntilLimit() == 0) return true;
        return Malformed();
      }
      if (end != 0 && tag == end) return true;
      if (++s_->fields > kMaxScanFields) {
        return Over("more than " + std::to_string(kMaxScanFields) + " fields");
      }
      const uint32_t number = tag >> 3;
      if (number == 0) return Malformed();
      const Rule* rule = nullptr;
      for (size_t i = 0; i < schema.n; ++i) {
        if (schema.rules[i].number == number) rule = &schema.rules[i];
      }
      switch (tag & 7) {
        case 0: {  // varint
          uint64_t v;
          if (!in->ReadVarint64(&v)) return Malformed();
          break;
        }
        case 1:  // fixed64
          if (!in->Skip(8)) return Malformed();
          if (rule != nullptr && rule->fixed64 && !Add(rule->count, 1)) return false;
          break;
        case 5:  // fixed32
          if (!in->Skip(4)) return Malformed();
          break;
        case 2: {  // length-delimited
          uint32_t len;
          if (!in->ReadVarint32(&len) || len > static_cast<uint32_t>(INT_MAX)) {
            return Malformed();
          }
          if (rule != nullptr && rule->fixed64) {  // packed
            if (!Add(rule->count, len / 8)) return false;
          } else if (rule != nullptr && !Add(rule->count, 1)) {
            return false;
          }
          if (rule != nullptr && rule->nested != nullptr) {
            if (depth >= kMaxScanDepth) return Over("nested too deep");
            const auto limit = in->PushLimit(static_cast<int>(len));
            if (!Walk(in, *rule->nested, 0, depth + 1)) return false;
            in->PopLimit(limit);
          } else if (!in->Skip(static_cast<int>(len))) {
            return Malformed();
          }
          break;
        }
        case 3:  // a group: an unknown field here, its fields walked (and counted) too
          if (depth >= kMaxScanDepth) return Over("groups nested too deep");
          if (!Walk(in, kPlain, (number << 3) | 4, depth + 1)) return false;
          break;
        default:  // an END_GROUP that ends no group, or wire types 6 and 7
          return Malformed();
      }
    }
  }

 private:
  bool Malformed() {
    s_->malformed = true;
    return false;
  }
  bool Over(std::string what) {
    s_->over = std::move(what);
    return false;
  }
  bool Add(Count c, size_t n) {
    switch (c) {
      case Count::kNone: return true;
      case Count::kItems:
        s_->items += n;
        if (s_->items <= kMaxBatchItems) return true;
        s_->over_batch = true;
        return Over("more than " + std::to_string(kMaxBatchItems) + " items");
      case Count::kLeaseIds:
        s_->lease_ids += n;
        if (s_->lease_ids <= kMaxBatchItems) return true;
        return Over("more than " + std::to_string(kMaxBatchItems) + " read_lease_ids");
      case Count::kPreferred:
        s_->preferred += n;
        if (s_->preferred <= kMaxBatchItems) return true;
        return Over("more than " + std::to_string(kMaxBatchItems) + " preferred segments");
    }
    return true;
  }
  RequestShape* s_;
};

// The service's refusal of a batch over kMaxBatchItems, for a request too large to parse:
// the service is given a stand-in of kMaxBatchItems + 1 empty entries (it refuses any batch
// over the bound before looking at an entry, and counts the refusal), and its message then
// names what came.
template <class Resp>
RpcStatus RefuseBatch(MasterService* master, uint16_t method, std::string* out) {
  google::protobuf::Arena arena;
  std::string standin;
  if (method == static_cast<uint16_t>(MasterMethod::kPutStart)) {
    auto* q = google::protobuf::Arena::CreateMessage<rpc::PutStartRequest>(&arena);
    for (size_t i = 0; i <= kMaxBatchItems; ++i) q->add_items();
    q->SerializeToString(&standin);
  } else if (method == static_cast<uint16_t>(MasterMethod::kReplicaClear)) {
    auto* q = google::protobuf::Arena::CreateMessage<rpc::ReplicaClearRequest>(&arena);
    for (size_t i = 0; i <= kMaxBatchItems; ++i) q->add_keys();
    q->SerializeToString(&standin);
  } else {
    auto* q = google::protobuf::Arena::CreateMessage<rpc::KeysRequest>(&arena);
    for (size_t i = 0; i <= kMaxBatchItems; ++i) q->add_keys();
    q->SerializeToString(&standin);
  }
  const std::string why = std::string(MethodName(method)) + " with more than " +
                          std::to_string(kMaxBatchItems) + " items: at most " +
                          std::to_string(kMaxBatchItems) + " per request (split the batch)";
  const size_t base = out->size();
  const RpcStatus st = Dispatch(master, method, standin.data(), standin.size(), out);
  Resp resp;
  if (st != RpcStatus::kOk ||
      !resp.ParseFromArray(out->data() + base, static_cast<int>(out->size() - base)) ||
      resp.code() == 0) {
    resp.Clear();  // not refused: not expected of the service, refused here then
    resp.set_code(ToInt(ErrorCode::INVALID_PARAMS));
  }
  resp.set_message(why);
  out->resize(base);
  resp.AppendToString(out);
  return RpcStatus::kOk;
}

}  // namespace

size_t MaxMasterRequestBytes(uint16_t method) {
  switch (static_cast<MasterMethod>(method)) {
    case MasterMethod::kPing:
    case MasterMethod::kMountSegment:
    case MasterMethod::kUnmountSegment:
    case MasterMethod::kRemoveByRegex:
    case MasterMethod::kGetStats:
    case MasterMethod::kCreateReplicaTask:
    case MasterMethod::kQueryTask:
    case MasterMethod::kFetchTasks:
    case MasterMethod::kFinishTask:
    case MasterMethod::kMountLocalDisk:
    case MasterMethod::kOffloadFetch:
      return kMaxSmallRequestBytes;
    default:
      return static_cast<size_t>(kMaxMessageBytes);
  }
}

RequestShape ScanMasterRequest(uint16_t method, const char* data, size_t n) {
  RequestShape shape;
  if (n > static_cast<size_t>(INT_MAX)) {
    shape.malformed = true;
    return shape;
  }
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(data),
                                            static_cast<int>(n));
  in.PushLimit(static_cast<int>(n));
  Scanner(&shape).Walk(&in, *SchemaOf(method), 0, 0);
  return shape;
}

RpcStatus ServeMasterRpc(MasterService* master, uint16_t method, const char* data, size_t n,
                         std::string* out) {
  if (method < 1 || method > kMaxMethod) return Dispatch(master, method, data, n, out);
  const char* name = MethodName(method);
  if (n > MaxMasterRequestBytes(method)) {
    out->append(std::string(name) + " request of " + std::to_string(n) +
                " bytes is over this method's limit of " +
                std::to_string(MaxMasterRequestBytes(method)) + " bytes");
    return RpcStatus::kBadRequest;
  }
  const RequestShape shape = ScanMasterRequest(method, data, n);
  if (shape.over_batch) {
    switch (static_cast<MasterMethod>(method)) {
      case MasterMethod::kPutStart: return RefuseBatch<rpc::PutStartResponse>(master, method, out);
      case MasterMethod::kPutEnd:
      case MasterMethod::kPutRevoke:
      case MasterMethod::kRemove: return RefuseBatch<rpc::CodesResponse>(master, method, out);
      case MasterMethod::kGetReplicaList:
        return RefuseBatch<rpc::GetReplicaListResponse>(master, method, out);
      case MasterMethod::kExistKey: return RefuseBatch<rpc::ExistResponse>(master, method, out);
      case MasterMethod::kReplicaClear:
        return RefuseBatch<rpc::ReplicaClearResponse>(master, method, out);
      case MasterMethod::kOffloadDone:
        return RefuseBatch<rpc::OffloadDoneResponse>(master, method, out);
      case MasterMethod::kEvictDisk: return RefuseBatch<rpc::EvictDiskResponse>(master, method, out);
      default: break;  // RemoveAll: its keys are not a batch the service bounds
    }
  }
  if (shape.malformed) {
    out->append(std::string("the payload is not a ") + name + " request");
    return RpcStatus::kBadRequest;
  }
  if (!shape.over.empty()) {
    out->append(std::string(name) + " request refused before parsing: " + shape.over +
                " (the bound is " + std::to_string(kMaxBatchItems) + " items per batch, " +
                std::to_string(kMaxScanFields) + " fields in all)");
    return RpcStatus::kBadRequest;
  }
  return Dispatch(master, method, data, n, out);
}

bool IsSlowMasterMethod(uint16_t method) {
  return method == static_cast<uint16_t>(MasterMethod::kRemoveAll) ||
         method == static_cast<uint16_t>(MasterMethod::kRemoveByRegex);
}

}  // namespace store
}  // namespace mooncake
