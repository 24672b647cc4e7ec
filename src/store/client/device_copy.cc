#include "store/client/device_copy.h"

#include <cstring>

#include "platform/device.h"

namespace mooncake {
namespace store {

bool DeviceMemoryPossible() {
  static const bool possible = platform::Devices().Available().ok();
  return possible;
}

bool IsDeviceMemory(const void* p) {
  return DeviceMemoryPossible() && platform::Devices().DeviceOf(p) != platform::kHostMemory;
}

Status CopyBytes(void* dst, const void* src, size_t n) {
  if (n == 0) return Status::OK();
  return CopyKnown(IsDeviceMemory(dst) || IsDeviceMemory(src), dst, src, n);
}

Status CopyKnown(bool device, void* dst, const void* src, size_t n) {
  if (device) return platform::Devices().Copy(dst, src, n);
  std::memcpy(dst, src, n);
  return Status::OK();
}

}  // namespace store
}  // namespace mooncake
