// The master's RPC methods (rpc_wire.h's MasterMethod) served from a MasterService: parses a
// request payload, calls the service, appends the response payload. rpc_server.h carries it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "store/master_service.h"
#include "store/rpc_wire.h"

namespace mooncake {
namespace store {

// For RpcServer's handler: kOk with the response appended to *out, or kUnknownMethod /
// kBadRequest with a message.
RpcStatus ServeMasterRpc(MasterService* master, uint16_t method, const char* data, size_t n,
                         std::string* out);

// The methods that may take long (they walk the whole object table): RpcServer runs them on
// its worker thread.
bool IsSlowMasterMethod(uint16_t method);

}  // namespace store
}  // namespace mooncake
