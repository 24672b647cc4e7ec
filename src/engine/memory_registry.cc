#include "engine/memory_registry.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
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
  WriterLock lock(&mu_);
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
  ExportSlot* slot = nullptr;
  {
    WriterLock lock(&mu_);
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
    if (region->export_slot >= 0) {
      // Peers that mapped it stop here: they copy only while the slot holds their gen
      // (seq_cst, paired with their users increment before they check it).
      slot = &export_page_[region->export_slot];
      slot->gen.store(next_gen_++, std::memory_order_seq_cst);
    }
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  auto busy = [&] {
    return region->users.load(std::memory_order_acquire) != 0 ||
           (slot && slot->users.load(std::memory_order_seq_cst) != 0);
  };
  while (busy() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  WriterLock lock(&mu_);
  int64_t users = region->users.load(std::memory_order_acquire);
  if (users != 0) {
    region->removing = false;
    return Status::FailedPrecondition("buffer " + Hex(addr) + " is still used by " +
                                      std::to_string(users) +
                                      " transfer(s); it stays registered");
  }
  if (slot) {
    const uint64_t peers = slot->users.load(std::memory_order_seq_cst);
    if (peers == 0) {
      free_slots_.push_back(static_cast<uint32_t>(region->export_slot));
    } else {
      // An honest peer is counted for one memcpy; one still counted after wait_ms is stuck
      // or hostile. The range goes anyway (what such a peer copies lands in the memfd's
      // pages, not in other memory of ours); its slot is retired, not reused.
      LOG(WARNING) << "buffer " << Hex(addr) << ": " << peers << " same-host peer(s) still "
                   << "count themselves as copying it after " << wait_ms
                   << " ms; unregistered anyway, its export slot retired";
    }
  }
  long i = FindLocked(addr);  // the table may have shifted while we waited
  regions_.erase(regions_.begin() + i);
  version_.fetch_add(1, std::memory_order_acq_rel);
  return Status::OK();
}

MemoryRegistry::~MemoryRegistry() {
  if (export_page_) ::munmap(export_page_, kExportSlots * sizeof(ExportSlot));
  if (export_fd_ >= 0) ::close(export_fd_);
}

Status MemoryRegistry::MakeExportPageLocked() {
  const size_t bytes = kExportSlots * sizeof(ExportSlot);
  int fd = ::memfd_create("mooncake-export", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::Internal(std::string("memfd_create: ") + std::strerror(errno));
  void* p = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  // Peers check the seals: a page they could lose would turn their reads into SIGBUS.
  if (p == MAP_FAILED ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int err = errno;
    if (p != MAP_FAILED) ::munmap(p, bytes);
    ::close(fd);
    return Status::Internal(std::string("export page: ") + std::strerror(err));
  }
  export_fd_ = fd;
  export_page_ = static_cast<ExportSlot*>(p);
  for (uint32_t i = kExportSlots; i-- > 0;) free_slots_.push_back(i);
  return Status::OK();
}

Result<ExportList> MemoryRegistry::Export(size_t max) {
  ExportList out;
  WriterLock lock(&mu_);
  for (const auto& r : regions_) {
    if (out.ranges.size() == max) break;
    if (r->shared_fd < 0 || !r->remote_accessible || r->removing || r->device >= 0) continue;
    if (!export_page_) {
      Status made = MakeExportPageLocked();
      if (!made.ok()) {
        for (const ExportedRange& e : out.ranges) ::close(e.fd);
        return made;
      }
    }
    if (r->export_slot < 0) {
      if (free_slots_.empty()) continue;  // lent no further: the target copies these
      r->export_slot = static_cast<int>(free_slots_.back());
      free_slots_.pop_back();
      export_page_[r->export_slot].gen.store(next_gen_++, std::memory_order_seq_cst);
    }
    int fd = ::fcntl(r->shared_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) break;  // out of descriptors: lend what we have
    const ExportSlot& s = export_page_[r->export_slot];
    out.ranges.push_back({r->begin, r->length, fd, static_cast<uint32_t>(r->export_slot),
                          s.gen.load(std::memory_order_seq_cst)});
  }
  if (!out.ranges.empty()) {
    out.page_fd = ::fcntl(export_fd_, F_DUPFD_CLOEXEC, 0);
    out.page_bytes = kExportSlots * sizeof(ExportSlot);
    if (out.page_fd < 0) {
      for (const ExportedRange& e : out.ranges) ::close(e.fd);
      out.ranges.clear();
    }
  }
  return out;
}

MemoryRegion* MemoryRegistry::PinIf(uint64_t addr, uint64_t len, bool remote_only,
                                     bool while_removing) {
  if (len == 0 || addr + len < addr) return nullptr;
  ReaderLock lock(&mu_);
  long i = FindLocked(addr);
  if (i < 0) return nullptr;
  MemoryRegion* r = regions_[i].get();
  if (addr + len > r->end() || (r->removing && !while_removing)) return nullptr;
  if (remote_only && !r->remote_accessible) return nullptr;
  r->users.fetch_add(1, std::memory_order_acq_rel);
  return r;
}

bool MemoryRegistry::Contains(uint64_t addr, uint64_t len) const {
  if (len == 0 || addr + len < addr) return false;
  ReaderLock lock(&mu_);
  long i = FindLocked(addr);
  return i >= 0 && addr + len <= regions_[i]->end() && !regions_[i]->removing;
}

std::vector<RegionInfo> MemoryRegistry::List() const {
  ReaderLock lock(&mu_);
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
  ReaderLock lock(&mu_);
  return regions_.size();
}

}  // namespace mooncake
