#include "transport/tcp/tcp_staging.h"

#include <glog/logging.h>

namespace mooncake::tcp {

Result<std::unique_ptr<BounceRing>> BounceRing::Create(int device, size_t count, size_t size) {
  std::unique_ptr<BounceRing> r(new BounceRing);
  r->dev_ = &platform::Devices();
  r->device_ = device;
  r->size_ = size;
  const int saved = r->dev_->CurrentDevice();  // the caller's thread keeps its device
  MC_RETURN_IF_ERROR(r->dev_->SetDevice(device));
  auto stream = r->dev_->CreateStream();
  (void)r->dev_->SetDevice(saved);
  MC_RETURN_IF_ERROR(stream.status());
  r->stream_ = *stream;
  for (size_t i = 0; i < count; ++i) {
    MC_ASSIGN_OR_RETURN(void* p, r->dev_->MallocHost(size));
    r->buffers_.push_back(static_cast<uint8_t*>(p));
    MC_ASSIGN_OR_RETURN(platform::EventHandle e, r->dev_->CreateEvent());
    r->events_.push_back(e);
  }
  return r;
}

BounceRing::~BounceRing() {
  if (stream_ != nullptr) (void)dev_->StreamSynchronize(stream_);
  for (uint8_t* b : buffers_) (void)dev_->FreeHost(b);
  for (platform::EventHandle e : events_) dev_->DestroyEvent(e);
  if (stream_ != nullptr) dev_->DestroyStream(stream_);
}

Status BounceRing::CopyAsync(size_t i, void* dst, const void* src, size_t length) {
  MC_RETURN_IF_ERROR(dev_->CopyAsync(dst, src, length, stream_));
  return dev_->RecordEvent(events_[i], stream_);
}

Status BounceRing::Wait(size_t i) { return dev_->EventSynchronize(events_[i]); }

DeviceStager::DeviceStager(std::unique_ptr<BounceRing> ring, Forward forward)
    : ring_(std::move(ring)), forward_(std::move(forward)), jobs_(ring_->count()) {
  for (size_t i = ring_->count(); i > 0; --i) free_.push_back(i - 1);
  thread_ = std::thread([this] { Run(); });
}

DeviceStager::~DeviceStager() { Stop(); }

void DeviceStager::Stop() {
  bool first;
  {
    std::lock_guard lock(mu_);
    first = !stopping_;
    stopping_ = true;
  }
  cv_.notify_all();
  if (first) thread_.join();
}

void DeviceStager::Submit(const std::shared_ptr<const SegmentDesc>& peer, const Slice* slices,
                          size_t count) {
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      for (size_t i = 0; i < count; ++i) waiting_.push_back({slices[i], peer});
      cv_.notify_all();
      return;
    }
  }
  for (size_t i = 0; i < count; ++i) {
    slices[i].Done(FAILED, 0, "the TCP transport is stopping");
  }
}

void DeviceStager::OnSliceDone(const Slice& slice, TransferStatusEnum result, uint64_t,
                               const char* message) {
  std::lock_guard lock(mu_);
  net_done_.push_back({static_cast<size_t>(slice.hook_cookie), result, message ? message : ""});
  cv_.notify_all();
}

// Reports buffer's slice to its owner and frees the buffer. Thread only.
void DeviceStager::Finish(size_t buffer, TransferStatusEnum result, const char* message) {
  Job job = std::move(jobs_[buffer]);
  jobs_[buffer] = Job{};
  {
    std::lock_guard lock(mu_);
    free_.push_back(buffer);
  }
  job.original.Done(result, result == COMPLETED ? job.original.length : 0, message);
}

void DeviceStager::ForwardBuffer(size_t buffer) {
  Slice s = jobs_[buffer].original;
  s.local = reinterpret_cast<uint64_t>(ring_->buffer(buffer));
  s.local_device = -1;
  s.hook = this;
  s.hook_cookie = buffer;
  forward_(jobs_[buffer].peer, &s, 1);
}

void DeviceStager::Run() {
  std::deque<size_t> copying;  // buffers with a copy in flight, in issue order
  size_t in_flight = 0;        // buffers taken
  std::vector<size_t> started;
  std::vector<NetDone> done;
  for (;;) {
    started.clear();
    done.clear();
    std::vector<Waiting> failed;
    {
      std::unique_lock lock(mu_);
      auto ready = [&] {
        return !net_done_.empty() || (!waiting_.empty() && (!free_.empty() || stopping_)) ||
               (stopping_ && in_flight == 0);
      };
      if (copying.empty()) cv_.wait(lock, ready);
      done.swap(net_done_);
      while (!waiting_.empty() && !free_.empty() && !stopping_) {
        size_t b = free_.back();
        free_.pop_back();
        jobs_[b] = Job{waiting_.front().slice, std::move(waiting_.front().peer)};
        waiting_.pop_front();
        started.push_back(b);
      }
      if (stopping_) {
        failed.assign(waiting_.begin(), waiting_.end());
        waiting_.clear();
      }
      if (stopping_ && done.empty() && copying.empty() && in_flight == 0) {
        lock.unlock();
        for (auto& w : failed) w.slice.Done(FAILED, 0, "the TCP transport is stopping");
        return;
      }
    }
    for (auto& w : failed) w.slice.Done(FAILED, 0, "the TCP transport is stopping");
    in_flight += started.size();
    for (const NetDone& d : done) {
      const Slice& o = jobs_[d.buffer].original;
      if (d.result == COMPLETED && o.opcode == TransferRequest::READ) {
        Status s = ring_->CopyAsync(d.buffer, reinterpret_cast<void*>(o.local),
                                    ring_->buffer(d.buffer), o.length);
        if (s.ok()) {
          copying.push_back(d.buffer);
          continue;
        }
        --in_flight;
        Finish(d.buffer, FAILED, ("copy to device memory: " + s.ToString()).c_str());
        continue;
      }
      --in_flight;
      Finish(d.buffer, d.result, d.message.empty() ? nullptr : d.message.c_str());
    }
    for (size_t b : started) {
      const Slice& o = jobs_[b].original;
      if (o.opcode == TransferRequest::READ) {
        ForwardBuffer(b);
        continue;
      }
      Status s = ring_->CopyAsync(b, ring_->buffer(b), reinterpret_cast<const void*>(o.local),
                                  o.length);
      if (s.ok()) {
        copying.push_back(b);
      } else {
        --in_flight;
        Finish(b, FAILED, ("copy from device memory: " + s.ToString()).c_str());
      }
    }
    if (copying.empty()) continue;
    // Copies on one stream finish in order: wait for the oldest, then look for new work.
    size_t b = copying.front();
    copying.pop_front();
    Status s = ring_->Wait(b);
    bool read = jobs_[b].original.opcode == TransferRequest::READ;
    if (!s.ok()) {
      --in_flight;
      Finish(b, FAILED, (std::string(read ? "copy to" : "copy from") + " device memory: " +
                         s.ToString()).c_str());
    } else if (read) {
      --in_flight;
      Finish(b, COMPLETED, nullptr);
    } else {
      ForwardBuffer(b);
    }
  }
}

}  // namespace mooncake::tcp
