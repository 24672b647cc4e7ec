#include "store/client/client_port.h"

#include <glog/logging.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "common/net.h"

namespace mooncake {
namespace store {

std::unique_ptr<PortHold> PortHold::Pick(uint16_t lo, uint16_t hi) {
  std::random_device rd;
  std::mt19937 gen(rd());
  std::uniform_int_distribution<int> dist(lo, hi);
  for (int attempt = 0; attempt < 20; ++attempt) {
    const uint16_t port = static_cast<uint16_t>(dist(gen));
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(port);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      return std::unique_ptr<PortHold>(new PortHold(fd, port));
    }
    ::close(fd);
  }
  return nullptr;
}

PortHold::~PortHold() {
  if (fd_ >= 0) ::close(fd_);
}

bool NeedsAutoPort(const std::string& metadata_server, const std::string& local_hostname) {
  if (metadata_server == "P2PHANDSHAKE") return false;
  auto hp = ParseHostPort(local_hostname);
  return hp.ok() && !hp->has_port;
}

Status InitClientEngine(const std::string& metadata_server, const std::string& local_hostname,
                        const std::string& transport, const EngineOptions& options,
                        std::shared_ptr<TransferEngine>* engine, std::unique_ptr<PortHold>* hold) {
  if (!NeedsAutoPort(metadata_server, local_hostname)) {
    *engine = std::make_shared<TransferEngine>(options);
    return (*engine)->Init(metadata_server, local_hostname, transport);
  }
  MC_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(local_hostname));
  Status last = Status::Unavailable("no attempt made");
  const int attempts = std::max(1, options.store_client_setup_retries);
  for (int attempt = 1; attempt <= attempts; ++attempt) {
    std::unique_ptr<PortHold> h =
        PortHold::Pick(options.store_client_min_port, options.store_client_max_port);
    if (!h) {
      last = Status::Unavailable(
          "no free port in " + std::to_string(options.store_client_min_port) + ".." +
          std::to_string(options.store_client_max_port) +
          " (MC_STORE_CLIENT_MIN_PORT / MC_STORE_CLIENT_MAX_PORT)");
      LOG(WARNING) << "store setup: " << last.ToString() << ", attempt " << attempt << "/"
                   << attempts;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    const std::string name = HostPort{hp.host, h->port(), true}.ToString();
    // In legacy mode the engine listens on the name's port itself: it must be free.
    if (options.legacy_rpc_port_binding) h.reset();
    auto e = std::make_shared<TransferEngine>(options);
    last = e->Init(metadata_server, name, transport);
    if (last.ok()) {
      LOG(INFO) << "store setup: segment name " << name << " (local_hostname " << local_hostname
                << " had no port), attempt " << attempt;
      *engine = std::move(e);
      *hold = std::move(h);
      return Status::OK();
    }
    if (last.code() != Status::Code::kAlreadyExists &&
        !(options.legacy_rpc_port_binding && last.code() == Status::Code::kUnavailable)) {
      return last;
    }
    LOG(WARNING) << "store setup: " << last.ToString() << "; attempt " << attempt << "/"
                 << attempts << ", trying another port";
  }
  return last.WithContext("no free segment name " + hp.host + ":<port> after " +
                          std::to_string(attempts) + " attempts");
}

}  // namespace store
}  // namespace mooncake
