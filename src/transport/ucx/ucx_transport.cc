#include "transport/ucx/ucx_transport.h"

#include <glog/logging.h>
#include <unistd.h>

#include <cstdlib>

#include "common/auth.h"
#include "common/host_id.h"
#include "transport/ucx/ucx_env.h"
#include "transport/ucx/ucx_factory.h"

namespace mooncake::ucx {

bool UcxTransportBuilt() { return true; }

Result<std::unique_ptr<Transport>> CreateUcxTransport() {
  return std::unique_ptr<Transport>(new UcxTransport());
}

UcxTransport::~UcxTransport() { Stop(); }

Status UcxTransport::Start(const TransportContext& ctx, SegmentDesc* local_desc) {
  if (!ctx.options.auth_secret.empty() && !Authenticator::UcxUnauthenticatedAllowed()) {
    // UCX authenticates no peer: its worker address and rkeys open this process's memory to
    // anyone who learns them. With a secret the engine never starts it (engine_impl.cc);
    // this guard keeps any other caller from publishing them either.
    return Status::FailedPrecondition(
        "MC_AUTH_SECRET is set and UCX has no authentication: the UCX transport is not "
        "started (set MC_UCX_ALLOW_UNAUTHENTICATED=1 to run it unauthenticated)");
  }
  if (!ctx.options.auth_secret.empty()) {
    LOG(WARNING) << "UcxTransport: MC_UCX_ALLOW_UNAUTHENTICATED=1: UCX runs although "
                    "MC_AUTH_SECRET is set. UCX is NOT authenticated: any process that learns "
                    "this engine's worker address and remote keys (from the metadata store or "
                    "a descriptor) can read and write its memory over UCX; the secret protects "
                    "only the handshake, tcp and shm connections";
  }
  MC_ASSIGN_OR_RETURN(const UcxApi* api, LoadUcxApi());
  UcxWorker::Config config;
  config.slice_timeout_ms = ctx.options.slice_timeout_ms;
  config.on_peer_failure = ctx.on_peer_failure;
  config.registry = ctx.registry;
  if (ctx.update_local_desc) {
    config.on_address_changed = [update = ctx.update_local_desc](const std::string& hex) {
      update([&hex](SegmentDesc* d) { d->mc_ucx_worker = hex; });
    };
  }
  config.host_id = LocalHostId(ctx.options);
  MC_ASSIGN_OR_RETURN(worker_, UcxWorker::Create(api, std::move(config)));
  chosen_by_name_ = ctx.chosen_by_name;
  local_desc->mc_ucx_worker = worker_->address_hex();
  if (local_desc->mc_host_id.empty()) {  // shm writes them too; peers watch us by pid
    local_desc->mc_host_id = LocalHostId(ctx.options);
    local_desc->mc_pid = static_cast<uint64_t>(::getpid());
  }
  const std::string& fast = worker_->local_fast_lanes();
  if (!chosen_by_name_ && fast.empty() && std::getenv("UCX_TLS") == nullptr) {
    // Not offered: it would carry no peer, and UCX serves any process that learns its
    // worker address (README.md, "Trust"), so it is not left listening for nothing.
    const std::string seen = worker_->local_transports();
    worker_->Stop();
    worker_.reset();
    return Status::FailedPrecondition(
        "UCX " + api->Version() + " finds no RDMA-class or GPU lane here (it sees " +
        (seen.empty() ? std::string("none") : seen) +
        "): not started, shm and tcp carry every peer; transport 'ucx' or UCX_TLS starts it");
  }
  LOG(INFO) << "UcxTransport: UCX " << api->Version() << ", worker address "
            << worker_->address_hex().size() / 2 << " bytes, RDMA-class/GPU lanes: "
            << (fast.empty() ? "none" : fast) << ", CUDA memory: "
            << (worker_->cuda_memory() ? "yes" : "no")
            << (chosen_by_name_ ? ", named: used for every peer with UCX"
                : fast.empty()  ? ", not chosen for any peer (shm and tcp keep them; "
                                  "transport 'ucx' forces it)"
                                : ", chosen for peers reached over those lanes");
  return Status::OK();
}

void UcxTransport::Stop() {
  WriterLock lock(&state_mu_);
  if (worker_) worker_->Stop();
  stopped_ = true;
}

bool UcxTransport::CanReach(const SegmentDesc& peer) {
  if (!worker_ || peer.mc_ucx_worker.empty()) return false;
  if (!chosen_by_name_ && worker_->local_fast_lanes().empty()) return false;
  const std::string key = (peer.lookup_name.empty() ? peer.name : peer.lookup_name) + "|" +
                          peer.mc_ucx_worker;
  {
    MutexLock lock(&mu_);
    auto it = reach_.find(key);
    if (it != reach_.end()) return it->second;
  }
  auto lanes = worker_->PeerLanes(peer);
  bool reach = false;
  if (!lanes.ok()) {
    LOG(WARNING) << "UcxTransport: segment " << peer.name << " not reachable over UCX: "
                 << lanes.status().ToString();
  } else {
    reach = chosen_by_name_ || !lanes->empty();
    LOG(INFO) << "UcxTransport: segment " << peer.name << ": RDMA-class/GPU lanes "
              << (lanes->empty() ? "none" : *lanes) << (reach ? "" : "; left to shm/tcp");
  }
  MutexLock lock(&mu_);
  reach_[key] = reach;
  return reach;
}

bool UcxTransport::CanMove(const SegmentDesc&, const BufferDesc& remote, int local_device) {
  if (!worker_ || remote.ucx_rkey.empty()) return false;
  if (remote.device < 0 && local_device < 0) return true;
  return worker_->cuda_memory();
}

Status UcxTransport::Submit(const std::shared_ptr<const SegmentDesc>& peer, const Slice* slices,
                            size_t count) {
  if (!worker_) return Status::FailedPrecondition("UCX transport is not started");
  return worker_->Submit(peer, slices, count);
}

void UcxTransport::DropPeer(const SegmentDesc& peer) {
  if (!worker_) return;
  {
    MutexLock lock(&mu_);
    const std::string name = peer.lookup_name.empty() ? peer.name : peer.lookup_name;
    for (auto it = reach_.lower_bound(name + "|"); it != reach_.end() &&
                                                   it->first.compare(0, name.size() + 1, name + "|") == 0;) {
      it = reach_.erase(it);
    }
  }
  worker_->DropPeer(peer);
}

Status UcxTransport::RegisterMemory(const RegionInfo& region) {
  ReaderLock lock(&state_mu_);
  if (!worker_ || stopped_) return Status::FailedPrecondition("UCX transport is not running");
  return worker_->memory().Map(region);
}

void UcxTransport::UnregisterMemory(uint64_t addr) {
  ReaderLock lock(&state_mu_);
  if (worker_ && !stopped_) worker_->memory().Unmap(addr);
}

void UcxTransport::DescribeBuffer(const RegionInfo& region, BufferDesc* out) {
  ReaderLock lock(&state_mu_);
  if (worker_ && !stopped_) out->ucx_rkey = worker_->memory().PackedKey(region.addr);
}

}  // namespace mooncake::ucx
