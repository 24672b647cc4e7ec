// ShmTransport: one copy between two processes of one host. The initiator sends batches of
// slice descriptors over a unix socket; the target checks each range against its registered
// memory and copies with process_vm_readv/process_vm_writev straight between its memory and
// the initiator's. See README.md in this folder.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/host_id.h"
#include "common/conn_server.h"
#include "common/net.h"
#include "common/thread_annotations.h"
#include "engine/transport.h"
#include "transport/shm/shm_exports.h"
#include "transport/shm/shm_maps.h"

namespace mooncake::shm {

using mooncake::LocalHostId;  // common/host_id.h

// The target side: accepts connections and serves copy requests.
class ShmServer {
 public:
  // `segment_name`: this engine's segment name, which authenticating clients must ask for;
  // `instance`: this engine start's id, which clients append (Authenticator::OwnNames).
  ShmServer(const EngineOptions& options, MemoryRegistry* registry, std::string segment_name = {},
            std::string instance = {});
  ~ShmServer();
  // Listens on an abstract unix socket; *path receives its name (without the leading NUL).
  Status Start(std::string* path);
  void Stop();

  // Initiator connections served at once; more are refused (closed at once).
  static constexpr size_t kMaxConnections = 4096;
  // Accepted / still-served connection counts (tests and fuzzers).
  const ConnServer& connections() const { return server_; }
  // Mapping and descriptor limits with their refusal counters (README.md in this folder).
  const ShmLimits& limits() const { return limits_; }

 private:
  void Serve(int fd);

  const EngineOptions options_;
  MemoryRegistry* const registry_;
  const std::string segment_name_;
  const std::string instance_;
  ShmLimits limits_;
  ConnServer server_;
};

// One initiator connection to a target, driven by its own thread (up to two requests in
// flight), or for a small request on an idle connection by the submitting thread itself.
class ShmStream {
 public:
  // `registry` (outlives the stream): its shareable ranges are announced to the target.
  // `hold(fd, pins)`: called when a connection with requests in flight is given up on
  // (timeout or error), with the half-closed connection and one extra pin on each local
  // region the target may still copy into; the callee unpins and closes once the target has
  // closed its end (it finished every copy or died).
  // `fence(timeout_ms)`: called before each request is sent; returns once no connection to
  // this peer given up on is still open at the target (so nothing of it can land after this
  // request), DeadlineExceeded after timeout_ms.
  using Hold = std::function<void(int fd, std::vector<MemoryRegion*> pins)>;
  using Fence = std::function<Status(int timeout_ms)>;
  // `segment`: the segment name the connection is meant to reach (checked by authentication).
  ShmStream(std::string path, const EngineOptions& options, MemoryRegistry* registry,
            std::function<void()> on_failure, Hold hold, Fence fence, std::string segment = {});
  ~ShmStream();
  void Enqueue(const Slice* slices, size_t count, uint64_t bytes) MC_EXCLUDES(mu_);
  // Runs one small request on the calling thread when the stream is idle (connected, nothing
  // queued or in flight, the target knows our shared ranges, no fenced connection): sends
  // it, then looks for the reply awake for up to the spin time (MC_SHM_SPIN_US) and
  // completes the slices itself; a reply not there by then is left in flight for the
  // stream's thread. No sleeping thread is woken on either side when the target answers
  // in time. True: the slices were taken (completed, failed or in flight); false: nothing
  // done, the caller enqueues them. At most kMaxItems slices.
  bool TryInline(const Slice* slices, size_t count) MC_EXCLUDES(mu_);
  uint64_t queued_bytes() const { return queued_bytes_.load(std::memory_order_relaxed); }
  // Requests TryInline sent: completed on the caller's thread / left to the stream's thread.
  uint64_t inline_done() const { return inline_done_.load(std::memory_order_relaxed); }
  uint64_t inline_left() const { return inline_left_.load(std::memory_order_relaxed); }
  void Stop() MC_EXCLUDES(mu_);

