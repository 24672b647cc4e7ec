// The UCX transport's entry point for the registry (src/engine/transport_registry.cc). Built
// from ucx_transport.cc where UCX's headers were found at configure time, else from
// ucx_unavailable.cc, which answers Unimplemented with the reason.
#pragma once

#include <memory>

#include "engine/transport.h"

namespace mooncake::ucx {

Result<std::unique_ptr<Transport>> CreateUcxTransport();
// Whether this build has the transport (false from ucx_unavailable.cc).
bool UcxTransportBuilt();

}  // namespace mooncake::ucx
