// The one list of built-in transports. Adding a transport: one line here and its folder.
#include "engine/transport.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/ucx/ucx_factory.h"

namespace mooncake {

// cuda_ipc first: it serves only requests whose remote end is device memory on this host,
// and CanMove() sends everything else on. shm keeps same-host peers; ucx takes a peer only
// over an RDMA-class or GPU lane (unless named), so tcp keeps every other one.
std::vector<std::string> BuiltinTransports() {
  if (ucx::UcxTransportBuilt()) return {"cuda_ipc", "shm", "ucx", "tcp"};
  return {"cuda_ipc", "shm", "tcp"};
}

Result<std::unique_ptr<Transport>> CreateTransport(const std::string& name) {
  if (name == "tcp") return std::unique_ptr<Transport>(new tcp::TcpTransport());
  if (name == "shm") return std::unique_ptr<Transport>(new shm::ShmTransport());
  if (name == "cuda_ipc") return std::unique_ptr<Transport>(new cuda_ipc::CudaIpcTransport());
  if (name == "ucx") return ucx::CreateUcxTransport();
  std::string built;
  for (const auto& n : BuiltinTransports()) built += (built.empty() ? "" : ", ") + n;
  return Status::Unimplemented("transport '" + name + "' is not built into this engine (built in: " +
                               built + ")");
}

}  // namespace mooncake
