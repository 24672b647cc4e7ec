#include "transport/ucx/ucx_memory.h"

#include <mutex>

namespace mooncake::ucx {

std::string ToHex(const void* data, size_t size) {
  static const char kDigits[] = "0123456789abcdef";
  const auto* p = static_cast<const uint8_t*>(data);
  std::string out(size * 2, '0');
  for (size_t i = 0; i < size; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

bool FromHex(const std::string& hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  out->resize(hex.size() / 2);
  for (size_t i = 0; i < out->size(); ++i) {
    int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<char>(hi << 4 | lo);
  }
  return true;
}

MemoryTable::~MemoryTable() {
  WriterLock lock(&mu_);
  for (auto& [addr, e] : entries_) api_->mem_unmap(context_, e.memh);
  entries_.clear();
}

Status MemoryTable::Map(const RegionInfo& region) {
  {
    ReaderLock lock(&mu_);
    if (entries_.count(region.addr)) {
      return Status::AlreadyExists("UCX: a range at this address is mapped already");
    }
  }
  if (region.device >= 0 && !cuda_memory_) {
    return Status::FailedPrecondition("UCX " + api_->Version() +
                                      " here was built without CUDA: device memory stays on "
                                      "the staging paths");
  }
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  p.address = reinterpret_cast<void*>(region.addr);
  p.length = region.length;
  if (region.device >= 0) {
    p.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    p.memory_type = UCS_MEMORY_TYPE_CUDA;
  }
  ucp_mem_h memh = nullptr;
  ucs_status_t st = api_->mem_map(context_, &p, &memh);
  if (st != UCS_OK) return api_->Error("ucp_mem_map of " + std::to_string(region.length) + " bytes", st);
  void* packed = nullptr;
  size_t packed_size = 0;
  st = api_->rkey_pack(context_, memh, &packed, &packed_size);
  if (st != UCS_OK) {
    api_->mem_unmap(context_, memh);
    return api_->Error("ucp_rkey_pack", st);
  }
  std::string hex = ToHex(packed, packed_size);
  api_->rkey_buffer_release(packed);
  bool inserted;
  {
    WriterLock lock(&mu_);
    inserted = entries_.emplace(region.addr, Entry{region.length, memh, std::move(hex)}).second;
  }
  if (!inserted) {  // a racing Map of the same address won
    api_->mem_unmap(context_, memh);
    return Status::AlreadyExists("UCX: a range at this address is mapped already");
  }
  return Status::OK();
}

void MemoryTable::Unmap(uint64_t addr) {
  ucp_mem_h memh = nullptr;
  {
    WriterLock lock(&mu_);
    auto it = entries_.find(addr);
    if (it == entries_.end()) return;
    memh = it->second.memh;
    entries_.erase(it);
  }
  api_->mem_unmap(context_, memh);
}

std::string MemoryTable::PackedKey(uint64_t addr) const {
  ReaderLock lock(&mu_);
  auto it = entries_.find(addr);
  return it == entries_.end() ? std::string() : it->second.rkey_hex;
}

ucp_mem_h MemoryTable::Find(uint64_t addr, uint64_t len) const {
  ReaderLock lock(&mu_);
  auto it = entries_.upper_bound(addr);
  if (it == entries_.begin()) return nullptr;
  --it;
  if (addr + len < addr || addr + len > it->first + it->second.length) return nullptr;
  return it->second.memh;
}

}  // namespace mooncake::ucx
