// TransferEngine: set-up, registration, segments, notifies. The data path is in
// transfer_submit.cc.
#include "mooncake/transfer_engine.h"

#include <glog/logging.h>
#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include "common/net.h"
#include "engine/engine_impl.h"
#include "metadata/json_util.h"

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
}  // namespace

TransferEngine::Impl::Impl(const EngineOptions& opts)
    : options(opts),
      segments([this](const std::string& name) { return FetchDesc(name); },
               [this](const SegmentDesc& old_desc, const SegmentDesc&) {
                 LOG(INFO) << "segment " << old_desc.name << " changed its descriptor";
                 for (auto& t : transports) t->DropPeer(old_desc);
               }) {
  limits.max_length = options.handshake_max_length;
  limits.connect_timeout_ms = options.handshake_connect_timeout_ms;
  limits.io_timeout_ms = options.handshake_io_timeout_ms;
}

TransferEngine::Impl::~Impl() { Shutdown(); }

void TransferEngine::Impl::Shutdown() {
  if (handshake) handshake->Stop();
  for (auto& t : transports) t->Stop();
}

Status TransferEngine::Impl::Init(const std::string& metadata,
                                  const std::string& local_server_name,
                                  const std::string& transport) {
  if (initialized.load()) return Status::FailedPrecondition("engine is already initialized");
  if (metadata != kP2PHandshake) {
    return Status::Unimplemented("metadata '" + metadata +
                                 "': only P2PHANDSHAKE is built into this engine so far");
  }
  MC_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(local_server_name));
  LOG(INFO) << "Transfer Engine parseHostNameWithPort. server_name: " << hp.host
            << " port: " << (hp.has_port ? hp.port : options.handshake_port);
  RaiseFileLimit();

  uint16_t port = 0;
  MC_ASSIGN_OR_RETURN(UniqueFd listen_fd,
                      ListenTcpInRange(options.min_rpc_port, options.max_rpc_port,
                                       options.handshake_backlog, &port));
  local_host = hp.host;
  rpc_port = port;
  local_name = HostPort{hp.host, port, true}.ToString();
  {
    std::lock_guard lock(desc_mu);
    local_desc.name = local_name;
    local_desc.protocol = "tcp";
    local_desc.tcp_data_host = hp.host;
  }

  std::vector<std::string> names;
  bool explicit_choice = !(transport.empty() || transport == "auto");
  if (!explicit_choice) {
    names = BuiltinTransports();
  } else {
    names = {transport};
  }
  TransportContext ctx{options, &registry, local_host};
  for (const auto& name : names) {
    if (options.force_tcp && name != "tcp") {
      LOG(INFO) << "MC_FORCE_TCP is set: not installing transport " << name;
      continue;
    }
    MC_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, CreateTransport(name));
    Status started;
    {
      std::lock_guard lock(desc_mu);
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
    transports.push_back(std::move(t));
  }

  handshake = std::make_unique<HandshakeServer>(limits, options.handshake_threads);
  MC_RETURN_IF_ERROR(handshake->Start(
      std::move(listen_fd), [this](const HandshakeFrame& f) { return HandleHandshake(f); }));
  LOG(INFO) << "Transfer Engine RPC using P2P handshake, listening on " << local_name;
  initialized.store(true);
  return Status::OK();
}

