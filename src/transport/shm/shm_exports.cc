// PeerExports, FetchExports and ServeExport: target memory the initiator maps (shm_exports.h).
#include "transport/shm/shm_exports.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/net.h"
#include "common/prefault.h"
#include "transport/shm/shm_wire.h"

namespace mooncake::shm {
namespace {

constexpr uint32_t kMaxExports = kMaxSharedRanges - 1;  // the page takes one descriptor
constexpr uint64_t kMaxPageBytes = 1 << 20;

// Reads exactly `len` bytes, keeping the descriptors that come with them (at most the
// kernel's SCM_MAX_FD per message; a truncated set fails).
Status RecvAllWithFds(int fd, void* buf, size_t len, int timeout_ms, std::vector<int>* fds) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t got = 0;
  while (got < len) {
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, timeout_ms);
    if (r == 0) return Status::DeadlineExceeded("the same-host target did not answer the export request");
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("poll", errno);
    }
    bool truncated = false;
    ssize_t n = RecvWithFds(fd, p + got, len - got, fds, &truncated);
    if (n == 0) return Status::Unavailable("the same-host target closed the connection");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoStatus("recvmsg", errno);
    }
    if (truncated) return Status::ResourceExhausted("descriptors truncated");
    got += static_cast<size_t>(n);
  }
  return Status::OK();
}

// A memfd we may map `length` bytes of without ever faulting on a missing page.
bool Mappable(int fd, uint64_t length) {
  struct stat st {};
  const int seals = ::fcntl(fd, F_GET_SEALS);
  return ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && length > 0 &&
         length <= static_cast<uint64_t>(st.st_size) && seals >= 0 && (seals & F_SEAL_SHRINK);
}

}  // namespace

PeerExports::~PeerExports() {
  for (const auto& job : prefaults_) Prefaulter::Cancel(job);
  for (const Range& r : ranges_) ::munmap(r.ptr, r.length);
  if (page_) ::munmap(page_, page_bytes_);
  if (mapped_) limits_->mapped.fetch_sub(mapped_);
}

