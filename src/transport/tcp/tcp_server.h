// The serving side of the TCP transport: accepts data connections and applies each request to
// this process's registered memory, after checking the range against the MemoryRegistry.
// One thread per connection (blocking I/O; a connection carries one initiator stream).
#pragma once

#include "common/conn_server.h"
#include "common/net.h"
#include "engine/memory_registry.h"
#include "mooncake/options.h"
#include "transport/tcp/tcp_fence.h"

namespace mooncake::tcp {

class TcpServer {
 public:
  // `segment_name`: this engine's segment name, which authenticating clients must ask for;
  // `instance`: this engine start's id, which clients append (Authenticator::OwnNames).
  TcpServer(const EngineOptions& options, MemoryRegistry* registry,
            std::string segment_name = {}, std::string instance = {});
  ~TcpServer();
  TcpServer(const TcpServer&) = delete;
  TcpServer& operator=(const TcpServer&) = delete;

  // Takes a listening socket and starts accepting.
  Status Start(UniqueFd listen_fd);
  // Closes the listener and every connection; joins all threads.
  void Stop();

  // Connections fenced so far (tests).
  uint64_t fenced_connections() const { return fences_.fenced_count(); }

  // Limits a connection may not exceed.
  static constexpr size_t kMaxConnections = 4096;

 private:
  void ServeConnection(int fd);

  const EngineOptions options_;
  MemoryRegistry* const registry_;
  const std::string segment_name_;
  const std::string instance_;
  FenceTable fences_;  // before server_: connections unregister from it as they end
  ConnServer server_;
};

}  // namespace mooncake::tcp
