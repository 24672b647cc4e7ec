// UcxWorker's endpoints: creating one per peer (checked address, error handling where the
// lanes allow it), remote keys, closing (forced, with the grace for UCX's callbacks), and
// endpoint failures. The rest of UcxWorker is in ucx_worker.cc.
#include <glog/logging.h>

#include "transport/ucx/ucx_env.h"
#include "transport/ucx/ucx_worker.h"

namespace mooncake::ucx {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

// ---- peers -------------------------------------------------------------------------------

Result<std::shared_ptr<UcxWorker::PeerState>> UcxWorker::PeerLocked(const SegmentDesc& desc) {
  if (stopping_) return Status::Unavailable("UCX transport is stopped");
  if (worker_ == nullptr) {
    return Status::Unavailable("this engine's UCX worker could not be rebuilt after its "
                               "receive queue blocked (see the log); restart the process");
  }
  const std::string key = desc.lookup_name.empty() ? desc.name : desc.lookup_name;
  auto it = peers_.find(key);
  if (it != peers_.end()) {
    if (it->second->worker_hex == desc.mc_ucx_worker) return it->second;
    ClosePeerLocked(it->second, "peer " + key + " has a new UCX worker address", false);
  }
  std::string address;
  if (desc.mc_ucx_worker.empty() || !FromHex(desc.mc_ucx_worker, &address)) {
    return Status::InvalidArgument("segment '" + key + "' publishes no valid UCX worker address");
  }
  MC_RETURN_IF_ERROR(CheckWorkerAddress(address).WithContext("segment '" + key + "'"));
  // UCX reads the address without a length: zero padding keeps a truncated one from reading
  // past this copy.
  address.resize(address.size() + kAddressPadding, '\0');
  auto st = std::make_shared<PeerState>();
  st->worker = this;
  st->key = key;
  st->name = desc.name;
  st->worker_hex = desc.mc_ucx_worker;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  if (peer_failure_lanes_) {
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  }
  ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxWorker::OnEpError;
  ep.err_handler.arg = st.get();
  ucs_status_t s = api_->ep_create(worker_, &ep, &st->ep);
  address.resize(address.size() - kAddressPadding);
  if (s == UCS_ERR_UNREACHABLE && peer_failure_lanes_) {
    // UCX 1.13's shared-memory lanes (sysv, posix, cma) cannot report a peer's failure: with
    // peer-failure handling no lane qualifies when the peer shares only those with us.
    ep.field_mask &= ~(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER);
    s = api_->ep_create(worker_, &ep, &st->ep);
  }
  if (s == UCS_OK && !(ep.field_mask & UCP_EP_PARAM_FIELD_ERR_HANDLER)) {
    // Without it, a same-host peer is watched by its pid.
    st->no_failure_handling = true;
    {
      if (desc.mc_pid != 0 && !config_.host_id.empty() && desc.mc_host_id == config_.host_id) {
        st->watch_pid = static_cast<pid_t>(desc.mc_pid);
      } else {
        LOG(WARNING) << "UCX: endpoint to segment " << key << " has no peer-failure "
                     << "detection; a dead peer's requests end TIMEOUT (MC_SLICE_TIMEOUT)";
      }
    }
  }
  if (s != UCS_OK) {
    // The address may be stale (the peer rebuilt its worker): fetch the descriptor anew.
    failed_names_.push_back(desc.name);
    WakeProgress();
    return api_->Error("UCX endpoint to segment '" + key + "' (worker address of " +
                           std::to_string(address.size()) + " bytes)",
                       s);
  }
  st->lanes = FastLanes(PrintToString([&](FILE* f) { api_->ep_print_info(st->ep, f); }));
  peers_[key] = st;
  return st;
}

Result<std::string> UcxWorker::PeerLanes(const SegmentDesc& desc) {
  MutexLock lock(&mu_);
  MC_ASSIGN_OR_RETURN(std::shared_ptr<PeerState> st, PeerLocked(desc));
  return st->lanes;
}

void UcxWorker::DropPeer(const SegmentDesc& desc) {
  MutexLock lock(&mu_);
  const std::string key = desc.lookup_name.empty() ? desc.name : desc.lookup_name;
  auto it = peers_.find(key);
  if (it == peers_.end() || it->second->head != nullptr || !it->second->deferred.empty()) {
    return;  // busy ones stay until done
  }
  ClosePeerLocked(it->second, "peer " + key + " changed its descriptor", false);
}

Result<ucp_rkey_h> UcxWorker::RkeyLocked(PeerState* st,
                                         const std::shared_ptr<const SegmentDesc>& desc,
                                         size_t index) {
  if (st->fast_desc != desc.get()) {
    st->fast_desc = desc.get();
    st->fast_desc_ref = desc;
    st->fast.assign(desc->buffers.size(), nullptr);
  }
  if (st->fast[index] != nullptr) return st->fast[index];
  const BufferDesc& b = desc->buffers[index];
  if (b.ucx_rkey.empty()) {
    return Status::FailedPrecondition("a buffer of segment '" + st->key + "' (" +
                                      std::to_string(b.length) + " bytes at " +
                                      std::to_string(b.addr) +
                                      ") has no UCX key: its owner could not map it");
  }
  auto it = st->rkeys.find(b.ucx_rkey);
  if (it == st->rkeys.end()) {
    std::string packed;
    if (!FromHex(b.ucx_rkey, &packed)) return Status::DataLoss("UCX key is not hex");
    // UCX reads the packed key without a length: zero padding keeps a truncated key from
    // reading past this copy.
    packed.resize(packed.size() + kMaxUcxRkeyBytes, '\0');
    ucp_rkey_h rkey = nullptr;
    ucs_status_t s = api_->ep_rkey_unpack(st->ep, packed.data(), &rkey);
    if (s != UCS_OK) {
      return api_->Error("unpack the UCX key of a buffer of segment '" + st->key + "'", s);
    }
    it = st->rkeys.emplace(b.ucx_rkey, rkey).first;
  }
  st->fast[index] = it->second;
  return it->second;
}

void UcxWorker::DestroyRkeysLocked(PeerState* st) {
  for (auto& [hex, rkey] : st->rkeys) api_->rkey_destroy(rkey);
  st->rkeys.clear();
  st->fast.clear();
  st->fast_desc = nullptr;
  st->fast_desc_ref.reset();
}

void UcxWorker::ClosePeerLocked(std::shared_ptr<PeerState> st, const std::string& why,
                                bool timeout) {
  auto it = peers_.find(st->key);
  if (it != peers_.end() && it->second == st) peers_.erase(it);
  if (!st->failed) {
    st->failed = true;
    st->why = why;
  }
  for (Pending* p = st->head; p != nullptr; p = p->next) p->timed_out = p->timed_out || timeout;
  EndDeferredLocked(st.get(), timeout ? TIMEOUT : FAILED,
                    "UCX transfer to segment '" + st->key + "' failed: " + st->why);
  void* req = nullptr;
  if (st->ep != nullptr) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = api_->ep_close_nbx(st->ep, &param);
    st->ep = nullptr;
    if (UCS_PTR_IS_PTR(r)) req = r;
  }
  // UCX cancels an endpoint's requests when it closes it with peer-failure handling; without
  // it (shared-memory lanes) it may never call them back.
  const auto grace = st->no_failure_handling ? std::chrono::milliseconds(200)
                                             : std::chrono::milliseconds(2000);
  closing_.push_back({st, req, Clock::now() + grace});
}

