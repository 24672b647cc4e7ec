// DeviceBackend: the one seam between the engine and accelerator memory (CUDA GPUs and
// Ascend NPUs).
//
// The engine, the transports and the tools reach device memory only through this interface:
// detecting whether an address is device memory, copying (synchronously, or asynchronously
// on a stream with events), allocating device memory and pinned host memory, and exporting /
// opening inter-process handles. Three implementations:
//   - cuda: loads the CUDA runtime (libcudart.so, .13, .12, .11) with dlopen at first use, so
//     one binary runs on hosts with and without a GPU; no CUDA header or library is needed to
//     build it. Without the library or a device, Available() says why, and every call that
//     needs a device returns that error.
//   - ascend: the same for Huawei Ascend NPUs through the ACL runtime (libascendcl.so, from
//     the CANN toolkit); locations "npu:N"; IPC through aclrtIpcMemGetExportKey /
//     aclrtIpcMemImportByKey. Written from CANN's documentation; never run on an NPU yet.
//   - sim: "device memory" is host memory this backend hands out (memfd mappings) and tracks.
//     Tests select it (MC_DEVICE_SIM=1 or UseSimulatedDevicesForTesting) to exercise staging,
//     pipelining and IPC logic on machines without a GPU; it can delay and fail copies. It
//     plays CUDA (MC_DEVICE_SIM=1) or Ascend (MC_DEVICE_SIM=npu: "npu:N", and ACL's rule that
//     memory imported from another process is copied device to device only).
//
// Process-wide: a vendor runtime is itself one per process, so Devices() returns one backend
// for the process, chosen at first use (SelectDeviceKind, or the first of CUDA and Ascend
// that is usable). All methods are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mooncake/status.h"

namespace mooncake::platform {

constexpr int kHostMemory = -1;
// sizeof(cudaIpcMemHandle_t); an ACL IPC key is at most 64 characters (65 with its NUL).
constexpr size_t kIpcHandleSize = 64;

struct IpcHandle {
  uint8_t bytes[kIpcHandleSize] = {};
};
// 128 lowercase hex digits, and back (InvalidArgument on anything else).
std::string IpcHandleToHex(const IpcHandle& h);
Result<IpcHandle> IpcHandleFromHex(const std::string& hex);

// A handle exported for a registered range: open it in another process to reach the range
// at (opened base + offset).
struct IpcExport {
  IpcHandle handle;
  uint64_t offset = 0;  // of the range's start from the allocation the handle names
};

// Opaque backend objects (cudaStream_t / cudaEvent_t for CUDA).
using StreamHandle = void*;
using EventHandle = void*;

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual const char* name() const = 0;  // "cuda", "ascend" or "sim"
  // The registration location's device prefix: "cuda" (cuda:N) or "npu" (npu:N).
  virtual const char* location_prefix() const { return "cuda"; }
  // Whether memory opened with IpcOpen may be copied to and from host memory (CUDA: yes;
  // ACL: device to device only, so host memory reaches a peer's NPU memory over TCP).
  virtual bool IpcCopiesWithHost() const { return true; }

  // OK when device memory can be used here; otherwise the reason, e.g. "CUDA runtime not
  // found (libcudart.so): GPU memory cannot be used on this host".
  virtual Status Available() = 0;
  virtual int DeviceCount() = 0;  // 0 when not Available()
  // The device whose memory holds `addr`, or kHostMemory (host, pinned host, managed or
  // unknown memory: all of these the CPU can touch).
  virtual int DeviceOf(const void* addr) = 0;

  virtual Result<void*> Malloc(int device, size_t length) = 0;
  virtual Status Free(void* ptr) = 0;
  // Page-locked host memory (the staging buffers of the TCP transport).
  virtual Result<void*> MallocHost(size_t length) = 0;
  virtual Status FreeHost(void* ptr) = 0;

  // Makes `device` current for the calling thread (streams and copies issued after it).
  // Malloc, IpcExportRange and IpcOpen leave the caller's current device as it was.
  virtual Status SetDevice(int device) = 0;
  virtual int CurrentDevice() = 0;  // 0 when none was set
  // Synchronous copy in any direction (host or device at either end).
  virtual Status Copy(void* dst, const void* src, size_t length) = 0;

  // Streams and events. Copies issued on one stream complete in issue order.
  virtual Result<StreamHandle> CreateStream() = 0;
  virtual void DestroyStream(StreamHandle s) = 0;
  virtual Status CopyAsync(void* dst, const void* src, size_t length, StreamHandle s) = 0;
  virtual Status StreamSynchronize(StreamHandle s) = 0;
  virtual Result<EventHandle> CreateEvent() = 0;
  virtual void DestroyEvent(EventHandle e) = 0;
  // Marks the point, on `s`, after everything issued so far.
  virtual Status RecordEvent(EventHandle e, StreamHandle s) = 0;
  // Blocks until the work before the recorded point is done; its error if a copy failed.
  virtual Status EventSynchronize(EventHandle e) = 0;

  // Inter-process handles. `addr` lies in device memory; the handle names its allocation.
  virtual Result<IpcExport> IpcExportRange(void* addr) = 0;
  // Maps a peer's allocation into this process; the same handle may be opened once only per
  // process (CUDA's rule), so callers cache the result until they close it.
  virtual Result<void*> IpcOpen(const IpcHandle& handle, int device) = 0;
  virtual Status IpcClose(void* base) = 0;
};

// The backend of this process: the simulated one when MC_DEVICE_SIM is set (or a test chose
// it); else the kind SelectDeviceKind chose; else, at first use, CUDA if usable, else Ascend
// if usable, else one whose Available() gives both runtimes' reasons.
DeviceBackend& Devices();

// Makes the backend whose location prefix is `prefix` ("cuda" or "npu") the process's, if
// none was chosen yet, and returns it when it is usable. FailedPrecondition when it is not
// (its Available() reason, e.g. "Ascend runtime not found (libascendcl.so) ... install the
// CANN toolkit and source set_env.sh"), or when the process already uses another usable
// backend (one vendor runtime per process). protocol "ascend" calls it with "npu".
Result<DeviceBackend*> SelectDeviceKind(const std::string& prefix);

// Test hook: from now on Devices() returns a simulated backend with `devices` devices
// (simulated NPUs, "npu:N", when `npu`). Call before anything uses Devices() (e.g. at the
// start of main or of a test binary).
void UseSimulatedDevicesForTesting(int devices = 2, bool npu = false);

// Parses a registration location: "cpu", "cpu:N", "*", "cuda:N", "npu:N", and other names
// (which are host memory to this engine). On success *device is kHostMemory or the device.
// "*" asks the backend. "cuda:N" / "npu:N" on a host without that runtime or device:
// FailedPrecondition naming why (SelectDeviceKind). An address the backend knows to be host
// memory (managed, pinned) is moved as host memory whatever its label.
Status ResolveLocation(const std::string& location, const void* addr, int* device);

}  // namespace mooncake::platform