std::string TransferEngine::Impl::EncodeLocalDesc() {
  std::lock_guard lock(desc_mu);
  local_desc.buffers.clear();
  for (const RegionInfo& r : registry.List()) {
    if (r.remote_accessible) local_desc.buffers.push_back({local_name, r.addr, r.length});
  }
  local_desc.timestamp = DescriptorTimestampNow();
  return EncodeSegmentDesc(local_desc);
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
        std::lock_guard lock(notify_mu);
        if (notifies.size() >= 65536) {
          return Status::ResourceExhausted("notify queue full; the receiver is not draining it");
        }
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

Status TransferEngine::Impl::Register(const std::vector<RegionInfo>& regions) {
  return registry.AddBatch(regions);
}

Status TransferEngine::Impl::Unregister(void* addr) {
  return registry.Remove(reinterpret_cast<uint64_t>(addr), options.slice_timeout_ms + 1000);
}

Result<SegmentCache::DescPtr> TransferEngine::Impl::FetchDesc(const std::string& name) {
  MC_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(name));
  if (!hp.has_port) {
    return Status::InvalidArgument("segment name '" + name +
                                   "' has no port; under P2PHANDSHAKE a segment is named "
                                   "<host>:<rpc port> as its engine logs it");
  }
  MC_ASSIGN_OR_RETURN(std::string reply, HandshakeCall(hp.host, hp.port, HandshakeType::kMetadata,
                                                       EncodeLocalDesc(), limits));
  auto desc = DecodeSegmentDesc(reply);
  if (!desc.ok()) return desc.status().WithContext("descriptor of segment '" + name + "'");
  auto out = std::make_shared<SegmentDesc>(std::move(desc).value());
  out->host = out->tcp_data_host.empty() ? hp.host : out->tcp_data_host;
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

Transport* TransferEngine::Impl::PickTransport(const SegmentDesc& peer) {
  Transport* pick = nullptr;
  for (const auto& t : transports) {
    if (t->CanReach(peer)) {
      pick = t.get();
      break;
    }
  }
  std::lock_guard lock(chosen_mu);
  auto& last = chosen[peer.name];
  if (last != pick) {
    LOG(INFO) << "segment " << peer.name << ": using transport "
              << (pick ? pick->name() : "(none reaches it)");
    last = pick;
  }
  return pick;
}

Status TransferEngine::Impl::SendNotifyTo(const std::string& segment_name,
                                          const NotifyDesc& notify) {
  MC_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(segment_name));
  if (!hp.has_port) return Status::InvalidArgument("segment name '" + segment_name + "' has no port");
  nlohmann::json j = {{"name", notify.name}, {"notify_msg", notify.notify_msg}};
  MC_ASSIGN_OR_RETURN(std::string reply,
                      HandshakeCall(hp.host, hp.port, HandshakeType::kNotify,
                                    j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                                    limits));
  auto r = ParseJsonBounded(reply, "notify reply");
  std::string msg;
  if (r.ok() && r->is_object()) (void)GetString(*r, "notify_msg", false, &msg);
  if (msg.empty()) return Status::Unavailable("peer " + segment_name + " did not accept the notify");
  return Status::OK();
}

// ---------------------------------------------------------------------------------------
// Public API: thin forwarding with argument checks.

TransferEngine::TransferEngine() : TransferEngine(EngineOptions::FromEnvironment()) {}
TransferEngine::TransferEngine(const EngineOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}
TransferEngine::~TransferEngine() = default;

Status TransferEngine::Init(const std::string& metadata, const std::string& local_server_name,
                            const std::string& transport) {
  Status s = impl_->Init(metadata, local_server_name, transport);
  if (!s.ok()) {
    impl_->Shutdown();
    impl_ = std::make_unique<Impl>(impl_->options);
  }
  return s;
}

bool TransferEngine::initialized() const { return impl_->initialized.load(); }
std::string TransferEngine::GetLocalSegmentName() const { return impl_->local_name; }
uint16_t TransferEngine::GetRpcPort() const { return impl_->rpc_port; }
std::string TransferEngine::GetLocalIpAndPort() const {
  return HostPort{impl_->local_host, impl_->rpc_port, true}.ToString();
}

std::vector<std::string> TransferEngine::GetTransports() const {
  std::vector<std::string> out;
  for (const auto& t : impl_->transports) out.push_back(t->name());
  return out;
}

Status TransferEngine::RegisterLocalMemory(void* addr, size_t length, const std::string& location,
                                           bool remote_accessible) {
  return impl_->Register(
      {RegionInfo{reinterpret_cast<uint64_t>(addr), length, location, remote_accessible}});
}

Status TransferEngine::UnregisterLocalMemory(void* addr) { return impl_->Unregister(addr); }

Status TransferEngine::RegisterLocalMemoryBatch(const std::vector<BufferEntry>& buffers,
                                                const std::string& location) {
  std::vector<RegionInfo> regions;
  regions.reserve(buffers.size());
  for (const auto& b : buffers) {
    regions.push_back({reinterpret_cast<uint64_t>(b.addr), b.length, location, true});
  }
  return impl_->Register(regions);
}

