// Device memory over TCP: sockets cannot read or write GPU memory, so bytes pass through
// pinned host bounce buffers, pipelined: while one buffer's bytes are on the wire, the next
// buffers are being copied to or from the device (asynchronous copies on a stream, one event
// per buffer).
//
// - BounceRing: K pinned buffers of S bytes, one device stream, one event per buffer.
// - DeviceStager (initiator side): takes the slices whose local memory is device memory.
//   WRITE: copy device -> buffer, then hand the TCP streams a slice over the buffer.
//   READ: hand the streams a slice into a buffer; when it lands, copy buffer -> device.
//   Up to K slices are in flight; the rest wait in order for a free buffer.
// The target side (tcp_server.cc) uses a BounceRing per connection the same way.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"
#include "engine/transport.h"
#include "platform/device.h"

namespace mooncake::tcp {

class BounceRing {
 public:
  // Allocates `count` pinned buffers of `size` bytes and a stream for `device`.
  static Result<std::unique_ptr<BounceRing>> Create(int device, size_t count, size_t size);
  ~BounceRing();
  BounceRing(const BounceRing&) = delete;
  BounceRing& operator=(const BounceRing&) = delete;

  size_t count() const { return buffers_.size(); }
  size_t size() const { return size_; }
  int device() const { return device_; }
  uint8_t* buffer(size_t i) const { return buffers_[i]; }
  // Issues an asynchronous copy on the ring's stream and records buffer i's event after it.
  Status CopyAsync(size_t i, void* dst, const void* src, size_t length);
  // Waits for the last copy recorded on buffer i (its error, if the copy failed).
  Status Wait(size_t i);

 private:
  BounceRing() = default;
  platform::DeviceBackend* dev_ = nullptr;
  int device_ = -1;
  size_t size_ = 0;
  platform::StreamHandle stream_ = nullptr;
  std::vector<uint8_t*> buffers_;
  std::vector<platform::EventHandle> events_;
};

class DeviceStager final : public SliceHook {
 public:
  // Hands host-memory slices (over bounce buffers, with this stager as their hook) to the
  // TCP streams of `peer`; must not block.
  using Forward = std::function<void(const std::shared_ptr<const SegmentDesc>& peer,
                                     const Slice* slices, size_t count)>;

  DeviceStager(std::unique_ptr<BounceRing> ring, Forward forward);
  ~DeviceStager();  // Stop()s
  DeviceStager(const DeviceStager&) = delete;
  DeviceStager& operator=(const DeviceStager&) = delete;

  // REQUIRES: each slice's local memory is on ring's device and no longer than its buffers.
  // Never blocks; after Stop() the slices fail at once.
  void Submit(const std::shared_ptr<const SegmentDesc>& peer, const Slice* slices,
              size_t count) MC_EXCLUDES(mu_);
  // Fails waiting slices, waits for those in flight (the caller stopped the streams first,
  // so they report), joins the thread. Idempotent.
  void Stop() MC_EXCLUDES(mu_);

  void OnSliceDone(const Slice& slice, TransferStatusEnum result, uint64_t bytes,
                   const char* message) override MC_EXCLUDES(mu_);

 private:
  struct Waiting {
    Slice slice;
    std::shared_ptr<const SegmentDesc> peer;
  };
  struct Job {  // one per buffer
    Slice original;
    std::shared_ptr<const SegmentDesc> peer;
  };
  struct NetDone {
    size_t buffer;
    TransferStatusEnum result;
    std::string message;
  };
  // The thread's loop: takes work, finishes what the network reported, starts new
  // buffers, waits for the oldest copy.
  void Run() MC_EXCLUDES(mu_);
  // Something for the thread to do (or it may stop).
  bool HasWork() const MC_REQUIRES(mu_);
  // Waits for work when no copy is in flight; takes the network's reports (into done_) and
  // free buffers for waiting slices (started_); when stopping, the waiting slices go to
  // *failed. False when the thread is done (stopping, nothing left in flight).
  bool TakeWork(std::vector<Waiting>* failed) MC_EXCLUDES(mu_);
  // A slice over a buffer ended on the network: a READ's bytes go on to the device.
  void OnNetDone(const NetDone& d) MC_EXCLUDES(mu_);
  // A slice got buffer b: a READ goes to the network, a WRITE first copies from the device.
  void StartBuffer(size_t b) MC_EXCLUDES(mu_);
  // Waits for the oldest copy on the stream and passes its buffer on.
  void WaitOldestCopy() MC_EXCLUDES(mu_);
  void Finish(size_t buffer, TransferStatusEnum result, const char* message) MC_EXCLUDES(mu_);
  void ForwardBuffer(size_t buffer);

  std::unique_ptr<BounceRing> ring_;
  const Forward forward_;
  std::vector<Job> jobs_;  // by buffer; owned by the thread while the buffer is busy
  // Owned by the thread:
  std::deque<size_t> copying_;     // buffers with a copy in flight, in issue order
  size_t in_flight_ = 0;           // buffers taken
  std::vector<size_t> started_;    // buffers taken by TakeWork
  std::vector<NetDone> done_;      // network reports taken by TakeWork

  Mutex mu_;
  CondVar cv_;
  std::deque<Waiting> waiting_ MC_GUARDED_BY(mu_);
  std::vector<size_t> free_ MC_GUARDED_BY(mu_);  // free buffers
  std::vector<NetDone> net_done_ MC_GUARDED_BY(mu_);
  bool stopping_ MC_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace mooncake::tcp
