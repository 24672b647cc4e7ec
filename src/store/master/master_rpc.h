// The master's RPC methods (rpc_wire.h's MasterMethod) served from a MasterService: parses a
// request payload, calls the service, appends the response payload. rpc_server.h carries it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "store/master/master_service.h"
#include "store/rpc/rpc_wire.h"

namespace mooncake {
namespace store {

// For RpcServer's handler: kOk with the response appended to *out, or kUnknownMethod /
// kBadRequest with a message.
//
// Before a request is parsed (on the loop thread that read it), its shape is checked without
// allocating (ScanMasterRequest), so that no payload costs more to parse than a request
// within the bounds would (issue 28: 64 MiB of 33.5 M empty keys had been parsed whole,
// 1.9 GB and seconds a request, before the batch bound was looked at):
//   - the batch (PutStartRequest.items, KeysRequest.keys, ReplicaClearRequest.keys) over
//     kMaxBatchItems: the method's response with INVALID_PARAMS, as the service refuses any
//     over-bound batch (the service gives it, from a stand-in request of kMaxBatchItems + 1
//     empty entries, so that its refusal counters see it too);
//   - KeysRequest.read_lease_ids or ReplicateConfig.preferred_segments over kMaxBatchItems,
//     more than kMaxScanFields fields in all (unknown ones included, at every level), or
//     groups nested deeper than kMaxScanDepth: kBadRequest naming the bound;
//   - a payload over MaxMasterRequestBytes(method) (1 MiB for the methods that carry no
//     batch): kBadRequest naming the bound.
// So a parse allocates at most about kMaxScanFields entries, and copies at most the payload.
RpcStatus ServeMasterRpc(MasterService* master, uint16_t method, const char* data, size_t n,
                         std::string* out);

// Fields of one request, at every level walked (a legitimate PutStart of kMaxBatchItems
// items has about 3 x kMaxBatchItems), and the nesting of groups (none in these messages).
constexpr size_t kMaxScanFields = 4 * kMaxBatchItems + 1024;
constexpr int kMaxScanDepth = 16;
constexpr size_t kMaxSmallRequestBytes = 1 << 20;

// The largest payload `method` accepts.
size_t MaxMasterRequestBytes(uint16_t method);

// What a request's payload holds, counted without parsing it. When `malformed` is false and
// `over` empty, and protobuf parses the payload as the method's request, the counts are
// those of the parsed message (fuzz_master_rpc checks this); `malformed` means protobuf's
// parse fails too. The walk stops at the first bound passed (`over` says which; `over_batch`
// when it is the batch's).
struct RequestShape {
  bool malformed = false;
  bool over_batch = false;
  std::string over;
  size_t fields = 0;     // every field, at every level walked
  size_t items = 0;      // PutStartRequest.items, KeysRequest.keys, ReplicaClearRequest.keys
  size_t lease_ids = 0;  // KeysRequest.read_lease_ids
  size_t preferred = 0;  // PutStartRequest.config.preferred_segments (all configs merged)
};
RequestShape ScanMasterRequest(uint16_t method, const char* data, size_t n);

// The methods that may take long (they walk the whole object table): RpcServer runs them on
// its worker thread.
bool IsSlowMasterMethod(uint16_t method);

}  // namespace store
}  // namespace mooncake