 private:
  struct InFlight {
    std::vector<Slice> batch;
    uint64_t seq;
  };
  // The thread's loop: takes batches off the queue, sends them (pipelined), reads replies.
  void Run() MC_EXCLUDES(mu_);
  // Waits (when nothing is in flight) for slices or Stop; moves the next request's worth of
  // the queue into *batch when the pipeline has room. False once stopping.
  bool TakeBatch(std::vector<Slice>* batch) MC_EXCLUDES(mu_);
  // All of the queue.
  std::vector<Slice> TakeQueue() MC_EXCLUDES(mu_);
  // Connects if need be, announces shared ranges, fences, sends `batch` as one request and
  // puts it in flight. False when it failed (`batch` with it: its slices are reported).
  bool SendBatch(std::vector<Slice>& batch) MC_EXCLUDES(mu_);
  // The connection failed with `s`: gives it up (held for the target to close when requests
  // are in flight), fails what is in flight, `also` and the queue.
  void Broken(const Status& s, std::vector<Slice>* also) MC_EXCLUDES(mu_);
  Status Connect();
  // Announces our shareable ranges when the registry changed since the last announcement.
  Status SyncSharedRanges(int fd);
  Status SendRequest(int fd, const std::vector<Slice>& batch, uint64_t seq);
  // A request whose reply was read: its slices and their statuses, to be reported.
  struct Answered {
    std::vector<Slice> batch;
    std::vector<uint32_t> statuses;
  };
  // Reads the reply to the oldest request in flight and moves that request into *out.
  Status ReadReply(int fd, Answered* out);
  // Reports each slice of `a` (touches nothing of the connection).
  void Complete(Answered& a);
  // With mu_ held and idle_ set: waits until there is work for the thread (or stopping) and
  // no caller has the connection, then clears idle_.
  void WaitWhileIdle() MC_REQUIRES(mu_);
  void Fail(std::vector<Slice>& slices, TransferStatusEnum result, const std::string& why);
  // Gives the connection back after TryInline; wakes the thread for what it left.
  void EndInline() MC_EXCLUDES(mu_);

  const std::string path_;
  const std::string segment_;
  const EngineOptions options_;
  const std::function<void()> on_failure_;
  const Hold hold_;
  const Fence fence_;
  MemoryRegistry* const registry_;
  // The connection (fd_, inflight_, seq_, announced_version_, the scratch vectors) belongs to
  // the stream's thread, except while that thread waits idle and a caller holds inline_:
  // then to that caller (TryInline).
  uint64_t announced_version_ = UINT64_MAX;
  std::deque<InFlight> inflight_;  // oldest first
  std::vector<char> out_;          // SendRequest's message
  Answered answered_;              // the thread's (not an inline caller's)
  Mutex mu_;
  CondVar cv_;
  std::deque<Slice> queue_ MC_GUARDED_BY(mu_);
  bool stopping_ MC_GUARDED_BY(mu_) = false;
  bool idle_ MC_GUARDED_BY(mu_) = false;    // the thread waits with nothing in flight
  bool inline_ MC_GUARDED_BY(mu_) = false;  // a caller has the connection (TryInline)
  std::atomic<uint64_t> queued_bytes_{0};
  std::atomic<uint64_t> inline_done_{0}, inline_left_{0};
  std::atomic<int> fd_{-1};  // owned by the thread; shut down by Stop()
  uint64_t seq_ = 0;
  std::thread thread_;
};

// Connects, says hello and returns the socket; Unavailable/PermissionDenied with the reason.
// `segment`: the segment name the caller means to reach (checked by authentication).
Result<UniqueFd> ConnectAndHello(const std::string& path, int timeout_ms,
                                 const std::string& auth_secret, const std::string& segment = {});

class ShmTransport : public Transport {
 public:
  ShmTransport() = default;
  ~ShmTransport() override;
  const char* name() const override { return "shm"; }
  Status Start(const TransportContext& ctx, SegmentDesc* local_desc) override;
  void Stop() override;
  bool CanReach(const SegmentDesc& peer) override;
  uint64_t slice_size() const override { return options_.shm_split_size; }
  Status Submit(const std::shared_ptr<const SegmentDesc>& peer, const Slice* slices,
                size_t count) override;
  void DropPeer(const SegmentDesc& peer) override;
  // Slices this transport copied itself through memory a target lends (tests, benches).
  uint64_t mapped_copies() const { return mapped_copies_.load(std::memory_order_relaxed); }
  // Requests sent by submitting threads themselves (ShmStream::TryInline), over all peers:
  // completed there / left to a stream's thread (tests, benches).
  uint64_t inline_done() const { return SumOverStreams(&ShmStream::inline_done); }
  uint64_t inline_left() const { return SumOverStreams(&ShmStream::inline_left); }