Status TransferEngine::UnregisterLocalMemoryBatch(const std::vector<void*>& addrs) {
  Status first;
  for (void* a : addrs) {
    Status s = impl_->Unregister(a);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Result<SegmentID> TransferEngine::OpenSegment(const std::string& name) {
  return impl_->OpenSegment(name);
}

Status TransferEngine::CloseSegment(SegmentID id) {
  if (id == LOCAL_SEGMENT_ID) return Status::OK();
  return impl_->segments.Invalidate(id);
}

Status TransferEngine::RefreshSegment(SegmentID id) {
  if (id == LOCAL_SEGMENT_ID) return Status::OK();
  return impl_->segments.Refresh(id).status();
}

Result<SegmentInfo> TransferEngine::GetSegmentInfo(SegmentID id) {
  SegmentInfo info;
  if (id == LOCAL_SEGMENT_ID) {
    info.name = impl_->local_name;
    info.protocol = "tcp";
    for (const RegionInfo& r : impl_->registry.List()) info.buffers.push_back({r.addr, r.length});
    return info;
  }
  MC_ASSIGN_OR_RETURN(SegmentCache::DescPtr desc, impl_->segments.Get(id));
  info.name = desc->name;
  info.protocol = desc->protocol;
  for (const auto& b : desc->buffers) info.buffers.push_back({b.addr, b.length});
  if (Transport* t = impl_->PickTransport(*desc)) info.transport = t->name();
  return info;
}

Result<BatchID> TransferEngine::AllocateBatchID(size_t batch_size) {
  return impl_->batches.Allocate(batch_size);
}

Status TransferEngine::SubmitTransfer(BatchID batch, const std::vector<TransferRequest>& reqs) {
  return impl_->Submit(batch, reqs);
}

Status TransferEngine::SubmitTransferWithNotify(BatchID batch,
                                                const std::vector<TransferRequest>& reqs,
                                                const NotifyDesc& notify) {
  if (reqs.empty()) return Status::InvalidArgument("no requests to attach the notify to");
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Batch> b, impl_->batches.Get(batch));
  MC_RETURN_IF_ERROR(impl_->Submit(batch, reqs));
  std::lock_guard lock(b->notify_mu);
  b->pending_notify.emplace(reqs[0].target_id, notify);
  return Status::OK();
}

Result<TransferStatus> TransferEngine::GetTransferStatus(BatchID batch, size_t task_id) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Batch> b, impl_->batches.Get(batch));
  if (task_id >= b->size()) {
    return Status::InvalidArgument("task " + std::to_string(task_id) + " of batch " +
                                   std::to_string(batch) + " does not exist (it has " +
                                   std::to_string(b->size()) + ")");
  }
  return b->task(task_id).status();
}

Result<TransferStatus> TransferEngine::GetBatchTransferStatus(BatchID batch) {
  return impl_->BatchStatus(batch);
}

Result<TransferStatus> TransferEngine::WaitBatch(BatchID batch, std::chrono::milliseconds timeout) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Batch> b, impl_->batches.Get(batch));
  b->WaitAll(timeout);
  return impl_->BatchStatus(batch);
}

Result<std::string> TransferEngine::GetTransferError(BatchID batch, size_t task_id) {
  MC_ASSIGN_OR_RETURN(std::shared_ptr<Batch> b, impl_->batches.Get(batch));
  if (task_id >= b->size()) return Status::InvalidArgument("no such task");
  return b->task(task_id).error();
}

Status TransferEngine::FreeBatchID(BatchID batch) { return impl_->batches.Free(batch); }

Status TransferEngine::TransferSync(const std::vector<TransferRequest>& requests,
                                    std::chrono::milliseconds timeout) {
  return impl_->TransferSync(requests, timeout);
}

Status TransferEngine::SendNotify(SegmentID target, const NotifyDesc& notify) {
  if (target == LOCAL_SEGMENT_ID) return impl_->SendNotifyTo(impl_->local_name, notify);
  MC_ASSIGN_OR_RETURN(std::string name, impl_->segments.NameOf(target));
  return impl_->SendNotifyTo(name, notify);
}

Status TransferEngine::SendNotifyByName(const std::string& name, const NotifyDesc& notify) {
  return impl_->SendNotifyTo(name, notify);
}

std::vector<NotifyDesc> TransferEngine::GetNotifies() {
  std::lock_guard lock(impl_->notify_mu);
  std::vector<NotifyDesc> out;
  out.swap(impl_->notifies);
  return out;
}

Status TransferEngine::Probe(const std::string& segment_name) {
  MC_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(segment_name));
  if (!hp.has_port) return Status::InvalidArgument("segment name '" + segment_name + "' has no port");
  return HandshakeCall(hp.host, hp.port, HandshakeType::kProbe, "{}", impl_->limits).status();
}

}  // namespace mooncake
