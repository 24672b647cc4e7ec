// UcxWorker: one UCP context and worker, the endpoints to peers and the requests in flight.
//
// Threading: every UCP call is made under mu_ (the worker runs in UCS_THREAD_MODE_SINGLE; the
// lock is ours). Submit posts the puts/gets of a batch from the caller's thread, in groups of
// up to 16 MiB; a group ends when its gets have completed and, if it has puts, when the ep
// flush posted after them has (a put completes locally before the bytes are remote; the
// flush completes when they are). One progress thread drives
// ucp_worker_progress: it spins while requests are outstanding and sleeps on the worker's
// event fd otherwise; completions are reported from it.
//
// A new endpoint is probed first: one 1-byte get, and the peer's requests wait (unposted)
// until it completes. A peer that never answers is never sent requests, so its endpoint,
// still setting up its connection, is never force-closed: UCX 1.13's tcp transport corrupts
// its heap when an endpoint closed that way gets the peer's late answer (seen as SIGSEGV or
// "unaligned tcache chunk" after SIGCONT of a stopped peer). The waiting requests end
// TIMEOUT by slice_timeout_ms; the endpoint stays, and is used once the probe completes.
//
// Failure: an endpoint error (peer died: connection reset, keepalive) fails the peer's
// outstanding batches FAILED, closes the endpoint and calls on_peer_failure; the next Submit
// to the peer opens a new one.
//
// A slice timeout: when none of a peer's outstanding batches completes for slice_timeout_ms
// (a stopped peer does not progress software RMA), they all end TIMEOUT at once, but the
// endpoint is not closed: the peer drains. UCX keeps owning the requests, their local ranges
// stay pinned in the registry (UnregisterLocalMemory of one is refused meanwhile), and newer
// requests to the peer wait unposted (ending TIMEOUT, "nothing was sent", after
// slice_timeout_ms) until UCX has ended every old one: so a write that timed out can never
// land after a newer one, and a read that timed out never writes memory that was
// unregistered. The peer resuming ends them; its death fails the endpoint as above.
// Force-closing instead (as before) crashed UCX 1.13 over its tcp lanes when the stopped peer
// resumed: this process in uct_tcp_iface_progress -> uct_tcp_iface_add_ep on a freed tcp
// endpoint, or the peer asserting in ucp_request.c ("got REP message"). Endpoints without
// peer-failure handling (shared-memory lanes) are still closed at a slice timeout.
//
// A blocked receive queue: over UCX's shared-memory lanes every peer writes its messages
// (software-RMA acknowledgements, get replies) into one FIFO of this worker, in the order it
// reserved their slots; a peer killed between reserving a slot and marking it written blocks
// the FIFO for good (UCX 1.13 has no recovery), so nothing from any shared-memory peer
// completes again. When a watched same-host peer has died and afterwards nothing has
// completed while another shared-memory peer has waited kBlockedQueueMs for its requests, the
// worker is rebuilt: every outstanding request ends FAILED saying so, the old worker is
// destroyed, a new one (new FIFO, new address) takes its place and on_address_changed
// publishes the new address. Memory handles and keys belong to the context and stay valid.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"
#include "engine/transport.h"
#include "transport/ucx/ucx_api.h"
#include "transport/ucx/ucx_memory.h"

namespace mooncake::ucx {

// The checks a peer's worker address passes before UCX parses it: a minimum length and a
// known format version (UCX asserts, aborting the process, on an unknown one). UCX's own
// parser is trusted past them (README.md: what a hostile peer can still do).
Status CheckWorkerAddress(const std::string& address);

class UcxWorker {
 public:
  struct Config {
    int slice_timeout_ms = 30000;
    // This host's identity (common/host_id.h): a peer with the same one and a pid is watched
    // by pid where UCX cannot detect its death (shared-memory lanes).
    std::string host_id;
    std::function<void(const std::string& segment_name)> on_peer_failure;
    // Called from the progress thread, no lock of ours held, when the worker was rebuilt
    // (file comment) and has a new address.
    std::function<void(const std::string& address_hex)> on_address_changed;
    // The engine's registry: local ranges of requests that timed out while UCX still owns
    // them are pinned until UCX ends them (a draining peer, file comment). May be null.
    MemoryRegistry* registry = nullptr;
  };
  static Result<std::unique_ptr<UcxWorker>> Create(const UcxApi* api, Config config);
  ~UcxWorker();
  // Fails what is outstanding, closes every endpoint, destroys the worker. Idempotent.
  void Stop() MC_EXCLUDES(mu_);

