// TransferEngine::Impl: set-up (P2P handshake or a metadata store), registration and
// publishing, segment resolution, the handshake server's handlers, notifies.
#include "engine/engine_impl.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <ifaddrs.h>
#include <linux/memfd.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>

#include <nlohmann/json.hpp>

#include "common/net.h"
#include "metadata/json_util.h"
#include "metadata/stores/store_env.h"
#include "platform/device.h"

namespace mooncake {
namespace {

constexpr char kP2PHandshake[] = "P2PHANDSHAKE";

void RaiseFileLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

bool IsIpv4Literal(const std::string& host) {
  in_addr a{};
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1;
}

// The first UP, RUNNING, non-loopback IPv4 interface address, as upstream picks it.
std::string FirstInterfaceAddress() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* i = list; i && out.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || !(i->ifa_flags & IFF_RUNNING) || (i->ifa_flags & IFF_LOOPBACK)) {
      continue;
    }
    char buf[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof(buf));
    out = buf;
  }
  ::freeifaddrs(list);
  return out;
}

}  // namespace

TransferEngine::Impl::Impl(const EngineOptions& opts)
    : options(opts),
      segments([this](const std::string& name) { return FetchDesc(name); },
               [this](const SegmentDesc& old_desc, const SegmentDesc&) {
                 LOG(INFO) << "segment " << old_desc.name << " changed its descriptor";
                 for (auto& t : transports) t->DropPeer(old_desc);
               }),
      auth(opts.auth_secret) {
  limits.max_length = options.handshake_max_length;
  limits.connect_timeout_ms = options.handshake_connect_timeout_ms;
  limits.io_timeout_ms = options.handshake_io_timeout_ms;
  limits.auth_secret = options.auth_secret;
  limits.first_frame_timeout_ms = options.first_frame_timeout_ms;
  limits.max_connections = options.handshake_max_connections;
  limits.max_per_address = options.handshake_max_per_address;
}

TransferEngine::Impl::~Impl() {
  Shutdown();
  MutexLock lock(&shared_mu);
  for (auto& [addr, entry] : shared) {
    ::munmap(reinterpret_cast<void*>(addr), entry.second);
    ::close(entry.first);
  }
}

void TransferEngine::Impl::Shutdown() {
  if (handshake) handshake->Stop();
  for (auto& t : transports) t->Stop();
  if (store && initialized.load()) {
    // Clean shutdown: peers stop finding us at once (a crash is covered by the etcd lease).
    Status a = store->Remove(SegmentKey(options.metadata_cluster_id, local_name));
    Status b = store->Remove(RpcMetaKey(options.metadata_cluster_id, local_name));
    if (!a.ok() || !b.ok()) {
      LOG(WARNING) << "could not remove our entries from " << store->Describe() << ": "
                   << (a.ok() ? b : a).ToString();
    }
  }
  initialized.store(false);
}

