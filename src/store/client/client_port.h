// The segment name of a store client under a metadata server (etcd, redis, http): a
// local_hostname given without ":port" gets one, so that many clients of one host may share a
// local_hostname (one per tensor-parallel rank), as upstream's store client does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mooncake/options.h"
#include "mooncake/status.h"
#include "mooncake/transfer_engine.h"

namespace mooncake {
namespace store {

// A TCP port held for the life of this object: a socket bound (never listening) to it on
// every local address, so that no other process of the host picks the same port — and with
// it the same segment name — while this client lives.
class PortHold {
 public:
  // Tries 20 ports drawn at random in [lo, hi]; null when none could be bound.
  static std::unique_ptr<PortHold> Pick(uint16_t lo, uint16_t hi);
  ~PortHold();
  PortHold(const PortHold&) = delete;
  PortHold& operator=(const PortHold&) = delete;
  uint16_t port() const { return port_; }

 private:
  PortHold(int fd, uint16_t port) : fd_(fd), port_(port) {}
  int fd_;
  uint16_t port_;
};

// True when a store client would append a port to `local_hostname` (a metadata server and no
// ":port" in the name).
bool NeedsAutoPort(const std::string& metadata_server, const std::string& local_hostname);

// Initializes `engine` (fresh, not initialized) as a store client's own engine. With a port to
// append (NeedsAutoPort), picks one (PortHold, in options.store_client_min_port..max) and tries
// the name host:port; a name in use (AlreadyExists) is tried again with another port, up to
// options.store_client_setup_retries times, each attempt on a new engine made by `make`.
// *hold keeps the port while the client lives (released at once when the engine binds the
// port itself: MC_LEGACY_RPC_PORT_BINDING). Other errors are returned at once.
Status InitClientEngine(const std::string& metadata_server, const std::string& local_hostname,
                        const std::string& transport, const EngineOptions& options,
                        std::shared_ptr<TransferEngine>* engine, std::unique_ptr<PortHold>* hold);

}  // namespace store
}  // namespace mooncake
