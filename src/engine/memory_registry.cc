#include "engine/memory_registry.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <sstream>
#include <thread>

namespace mooncake {
namespace {

std::string Hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

Status CheckRange(uint64_t addr, uint64_t length) {
  if (addr == 0) return Status::InvalidArgument("address is null");
  if (length == 0) return Status::InvalidArgument("length is 0 at " + Hex(addr));
  if (addr + length < addr) {
    return Status::InvalidArgument("range " + Hex(addr) + " + " + std::to_string(length) +
                                   " wraps around the address space");
  }
  return Status::OK();
}

}  // namespace

long MemoryRegistry::FindLocked(uint64_t addr) const {
  auto it = std::upper_bound(regions_.begin(), regions_.end(), addr,
                             [](uint64_t a, const auto& r) { return a < r->begin; });
  return static_cast<long>(it - regions_.begin()) - 1;
}

bool MemoryRegistry::OverlapsLocked(uint64_t addr, uint64_t length) const {
  long i = FindLocked(addr);
  if (i >= 0 && regions_[i]->end() > addr) return true;
  size_t next = static_cast<size_t>(i + 1);
  return next < regions_.size() && regions_[next]->begin < addr + length;
}

void MemoryRegistry::InsertLocked(std::unique_ptr<MemoryRegion> region) {
  auto it = std::upper_bound(regions_.begin(), regions_.end(), region->begin,
                             [](uint64_t a, const auto& r) { return a < r->begin; });
  regions_.insert(it, std::move(region));
}

Status MemoryRegistry::Add(uint64_t addr, uint64_t length, const std::string& location,
                           bool remote_accessible) {
  return AddBatch({RegionInfo{addr, length, location, remote_accessible}});
}

Status MemoryRegistry::AddBatch(const std::vector<RegionInfo>& regions) {
  for (const auto& r : regions) MC_RETURN_IF_ERROR(CheckRange(r.addr, r.length));
  std::vector<RegionInfo> sorted = regions;
  std::sort(sorted.begin(), sorted.end(),
            [](const RegionInfo& a, const RegionInfo& b) { return a.addr < b.addr; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1].addr + sorted[i - 1].length > sorted[i].addr) {
      return Status::AlreadyExists("ranges in the same call overlap at " + Hex(sorted[i].addr));
    }
  }
  sorted = regions;  // insert in call order: sequence numbers follow the caller's order
  std::unique_lock lock(mu_);
  for (const auto& r : sorted) {
    if (OverlapsLocked(r.addr, r.length)) {
      return Status::AlreadyExists("range " + Hex(r.addr) + " + " + std::to_string(r.length) +
                                   " overlaps memory already registered; unregister it first");
    }
  }
  for (const auto& r : sorted) {
    auto region = std::make_unique<MemoryRegion>();
    region->begin = r.addr;
    region->length = r.length;
    region->location = r.location;
    region->remote_accessible = r.remote_accessible;
    region->sequence = next_sequence_++;
    region->shared_fd = r.shared_fd;
    region->device = r.device;
    region->ipc_handle = r.ipc_handle;
    region->ipc_offset = r.ipc_offset;
    InsertLocked(std::move(region));
  }
  version_.fetch_add(1, std::memory_order_acq_rel);
  return Status::OK();
}

Status MemoryRegistry::Remove(uint64_t addr, int wait_ms) {
  MemoryRegion* region = nullptr;
  {
    std::unique_lock lock(mu_);
    long i = FindLocked(addr);
    if (i < 0 || regions_[i]->begin != addr) {
      return Status::NotFound(Hex(addr) + " is not the start of a registered buffer");
    }
    region = regions_[i].get();
    if (region->removing) {
      return Status::FailedPrecondition("buffer " + Hex(addr) +
                                        " is already being unregistered by another call");
    }
    region->removing = true;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  while (region->users.load(std::memory_order_acquire) != 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::unique_lock lock(mu_);
  int64_t users = region->users.load(std::memory_order_acquire);
  if (users != 0) {
    region->removing = false;
    return Status::FailedPrecondition("buffer " + Hex(addr) + " is still used by " +
                                      std::to_string(users) +
                                      " transfer(s); it stays registered");
  }
  long i = FindLocked(addr);  // the table may have shifted while we waited
  regions_.erase(regions_.begin() + i);
  version_.fetch_add(1, std::memory_order_acq_rel);
  return Status::OK();
}

MemoryRegion* MemoryRegistry::Pin(uint64_t addr, uint64_t len, bool remote_only) {
  if (len == 0 || addr + len < addr) return nullptr;
  std::shared_lock lock(mu_);
  long i = FindLocked(addr);
  if (i < 0) return nullptr;
  MemoryRegion* r = regions_[i].get();
  if (addr + len > r->end() || r->removing) return nullptr;
  if (remote_only && !r->remote_accessible) return nullptr;
  r->users.fetch_add(1, std::memory_order_acq_rel);
  return r;
}

bool MemoryRegistry::Contains(uint64_t addr, uint64_t len) const {
  if (len == 0 || addr + len < addr) return false;
  std::shared_lock lock(mu_);
  long i = FindLocked(addr);
  return i >= 0 && addr + len <= regions_[i]->end() && !regions_[i]->removing;
}

std::vector<RegionInfo> MemoryRegistry::List() const {
  std::shared_lock lock(mu_);
  std::vector<const MemoryRegion*> order;
  order.reserve(regions_.size());
  for (const auto& r : regions_) {
    if (!r->removing) order.push_back(r.get());
  }
  std::sort(order.begin(), order.end(),
            [](const MemoryRegion* a, const MemoryRegion* b) { return a->sequence < b->sequence; });
  std::vector<RegionInfo> out;
  out.reserve(order.size());
  for (const MemoryRegion* r : order) {
    out.push_back({r->begin, r->length, r->location, r->remote_accessible, r->shared_fd,
                   r->device, r->ipc_handle, r->ipc_offset});
  }
  return out;
}

size_t MemoryRegistry::size() const {
  std::shared_lock lock(mu_);
  return regions_.size();
}

}  // namespace mooncake
