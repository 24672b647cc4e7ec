// Run-time segments (upstream's mount_segment / unmount_segment / allocate_and_mount_segment /
// unmount_and_free_segment): memory lent beside the global segment, under the client's
// segment name, mounted with the master as segments of their own (the master keys a segment
// by name and base). What keeps them safe to take away:
//   - the master unmounts first: no new replica or lease names the memory after that;
//   - the memory then leaves under layout_mu held exclusively, and every copy holds it shared
//     and checks that an address of its own segment name is still registered before it
//     touches it (Copier): a get that learned of a replica there before the unmount fails
//     that replica rather than read unmapped memory;
//   - a file mapping's range is replaced by a PROT_NONE reservation (kept until Close), so a
//     same-host peer still reading with an old lease gets EFAULT, never memory mapped there
//     later; shared memory (AllocateSegment) is the engine's memfd, whose pages a peer that
//     mapped it keeps.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "store/client/store_client_impl.h"

namespace mooncake {
namespace store {

namespace {

constexpr uint64_t kAllocUnit = 16ull << 20;  // upstream rounds allocations to its 16 MiB slabs

std::string NewSegmentId() {
  thread_local std::mt19937_64 gen{(static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                   std::random_device{}()};
  return std::to_string(gen()) + "-" + std::to_string(gen());
}

int Refuse(const std::string& why) {
  LOG(WARNING) << why;
  return ToInt(ErrorCode::INVALID_PARAMS);
}

}  // namespace

int StoreClient::Impl::MountRange(void* base, uint64_t size, bool remount) {
  rpc::MountSegmentRequest req;
  req.set_client_id(client_id);
  req.set_segment_name(seg_name);
  req.set_base(reinterpret_cast<uint64_t>(base));
  req.set_size(size);
  req.set_remount(remount);
  rpc::MountSegmentResponse resp;
  int rc = Checked("MountSegment", master->MountSegment(req, &resp));
  if (rc == 0 && resp.code() != 0) {
    LOG(WARNING) << "mount segment: " << ErrorCodeName(resp.code()) << ": " << resp.message();
    rc = resp.code();
  }
  return rc;
}

int StoreClient::Impl::UnmountRange(void* base) {
  rpc::UnmountSegmentRequest req;
  req.set_client_id(client_id);
  req.set_segment_name(seg_name);
  req.set_base(reinterpret_cast<uint64_t>(base));
  rpc::UnmountSegmentResponse resp;
  int rc = Checked("UnmountSegment", master->UnmountSegment(req, &resp));
  if (rc == 0 && resp.code() != 0 && resp.code() != ToInt(ErrorCode::SEGMENT_NOT_FOUND)) {
    rc = resp.code();
  }
  return rc;
}

int StoreClient::Impl::DropRuntime(const RuntimeSegment& seg) {
  const int rc = UnmountRange(seg.base);
  if (rc != 0) {
    // The master keeps it until this client's TTL passes (it is gone from here either way).
    LOG(WARNING) << "unmount segment at " << seg.base << ": the master did not confirm ("
                 << ErrorCodeName(rc) << "); its replicas go when this client expires";
  }
  MutexLock turnstile(&layout_mu.turnstile);
  WriterLock layout(&layout_mu.rw);
  registrations.Remove(seg.base);
  if (seg.allocated) {
    Status s = engine->FreeSharedMemory(seg.base);
    if (!s.ok()) LOG(WARNING) << "unmount segment: " << s.ToString();
    return rc;
  }
  Status s = engine->UnregisterLocalMemory(seg.base);
  if (!s.ok()) LOG(WARNING) << "unmount segment: " << s.ToString();
  void* r = ::mmap(seg.base, seg.size, PROT_NONE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  MutexLock lock(&runtime_mu);
  if (r == MAP_FAILED) {
    ::munmap(seg.base, seg.size);
  } else {
    reservations.emplace_back(seg.base, seg.size);
  }
  return rc;
}

void StoreClient::Impl::RemountRuntime() {
  std::vector<std::pair<void*, uint64_t>> all;
  {
    MutexLock lock(&runtime_mu);
    for (const auto& [id, seg] : runtime_segments) all.emplace_back(seg.base, seg.size);
  }
  for (const auto& [base, size] : all) (void)MountRange(base, size, /*remount=*/true);
}

void StoreClient::Impl::UnmountDueRuntime() {
  std::vector<RuntimeSegment> due;
  {
    MutexLock lock(&runtime_mu);
    const auto now = std::chrono::steady_clock::now();
    for (auto it = runtime_segments.begin(); it != runtime_segments.end();) {
      if (it->second.due && it->second.unmount_at <= now) {
        due.push_back(it->second);
        it = runtime_segments.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& seg : due) DropRuntime(seg);
}

void StoreClient::Impl::CloseRuntime() {
  std::vector<RuntimeSegment> all;
  {
    MutexLock lock(&runtime_mu);
    for (const auto& [id, seg] : runtime_segments) all.push_back(seg);
    runtime_segments.clear();
  }
  if (engine) {
    for (const auto& seg : all) DropRuntime(seg);
  }
  MutexLock lock(&runtime_mu);
  for (const auto& [base, size] : reservations) ::munmap(base, size);
  reservations.clear();
}

int StoreClient::MountFileSegment(const std::string& path, uint64_t offset, uint64_t size,
                                  const std::string& location, std::string* id) {
  Impl& m = *impl_;
  if (m.closed || !m.engine) return ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  const std::string what = "mount_segment(" + path + ")";
  if (size == 0) return Refuse(what + ": size is 0");
  const long page = ::sysconf(_SC_PAGESIZE);
  if (offset % static_cast<uint64_t>(page) != 0) {
    return Refuse(what + ": offset " + std::to_string(offset) + " is not a multiple of the page "
                  "size (" + std::to_string(page) + ")");
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Refuse(what + ": cannot open it read-write: " + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode))) {
    ::close(fd);
    return Refuse(what + ": not a regular file (a /dev/shm object, a hugetlbfs or plain file)");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (offset > file_size || size > file_size - offset) {
    ::close(fd);
    return Refuse(what + ": the range [" + std::to_string(offset) + ", +" +
                  std::to_string(size) + ") passes the file's end (" + std::to_string(file_size) +
                  " bytes): size the file first");
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                      static_cast<off_t>(offset));
  const int map_errno = errno;
  ::close(fd);
  if (base == MAP_FAILED) return Refuse(what + ": mmap failed: " + std::strerror(map_errno));
  Status reg = m.engine->RegisterLocalMemory(base, size, location.empty() ? "*" : location, true);
  if (!reg.ok()) {
    ::munmap(base, size);
    return Refuse(what + ": " + reg.ToString());
  }
  m.registrations.Add(base, size);
  const int rc = m.MountRange(base, size, /*remount=*/false);
  if (rc != 0) {
    {
      MutexLock turnstile(&m.layout_mu.turnstile);
      WriterLock layout(&m.layout_mu.rw);
      m.registrations.Remove(base);
      (void)m.engine->UnregisterLocalMemory(base);
    }
    ::munmap(base, size);
    return rc;
  }
  *id = NewSegmentId();
  MutexLock lock(&m.runtime_mu);
  m.runtime_segments[*id] = Impl::RuntimeSegment{base, size, false, false, {}};
  LOG(INFO) << "mounted segment " << *id << ": " << size << " bytes of " << path << " at offset "
            << offset;
  return 0;
}

int StoreClient::AllocateSegment(uint64_t size, const std::string& location, std::string* id,
                                 uint64_t* allocated) {
  Impl& m = *impl_;
  *allocated = 0;
  if (m.closed || !m.engine) return ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  if (size == 0) return Refuse("allocate_and_mount_segment: size is 0");
  if (size > UINT64_MAX - (kAllocUnit - 1)) {
    return Refuse("allocate_and_mount_segment: size " + std::to_string(size) + " is too large");
  }
  const uint64_t rounded = (size + kAllocUnit - 1) / kAllocUnit * kAllocUnit;
  auto mem = m.engine->AllocateSharedMemory(rounded, location.empty() ? "cpu:0" : location);
  if (!mem.ok()) {
    return Refuse("allocate_and_mount_segment: cannot allocate " + std::to_string(rounded) +
                  " bytes: " + mem.status().ToString());
  }
  void* base = *mem;
  m.registrations.Add(base, rounded);
  const int rc = m.MountRange(base, rounded, /*remount=*/false);
  if (rc != 0) {
    MutexLock turnstile(&m.layout_mu.turnstile);
    WriterLock layout(&m.layout_mu.rw);
    m.registrations.Remove(base);
    (void)m.engine->FreeSharedMemory(base);
    return rc;
  }
  *id = NewSegmentId();
  *allocated = rounded;
  MutexLock lock(&m.runtime_mu);
  m.runtime_segments[*id] = Impl::RuntimeSegment{base, rounded, true, false, {}};
  LOG(INFO) << "mounted segment " << *id << ": " << rounded << " bytes allocated";
  return 0;
}

int StoreClient::UnmountSegment(const std::string& id, bool allocated, int64_t grace_s) {
  Impl& m = *impl_;
  Impl::RuntimeSegment seg;
  if (m.closed || !m.engine) return ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  {
    MutexLock lock(&m.runtime_mu);
    auto it = m.runtime_segments.find(id);
    if (it == m.runtime_segments.end() || it->second.allocated != allocated) {
      return Refuse(std::string(allocated ? "unmount_and_free_segment" : "unmount_segment") +
                    ": " + id + " is not a segment of this client's " +
                    (allocated ? "allocate_and_mount_segment" : "mount_segment"));
    }
    if (grace_s > 0) {
      it->second.due = true;
      it->second.unmount_at = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
      return 0;
    }
    seg = it->second;
    m.runtime_segments.erase(it);
  }
  // The memory goes even when the master does not confirm (its code is returned): it then
  // drops the segment's replicas when this client expires, and no copy reads it meanwhile.
  return m.DropRuntime(seg);
}

}  // namespace store
}  // namespace mooncake