void UcxWorker::ReapClosingLocked(bool force) {
  const auto now = Clock::now();
  for (size_t i = 0; i < closing_.size();) {
    Closing& c = closing_[i];
    if (!force && c.request != nullptr &&
        api_->request_check_status(c.request) == UCS_INPROGRESS) {
      ++i;
      continue;
    }
    if (c.request != nullptr) {
      if (api_->request_check_status(c.request) != UCS_INPROGRESS) api_->request_free(c.request);
      c.request = nullptr;
    }
    if (!force && c.peer->head != nullptr && now < c.deadline) {
      ++i;  // UCX still owes callbacks of canceled flushes
      continue;
    }
    if (c.peer->head != nullptr) {
      LOG(WARNING) << "UCX: endpoint to " << c.peer->key << " closed with requests UCX did "
                   << "not complete; reporting them failed";
      while (c.peer->head != nullptr) FinishLocked(c.peer->head, UCS_ERR_CANCELED, true);
    }
    DestroyRkeysLocked(c.peer.get());
    if (i + 1 != closing_.size()) closing_[i] = std::move(closing_.back());
    closing_.pop_back();
  }
}

void UcxWorker::OnEpError(void* arg, ucp_ep_h, ucs_status_t status) {
  // Called inside ucp_worker_progress, mu_ held; the endpoint is closed after it returns.
  // The PeerState outlives its endpoint (peers_ or closing_ holds it until the close ends).
  auto* st = static_cast<PeerState*>(arg);
  st->worker->mu_.AssertHeld();
  st->worker->failed_.emplace_back(st, status);
}

}  // namespace mooncake::ucx