  std::string address_hex() const MC_EXCLUDES(mu_);
  // The RDMA-class and GPU transports this worker opened, "" when none (ucx_env.h).
  const std::string& local_fast_lanes() const { return local_fast_lanes_; }
  // Every transport UCX opened here ("tcp,sysv,posix,cma"), for messages.
  const std::string& local_transports() const { return local_transports_; }
  // Whether the UCX library handles CUDA memory.
  bool cuda_memory() const { return cuda_memory_; }
  MemoryTable& memory() { return *memory_; }
  const UcxApi& api() const { return *api_; }

  // The RDMA-class lanes of the endpoint to `peer` ("" when UCX reaches it over sockets or
  // shared memory only; the endpoint is created on first use). Error when UCX cannot create
  // one (a malformed worker address, no common transport).
  Result<std::string> PeerLanes(const SegmentDesc& peer) MC_EXCLUDES(mu_);
  // REQUIRES: every slice's remote_buffer points into peer->buffers. Slices whose buffer has
  // no key end FAILED at once; an error is returned only when nothing was queued.
  Status Submit(const std::shared_ptr<const SegmentDesc>& peer, const Slice* slices,
                size_t count) MC_EXCLUDES(mu_);
  void DropPeer(const SegmentDesc& peer) MC_EXCLUDES(mu_);

 private:
  struct PeerState;
  struct Pending {
    UcxWorker* worker = nullptr;
    std::shared_ptr<PeerState> peer;
    std::vector<Slice> slices;
    bool timed_out = false;
    // Reported by us after UCX failed to call back in time; OnOpDone then only frees it.
    bool abandoned = false;
    bool has_puts = false;  // the group ends with an ep flush (puts complete locally first)
    bool probe = false;     // the endpoint's probe (no slices): see the file comment
    uint64_t probe_byte = 0;  // where the probe's get lands (lives as long as the request)
    int ops = 0;            // UCX requests (gets, the flush) that will still call back
    ucs_status_t status = UCS_OK;  // the first error among them
    Pending* prev = nullptr;
    Pending* next = nullptr;
  };
  // A request waiting for its peer's probe: never posted before it completes.
  struct Deferred {
    std::shared_ptr<const SegmentDesc> desc;  // keeps slice.remote_buffer valid
    Slice slice;
    std::chrono::steady_clock::time_point since;
  };
  struct PeerState {
    UcxWorker* worker = nullptr;
    std::string key;   // the name the peer was opened under
    std::string name;  // its descriptor's name (for on_peer_failure)
    std::string worker_hex;
    ucp_ep_h ep = nullptr;
    std::string lanes;
    std::map<std::string, ucp_rkey_h> rkeys;  // by packed key (hex); destroyed at close
    const SegmentDesc* fast_desc = nullptr;   // rkeys by buffer index, for this descriptor
    std::shared_ptr<const SegmentDesc> fast_desc_ref;
    std::vector<ucp_rkey_h> fast;
    // When a batch of this peer last completed (or it was idle and got one): nothing for
    // slice_timeout_ms while batches are outstanding ends them TIMEOUT.
    std::chrono::steady_clock::time_point last_progress;
    Pending* head = nullptr;  // oldest first
    Pending* tail = nullptr;
    // The peer answered on this endpoint (its probe completed): requests are posted at once.
    bool confirmed = false;
    Pending* probe = nullptr;  // outstanding, also linked in head..tail
    std::vector<Deferred> deferred;  // oldest first; posted when the probe completes
    bool failed = false;
    std::string why;  // the failure, for the slices' messages
    // The endpoint has no peer-failure handling (UCX's shared-memory lanes offer none in
    // 1.13): a same-host peer's death is noticed by its pid instead (0: not watched).
    pid_t watch_pid = 0;
    bool no_failure_handling = false;
    // Draining: its requests timed out and were reported TIMEOUT, but the endpoint stays open
    // and UCX still owns them (their local ranges pinned in drain_pins) until the peer ends
    // them; nothing newer is posted before (file comment: a slice timeout).
    bool draining = false;
    std::vector<MemoryRegion*> drain_pins;
    ~PeerState() {
      for (MemoryRegion* r : drain_pins) MemoryRegistry::Unpin(r);
    }
  };
  struct Closing {
    std::shared_ptr<PeerState> peer;
    void* request;  // of ucp_ep_close_nbx, or nullptr once done
    // After the close, UCX calls back every outstanding flush (canceled); what it has not by
    // then is reported by us.
    std::chrono::steady_clock::time_point deadline;
  };

