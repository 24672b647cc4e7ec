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

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

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
              size_t count);
  // Fails waiting slices, waits for those in flight (the caller stopped the streams first,
  // so they report), joins the thread. Idempotent.
  void Stop();

  void OnSliceDone(const Slice& slice, TransferStatusEnum result, uint64_t bytes,
                   const char* message) override;

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
  void Run();
  void Finish(size_t buffer, TransferStatusEnum result, const char* message);
  void ForwardBuffer(size_t buffer);

  std::unique_ptr<BounceRing> ring_;
  const Forward forward_;
  std::vector<Job> jobs_;  // by buffer; owned by the thread while the buffer is busy

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Waiting> waiting_;     // GUARDED_BY(mu_)
  std::vector<size_t> free_;        // free buffers; GUARDED_BY(mu_)
  std::vector<NetDone> net_done_;   // GUARDED_BY(mu_)
  bool stopping_ = false;           // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace mooncake::tcp
