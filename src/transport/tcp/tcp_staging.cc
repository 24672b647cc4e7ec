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
    MutexLock lock(&mu_);
    first = !stopping_;
    stopping_ = true;
  }
  cv_.SignalAll();
  if (first) thread_.join();
}

void DeviceStager::Submit(const std::shared_ptr<const SegmentDesc>& peer, const Slice* slices,
                          size_t count) {
  {
    MutexLock lock(&mu_);
    if (!stopping_) {
      for (size_t i = 0; i < count; ++i) waiting_.push_back({slices[i], peer});
      cv_.SignalAll();
      return;
    }
  }
  for (size_t i = 0; i < count; ++i) {
    slices[i].Done(FAILED, 0, "the TCP transport is stopping");
  }
}

void DeviceStager::OnSliceDone(const Slice& slice, TransferStatusEnum result, uint64_t,
                               const char* message) {
  MutexLock lock(&mu_);
  net_done_.push_back({static_cast<size_t>(slice.hook_cookie), result, message ? message : ""});
  cv_.SignalAll();
}

// Reports buffer's slice to its owner and frees the buffer. Thread only.
void DeviceStager::Finish(size_t buffer, TransferStatusEnum result, const char* message) {
  Job job = std::move(jobs_[buffer]);
  jobs_[buffer] = Job{};
  {
    MutexLock lock(&mu_);
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
  for (;;) {
    std::vector<Waiting> failed;
    const bool more = TakeWork(&failed);
    for (auto& w : failed) w.slice.Done(FAILED, 0, "the TCP transport is stopping");
    if (!more) return;
    in_flight_ += started_.size();
    for (const NetDone& d : done_) OnNetDone(d);
    for (size_t b : started_) StartBuffer(b);
    if (!copying_.empty()) WaitOldestCopy();
  }
}

bool DeviceStager::HasWork() const {
  return !net_done_.empty() || (!waiting_.empty() && (!free_.empty() || stopping_)) ||
         (stopping_ && in_flight_ == 0);
}

bool DeviceStager::TakeWork(std::vector<Waiting>* failed) {
  started_.clear();
  done_.clear();
  MutexLock lock(&mu_);
  if (copying_.empty()) {
    while (!HasWork()) cv_.Wait(&mu_);
  }
  done_.swap(net_done_);
  while (!waiting_.empty() && !free_.empty() && !stopping_) {
    size_t b = free_.back();
    free_.pop_back();
    jobs_[b] = Job{waiting_.front().slice, std::move(waiting_.front().peer)};
    waiting_.pop_front();
    started_.push_back(b);
  }
  if (stopping_) {
    failed->assign(waiting_.begin(), waiting_.end());
    waiting_.clear();
  }
  return !(stopping_ && done_.empty() && copying_.empty() && in_flight_ == 0);
}

void DeviceStager::OnNetDone(const NetDone& d) {
  const Slice& o = jobs_[d.buffer].original;
  if (d.result == COMPLETED && o.opcode == TransferRequest::READ) {
    Status s = ring_->CopyAsync(d.buffer, reinterpret_cast<void*>(o.local),
                                ring_->buffer(d.buffer), o.length);
    if (s.ok()) {
      copying_.push_back(d.buffer);
      return;
    }
    --in_flight_;
    Finish(d.buffer, FAILED, ("copy to device memory: " + s.ToString()).c_str());
    return;
  }
  --in_flight_;
  Finish(d.buffer, d.result, d.message.empty() ? nullptr : d.message.c_str());
}

void DeviceStager::StartBuffer(size_t b) {
  const Slice& o = jobs_[b].original;
  if (o.opcode == TransferRequest::READ) {
    ForwardBuffer(b);
    return;
  }
  Status s = ring_->CopyAsync(b, ring_->buffer(b), reinterpret_cast<const void*>(o.local),
                              o.length);
  if (s.ok()) {
    copying_.push_back(b);
  } else {
    --in_flight_;
    Finish(b, FAILED, ("copy from device memory: " + s.ToString()).c_str());
  }
}

void DeviceStager::WaitOldestCopy() {
  // Copies on one stream finish in order: wait for the oldest, then look for new work.
  size_t b = copying_.front();
  copying_.pop_front();
  Status s = ring_->Wait(b);
  bool read = jobs_[b].original.opcode == TransferRequest::READ;
  if (!s.ok()) {
    --in_flight_;
    Finish(b, FAILED, (std::string(read ? "copy to" : "copy from") + " device memory: " +
                       s.ToString()).c_str());
  } else if (read) {
    --in_flight_;
    Finish(b, COMPLETED, nullptr);
  } else {
    ForwardBuffer(b);
  }
}

}  // namespace mooncake::tcp