bool PeerExports::Alive() const {
  char c;
  const ssize_t n = ::recv(conn_.get(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

const PeerExports::Range* PeerExports::Find(const Slice& s) const {
  // The last range starting at or below s.remote.
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), s.remote,
                             [](uint64_t a, const Range& r) { return a < r.addr; });
  if (it == ranges_.begin()) return nullptr;
  const Range& r = *--it;
  if (s.length > r.length || s.remote - r.addr > r.length - s.length) return nullptr;
  return &r;
}

void PeerExports::Copy(const Slice* s, size_t n, uint8_t* copied) const {
  // Counted first, then the gen checked (both seq_cst): an unregistration that changed the
  // gen before our check sees our count when it waits (MemoryRegistry::Remove). The count
  // is held across a run of slices in the same range (at most kInlineBytes of copies).
  const Range* held = nullptr;
  auto release = [&] {
    if (held) held->slot->users.fetch_sub(1, std::memory_order_seq_cst);
    held = nullptr;
  };
  for (size_t i = 0; i < n; ++i) {
    const Range* r = Find(s[i]);
    if (r != held) {
      release();
      if (r != nullptr) {
        r->slot->users.fetch_add(1, std::memory_order_seq_cst);
        held = r;
        if (r->slot->gen.load(std::memory_order_seq_cst) != r->gen) release();
      }
    }
    if (held == nullptr) {
      copied[i] = 0;
      continue;
    }
    uint8_t* theirs = held->ptr + (s[i].remote - held->addr);
    auto* mine = reinterpret_cast<uint8_t*>(s[i].local);
    if (s[i].opcode == TransferRequest::WRITE) {
      std::memcpy(theirs, mine, s[i].length);
    } else {
      std::memcpy(mine, theirs, s[i].length);
    }
    copied[i] = 1;
  }
  release();
}

Result<std::shared_ptr<const PeerExports>> FetchExports(UniqueFd conn, int timeout_ms,
                                                        ShmLimits* limits) {
  const int fd = conn.get();
  RequestHeader h;
  h.magic = kExportMagic;
  h.count = 0;
  h.seq = 1;
  MC_RETURN_IF_ERROR(WriteFull(fd, &h, sizeof(h), timeout_ms));
  std::vector<int> fds;
  struct Closer {
    std::vector<int>& fds;
    ~Closer() {
      for (int f : fds) ::close(f);
    }
  } closer{fds};
  ExportReply er;
  MC_RETURN_IF_ERROR(RecvAllWithFds(fd, &er, sizeof(er), timeout_ms, &fds));
  if (er.magic != kExportMagic || er.seq != h.seq || er.count > kMaxExports) {
    return Status::DataLoss("malformed reply to the export request");
  }
  if (er.count == 0) {
    if (!fds.empty()) return Status::DataLoss("descriptors on an empty export reply");
    return std::shared_ptr<const PeerExports>();
  }
  std::vector<ExportItem> items(er.count);
  MC_RETURN_IF_ERROR(RecvAllWithFds(fd, items.data(), items.size() * sizeof(ExportItem),
                                    timeout_ms, &fds));
  if (fds.size() != er.count + 1) {
    return Status::DataLoss("the export reply carries " + std::to_string(fds.size()) +
                            " descriptors for " + std::to_string(er.count) + " ranges");
  }
  if (er.page_bytes < sizeof(ExportSlot) || er.page_bytes > kMaxPageBytes ||
      er.page_bytes % sizeof(ExportSlot) != 0 || !Mappable(fds[0], er.page_bytes)) {
    return Status::DataLoss("the export page is not a sealed memfd of its length");
  }
  std::shared_ptr<PeerExports> ex(new PeerExports(limits, std::move(conn)));
  uint64_t total = 0;
  for (uint32_t i = 0; i < er.count; ++i) {
    const ExportItem& it = items[i];
    if (it.slot >= er.page_bytes / sizeof(ExportSlot) || it.addr + it.length < it.addr ||
        !Mappable(fds[i + 1], it.length)) {
      return Status::DataLoss("lent range " + std::to_string(i) +
                              " is empty, wraps, names no slot, or is not a memfd sealed "
                              "against shrinking at least as long as said");
    }
    total += it.length;
    if (total > limits->max_map_per_conn || total < it.length) {
      return Status::ResourceExhausted("the target lends more than the per-peer cap of " +
                                       std::to_string(limits->max_map_per_conn) +
                                       " bytes (MC_SHM_MAX_MAP_PER_CONN_GB)");
    }
  }
  const uint64_t before = limits->mapped.fetch_add(total);
  if (before + total > limits->max_map_total || before + total < before) {
    limits->mapped.fetch_sub(total);
    return Status::ResourceExhausted("mapping " + std::to_string(total) +
                                     " more bytes of peers' memory would pass the total cap of " +
                                     std::to_string(limits->max_map_total) +
                                     " (MC_SHM_MAX_MAP_TOTAL_GB)");
  }
  ex->mapped_ = total;
  void* page = ::mmap(nullptr, er.page_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
  if (page == MAP_FAILED) return ErrnoStatus("mmap of the export page", errno);
  ex->page_ = page;
  ex->page_bytes_ = er.page_bytes;
  auto* slots = static_cast<ExportSlot*>(page);
  for (uint32_t i = 0; i < er.count; ++i) {
    const ExportItem& it = items[i];
    void* p = ::mmap(nullptr, it.length, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i + 1], 0);
    if (p == MAP_FAILED) return ErrnoStatus("mmap of lent range " + std::to_string(i), errno);
    ex->ranges_.push_back({it.addr, it.length, static_cast<uint8_t*>(p), &slots[it.slot], it.gen});
  }
  std::sort(ex->ranges_.begin(), ex->ranges_.end(),
            [](const PeerExports::Range& a, const PeerExports::Range& b) { return a.addr < b.addr; });
  for (size_t i = 1; i < ex->ranges_.size(); ++i) {
    if (ex->ranges_[i - 1].addr + ex->ranges_[i - 1].length > ex->ranges_[i].addr) {
      return Status::DataLoss("the target lends overlapping ranges");
    }
  }
  for (const PeerExports::Range& r : ex->ranges_) {
    if (auto job = Prefaulter::Start(r.ptr, r.length, "a peer's lent range",
                                     Prefaulter::Mode::kResidentOnly)) {
      ex->prefaults_.push_back(std::move(job));
    }
  }
  return std::shared_ptr<const PeerExports>(std::move(ex));
}

Status ServeExport(int fd, uint64_t seq, MemoryRegistry* registry, int timeout_ms) {
  ExportReply er;
  er.seq = seq;
  auto list = registry->Export(kMaxExports);
  std::vector<ExportItem> items;
  std::vector<int> fds;
  if (list.ok() && !list->ranges.empty()) {
    er.page_bytes = list->page_bytes;
    fds.push_back(list->page_fd);
    for (const ExportedRange& r : list->ranges) {
      items.push_back({r.addr, r.length, r.gen, r.slot, 0});
      fds.push_back(r.fd);
    }
    er.count = static_cast<uint32_t>(items.size());
  }
  struct Closer {
    std::vector<int>& fds;
    ~Closer() {
      for (int f : fds) ::close(f);
    }
  } closer{fds};
  iovec iov[2] = {{&er, sizeof(er)}, {items.data(), items.size() * sizeof(ExportItem)}};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxSharedRanges)];
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = items.empty() ? 1 : 2;
  AttachFds(&msg, control, fds.data(), fds.size());
  const size_t want = sizeof(er) + items.size() * sizeof(ExportItem);
  ssize_t n;
  do {
    n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus("send the export reply", errno);
  if (static_cast<size_t>(n) < want) {
    std::vector<uint8_t> all(want);
    std::memcpy(all.data(), &er, sizeof(er));
    std::memcpy(all.data() + sizeof(er), items.data(), items.size() * sizeof(ExportItem));
    MC_RETURN_IF_ERROR(WriteFull(fd, all.data() + n, want - static_cast<size_t>(n), timeout_ms));
  }
  return Status::OK();
}

}  // namespace mooncake::shm
