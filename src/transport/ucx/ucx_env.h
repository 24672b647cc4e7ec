// The environment of the UCX transport: upstream's RDMA variables mapped to UCX's, the
// defaults this engine gives UCX, and which UCX lanes count as RDMA-class.
//
// The variables are read here, not in EngineOptions: they mean something only to UCX, and
// UCX itself reads its configuration from the environment (UCX_*), so the mapping is done by
// setting UCX_* variables that are not set already (an explicit UCX_* always wins). It runs
// once, before libucp is loaded (UCX reads some of them when it is loaded).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace mooncake::ucx {

// Sets, where unset: UCX_IB_GID_INDEX from MC_GID_INDEX, UCX_NET_DEVICES from MC_UCX_DEVICES
// (upstream's NIC list "mlx5_0,mlx5_1"; each gets ":<MC_IB_PORT>", default port 1),
// UCX_IB_PATH_MTU from MC_MTU, UCX_IB_SL from MC_IB_SL, UCX_IB_TRAFFIC_CLASS from MC_IB_TC,
// UCX_IB_PCI_RELAXED_ORDERING from MC_IB_PCI_RELAXED_ORDERING, UCX_RC_RETRY_COUNT from
// MC_RETRY_CNT; and this engine's defaults: UCX_KEEPALIVE_INTERVAL=1s (a dead peer is found
// within seconds), UCX_ERROR_SIGNALS= and UCX_HANDLE_ERRORS=none (UCX installs no signal
// handlers in the host process), UCX_MEM_EVENTS=no (no malloc/mmap hooks: every range this
// transport moves is mapped explicitly), UCX_LOG_FILE=stderr (UCX's messages stay off the
// application's stdout). Returns one "UCX_X=v (from MC_Y)" line per variable
// set, for the log.
std::vector<std::string> ApplyEnvironment();

// rc (verbs, mlx5), dc (mlx5), cuda_ipc, gdr_copy: the lanes for which the engine
// prefers UCX over its own shm and tcp. `info` is ucp_context_print_info's text (its
// resources) or ucp_ep_print_info's (its lanes); returns the RDMA-class and GPU transports
// named in it, comma separated, "" if none.
std::string FastLanes(const std::string& info);
// Whether `info` (as above) names a transport that reports a peer's failure (tcp, rc, dc,
// ud); UCX 1.13's shared-memory ones (sysv, posix, cma) do not.
bool HasPeerFailureLane(const std::string& info);
// Every transport named in `info` (as above), comma separated.
std::string TransportList(const std::string& info);

// What `print(FILE*)` writes (UCX's *_print_info), as a string; "" without a memory stream.
template <typename F>
std::string PrintToString(F print) {
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = ::open_memstream(&buf, &size);
  if (f == nullptr) return "";
  print(f);
  ::fclose(f);
  std::string out(buf, size);
  ::free(buf);
  return out;
}

}  // namespace mooncake::ucx
