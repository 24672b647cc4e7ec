// Copies between the caller's memory and the client's own host memory (its segment, its
// staging buffer, its hot cache) where the caller's memory may be device memory (a CUDA
// tensor, NPU memory): the CPU must never touch that, so such copies go through the device
// backend (platform/device.h). On a host with no usable device runtime nothing can be device
// memory, and a copy is a plain memcpy after one cached check.
#pragma once

#include <cstddef>

#include "mooncake/status.h"

namespace mooncake {
namespace store {

// Whether this process has a usable device backend (decided once, at the first call).
bool DeviceMemoryPossible();

// Whether p is device memory (false at once where DeviceMemoryPossible() is false).
bool IsDeviceMemory(const void* p);

// Copies n bytes from src to dst (non-overlapping), either of which may be device memory.
// Fails only for a failed device copy (its reason).
Status CopyBytes(void* dst, const void* src, size_t n);
// The same when the caller knows already whether an end is device memory (`device`).
Status CopyKnown(bool device, void* dst, const void* src, size_t n);

}  // namespace store
}  // namespace mooncake