  // A Submit's slices are reported in groups of at most this many bytes / slices, each by
  // its own flush: a long batch shows progress (and is not timed out) while it moves.
  static constexpr uint64_t kFlushGroupBytes = 16 << 20;
  static constexpr size_t kFlushGroupSlices = 1024;
  static constexpr size_t kAddressPadding = 4096;

  UcxWorker(const UcxApi* api, Config config) : api_(api), config_(std::move(config)) {}
  Status Init();
  // Creates worker_ on context_ and reads its address and event fd.
  Status CreateWorkerLocked() MC_REQUIRES(mu_);
  // Whether this worker's shared-memory receive queue looks blocked (file comment).
  bool QueueBlockedLocked(std::chrono::steady_clock::time_point now) MC_REQUIRES(mu_);
  // Fails everything outstanding with `why`, destroys the worker and creates a new one.
  void RebuildLocked(const std::string& why) MC_REQUIRES(mu_);
  void Run() MC_EXCLUDES(mu_);
  void WakeProgress();  // when the progress thread sleeps

  // A get's or a group flush's completion: the group ends when its last one calls back.
  // Both are called inside ucp_worker_progress, which runs with mu_ held.
  static void OnOpDone(void* request, ucs_status_t status, void* user_data);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);

  Result<std::shared_ptr<PeerState>> PeerLocked(const SegmentDesc& desc) MC_REQUIRES(mu_);
  Result<ucp_rkey_h> RkeyLocked(PeerState* st, const std::shared_ptr<const SegmentDesc>& desc,
                                size_t index) MC_REQUIRES(mu_);
  Pending* NewPendingLocked() MC_REQUIRES(mu_);
  // Posts slices [from, count) to the peer in flush groups; returns where it stopped: after
  // a full group (more to post), or count.
  size_t PostLocked(const std::shared_ptr<PeerState>& st,
                    const std::shared_ptr<const SegmentDesc>& desc, const Slice* slices,
                    size_t count, size_t from) MC_REQUIRES(mu_);
  // Closes the group `p`: links it to the peer's outstanding batches and, when it has puts,
  // posts the ep flush that reports them; ends it at once when nothing is owed.
  void FlushLocked(const std::shared_ptr<PeerState>& st, Pending* p) MC_REQUIRES(mu_);
  void FinishLocked(Pending* p, ucs_status_t status, bool abandon = false) MC_REQUIRES(mu_);
  // Posts the endpoint's probe once; confirms the peer at once when there is nothing to
  // probe with (no usable key: the requests then fail with their own message).
  void StartProbeLocked(const std::shared_ptr<PeerState>& st,
                        const std::shared_ptr<const SegmentDesc>& desc) MC_REQUIRES(mu_);
  // Posts the requests that waited for the probe, in their order.
  void PostDeferredLocked(const std::shared_ptr<PeerState>& st) MC_REQUIRES(mu_);
  // Ends the waiting requests (all, or those waiting since before `before`).
  void EndDeferredLocked(PeerState* st, TransferStatusEnum result, const std::string& msg,
                         std::chrono::steady_clock::time_point before =
                             std::chrono::steady_clock::time_point::max()) MC_REQUIRES(mu_);
  // Marks the peer failed with `why`, takes it out of peers_ and force-closes its endpoint;
  // its outstanding batches end TIMEOUT when `timeout`, else FAILED.
  void ClosePeerLocked(std::shared_ptr<PeerState> st, const std::string& why, bool timeout)
      MC_REQUIRES(mu_);
  // `force`: do not wait for UCX's callbacks (Stop, after its grace period).
  void ReapClosingLocked(bool force = false) MC_REQUIRES(mu_);
  void ScanTimeoutsLocked(std::chrono::steady_clock::time_point now) MC_REQUIRES(mu_);
  // A slice timeout on an endpoint with peer-failure handling: reports its outstanding
  // requests TIMEOUT, pins their local ranges and keeps the endpoint (file comment).
  void DrainLocked(const std::shared_ptr<PeerState>& st) MC_REQUIRES(mu_);
  // The last request UCX owed a draining peer ended: unpins, and posts what waited.
  void EndDrainLocked(const std::shared_ptr<PeerState>& st) MC_REQUIRES(mu_);
  void DestroyRkeysLocked(PeerState* st) MC_REQUIRES(mu_);