Status TransferEngine::Impl::Init(const std::string& metadata,
                                  const std::string& local_server_name,
                                  const std::string& transport) {
  if (initialized.load()) return Status::FailedPrecondition("engine is already initialized");
  std::string transports = transport;
  if (transport == "rdma") {
    // Upstream's RDMA protocol: every transport starts; ucx takes the peers it reaches over an
    // RDMA-class lane (its start-up line says whether it has one here), shm and tcp the rest.
    // Not an error where there is no RDMA (upstream fails; vLLM and SGLang ask for rdma by
    // default): the fallback is logged.
    LOG(INFO) << "protocol 'rdma': UCX carries peers reached over RDMA (ib/rc/dc) or GPU "
                 "lanes; others use shm or tcp";
    transports.clear();
  }
  if (transport == "ucx" && auth.enabled() && !Authenticator::UcxUnauthenticatedAllowed()) {
    // UCX authenticates nothing: whoever learns the worker address and rkeys reads and writes
    // the memory (over its tcp lane, any address of the process). With a secret it is not
    // started, so the secret protects every byte; the user may opt in knowingly.
    LOG(ERROR) << "protocol 'ucx' requested, but MC_AUTH_SECRET is set and UCX has no "
                  "authentication (any process that learns the worker address and remote keys "
                  "could read and write this engine's memory): UCX is NOT started, moving data "
                  "over the authenticated shm and tcp transports instead. Set "
                  "MC_UCX_ALLOW_UNAUTHENTICATED=1 to run UCX unauthenticated anyway";
    transports.clear();
  }
  if (transport == "ascend" || transport == "ascend_direct") {
    // Upstream's Ascend protocols: NPU memory, moved by this engine's own transports (same-host
    // device IPC over ACL, else TCP staged through pinned buffers). Fails at once without ACL.
    auto npu = platform::SelectDeviceKind("npu");
    if (!npu.ok()) return npu.status().WithContext("protocol '" + transport + "'");
    transports.clear();
  }
  MC_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(local_server_name));
  LOG(INFO) << "Transfer Engine parseHostNameWithPort. server_name: " << hp.host
            << " port: " << (hp.has_port ? hp.port : options.handshake_port);
  RaiseFileLimit();
  p2p = metadata == kP2PHandshake;
  if (!p2p) {
    auto s = CreateMetadataStore(metadata, StoreOptionsFromEnvironment());
    if (!s.ok()) return s.status().WithContext("metadata store '" + metadata + "'");
    store = std::move(s).value();
  }

  // The RPC (handshake) listener, and this engine's name and address.
  uint16_t port = 0;
  UniqueFd listen_fd;
  const char* mode = "P2P handshake";
  if (p2p) {
    MC_ASSIGN_OR_RETURN(listen_fd, ListenTcpInRange(options.min_rpc_port, options.max_rpc_port,
                                                    options.handshake_backlog, &port));
    local_host = hp.host;
    local_name = HostPort{hp.host, port, true}.ToString();
  } else {
    if (options.legacy_rpc_port_binding) {
      mode = "legacy/P2P";
      local_host = hp.host;
      uint16_t want = hp.has_port ? hp.port : options.handshake_port;
      MC_ASSIGN_OR_RETURN(listen_fd, ListenTcpInRange(want, want, options.handshake_backlog,
                                                      &port, IsIpv4Literal(hp.host) ? hp.host : ""));
    } else {
      mode = "new RPC mapping";
      local_host = !options.tcp_bind_address.empty() ? options.tcp_bind_address
                   : IsIpv4Literal(hp.host)          ? hp.host
                                                     : FirstInterfaceAddress();
      if (local_host.empty()) {
        return Status::Unavailable("no non-loopback IPv4 interface to publish; set "
                                   "MC_TCP_BIND_ADDRESS");
      }
      MC_ASSIGN_OR_RETURN(listen_fd, ListenTcpInRange(options.min_rpc_port, options.max_rpc_port,
                                                      options.handshake_backlog, &port,
                                                      options.tcp_bind_address));
    }
    local_name = local_server_name;  // the name stays as given; its :port is never bound
  }
  rpc_port = port;
  if (auth.enabled()) {
    MC_ASSIGN_OR_RETURN(instance, Authenticator::NewInstanceId());
  }
  {
    MutexLock lock(&desc_mu);
    local_desc.mc_auth_instance = instance;
    local_desc.name = local_name;
    local_desc.protocol = "tcp";
    local_desc.tcp_data_host = local_host;
  }

  requested_protocol = transport;
  MC_RETURN_IF_ERROR(StartTransports(transports));
  if (transport == "rdma") {
    bool ucx = false;
    for (const auto& t : this->transports) ucx = ucx || std::string(t->name()) == "ucx";
    if (!ucx) {
      LOG(WARNING) << "protocol 'rdma' requested, but the UCX transport is not available here "
                      "(see above); moving data over shm and tcp only";
    }
  }

  handshake = std::make_unique<HandshakeServer>(limits);
  MC_RETURN_IF_ERROR(handshake->Start(
      std::move(listen_fd), [this](const HandshakeFrame& f) { return HandleHandshake(f); },
      Authenticator::OwnNames(local_name, instance)));
  if (store) {
    const std::string rpc_text = EncodeRpcMeta();
    const std::string rpc_key = RpcMetaKey(options.metadata_cluster_id, local_name);
    Status s = store->Put(rpc_key, rpc_text);
    if (s.code() == Status::Code::kAlreadyExists) {
      // The http server refuses to replace an rpc_meta entry. A crashed engine of this name
      // left it: replace it, unless the engine it names still answers.
      std::string old_auth_name = local_name;
      auto old = ResolveRpc(local_name, &old_auth_name);
      if (old.ok() && HandshakeCall(old->host, old->port, old_auth_name, HandshakeType::kProbe, "{}\n", limits).ok()) {
        return Status::AlreadyExists("segment name '" + local_name + "' is in use by the engine at " +
                                     old->ToString());
      }
      LOG(WARNING) << "replacing the stale rpc_meta entry of " << local_name;
      s = store->Remove(rpc_key);
      if (s.ok()) s = store->Put(rpc_key, rpc_text);
    }
    if (s.ok()) s = PublishLocalDesc();
    if (!s.ok()) return s.WithContext("publish to " + store->Describe());
  }
  LOG(INFO) << "Transfer Engine RPC using " << mode << ", listening on "
            << HostPort{local_host, rpc_port, true}.ToString();
  initialized.store(true);
  return Status::OK();
}

