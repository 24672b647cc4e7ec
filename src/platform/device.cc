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
std::mutex g_backend_mu;

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

// The backend lives as long as the process (never destroyed: the CUDA runtime must not be
// torn down under threads that may still use it at exit).
DeviceBackend& Devices() {
  DeviceBackend* b = g_backend.load(std::memory_order_acquire);
  if (b != nullptr) return *b;
  std::lock_guard lock(g_backend_mu);
  b = g_backend.load(std::memory_order_acquire);
  if (b == nullptr) {
    DeviceEnvironment env = ReadDeviceEnvironment();
    if (env.simulate) {
      LOG(INFO) << "MC_DEVICE_SIM is set: device memory is simulated (" << env.sim_devices
                << " devices)";
      b = new SimDeviceBackend(env.sim_devices, env.sim_delay_us);
    } else {
      b = MakeCudaBackend().release();
    }
    g_backend.store(b, std::memory_order_release);
  }
  return *b;
}

void UseSimulatedDevicesForTesting(int devices) {
  std::lock_guard lock(g_backend_mu);
  g_backend.store(new SimDeviceBackend(devices), std::memory_order_release);  // old one leaks
}

Status ResolveLocation(const std::string& location, const void* addr, int* device) {
  *device = kHostMemory;
  if (location == "*") {
    DeviceBackend& d = Devices();
    if (d.Available().ok()) *device = d.DeviceOf(addr);
    return Status::OK();
  }
  if (location.rfind("cuda:", 0) != 0) return Status::OK();  // cpu:N and other host names
  const std::string num = location.substr(5);
  char* end = nullptr;
  long n = std::strtol(num.c_str(), &end, 10);
  if (num.empty() || *end != '\0' || n < 0 || n > 1023) {
    return Status::InvalidArgument("location '" + location + "' is not cuda:<device number>");
  }
  DeviceBackend& d = Devices();
  MC_RETURN_IF_ERROR(d.Available().WithContext("register memory at '" + location + "'"));
  if (n >= d.DeviceCount()) {
    return Status::InvalidArgument("location '" + location + "': this host has " +
                                   std::to_string(d.DeviceCount()) + " CUDA device(s)");
  }
  int actual = d.DeviceOf(addr);
  if (actual == kHostMemory) {
    // Managed or host memory labelled cuda:N: the CPU can touch it, so it moves as host memory.
    LOG_FIRST_N(INFO, 1) << "memory registered at '" << location
                         << "' is host-accessible (managed or host memory): moved as host memory";
    return Status::OK();
  }
  if (actual != n) {
    return Status::InvalidArgument("location '" + location + "' but the address is memory of cuda:" +
                                   std::to_string(actual));
  }
  *device = actual;
  return Status::OK();
}

}  // namespace mooncake::platform