  const UcxApi* const api_;
  const Config config_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;  // replaced only by RebuildLocked, on the progress thread
  int efd_ = -1;       // the worker's event fd (polled by the progress thread only)
  int wake_fd_ = -1;   // eventfd: Submit or Stop wakes the sleeping progress thread
  std::string address_hex_ MC_GUARDED_BY(mu_);
  std::string local_fast_lanes_;
  std::string local_transports_;
  bool cuda_memory_ = false;
  bool peer_failure_lanes_ = false;  // a local transport reports peer failures (ucx_env.h)
  std::unique_ptr<MemoryTable> memory_;

  mutable Mutex mu_;  // also serializes every call into the worker (UCS_THREAD_MODE_SINGLE)
  std::map<std::string, std::shared_ptr<PeerState>> peers_ MC_GUARDED_BY(mu_);  // by key
  std::vector<Closing> closing_ MC_GUARDED_BY(mu_);
  // Peers whose endpoint failed (from OnEpError, inside progress): closed after it returns.
  std::vector<std::pair<PeerState*, ucs_status_t>> failed_ MC_GUARDED_BY(mu_);
  std::vector<std::string> failed_names_ MC_GUARDED_BY(mu_);
  // Peers whose probe completed (inside progress): their waiting requests are posted after.
  std::vector<std::shared_ptr<PeerState>> ready_ MC_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Pending>> pool_ MC_GUARDED_BY(mu_);
  // Reported by us, still owed callbacks by UCX (shared-memory endpoints closed under
  // requests); freed by OnOpDone or, at the latest, when the worker is destroyed.
  std::set<Pending*> abandoned_ MC_GUARDED_BY(mu_);
  size_t outstanding_ MC_GUARDED_BY(mu_) = 0;
  // When a group last completed, and when (and which) a watched same-host peer last died:
  // what QueueBlockedLocked compares.
  std::chrono::steady_clock::time_point last_completion_ MC_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point same_host_death_at_ MC_GUARDED_BY(mu_);
  pid_t same_host_dead_pid_ MC_GUARDED_BY(mu_) = 0;
  // Set by RebuildLocked; the progress thread hands it to on_address_changed, unlocked.
  std::string new_address_ MC_GUARDED_BY(mu_);
  bool stopping_ MC_GUARDED_BY(mu_) = false;
  std::atomic<bool> sleeping_{false};
  std::thread thread_;
};

}  // namespace mooncake::ucx