Status TransferEngine::Impl::StartTransports(const std::string& transport) {
  std::vector<std::string> names;
  bool explicit_choice = !(transport.empty() || transport == "auto");
  if (!explicit_choice) {
    names = BuiltinTransports();
  } else {
    names = {transport};
  }
  TransportContext ctx{options, &registry, local_host,
                       [this](const std::string& name) { segments.InvalidateByName(name); },
                       explicit_choice, requested_protocol, {}};
  ctx.update_local_desc = [this](const std::function<void(SegmentDesc*)>& update) {
    {
      MutexLock lock(&desc_mu);
      update(&local_desc);
    }
    (void)PublishLocalDesc();  // logged when the store is down; the handshake serves it anyway
  };
  for (const auto& name : names) {
    if (name == "ucx" && auth.enabled() && !Authenticator::UcxUnauthenticatedAllowed()) {
      if (!explicit_choice) {
        LOG(WARNING) << "MC_AUTH_SECRET is set: not starting the UCX transport (UCX has no "
                        "authentication; its worker address and remote keys would let any "
                        "process read and write this engine's memory). Data moves over the "
                        "authenticated shm and tcp transports; MC_UCX_ALLOW_UNAUTHENTICATED=1 "
                        "runs UCX anyway, unauthenticated";
      }
      continue;
    }
    if (options.force_tcp && name != "tcp") {
      LOG(INFO) << "MC_FORCE_TCP is set: not installing transport " << name;
      continue;
    }
    MC_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, CreateTransport(name));
    Status started;
    {
      MutexLock lock(&desc_mu);
      started = t->Start(ctx, &local_desc);
    }
    if (!started.ok()) {
      if (!explicit_choice && name != "tcp") {
        // An optional transport that cannot start here is simply not offered.
        LOG(WARNING) << "transport " << name << " not available: " << started.ToString();
        continue;
      }
      return started.WithContext("start transport " + name);
    }
    // Memory registered before Init gets this transport's handles now.
    for (const RegionInfo& r : registry.List()) {
      if (!r.remote_accessible) continue;
      Status s = t->RegisterMemory(r);
      if (!s.ok()) {
        LOG(WARNING) << "transport " << name << " cannot register 0x" << std::hex << r.addr
                     << std::dec << " (+" << r.length << "): " << s.ToString();
      }
    }
    transports.push_back(std::move(t));
  }
  return Status::OK();
}

