#include "managed_buffer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace mooncake {
namespace pyapi {
namespace {

size_t RoundToPages(size_t length) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (length + page - 1) / page * page;
}

}  // namespace

// Arenas and dedicated buffers are the engine's shareable memory (memfd): a same-host peer
// maps them and copies with memcpy. The engine unmaps them when it is destroyed.
ManagedBufferPool::~ManagedBufferPool() = default;

int ManagedBufferPool::ClassOf(size_t length) {
  if (length > kMaxClass) return -1;
  int cls = 0;
  for (size_t size = kMinClass; size < length; size <<= 1) ++cls;
  return cls;
}

Result<uintptr_t> ManagedBufferPool::Carve(TransferEngine& engine, int cls) {
  const size_t size = kMinClass << cls;
  if (arenas_.empty() || kArenaSize - arena_used_ < size) {
    auto shared = engine.AllocateSharedMemory(kArenaSize, "*");
    if (!shared.ok()) return shared.status().WithContext("allocate a managed-buffer arena");
    void* base = *shared;
    arenas_.push_back({base, kArenaSize});
    arena_used_ = 0;
  }
  uintptr_t addr = reinterpret_cast<uintptr_t>(arenas_.back().base) + arena_used_;
  arena_used_ += size;
  return addr;
}

Result<uintptr_t> ManagedBufferPool::Allocate(TransferEngine& engine, size_t length) {
  if (length == 0) return Status::InvalidArgument("length is 0");
  const int cls = ClassOf(length);
  std::lock_guard lock(mu_);
  if (cls < 0) {
    const size_t size = RoundToPages(length);
    auto shared = engine.AllocateSharedMemory(size, "*");
    if (!shared.ok()) return shared.status().WithContext("allocate a dedicated managed buffer");
    void* base = *shared;
    auto addr = reinterpret_cast<uintptr_t>(base);
    dedicated_[addr] = {base, size};
    live_[addr] = -1;
    return addr;
  }
  uintptr_t addr = 0;
  if (!free_[cls].empty()) {
    addr = free_[cls].back();
    free_[cls].pop_back();
  } else {
    MC_ASSIGN_OR_RETURN(addr, Carve(engine, cls));
  }
  live_[addr] = cls;
  return addr;
}

Status ManagedBufferPool::Free(TransferEngine& engine, uintptr_t addr, size_t length) {
  std::lock_guard lock(mu_);
  auto it = live_.find(addr);
  if (it == live_.end()) {
    return Status::NotFound("address " + std::to_string(addr) +
                            " was not returned by allocate_managed_buffer, or is freed already");
  }
  const int cls = it->second;
  if (ClassOf(length) != cls) {
    return Status::InvalidArgument("length " + std::to_string(length) +
                                   " does not match the length this block was allocated with");
  }
  if (cls >= 0) {
    free_[cls].push_back(addr);
    live_.erase(it);
    return Status::OK();
  }
  Mapping m = dedicated_.at(addr);
  MC_RETURN_IF_ERROR(engine.FreeSharedMemory(m.base));
  dedicated_.erase(addr);
  live_.erase(it);
  return Status::OK();
}

}  // namespace pyapi
}  // namespace mooncake
