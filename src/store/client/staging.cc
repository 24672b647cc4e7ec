#include "store/client/staging.h"

#include <glog/logging.h>
#include <linux/mman.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "mooncake/transfer_engine.h"

namespace mooncake {
namespace store {

Result<std::unique_ptr<Staging>> Staging::Create(TransferEngine* engine, size_t size,
                                                 size_t huge_page_size) {
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (huge_page_size != 0) {
    flags |= MAP_HUGETLB | (huge_page_size == (size_t{1} << 30) ? MAP_HUGE_1GB : MAP_HUGE_2MB);
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    std::string why = std::strerror(err);
    if (huge_page_size != 0) {
      why += " (the host's pool of " + std::to_string(huge_page_size >> 10) +
             " kB huge pages has too few free: see HugePages_Free in /proc/meminfo; "
             "MC_STORE_USE_HUGEPAGE asked for them)";
    }
    return Status::ResourceExhausted("cannot allocate the local buffer of " +
                                     std::to_string(size) + " bytes: " + why);
  }
  // Otherwise huge pages where the kernel gives them on request: a first touch faults in
  // 2 MiB, not 4 KiB. Not populated ahead (unlike the segment): Python's default buffer is
  // 1 GiB per client, which would then be resident whether used or not.
  if (huge_page_size == 0) (void)::madvise(p, size, MADV_HUGEPAGE);
  Status reg = engine->RegisterLocalMemory(p, size, "cpu:0", /*remote_accessible=*/false);
  if (!reg.ok()) {
    ::munmap(p, size);
    return Status::Internal("cannot register the local buffer: " + reg.ToString());
  }
  return std::unique_ptr<Staging>(new Staging(engine, static_cast<char*>(p), size));
}

Staging::Staging(TransferEngine* engine, char* base, size_t size)
    : engine_(engine), base_(base), size_(size), capacity_(size / 64 * 64),  // as the allocator rounds it
      alloc_(size, 64) {}

Staging::~Staging() { Release(); }

char* Staging::Alloc(size_t size, bool wait, std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&mu_);
  while (!released_) {
    auto off = alloc_.Allocate(size);
    if (off) return base_ + *off;
    if (!wait || !freed_.WaitUntil(&mu_, deadline)) return nullptr;
  }
  return nullptr;
}

void Staging::Free(char* p) {
  {
    MutexLock lock(&mu_);
    alloc_.Free(static_cast<uint64_t>(p - base_));
  }
  freed_.SignalAll();
}

void Staging::Release() {
  {
    MutexLock lock(&mu_);
    if (released_) return;
    released_ = true;
  }
  freed_.SignalAll();
  Status s = engine_->UnregisterLocalMemory(base_);
  // Still in use by a transfer that did not end: leak it rather than free it under one.
  if (s.ok()) ::munmap(base_, size_);
  else LOG(WARNING) << "store close: the local buffer stays allocated: " << s.ToString();
}

}  // namespace store
}  // namespace mooncake