std::string TransferEngine::Impl::EncodeLocalDesc(bool for_store) {
  MutexLock lock(&desc_mu);
  local_desc.buffers.clear();
  for (const RegionInfo& r : registry.List()) {
    if (!r.remote_accessible) continue;
    BufferDesc b{local_name, r.addr, r.length};
    for (auto& t : transports) t->DescribeBuffer(r, &b);
    if (r.device != platform::kHostMemory) {
      b.location = std::string(platform::Devices().location_prefix()) + ":" +
                   std::to_string(r.device);
      b.device = r.device;
      b.ipc_handle = r.ipc_handle;
      b.ipc_offset = r.ipc_offset;
      if (for_store && auth.enabled() && !b.ipc_handle.empty()) {
        // An IPC handle is a capability: any process on this host that reads it opens the
        // memory, with no secret. The store is readable by others; handshake replies go only
        // to authenticated peers, so same-host device peers in store mode use TCP staging.
        static std::once_flag once;
        std::call_once(once, [] {
          LOG(WARNING) << "MC_AUTH_SECRET is set: device IPC handles are not published to the "
                          "metadata store (anyone reading it could open the memory); same-host "
                          "device memory moves over TCP staging in metadata-store mode";
        });
        b.ipc_handle.clear();
        b.ipc_offset = 0;
      }
    }
    local_desc.buffers.push_back(std::move(b));
  }
  local_desc.timestamp = DescriptorTimestampNow();
  local_desc.mc_auth_sig.clear();
  if (auth.enabled()) {
    local_desc.mc_auth_sig = auth.SignEntry("segment", options.metadata_cluster_id,
                                            SegmentDescSigningBytes(local_desc));
  }
  return EncodeSegmentDesc(local_desc);
}

std::string TransferEngine::Impl::EncodeRpcMeta() {
  nlohmann::json rpc = {{"ip_or_host_name", local_host}, {"rpc_port", rpc_port}};
  if (auth.enabled()) {
    // Fields upstream ignores; the signature covers the name, the address and the instance.
    rpc["mc_auth_instance"] = instance;
    rpc["mc_auth_sig"] = auth.SignEntry("rpc_meta", options.metadata_cluster_id,
                                        local_name + '\0' + local_host + '\0' +
                                            std::to_string(rpc_port) + '\0' + instance);
  }
  return rpc.dump();
}

Status TransferEngine::Impl::VerifyDesc(const SegmentDesc& d, const std::string& name,
                                        const std::string& source) {
  if (!auth.enabled()) return Status::OK();
  const std::string what = "descriptor of segment '" + name + "' from " + source + ": ";
  if (d.mc_auth_sig.empty()) {
    return Status::PermissionDenied(
        what + "not signed. With MC_AUTH_SECRET every engine signs its descriptor, so it was "
               "written by an engine without the secret (an upstream or older engine) or "
               "replaced by someone without it; refused");
  }
  if (!auth.VerifyEntry("segment", options.metadata_cluster_id, SegmentDescSigningBytes(d),
                        d.mc_auth_sig)) {
    return Status::PermissionDenied(
        what + "its signature does not verify: altered or replaced by someone without the "
               "shared secret (MC_AUTH_SECRET), or signed with another secret or cluster id "
               "(MC_METADATA_CLUSTER_ID); refused");
  }
  if (d.name != name) {
    return Status::PermissionDenied(what + "signed by segment '" + d.name.substr(0, 200) +
                                    "', not by '" + name +
                                    "' (copied under another name); refused");
  }
  return Status::OK();
}

Status TransferEngine::Impl::PublishLocalDesc() {
  if (!store) return Status::OK();
  MutexLock publishing(&publish_mu);
  Status s = store->Put(SegmentKey(options.metadata_cluster_id, local_name),
                        EncodeLocalDesc(/*for_store=*/true));
  // A lost store is logged once, not on every registration; peers that already know us keep
  // working, and the next successful publish is logged too.
  bool was_ok = store_ok.exchange(s.ok());
  if (!s.ok() && was_ok) {
    LOG(ERROR) << "metadata store " << store->Describe() << " unreachable: " << s.ToString()
               << "; known peers keep working, new ones cannot find our changes";
  } else if (s.ok() && !was_ok) {
    LOG(INFO) << "metadata store " << store->Describe() << " reachable again";
  }
  return s;
}

