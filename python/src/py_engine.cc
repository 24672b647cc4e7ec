// PyTransferEngine: set-up, registration, managed buffers, probes and notifies. The transfer
// methods are in py_transfer.cc. The environment of the Python layer (MC_TRANSFER_TIMEOUT,
// MC_LOG_LEVEL) is read here and nowhere else; the engine's own MC_* variables are read by
// EngineOptions::FromEnvironment().
#include "py_engine.h"

#include <glog/logging.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "error_codes.h"

namespace mooncake {
namespace pyapi {
namespace {

constexpr char kP2PHandshake[] = "P2PHANDSHAKE";
constexpr long kDefaultTimeoutS = 30;
constexpr long kMinTimeoutS = 5;

std::chrono::milliseconds TransferTimeoutFromEnvironment() {
  const char* v = std::getenv("MC_TRANSFER_TIMEOUT");
  if (v == nullptr || *v == '\0') return std::chrono::seconds(kDefaultTimeoutS);
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || n <= 0 || n > 100L * 86400) {
    LOG(WARNING) << "MC_TRANSFER_TIMEOUT='" << v << "' is not a number of seconds; using "
                 << kDefaultTimeoutS;
    return std::chrono::seconds(kDefaultTimeoutS);
  }
  if (n < kMinTimeoutS) {
    LOG(WARNING) << "MC_TRANSFER_TIMEOUT=" << n << " is below the minimum; using "
                 << kMinTimeoutS << " seconds";
    n = kMinTimeoutS;
  }
  return std::chrono::seconds(n);
}

std::string Hex(uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

void ApplyLogLevelFromEnvironment() {
  const char* v = std::getenv("MC_LOG_LEVEL");
  if (v == nullptr || *v == '\0') return;
  std::string level(v);
  if (level == "TRACE" || level == "INFO") {
    FLAGS_minloglevel = google::GLOG_INFO;
  } else if (level == "WARNING") {
    FLAGS_minloglevel = google::GLOG_WARNING;
  } else if (level == "ERROR") {
    FLAGS_minloglevel = google::GLOG_ERROR;
  } else {
    LOG(WARNING) << "MC_LOG_LEVEL='" << level << "' is not TRACE, INFO, WARNING or ERROR; ignored";
  }
}

PyTransferEngine::PyTransferEngine() : base_timeout_(TransferTimeoutFromEnvironment()) {}

PyTransferEngine::~PyTransferEngine() = default;

std::chrono::milliseconds PyTransferEngine::TimeoutFor(uint64_t bytes) const {
  // 1 ns per byte, rounded up to whole milliseconds.
  return base_timeout_ + std::chrono::milliseconds((bytes + 999999) / 1000000);
}

std::shared_ptr<EngineHolder> PyTransferEngine::Ready(const char* method) {
  std::shared_ptr<EngineHolder> h;
  {
    std::lock_guard lock(mu_);
    h = holder_;
  }
  if (h == nullptr) LOG(WARNING) << method << ": the engine is not initialized; call initialize() first";
  return h;
}

std::shared_ptr<EngineHolder> PyTransferEngine::GetEngine() {
  std::lock_guard lock(mu_);
  return holder_;
}

int PyTransferEngine::Initialize(const std::string& local_hostname,
                                 const std::string& metadata_server, const std::string& protocol,
                                 const std::string& device_name) {
  // Upstream's split: "P2PHANDSHAKE" -> ("", P2P); "a://b" -> (a, b); bare "h:p" -> etcd.
  std::string type = "etcd";
  std::string domain = metadata_server;
  if (metadata_server == kP2PHandshake) {
    type.clear();
  } else if (auto pos = metadata_server.find("://"); pos != std::string::npos) {
    type = metadata_server.substr(0, pos);
    domain = metadata_server.substr(pos + 3);
  }
  return InitializeExt(local_hostname, domain, protocol, device_name, type);
}

int PyTransferEngine::InitializeExt(const std::string& local_hostname,
                                    const std::string& metadata_server,
                                    const std::string& protocol, const std::string& device_name,
                                    const std::string& metadata_type) {
  std::lock_guard init_lock(init_mu_);
  const std::string what = "initialize(local_hostname='" + local_hostname + "', protocol='" +
                           protocol + "')";
  if (GetEngine() != nullptr) {
    LOG(WARNING) << what << ": this TransferEngine is initialized already; create another one";
    return kErrInvalidArgument;
  }
  std::string conn = metadata_server;
  if (metadata_server != kP2PHandshake && metadata_server.find("://") == std::string::npos) {
    conn = metadata_type + "://" + metadata_server;
  }
  // As upstream, the protocol does not pick between the network transports: "", "tcp" and
  // "rdma" (vLLM's and SGLang's default) start every transport built in, and requests take
  // the best one both ends share (shm on one host, ucx over an RDMA-class lane, else tcp;
  // MC_FORCE_TCP keeps tcp only). "rdma" says so when UCX is not available. Any other name
  // ("shm", "ucx") starts only that transport, and must be built in, or initialize fails.
  // device_name (upstream's NIC list, "mlx5_0,mlx5_1") becomes UCX's device list
  // (MC_UCX_DEVICES -> UCX_NET_DEVICES, src/transport/ucx/ucx_env.h) unless either is set.
  const bool wants_rdma = protocol == "rdma";
  const bool automatic = protocol.empty() || protocol == "tcp" || wants_rdma;
  const std::string transport = automatic ? (wants_rdma ? "rdma" : "") : protocol;
  if (!device_name.empty() && (wants_rdma || protocol == "ucx" || protocol.empty())) {
    ::setenv("MC_UCX_DEVICES", device_name.c_str(), 0);
  }

  auto holder = std::make_shared<EngineHolder>();
  holder->engine = std::make_unique<TransferEngine>();
  Status s = holder->engine->Init(conn, local_hostname, transport);
  if (!s.ok()) {
    LOG(WARNING) << what << " with metadata server '" << conn << "' failed: " << s.ToString();
    return kErrInvalidArgument;
  }
  std::vector<std::string> installed = holder->engine->GetTransports();
  std::string names;
  for (const auto& n : installed) names += (names.empty() ? "" : ",") + n;
  bool has_rdma = false;
  for (const auto& n : installed) has_rdma = has_rdma || n == "ucx";
  // protocol 'rdma' without RDMA: the engine has said so once (UCX absent or without an
  // RDMA-class lane).
  if (!device_name.empty() && !has_rdma) {
    LOG(INFO) << "device_name '" << device_name << "' (an RDMA NIC filter) is unused by " << names;
  }
  std::lock_guard lock(mu_);
  holder_ = std::move(holder);
  return 0;
}

int PyTransferEngine::GetRpcPort() {
  auto h = Ready("get_rpc_port");
  return h ? h->engine->GetRpcPort() : kErrInvalidArgument;
}

uintptr_t PyTransferEngine::AllocateManagedBuffer(size_t length) {
  auto h = Ready("allocate_managed_buffer");
  if (h == nullptr) return 0;
  auto r = h->pool.Allocate(*h->engine, length);
  if (!r.ok()) {
    LOG(WARNING) << "allocate_managed_buffer(" << length << "): " << r.status().ToString();
    return 0;
  }
  return *r;
}

int PyTransferEngine::FreeManagedBuffer(uintptr_t addr, size_t length) {
  auto h = Ready("free_managed_buffer");
  if (h == nullptr) return kErrInvalidArgument;
  Status s = h->pool.Free(*h->engine, addr, length);
  if (!s.ok()) {
    LOG(WARNING) << "free_managed_buffer(" << Hex(addr) << ", " << length << "): " << s.ToString();
  }
  return ToUpstreamCode(s);
}

int PyTransferEngine::RegisterMemory(uintptr_t addr, size_t capacity, const std::string& location) {
  auto h = Ready("register_memory");
  if (h == nullptr) return kErrInvalidArgument;
  Status s = h->engine->RegisterLocalMemory(reinterpret_cast<void*>(addr), capacity, location);
  if (!s.ok()) {
    LOG(WARNING) << "register_memory(" << Hex(addr) << ", " << capacity << "): " << s.ToString();
  }
  return ToUpstreamCode(s);
}

int PyTransferEngine::UnregisterMemory(uintptr_t addr) {
  auto h = Ready("unregister_memory");
  if (h == nullptr) return kErrInvalidArgument;
  Status s = h->engine->UnregisterLocalMemory(reinterpret_cast<void*>(addr));
  if (!s.ok()) LOG(WARNING) << "unregister_memory(" << Hex(addr) << "): " << s.ToString();
  return ToUpstreamCode(s);
}

int PyTransferEngine::BatchRegisterMemory(const std::vector<uintptr_t>& addrs,
                                          const std::vector<size_t>& capacities,
                                          const std::string& location) {
  auto h = Ready("batch_register_memory");
  if (h == nullptr) return kErrInvalidArgument;
  if (addrs.size() != capacities.size()) {
    LOG(WARNING) << "batch_register_memory: " << addrs.size() << " addresses but "
                 << capacities.size() << " capacities";
    return kErrInvalidArgument;
  }
  std::vector<BufferEntry> entries;
  entries.reserve(addrs.size());
  for (size_t i = 0; i < addrs.size(); ++i) {
    entries.push_back({reinterpret_cast<void*>(addrs[i]), capacities[i]});
  }
  Status s = h->engine->RegisterLocalMemoryBatch(entries, location);
  if (!s.ok()) {
    LOG(WARNING) << "batch_register_memory of " << addrs.size() << " buffers (none registered): "
                 << s.ToString();
  }
  return ToUpstreamCode(s);
}

int PyTransferEngine::BatchUnregisterMemory(const std::vector<uintptr_t>& addrs) {
  auto h = Ready("batch_unregister_memory");
  if (h == nullptr) return kErrInvalidArgument;
  std::vector<void*> ptrs;
  ptrs.reserve(addrs.size());
  for (uintptr_t a : addrs) ptrs.push_back(reinterpret_cast<void*>(a));
  Status s = h->engine->UnregisterLocalMemoryBatch(ptrs);
  if (!s.ok()) LOG(WARNING) << "batch_unregister_memory: " << s.ToString();
  return ToUpstreamCode(s);
}

uintptr_t PyTransferEngine::GetFirstBufferAddress(const std::string& segment_name) {
  auto h = Ready("get_first_buffer_address");
  if (h == nullptr) return 0;
  auto id = h->engine->OpenSegment(segment_name);
  if (!id.ok()) {
    LOG(WARNING) << "get_first_buffer_address('" << segment_name
                 << "'): " << id.status().ToString();
    return 0;
  }
  auto info = h->engine->GetSegmentInfo(*id);
  if (!info.ok()) {
    LOG(WARNING) << "get_first_buffer_address('" << segment_name
                 << "'): " << info.status().ToString();
    return 0;
  }
  if (info->buffers.empty()) {
    LOG(WARNING) << "get_first_buffer_address('" << segment_name
                 << "'): the segment has no registered buffer";
    return 0;
  }
  return info->buffers.front().addr;
}

int PyTransferEngine::SendProbe(const std::string& peer_server_name) {
  auto h = Ready("send_probe");
  if (h == nullptr) return kErrInvalidArgument;
  Status s = h->engine->Probe(peer_server_name);
  if (!s.ok()) LOG(WARNING) << "send_probe('" << peer_server_name << "'): " << s.ToString();
  return ToUpstreamCode(s);
}

std::vector<TransferNotify> PyTransferEngine::GetNotifies() {
  auto h = Ready("get_notifies");
  std::vector<TransferNotify> out;
  if (h == nullptr) return out;
  for (auto& n : h->engine->GetNotifies()) {
    out.emplace_back(std::move(n.name), std::move(n.notify_msg));
  }
  return out;
}

size_t PyTransferEngine::PendingBatches() {
  std::lock_guard lock(mu_);
  return async_.size() + abandoned_.size();
}

}  // namespace pyapi
}  // namespace mooncake
