// MemoryTable: the UCX memory handle of every registered range, and its packed remote key.
//
// Map() gives a range a handle (ucp_mem_map of the existing memory, with the CUDA memory type
// for device memory) and packs its remote key; Unmap() releases both, after which no peer's
// key for the range works on lanes that enforce keys (ib, rc, dc: the NIC refuses the
// access; see README.md for the software lanes). Find() returns the handle of the range
// holding a local address, for the data path. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/thread_annotations.h"
#include "engine/memory_registry.h"
#include "transport/ucx/ucx_api.h"

namespace mooncake::ucx {

class MemoryTable {
 public:
  MemoryTable(const UcxApi* api, ucp_context_h context, bool cuda_memory)
      : api_(api), context_(context), cuda_memory_(cuda_memory) {}
  ~MemoryTable();  // unmaps what is left

  // AlreadyExists when `region.addr` is mapped already; FailedPrecondition for device memory
  // when the UCX library has no CUDA support; Unavailable with UCX's words otherwise.
  Status Map(const RegionInfo& region);
  void Unmap(uint64_t addr);
  // The hex packed key of the range starting at `addr`, or "".
  std::string PackedKey(uint64_t addr) const;
  // The handle of the range containing [addr, addr + len), or nullptr.
  ucp_mem_h Find(uint64_t addr, uint64_t len) const;

 private:
  struct Entry {
    uint64_t length;
    ucp_mem_h memh;
    std::string rkey_hex;
  };
  const UcxApi* const api_;
  const ucp_context_h context_;
  const bool cuda_memory_;
  mutable RwMutex mu_;
  std::map<uint64_t, Entry> entries_ MC_GUARDED_BY(mu_);  // by start address
};

std::string ToHex(const void* data, size_t size);
// False when `hex` is not an even number of hex digits (the descriptor decoder checks this).
bool FromHex(const std::string& hex, std::string* out);

}  // namespace mooncake::ucx