Result<std::string> TransferEngine::Impl::HandleHandshake(const HandshakeFrame& request) {
  switch (request.type) {
    case HandshakeType::kMetadata:
      return EncodeLocalDesc();
    case HandshakeType::kProbe:
      return std::string(R"({"status":"success"})") + "\n";
    case HandshakeType::kNotify: {
      MC_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonBounded(request.payload, "notify"));
      NotifyDesc n;
      if (!j.is_object()) return Status::DataLoss("notify payload is not an object");
      MC_RETURN_IF_ERROR(GetString(j, "name", false, &n.name));
      MC_RETURN_IF_ERROR(GetString(j, "notify_msg", false, &n.notify_msg));
      {
        MutexLock lock(&notify_mu);
        size_t bytes = n.name.size() + n.notify_msg.size();
        if (notifies.size() >= kMaxQueuedNotifies ||
            notify_bytes + bytes > kMaxQueuedNotifyBytes) {
          return Status::ResourceExhausted(
              "notify queue full (" + std::to_string(notifies.size()) + " messages, " +
              std::to_string(notify_bytes) + " bytes queued; limits " +
              std::to_string(kMaxQueuedNotifies) + " and " +
              std::to_string(kMaxQueuedNotifyBytes) + "): the receiver is not draining it");
        }
        notify_bytes += bytes;
        notifies.push_back(std::move(n));
      }
      return std::string(R"({"name":"","notify_msg":"success"})") + "\n";
    }
    case HandshakeType::kConnection:
      // TCP needs no connection set-up: answer with an empty handshake description, as
      // upstream's TCP-only engine does.
      return std::string(
          R"({"local_gid":"","local_lid":0,"local_nic_path":"","payload":"","peer_nic_path":"",)"
          R"("qp_num":[],"reply_msg":""})") + "\n";
  }
  return Status::InvalidArgument("unknown handshake type");
}

Status TransferEngine::Impl::Register(const std::vector<RegionInfo>& given) {
  std::vector<RegionInfo> regions = given;
  for (RegionInfo& r : regions) {
    MC_RETURN_IF_ERROR(platform::ResolveLocation(r.location, reinterpret_cast<void*>(r.addr),
                                                 &r.device));
    if (r.device == platform::kHostMemory || !r.remote_accessible) continue;
    // Same-host peers open device memory through this handle (transport/cuda_ipc); without
    // one they still reach it over TCP.
    auto exported = platform::Devices().IpcExportRange(reinterpret_cast<void*>(r.addr));
    if (exported.ok()) {
      r.ipc_handle = platform::IpcHandleToHex(exported->handle);
      r.ipc_offset = exported->offset;
    } else {
      LOG(WARNING) << "no IPC handle for device memory at 0x" << std::hex << r.addr << std::dec
                   << " (same-host peers will use TCP): " << exported.status().ToString();
    }
  }
  // Transport handles first, so that no published descriptor lists a range without them.
  std::vector<std::pair<Transport*, uint64_t>> handled;
  for (const RegionInfo& r : regions) {
    if (!r.remote_accessible) continue;
    for (auto& t : transports) {
      Status s = t->RegisterMemory(r);
      if (s.ok()) {
        handled.emplace_back(t.get(), r.addr);
      } else {
        LOG(WARNING) << "transport " << t->name() << " cannot register 0x" << std::hex << r.addr
                     << std::dec << " (+" << r.length << "); peers reach it over another "
                     << "transport: " << s.ToString();
      }
    }
  }
  Status added = registry.AddBatch(regions);
  if (!added.ok()) {
    for (auto& [t, addr] : handled) t->UnregisterMemory(addr);
    return added;
  }
  (void)PublishLocalDesc();  // registration stands even if the store is down (logged)
  return Status::OK();
}

Status TransferEngine::Impl::Unregister(void* addr) {
  MC_RETURN_IF_ERROR(registry.Remove(reinterpret_cast<uint64_t>(addr),
                                     options.slice_timeout_ms + 1000));
  for (auto& t : transports) t->UnregisterMemory(reinterpret_cast<uint64_t>(addr));
  (void)PublishLocalDesc();
  return Status::OK();
}

