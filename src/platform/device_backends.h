// The backends behind Devices(): CUDA and Ascend (dlopen) and the simulated one tests use.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>

#include "common/thread_annotations.h"
#include "platform/device.h"

namespace mooncake::platform {

std::unique_ptr<DeviceBackend> MakeCudaBackend();
// The ACL runtime (libascendcl.so) loaded with dlopen at first use; ascend_backend.cc.
std::unique_ptr<DeviceBackend> MakeAscendBackend();

// Simulated devices: device memory is host memory from memfd mappings that this backend
// hands out and tracks, so DeviceOf() recognizes it and IPC handles can name it across
// processes (/proc/<pid>/fd/<n>). Like real device memory, the CPU cannot touch it: the
// address handed out is mapped PROT_NONE (a stray memcpy faults, a syscall gets EFAULT) and
// the backend's copies go through a second, private read-write mapping of the same memfd. Asynchronous copies run in order on one worker thread per
// stream, so they really overlap the caller. Knobs and counters are for tests.
// With `npu` it plays the Ascend backend: locations "npu:N", and, as ACL, memory opened from
// a peer's handle is copied device to device only (a copy between it and host memory fails).
class SimDeviceBackend final : public DeviceBackend {
 public:
  explicit SimDeviceBackend(int devices, int async_delay_us = 0, bool npu = false);
  ~SimDeviceBackend() override;

  const char* name() const override { return "sim"; }
  const char* location_prefix() const override { return npu_ ? "npu" : "cuda"; }
  bool IpcCopiesWithHost() const override { return !npu_; }
  Status Available() override { return Status::OK(); }
  int DeviceCount() override { return devices_; }
  int DeviceOf(const void* addr) override;
  Result<void*> Malloc(int device, size_t length) override;
  Status Free(void* ptr) override;
  Result<void*> MallocHost(size_t length) override;
  Status FreeHost(void* ptr) override;
  Status SetDevice(int device) override;
  int CurrentDevice() override;
  Status Copy(void* dst, const void* src, size_t length) override;
  Result<StreamHandle> CreateStream() override;
  void DestroyStream(StreamHandle s) override;
  Status CopyAsync(void* dst, const void* src, size_t length, StreamHandle s) override;
  Status StreamSynchronize(StreamHandle s) override;
  Result<EventHandle> CreateEvent() override;
  void DestroyEvent(EventHandle e) override;
  Status RecordEvent(EventHandle e, StreamHandle s) override;
  Status EventSynchronize(EventHandle e) override;
  Result<IpcExport> IpcExportRange(void* addr) override;
  Result<void*> IpcOpen(const IpcHandle& handle, int device) override;
  Status IpcClose(void* base) override;

  // Knobs (any time): every asynchronous copy sleeps this long first; after `n` more copies
  // succeed, copies fail (-1: never).
  std::atomic<int> async_delay_us{0};
  std::atomic<int64_t> fail_after_copies{-1};
  // Counters.
  std::atomic<uint64_t> sync_copies{0};
  std::atomic<uint64_t> async_copies{0};
  std::atomic<uint64_t> copied_bytes{0};
  std::atomic<int> max_stream_depth{0};  // most copies ever queued on one stream at once
  std::atomic<int> open_ipc_mappings{0};
  std::atomic<int> pinned_buffers{0};
  // A copy whose source or destination is simulated device memory of this process.
  bool TouchesDevice(const void* dst, const void* src, size_t length);

  struct Stream;
  struct Event;

 private:
  struct Alloc {
    uint64_t length;
    int device;
    int fd;          // memfd
    uint8_t* alias;  // read-write mapping of the same memfd
    bool opened;     // mapped from a peer's handle
  };
  Status CountCopy();
  const Alloc* FindLocked(uint64_t addr, uint64_t* base) const MC_REQUIRES(mu_);
  // The address the CPU may use for [addr, addr+length): the alias inside device memory, addr
  // itself for host memory. InvalidArgument for a range that leaves its allocation.
  Result<uint8_t*> Translate(const void* addr, size_t length) MC_EXCLUDES(mu_);
  Status DoCopy(void* dst, const void* src, size_t length);

  int KindOf(const void* addr) MC_EXCLUDES(mu_);  // -1 host, 0 own device memory, 1 opened from a handle
  const int devices_;
  const bool npu_;
  static thread_local int current_device_;
  mutable Mutex mu_;
  Mutex copy_engine_mu_;  // held by each copy's memmove (orders them; guards no member)
  std::map<uint64_t, Alloc> allocs_ MC_GUARDED_BY(mu_);  // base -> allocation
  std::map<uint64_t, size_t> pinned_ MC_GUARDED_BY(mu_);
};

}  // namespace mooncake::platform
