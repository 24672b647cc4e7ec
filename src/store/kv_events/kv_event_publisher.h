// The master's KV event publisher (--enable_kv_events): events for objects stored and removed
// go to a ZeroMQ PUB socket in upstream's format (kv_event_codec.h), so that cache-aware
// routers index which prefixes the pool holds.
//
// The master calls ObjectStored / ObjectRemoved with its lock held, in the order of the
// changes: each call only queues (a mutex and a deque; an eventfd write when the queue was
// empty). One thread batches the queue (at most 64 events), encodes and sends. The queue
// holds at most queue_capacity events (0: unbounded); when full the oldest is dropped and its
// sequence number is skipped, so subscribers see the gap.
//
// Beyond upstream: a ROUTER socket on replay_endpoint (optional) answers subscribers that
// missed batches or that start after a master restart or failover (the protocol is in
// src/store/kv_events/README.md): from a sequence number, the batches still kept (the last
// replay_batches, at most kReplayBytes); a sequence number no longer kept, one this
// publisher never sent (another master's), or the snapshot request, get a snapshot: every
// object the master holds now, as stored events, with the sequence number from which live
// batches apply on top of it. Snapshots are taken at most once per snapshot_interval;
// requests are bounded (8 bytes, small identities), and a client that does not read its
// replies loses them, never delays the live stream.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/thread_annotations.h"
#include "mooncake/status.h"
#include "store/kv_events/kv_event_codec.h"
#include "store/master/master_service.h"

namespace mooncake::store::kv_events {

// Replay request and reply markers (8-byte big-endian sequence frames).
constexpr uint64_t kEndOfReplay = UINT64_MAX;              // last message of every reply
constexpr uint64_t kSnapshotRequest = UINT64_MAX;          // a request for a snapshot
constexpr uint64_t kSnapshotMarker = UINT64_MAX - 1;       // frames of a snapshot
constexpr uint64_t kRetryMarker = UINT64_MAX - 2;          // snapshot refused for now
constexpr size_t kReplayBytes = 64 << 20;

struct PublisherOptions {
  std::string bind_endpoint;    // --kv_events_bind_endpoint, e.g. tcp://0.0.0.0:5557
  std::string replay_endpoint;  // --kv_events_replay_endpoint ("" : none)
  CodecOptions codec;           // backend_id (--kv_events_backend_id) and the emit flags
  size_t queue_capacity = 65536;
  size_t replay_batches = 4096;
  std::chrono::milliseconds snapshot_interval{5000};
  // The master is in strict multi-tenant mode: its keys are scoped (src/store/tenants/
  // tenant_id.h), and each event carries the key's tenant and the key as the tenant sent it.
  bool scoped_keys = false;
};

struct PublisherStats {
  uint64_t published_batches = 0, published_events = 0, dropped_events = 0;
  uint64_t skipped_unparsed_keys = 0, next_sequence = 0, replay_requests = 0, snapshots = 0;
};

class KvEventPublisher : public ObjectEventSink {
 public:
  // Every key of a complete object, for a snapshot (MasterService::ForEachCompleteKey).
  using SnapshotFn = std::function<void(const std::function<void(const std::string&)>&)>;

  // Binds the sockets and starts the thread. InvalidArgument for a missing endpoint or
  // backend id; Unavailable when libzmq cannot be loaded or a bind fails (the message says
  // which endpoint and why).
  static Result<std::unique_ptr<KvEventPublisher>> Start(PublisherOptions options,
                                                         SnapshotFn snapshot);
  ~KvEventPublisher() override;  // publishes what is queued, then stops

  void ObjectStored(const std::string& key) override { Enqueue(true, key); }
  void ObjectRemoved(const std::string& key) override { Enqueue(false, key); }

  PublisherStats Stats() const;
  // Tests: while paused, events queue (and drop) without being published.
  void PauseForTest(bool paused);
  // {"enabled":true,"published_batches":N,...} for GET /kv_events/status.
  std::string StatusJson() const;

 private:
  struct Pending {
    bool stored;
    std::string key;
  };
  struct Sockets;

  KvEventPublisher(PublisherOptions options, SnapshotFn snapshot);
  void Enqueue(bool stored, const std::string& key);
  // The event of a master's key (its tenant's key and tenant when the keys are scoped).
  Event MakeEvent(bool stored, std::string key) const;
  void Run();
  void PublishQueued();
  void Send(uint64_t seq, const std::string& payload, size_t events);
  void ServeReplay();
  void Reply(const std::string& identity, bool delimiter, uint64_t start);
  void ReplySnapshot(const std::string& identity, bool delimiter);

  const PublisherOptions options_;
  const SnapshotFn snapshot_;
  std::unique_ptr<Sockets> sockets_;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> paused_{false};

  mutable Mutex mu_;
  std::deque<Pending> queue_ MC_GUARDED_BY(mu_);
  uint64_t next_seq_ MC_GUARDED_BY(mu_) = 0;  // a dropped event takes one too
  uint64_t dropped_ MC_GUARDED_BY(mu_) = 0;

  // The thread's own (read by Stats through atomics).
  std::atomic<uint64_t> batches_{0}, events_{0}, unparsed_{0}, replays_{0}, snapshots_{0};
  uint64_t next_event_id_ = 0;
  std::deque<std::pair<uint64_t, std::string>> kept_;  // the replay ring: (seq, payload)
  size_t kept_bytes_ = 0;
  std::chrono::steady_clock::time_point last_snapshot_{};
};

}  // namespace mooncake::store::kv_events