Result<void*> TransferEngine::Impl::AllocateShared(size_t length, const std::string& location,
                                                   size_t huge_page_size) {
  if (length == 0) return Status::InvalidArgument("length is 0");
  unsigned int flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  if (huge_page_size != 0) {
    if (huge_page_size != (size_t{2} << 20) && huge_page_size != (size_t{1} << 30)) {
      return Status::InvalidArgument("huge page size " + std::to_string(huge_page_size) +
                                     " is neither 2 MiB nor 1 GiB");
    }
    // Whole huge pages: a peer maps and unmaps the registered length, which hugetlbfs
    // accepts only in whole pages.
    if (length > SIZE_MAX - huge_page_size) return Status::InvalidArgument("length too large");
    length = (length + huge_page_size - 1) / huge_page_size * huge_page_size;
    flags |= MFD_HUGETLB | (huge_page_size == (size_t{2} << 20) ? MFD_HUGE_2MB : MFD_HUGE_1GB);
  }
  int fd = ::memfd_create("mooncake-shared", flags);
  if (fd < 0) return ErrnoStatus("memfd_create", errno);
  // Sealed against shrinking: a peer that maps it can never fault past its end.
  if (::ftruncate(fd, static_cast<off_t>(length)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    Status s = ErrnoStatus("ftruncate memfd to " + std::to_string(length), errno);
    ::close(fd);
    return s;
  }
  void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    if (huge_page_size != 0 && err == ENOMEM) {
      const std::string kb = std::to_string(huge_page_size >> 10);
      return Status::ResourceExhausted(
          "the host has fewer than " + std::to_string(length / huge_page_size) + " free " +
          kb + " kB huge pages for " + std::to_string(length) + " bytes: reserve them (" +
          "/sys/kernel/mm/hugepages/hugepages-" + kb + "kB/nr_hugepages, see HugePages_Free "
          "in /proc/meminfo) or turn huge pages off (MC_STORE_USE_HUGEPAGE)");
    }
    return ErrnoStatus("mmap shared memory of " + std::to_string(length), err);
  }
  Status s = Register({RegionInfo{reinterpret_cast<uint64_t>(p), length, location, true, fd}});
  if (!s.ok()) {
    ::munmap(p, length);
    ::close(fd);
    return s;
  }
  MutexLock lock(&shared_mu);
  shared[reinterpret_cast<uint64_t>(p)] = {fd, length};
  return p;
}

Status TransferEngine::Impl::FreeShared(void* addr) {
  std::pair<int, size_t> entry;
  {
    MutexLock lock(&shared_mu);
    auto it = shared.find(reinterpret_cast<uint64_t>(addr));
    if (it == shared.end()) {
      return Status::NotFound("not memory from AllocateSharedMemory");
    }
    entry = it->second;
  }
  MC_RETURN_IF_ERROR(Unregister(addr));
  {
    MutexLock lock(&shared_mu);
    shared.erase(reinterpret_cast<uint64_t>(addr));
  }
  ::munmap(addr, entry.second);
  ::close(entry.first);
  return Status::OK();
}

Result<HostPort> TransferEngine::Impl::ResolveRpc(const std::string& name,
                                                  std::string* auth_name) {
  if (auth_name) *auth_name = name;
  if (p2p) {
    MC_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(name));
    if (!hp.has_port) {
      return Status::InvalidArgument("segment name '" + name +
                                     "' has no port; under P2PHANDSHAKE a segment is named "
                                     "<host>:<rpc port> as its engine logs it");
    }
    return hp;
  }
  MC_ASSIGN_OR_RETURN(std::string text,
                      store->Get(RpcMetaKey(options.metadata_cluster_id, name)));
  MC_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonBounded(text, "rpc_meta entry"));
  HostPort hp;
  uint64_t port = 0;
  if (!j.is_object()) return Status::DataLoss("rpc_meta entry of '" + name + "' is not an object");
  MC_RETURN_IF_ERROR(GetString(j, "ip_or_host_name", true, &hp.host));
  MC_RETURN_IF_ERROR(GetUint(j, "rpc_port", 65535, &port));
  hp.port = static_cast<uint16_t>(port);
  hp.has_port = port != 0;
  if (auth.enabled()) {
    std::string inst, sig;
    MC_RETURN_IF_ERROR(GetString(j, "mc_auth_instance", false, &inst));
    MC_RETURN_IF_ERROR(GetString(j, "mc_auth_sig", false, &sig));
    const std::string what = "rpc_meta entry of segment '" + name + "' in " + store->Describe() + ": ";
    if (sig.empty()) {
      return Status::PermissionDenied(
          what + "not signed. With MC_AUTH_SECRET every engine signs its entry, so it was "
                 "written by an engine without the secret or replaced by someone without it; "
                 "refused");
    }
    if (!auth.VerifyEntry("rpc_meta", options.metadata_cluster_id,
                          name + '\0' + hp.host + '\0' + std::to_string(port) + '\0' + inst,
                          sig)) {
      return Status::PermissionDenied(
          what + "its signature does not verify: altered or replaced by someone without the "
                 "shared secret, or signed with another secret, cluster id or name; refused");
    }
    if (auth_name) *auth_name = Authenticator::AuthName(name, inst);
  }
  return hp;
}

