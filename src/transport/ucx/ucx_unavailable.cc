// Built instead of the UCX transport when UCX's headers were not found at configure time.
#include "transport/ucx/ucx_factory.h"

namespace mooncake::ucx {

bool UcxTransportBuilt() { return false; }

Result<std::unique_ptr<Transport>> CreateUcxTransport() {
  return Status::Unimplemented(
      "transport 'ucx' is not built into this engine: UCX's headers (ucp/api/ucp.h) were not "
      "found when it was configured; install libucx-dev and configure again (MC_WITH_UCX)");
}

}  // namespace mooncake::ucx