 private:
  // A counter of every stream of every peer, added up.
  uint64_t SumOverStreams(uint64_t (ShmStream::*counter)() const) const MC_EXCLUDES(mu_);
  struct Peer {
    std::vector<std::unique_ptr<ShmStream>> streams;
  };
  // A connection given up on with requests in flight, half-closed, until the target closes
  // its end: it may still copy what it had received, so its local regions stay pinned and
  // new requests to the same peer wait (WaitForZombies) until it is gone.
  struct Zombie {
    std::string path;
    int fd;
    std::vector<MemoryRegion*> pins;
  };
  // Hands slices to the peer's streams (made on first use), spread over them.
  Status ToStreams(const std::shared_ptr<const SegmentDesc>& desc, std::shared_ptr<Peer>& peer,
                   const Slice* slices, size_t count);
  // Bytes of lent memory one Submit copies itself while it is the only thread copying into
  // lent memory here and the target has nothing of ours in hand; more go to the target, so
  // that both processes copy (one submitting thread: 1 MiB x 16 writes 18.5 GB/s split,
  // 14.1 all here). Otherwise the cores are busy with copies already and the target's share
  // would only take time from them (two threads, 64 KiB x 128: 16.6 GB/s split, 28.6 all
  // here, memcpy 29.5): a Submit then copies up to kInlineBusyBytes itself.
  static constexpr uint64_t kInlineBytes = 2 << 20;
  // The most bytes of one request the submitting thread runs itself over an idle stream and
  // waits for, awake (ShmStream::TryInline); larger ones are split over the streams so that
  // the target copies them on several threads.
  static constexpr uint64_t kInlineRoundTripBytes = 1 << 20;
  static constexpr uint64_t kInlineBusyBytes = 64 << 20;
  void Hold(const std::string& path, int fd, std::vector<MemoryRegion*> pins)
      MC_EXCLUDES(zombie_mu_);
  Status WaitForZombies(const std::string& path, int timeout_ms) MC_EXCLUDES(zombie_mu_);
  // True while a zombie of `path` is open.
  bool HasZombie(const std::string& path) MC_REQUIRES(zombie_mu_);
  void ReapLoop() MC_EXCLUDES(zombie_mu_);
  // Closes the zombies the targets have closed (they finished or died); true if any.
  bool ReapClosed() MC_REQUIRES(zombie_mu_);

  EngineOptions options_;
  std::function<void(const std::string&)> on_peer_failure_;
  std::string host_id_;
  MemoryRegistry* registry_ = nullptr;
  std::unique_ptr<ShmServer> server_;
  mutable RwMutex mu_;
  std::map<std::string, bool> reachable_ MC_GUARDED_BY(mu_);               // by socket path
  std::map<std::string, std::shared_ptr<Peer>> peers_ MC_GUARDED_BY(mu_);  // by socket path
  // Memory each target lends us to copy ourselves (shm_exports.h), fetched with the first
  // hello; by socket path.
  std::map<std::string, std::shared_ptr<const PeerExports>> exports_ MC_GUARDED_BY(mu_);
  ShmLimits export_limits_;  // caps on what we map of targets' memory
  bool stopped_ MC_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> mapped_copies_{0};
  std::atomic<int> inline_copiers_{0};  // threads in Submit with slices for lent memory

  Mutex zombie_mu_;
  CondVar zombie_cv_;
  std::vector<Zombie> zombies_ MC_GUARDED_BY(zombie_mu_);
  std::atomic<size_t> zombie_count_{0};  // zombies_.size(), read without the lock
  bool reaper_stop_ MC_GUARDED_BY(zombie_mu_) = false;
  int reaper_wake_ = -1;         // eventfd: a new zombie, or stop
  std::thread reaper_;
};

}  // namespace mooncake::shm
