#include "platform/device.h"

#include <glog/logging.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "common/device_env.h"
#include "platform/device_backends.h"

namespace mooncake::platform {
namespace {

std::atomic<DeviceBackend*> g_backend{nullptr};
Mutex g_backend_mu;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string IpcHandleToHex(const IpcHandle& h) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out(2 * kIpcHandleSize, '0');
  for (size_t i = 0; i < kIpcHandleSize; ++i) {
    out[2 * i] = kDigits[h.bytes[i] >> 4];
    out[2 * i + 1] = kDigits[h.bytes[i] & 15];
  }
  return out;
}

Result<IpcHandle> IpcHandleFromHex(const std::string& hex) {
  if (hex.size() != 2 * kIpcHandleSize) {
    return Status::InvalidArgument("IPC handle must be " + std::to_string(2 * kIpcHandleSize) +
                                   " hex digits, got " + std::to_string(hex.size()));
  }
  IpcHandle h;
  for (size_t i = 0; i < kIpcHandleSize; ++i) {
    int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return Status::InvalidArgument("IPC handle has a non-hex digit");
    h.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return h;
}

// Backends live as long as the process (never destroyed: a vendor runtime must not be torn
// down under threads that may still use it at exit).
namespace {

DeviceBackend* CudaBackendOnce() {
  static DeviceBackend* b = MakeCudaBackend().release();
  return b;
}
DeviceBackend* AscendBackendOnce() {
  static DeviceBackend* b = MakeAscendBackend().release();
  return b;
}

// The process backend when neither CUDA nor Ascend is usable: every call that needs a device
// fails with both reasons (so a tool's --gpu_id / --device_logicid names what to install for
// either). It has no location prefix: cuda:N and npu:N each report their own runtime's reason.
class NoDeviceBackend final : public DeviceBackend {
 public:
  explicit NoDeviceBackend(Status why) : why_(std::move(why)) {}
  const char* name() const override { return "none"; }
  const char* location_prefix() const override { return ""; }
  Status Available() override { return why_; }
  int DeviceCount() override { return 0; }
  int DeviceOf(const void*) override { return kHostMemory; }
  Result<void*> Malloc(int, size_t) override { return why_; }
  Status Free(void*) override { return why_; }
  Result<void*> MallocHost(size_t) override { return why_; }
  Status FreeHost(void*) override { return why_; }
  Status SetDevice(int) override { return why_; }
  int CurrentDevice() override { return 0; }
  Status Copy(void*, const void*, size_t) override { return why_; }
  Result<StreamHandle> CreateStream() override { return why_; }
  void DestroyStream(StreamHandle) override {}
  Status CopyAsync(void*, const void*, size_t, StreamHandle) override { return why_; }
  Status StreamSynchronize(StreamHandle) override { return why_; }
  Result<EventHandle> CreateEvent() override { return why_; }
  void DestroyEvent(EventHandle) override {}
  Status RecordEvent(EventHandle, StreamHandle) override { return why_; }
  Status EventSynchronize(EventHandle) override { return why_; }
  Result<IpcExport> IpcExportRange(void*) override { return why_; }
  Result<void*> IpcOpen(const IpcHandle&, int) override { return why_; }
  Status IpcClose(void*) override { return why_; }

 private:
  const Status why_;
};

// Chooses the process backend when none is chosen yet.
DeviceBackend* ChooseLocked(const std::string& prefix) MC_REQUIRES(g_backend_mu) {
  DeviceBackend* b = g_backend.load(std::memory_order_acquire);
  if (b != nullptr) return b;
  DeviceEnvironment env = ReadDeviceEnvironment();
  if (env.simulate) {
    LOG(INFO) << "MC_DEVICE_SIM is set: device memory is simulated (" << env.sim_devices << " "
              << (env.sim_npu ? "NPUs, npu:N" : "devices, cuda:N") << ")";
    b = new SimDeviceBackend(env.sim_devices, env.sim_delay_us, env.sim_npu);
  } else if (prefix == "npu") {
    b = AscendBackendOnce();
  } else if (prefix == "cuda") {
    b = CudaBackendOnce();
  } else if (CudaBackendOnce()->Available().ok()) {
    b = CudaBackendOnce();
  } else if (AscendBackendOnce()->Available().ok()) {
    b = AscendBackendOnce();
  } else {
    b = new NoDeviceBackend(Status::FailedPrecondition(
        "no device runtime is usable: " + CudaBackendOnce()->Available().message() + "; " +
        AscendBackendOnce()->Available().message()));
  }
  g_backend.store(b, std::memory_order_release);
  return b;
}

}  // namespace

DeviceBackend& Devices() {
  DeviceBackend* b = g_backend.load(std::memory_order_acquire);
  if (b != nullptr) return *b;
  MutexLock lock(&g_backend_mu);
  return *ChooseLocked("");
}

Result<DeviceBackend*> SelectDeviceKind(const std::string& prefix) {
  if (prefix != "cuda" && prefix != "npu") {
    return Status::InvalidArgument("unknown device kind '" + prefix + "' (cuda or npu)");
  }
  DeviceBackend* b = nullptr;
  {
    MutexLock lock(&g_backend_mu);
    b = ChooseLocked(prefix);
  }
  if (prefix == b->location_prefix()) {
    MC_RETURN_IF_ERROR(b->Available());
    return b;
  }
  DeviceBackend* wanted = prefix == "npu" ? AscendBackendOnce() : CudaBackendOnce();
  if (b->Available().ok()) {
    return Status::FailedPrecondition(
        std::string("this process already uses ") + b->name() + " device memory (" +
        b->location_prefix() + ":N); " + prefix +
        ":N memory cannot be used beside it (one device runtime per process)");
  }
  MC_RETURN_IF_ERROR(wanted->Available());
  return Status::FailedPrecondition(std::string("device backend ") + b->name() +
                                    " was chosen first and is unusable here");
}

void UseSimulatedDevicesForTesting(int devices, bool npu) {
  MutexLock lock(&g_backend_mu);
  g_backend.store(new SimDeviceBackend(devices, 0, npu),
                  std::memory_order_release);  // old one leaks
}

Status ResolveLocation(const std::string& location, const void* addr, int* device) {
  *device = kHostMemory;
  if (location == "*") {
    DeviceBackend& d = Devices();
    if (d.Available().ok()) *device = d.DeviceOf(addr);
    return Status::OK();
  }
  std::string prefix;
  if (location.rfind("cuda:", 0) == 0) {
    prefix = "cuda";
  } else if (location.rfind("npu:", 0) == 0) {
    prefix = "npu";
  } else {
    return Status::OK();  // cpu:N and other host names
  }
  const std::string num = location.substr(prefix.size() + 1);
  char* end = nullptr;
  long n = std::strtol(num.c_str(), &end, 10);
  if (num.empty() || *end != '\0' || n < 0 || n > 1023) {
    return Status::InvalidArgument("location '" + location + "' is not " + prefix +
                                   ":<device number>");
  }
  auto selected = SelectDeviceKind(prefix);
  MC_RETURN_IF_ERROR(selected.status().WithContext("register memory at '" + location + "'"));
  DeviceBackend& d = **selected;
  if (n >= d.DeviceCount()) {
    return Status::InvalidArgument("location '" + location + "': this host has " +
                                   std::to_string(d.DeviceCount()) + " " + prefix +
                                   " device(s)");
  }
  int actual = d.DeviceOf(addr);
  if (actual == kHostMemory) {
    // Managed or host memory labelled cuda:N / npu:N: the CPU can touch it, so it moves as
    // host memory.
    LOG_FIRST_N(INFO, 1) << "memory registered at '" << location
                         << "' is host-accessible (managed or host memory): moved as host memory";
    return Status::OK();
  }
  if (actual != n) {
    return Status::InvalidArgument("location '" + location + "' but the address is memory of " +
                                   prefix + ":" + std::to_string(actual));
  }
  *device = actual;
  return Status::OK();
}

}  // namespace mooncake::platform