Result<SegmentCache::DescPtr> TransferEngine::Impl::FetchDesc(const std::string& name) {
  std::string text;
  std::string host;
  if (p2p) {
    MC_ASSIGN_OR_RETURN(HostPort hp, ResolveRpc(name));
    MC_ASSIGN_OR_RETURN(text, HandshakeCall(hp.host, hp.port, name, HandshakeType::kMetadata,
                                            EncodeLocalDesc(), limits));
    host = hp.host;
  } else {
    auto got = store->Get(SegmentKey(options.metadata_cluster_id, name));
    if (!got.ok()) return got.status().WithContext("segment '" + name + "'");
    text = std::move(got).value();
  }
  auto desc = DecodeSegmentDesc(text);
  if (!desc.ok()) return desc.status().WithContext("descriptor of segment '" + name + "'");
  MC_RETURN_IF_ERROR(VerifyDesc(*desc, name, p2p ? "its handshake port" : store->Describe()));
  auto out = std::make_shared<SegmentDesc>(std::move(desc).value());
  out->lookup_name = name;
  if (!out->tcp_data_host.empty()) {
    out->host = out->tcp_data_host;
  } else if (!host.empty()) {
    out->host = host;
  } else {
    auto rpc = ResolveRpc(name);  // upstream: the data host is the rpc_meta address
    if (rpc.ok()) out->host = rpc->host;
  }
  return std::shared_ptr<const SegmentDesc>(std::move(out));
}

Result<SegmentID> TransferEngine::Impl::OpenSegment(const std::string& raw) {
  if (!initialized.load()) return Status::FailedPrecondition("call Init first");
  size_t start = raw.find_first_not_of('/');
  if (start == std::string::npos) return Status::InvalidArgument("segment name is empty");
  std::string name = raw.substr(start);
  if (name == local_name) return LOCAL_SEGMENT_ID;
  return segments.Open(name);
}

Transport* TransferEngine::Impl::PickTransport(const SegmentDesc& peer, const BufferDesc& remote,
                                               int local_device) {
  Transport* pick = nullptr;
  for (const auto& t : transports) {
    if (t->CanMove(peer, remote, local_device) && t->CanReach(peer)) {
      pick = t.get();
      break;
    }
  }
  std::string what = local_device < 0 && remote.device < 0
                         ? std::string()
                         : std::string(local_device < 0 ? " (host" : " (device") +
                               (remote.device < 0 ? " to host memory)" : " to device memory)");
  MutexLock lock(&chosen_mu);
  auto& last = chosen[peer.name + what];
  if (last != pick) {
    LOG(INFO) << "segment " << peer.name << ": using transport "
              << (pick ? pick->name() : "(none reaches it)") << what;
    last = pick;
  }
  return pick;
}

Status TransferEngine::Impl::SendNotifyTo(const std::string& segment_name,
                                          const NotifyDesc& notify) {
  std::string auth_name;
  MC_ASSIGN_OR_RETURN(HostPort hp, ResolveRpc(segment_name, &auth_name));
  nlohmann::json j = {{"name", notify.name}, {"notify_msg", notify.notify_msg}};
  MC_ASSIGN_OR_RETURN(std::string reply,
                      HandshakeCall(hp.host, hp.port, auth_name, HandshakeType::kNotify,
                                    j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                                    limits));
  auto r = ParseJsonBounded(reply, "notify reply");
  std::string msg;
  if (r.ok() && r->is_object()) (void)GetString(*r, "notify_msg", false, &msg);
  if (msg.empty()) return Status::Unavailable("peer " + segment_name + " did not accept the notify");
  return Status::OK();
}

Status TransferEngine::Impl::Probe(const std::string& segment_name) {
  std::string auth_name;
  MC_ASSIGN_OR_RETURN(HostPort hp, ResolveRpc(segment_name, &auth_name));
  return HandshakeCall(hp.host, hp.port, auth_name, HandshakeType::kProbe, "{}\n", limits).status();
}

}  // namespace mooncake
