// The one list of built-in transports. Adding a transport: one line here and its folder.
#include "engine/transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace mooncake {

std::vector<std::string> BuiltinTransports() { return {"shm", "tcp"}; }

Result<std::unique_ptr<Transport>> CreateTransport(const std::string& name) {
  if (name == "tcp") return std::unique_ptr<Transport>(new tcp::TcpTransport());
  if (name == "shm") return std::unique_ptr<Transport>(new shm::ShmTransport());
  return Status::Unimplemented("transport '" + name +
                               "' is not built into this engine (built in: shm, tcp)");
}

}  // namespace mooncake
