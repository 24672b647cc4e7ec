// The identity of "this host" for same-host transports (shm, cuda_ipc).
#pragma once

#include <string>

#include "mooncake/options.h"

namespace mooncake {

// "<boot id>/<pid ns>/<net ns>", or options.host_id_override. Two engines with equal ids
// share a kernel, a pid namespace and a network namespace.
std::string LocalHostId(const EngineOptions& options);

}  // namespace mooncake
