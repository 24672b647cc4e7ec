// The simulated device backend (tests only; see device_backends.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "common/net.h"
#include "platform/device_backends.h"

namespace mooncake::platform {
namespace {

constexpr char kSimMagic[8] = {'M', 'C', 'S', 'I', 'M', 'I', 'P', 'C'};

struct SimIpcHandle {  // laid out in IpcHandle::bytes
  char magic[8];
  uint32_t pid;
  int32_t fd;
  uint64_t length;
  int32_t device;
};
static_assert(sizeof(SimIpcHandle) <= kIpcHandleSize, "sim handle must fit");

}  // namespace

struct SimDeviceBackend::Event {
  Mutex mu;
  CondVar cv;
  uint64_t recorded MC_GUARDED_BY(mu) = 0;  // generation of the last record
  uint64_t reached MC_GUARDED_BY(mu) = 0;   // generation the stream has passed
  Status error MC_GUARDED_BY(mu);
};

struct SimDeviceBackend::Stream {
  struct Op {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t length = 0;
    Event* event = nullptr;  // set: an event record
    uint64_t generation = 0;
  };
  Mutex mu;
  CondVar cv;
  std::deque<Op> ops MC_GUARDED_BY(mu);
  size_t busy MC_GUARDED_BY(mu) = 0;  // ops taken but not finished
  bool stop MC_GUARDED_BY(mu) = false;
  Status error MC_GUARDED_BY(mu);     // first failed copy since the last event record
  std::thread worker;
};

SimDeviceBackend::SimDeviceBackend(int devices, int delay_us, bool npu)
    : devices_(devices), npu_(npu) {
  async_delay_us.store(delay_us);
}

SimDeviceBackend::~SimDeviceBackend() = default;  // process lifetime; mappings stay

const SimDeviceBackend::Alloc* SimDeviceBackend::FindLocked(uint64_t addr, uint64_t* base) const {
  auto it = allocs_.upper_bound(addr);
  if (it == allocs_.begin()) return nullptr;
  --it;
  if (addr >= it->first + it->second.length) return nullptr;
  *base = it->first;
  return &it->second;
}

int SimDeviceBackend::DeviceOf(const void* addr) {
  MutexLock lock(&mu_);
  uint64_t base = 0;
  const Alloc* a = FindLocked(reinterpret_cast<uint64_t>(addr), &base);
  return a ? a->device : kHostMemory;
}

int SimDeviceBackend::KindOf(const void* addr) {
  MutexLock lock(&mu_);
  uint64_t base = 0;
  const Alloc* a = FindLocked(reinterpret_cast<uint64_t>(addr), &base);
  return a == nullptr ? -1 : a->opened ? 1 : 0;
}

bool SimDeviceBackend::TouchesDevice(const void* dst, const void* src, size_t) {
  return DeviceOf(dst) != kHostMemory || DeviceOf(src) != kHostMemory;
}

Result<uint8_t*> SimDeviceBackend::Translate(const void* addr, size_t length) {
  MutexLock lock(&mu_);
  uint64_t base = 0;
  auto a64 = reinterpret_cast<uint64_t>(addr);
  const Alloc* a = FindLocked(a64, &base);
  if (a == nullptr) return reinterpret_cast<uint8_t*>(const_cast<void*>(addr));
  if (a64 + length > base + a->length) {
    return Status::InvalidArgument("simulated device: copy range leaves its allocation");
  }
  return a->alias + (a64 - base);
}

Result<void*> SimDeviceBackend::Malloc(int device, size_t length) {
  if (device < 0 || device >= devices_) {
    return Status::InvalidArgument("simulated device " + std::to_string(device) +
                                   " does not exist");
  }
  if (length == 0) return Status::InvalidArgument("simulated device: length 0");
  int fd = ::memfd_create("mc-sim-device", MFD_CLOEXEC);
  if (fd < 0) return ErrnoStatus("memfd_create", errno);
  if (::ftruncate(fd, static_cast<off_t>(length)) != 0) {
    Status s = ErrnoStatus("ftruncate", errno);
    ::close(fd);
    return s;
  }
  void* user = ::mmap(nullptr, length, PROT_NONE, MAP_SHARED, fd, 0);
  void* alias = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (user == MAP_FAILED || alias == MAP_FAILED) {
    Status s = ErrnoStatus("mmap simulated device memory", errno);
    if (user != MAP_FAILED) ::munmap(user, length);
    if (alias != MAP_FAILED) ::munmap(alias, length);
    ::close(fd);
    return s;
  }
  MutexLock lock(&mu_);
  allocs_[reinterpret_cast<uint64_t>(user)] =
      Alloc{length, device, fd, static_cast<uint8_t*>(alias), false};
  return user;
}

Status SimDeviceBackend::Free(void* ptr) {
  Alloc a{};
  {
    MutexLock lock(&mu_);
    auto it = allocs_.find(reinterpret_cast<uint64_t>(ptr));
    if (it == allocs_.end() || it->second.opened) {
      return Status::InvalidArgument("simulated device: free of an address it did not allocate");
    }
    a = it->second;
    allocs_.erase(it);
  }
  ::munmap(ptr, a.length);
  ::munmap(a.alias, a.length);
  ::close(a.fd);
  return Status::OK();
}

Result<void*> SimDeviceBackend::MallocHost(size_t length) {
  void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return ErrnoStatus("mmap pinned host memory", errno);
  MutexLock lock(&mu_);
  pinned_[reinterpret_cast<uint64_t>(p)] = length;
  pinned_buffers.fetch_add(1);
  return p;
}

Status SimDeviceBackend::FreeHost(void* ptr) {
  size_t length = 0;
  {
    MutexLock lock(&mu_);
    auto it = pinned_.find(reinterpret_cast<uint64_t>(ptr));
    if (it == pinned_.end()) {
      return Status::InvalidArgument("simulated device: FreeHost of memory not from MallocHost");
    }
    length = it->second;
    pinned_.erase(it);
  }
  pinned_buffers.fetch_sub(1);
  ::munmap(ptr, length);
  return Status::OK();
}

thread_local int SimDeviceBackend::current_device_ = 0;

Status SimDeviceBackend::SetDevice(int device) {
  if (device < 0 || device >= devices_) {
    return Status::InvalidArgument("simulated device " + std::to_string(device) +
                                   " does not exist");
  }
  current_device_ = device;
  return Status::OK();
}

int SimDeviceBackend::CurrentDevice() { return current_device_; }

Status SimDeviceBackend::CountCopy() {
  int64_t left = fail_after_copies.load();
  while (left >= 0) {
    if (left == 0) return Status::Internal("simulated device: injected copy failure");
    if (fail_after_copies.compare_exchange_weak(left, left - 1)) break;
  }
  return Status::OK();
}

Status SimDeviceBackend::DoCopy(void* dst, const void* src, size_t length) {
  MC_RETURN_IF_ERROR(CountCopy());
  if (npu_) {
    int d = KindOf(dst), s = KindOf(src);
    if ((d == 1 && s < 0) || (s == 1 && d < 0)) {
      // ACL: memory imported by aclrtIpcMemImportByKey takes device-to-device copies only.
      return Status::InvalidArgument(
          "simulated NPU: memory imported from another process copies device to device only");
    }
  }
  MC_ASSIGN_OR_RETURN(uint8_t * d, Translate(dst, length));
  MC_ASSIGN_OR_RETURN(uint8_t * s, Translate(src, length));
  // One simulated copy engine: copies into device memory are ordered as the device orders
  // them. (Without it, TSan sees two threads of a target, e.g. mp_peer's command loop and its
  // staging stream, write one buffer with only the peers' messages, invisible to it, between.)
  MutexLock engine(&copy_engine_mu_);
  std::memmove(d, s, length);
  copied_bytes.fetch_add(length);
  return Status::OK();
}

Status SimDeviceBackend::Copy(void* dst, const void* src, size_t length) {
  sync_copies.fetch_add(1);
  return DoCopy(dst, src, length);
}

Result<StreamHandle> SimDeviceBackend::CreateStream() {
  auto* s = new Stream;
  s->worker = std::thread([this, s] {
    for (;;) {
      Stream::Op op;
      {
        MutexLock lock(&s->mu);
        while (!s->stop && s->ops.empty()) s->cv.Wait(&s->mu);
        if (s->ops.empty()) return;
        op = s->ops.front();
        s->ops.pop_front();
        ++s->busy;
      }
      if (op.event != nullptr) {
        Status err;
        {
          MutexLock lock(&s->mu);
          err = s->error;  // failures since the previous record surface here, once
          s->error = Status::OK();
        }
        MutexLock elock(&op.event->mu);
        op.event->reached = std::max(op.event->reached, op.generation);
        op.event->error = err;
        op.event->cv.SignalAll();
      } else {
        int delay = async_delay_us.load();
        if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
        Status st = DoCopy(op.dst, op.src, op.length);
        if (!st.ok()) {
          MutexLock g(&s->mu);
          if (s->error.ok()) s->error = st;
        }
      }
      MutexLock lock(&s->mu);
      --s->busy;
      s->cv.SignalAll();
    }
  });
  return static_cast<StreamHandle>(s);
}

void SimDeviceBackend::DestroyStream(StreamHandle h) {
  auto* s = static_cast<Stream*>(h);
  if (s == nullptr) return;
  {
    MutexLock lock(&s->mu);
    s->stop = true;
  }
  s->cv.SignalAll();
  s->worker.join();
  delete s;
}

Status SimDeviceBackend::CopyAsync(void* dst, const void* src, size_t length, StreamHandle h) {
  auto* s = static_cast<Stream*>(h);
  async_copies.fetch_add(1);
  MutexLock lock(&s->mu);
  s->ops.push_back({dst, src, length, nullptr, 0});
  int depth = static_cast<int>(s->ops.size() + s->busy);
  int seen = max_stream_depth.load();
  while (depth > seen && !max_stream_depth.compare_exchange_weak(seen, depth)) {
  }
  s->cv.SignalAll();
  return Status::OK();
}

Status SimDeviceBackend::StreamSynchronize(StreamHandle h) {
  auto* s = static_cast<Stream*>(h);
  MutexLock lock(&s->mu);
  while (!s->ops.empty() || s->busy != 0) s->cv.Wait(&s->mu);
  Status err = s->error;
  s->error = Status::OK();
  return err;
}

Result<EventHandle> SimDeviceBackend::CreateEvent() { return static_cast<EventHandle>(new Event); }

void SimDeviceBackend::DestroyEvent(EventHandle e) { delete static_cast<Event*>(e); }

Status SimDeviceBackend::RecordEvent(EventHandle eh, StreamHandle sh) {
  auto* e = static_cast<Event*>(eh);
  auto* s = static_cast<Stream*>(sh);
  uint64_t gen;
  {
    MutexLock elock(&e->mu);
    gen = ++e->recorded;
  }
  MutexLock lock(&s->mu);
  s->ops.push_back({nullptr, nullptr, 0, e, gen});
  s->cv.SignalAll();
  return Status::OK();
}

Status SimDeviceBackend::EventSynchronize(EventHandle eh) {
  auto* e = static_cast<Event*>(eh);
  MutexLock lock(&e->mu);
  uint64_t want = e->recorded;
  while (e->reached < want) e->cv.Wait(&e->mu);
  return e->error;
}

Result<IpcExport> SimDeviceBackend::IpcExportRange(void* addr) {
  MutexLock lock(&mu_);
  uint64_t base = 0;
  const Alloc* a = FindLocked(reinterpret_cast<uint64_t>(addr), &base);
  if (a == nullptr || a->opened) {
    return Status::InvalidArgument("IPC export: address is not simulated device memory");
  }
  SimIpcHandle h{};
  std::memcpy(h.magic, kSimMagic, sizeof(kSimMagic));
  h.pid = static_cast<uint32_t>(::getpid());
  h.fd = a->fd;
  h.length = a->length;
  h.device = a->device;
  IpcExport out;
  std::memcpy(out.handle.bytes, &h, sizeof(h));
  out.offset = reinterpret_cast<uint64_t>(addr) - base;
  return out;
}

Result<void*> SimDeviceBackend::IpcOpen(const IpcHandle& handle, int) {
  SimIpcHandle h;
  std::memcpy(&h, handle.bytes, sizeof(h));
  if (std::memcmp(h.magic, kSimMagic, sizeof(kSimMagic)) != 0) {
    return Status::InvalidArgument("IPC open: not a simulated device handle");
  }
  if (h.pid == static_cast<uint32_t>(::getpid())) {
    // As cudaIpcOpenMemHandle: a process cannot open its own handles.
    return Status::InvalidArgument("IPC open: the handle belongs to this process");
  }
  std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("IPC open " + path, errno);
  void* user = ::mmap(nullptr, h.length, PROT_NONE, MAP_SHARED, fd, 0);
  void* alias = ::mmap(nullptr, h.length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (user == MAP_FAILED || alias == MAP_FAILED) {
    Status s = ErrnoStatus("IPC mmap " + path, errno);
    if (user != MAP_FAILED) ::munmap(user, h.length);
    if (alias != MAP_FAILED) ::munmap(alias, h.length);
    ::close(fd);
    return s;
  }
  MutexLock lock(&mu_);
  allocs_[reinterpret_cast<uint64_t>(user)] =
      Alloc{h.length, h.device, fd, static_cast<uint8_t*>(alias), true};
  open_ipc_mappings.fetch_add(1);
  return user;
}

Status SimDeviceBackend::IpcClose(void* base) {
  Alloc a{};
  {
    MutexLock lock(&mu_);
    auto it = allocs_.find(reinterpret_cast<uint64_t>(base));
    if (it == allocs_.end() || !it->second.opened) {
      return Status::InvalidArgument("IPC close: not an address IpcOpen returned");
    }
    a = it->second;
    allocs_.erase(it);
  }
  open_ipc_mappings.fetch_sub(1);
  ::munmap(base, a.length);
  ::munmap(a.alias, a.length);
  ::close(a.fd);
  return Status::OK();
}

}  // namespace mooncake::platform
