#include "managed_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace mooncake {
namespace pyapi {
namespace {

Result<void*> MapAnonymous(size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return Status::ResourceExhausted("mmap of " + std::to_string(size) +
                                     " bytes: " + std::strerror(errno));
  }
  return p;
}

size_t RoundToPages(size_t length) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (length + page - 1) / page * page;
}

}  // namespace

ManagedBufferPool::~ManagedBufferPool() {
  for (const Mapping& m : arenas_) ::munmap(m.base, m.size);
  for (const auto& [addr, m] : dedicated_) ::munmap(m.base, m.size);
}

int ManagedBufferPool::ClassOf(size_t length) {
  if (length > kMaxClass) return -1;
  int cls = 0;
  for (size_t size = kMinClass; size < length; size <<= 1) ++cls;
  return cls;
}

Result<uintptr_t> ManagedBufferPool::Carve(TransferEngine& engine, int cls) {
  const size_t size = kMinClass << cls;
  if (arenas_.empty() || kArenaSize - arena_used_ < size) {
    MC_ASSIGN_OR_RETURN(void* base, MapAnonymous(kArenaSize));
    Status s = engine.RegisterLocalMemory(base, kArenaSize, "*");
    if (!s.ok()) {
      ::munmap(base, kArenaSize);
      return s.WithContext("register a managed-buffer arena");
    }
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
    MC_ASSIGN_OR_RETURN(void* base, MapAnonymous(size));
    Status s = engine.RegisterLocalMemory(base, size, "*");
    if (!s.ok()) {
      ::munmap(base, size);
      return s.WithContext("register a dedicated managed buffer");
    }
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
  MC_RETURN_IF_ERROR(engine.UnregisterLocalMemory(m.base));
  ::munmap(m.base, m.size);
  dedicated_.erase(addr);
  live_.erase(it);
  return Status::OK();
}

}  // namespace pyapi
}  // namespace mooncake
