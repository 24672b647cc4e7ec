// ConnMaps: descriptors and mappings of one same-host connection, within ShmLimits.
#include "transport/shm/shm_maps.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/net.h"

namespace mooncake::shm {

ConnMaps::~ConnMaps() {
  CloseFds();
  UnmapAll();
}

void ConnMaps::CloseFds() {
  for (int f : fds_) ::close(f);
  limits_->held_fds.fetch_sub(fds_.size());
  fds_.clear();
}

void ConnMaps::UnmapAll() {
  for (const Mapped& m : maps_) ::munmap(m.ptr, m.length);
  maps_.clear();
  limits_->mapped.fetch_sub(mapped_bytes_);
  mapped_bytes_ = 0;
}

Status ConnMaps::RecvHeader(int fd, RequestHeader* h, int timeout_ms) {
  CloseFds();
  fds_refused_ = false;
  auto* p = reinterpret_cast<uint8_t*>(h);
  size_t got = 0, received = 0;
  while (got < sizeof(*h)) {
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, got == 0 ? -1 : timeout_ms);
    if (r == 0) return Status::DeadlineExceeded("incomplete message header from the initiator");
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("poll", errno);
    }
    const size_t before = fds_.size();
    bool truncated = false;
    ssize_t n = RecvWithFds(fd, p + got, sizeof(*h) - got, &fds_, &truncated);
    if (n == 0) return Status::Unavailable("connection closed by the initiator");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoStatus("recvmsg", errno);
    }
    const size_t added = fds_.size() - before;
    limits_->held_fds.fetch_add(added);
    received += added;
    got += static_cast<size_t>(n);
    if (received > kMaxSharedRanges) {
      CloseFds();
      limits_->dropped_for_fds.fetch_add(1);
      return Status::ResourceExhausted(
          std::to_string(received) + " descriptors before a message header was complete (a "
          "map message carries at most 250); closing the connection");
    }
    if (truncated ||
        (added > 0 && limits_->held_fds.load() > limits_->max_held_fds)) {
      // Out of descriptors, or all connections together hold their budget: close these at
      // once; the announcement is refused but the connection goes on (its copies then use
      // process_vm_readv/writev).
      CloseFds();
      fds_refused_ = true;
    }
  }
  if (received > 0 && h->magic != kMapMagic) {
    CloseFds();
    limits_->dropped_for_fds.fetch_add(1);
    return Status::InvalidArgument(std::to_string(received) +
                                   " descriptors attached to a message that is not a map "
                                   "announcement; closing the connection");
  }
  return Status::OK();
}

Status ConnMaps::Map(int fd, uint32_t count, int timeout_ms, MapReply* reply,
                     std::string* refusal) {
  std::vector<SharedRange> ranges(count);
  if (count) {
    MC_RETURN_IF_ERROR(ReadFull(fd, ranges.data(), count * sizeof(SharedRange), timeout_ms));
  }
  UnmapAll();
  refusal->clear();
  reply->count = 0;
  reply->status = kMapOk;
  reply->detail = 0;
  auto refuse = [&](MapStatus st, uint32_t detail, const std::string& why) {
    reply->status = st;
    reply->detail = detail;
    *refusal = "refused a shared-memory announcement of " + std::to_string(count) +
               " ranges: " + why + "; copies go through process_vm_readv/writev";
    limits_->maps_refused.fetch_add(1);
  };
  uint64_t total = 0;
  if (fds_refused_) {
    refuse(kMapBusy, 0,
           "the target holds its limit of descriptors of incomplete messages (a quarter of "
           "its RLIMIT_NOFILE); announce again later");
  } else if (fds_.size() != count) {
    refuse(kMapBadDescriptors, 0,
           "it carries " + std::to_string(fds_.size()) + " descriptors (one per range)");
  }
  // A range longer than its memfd, or a memfd the peer could still shrink, would turn our
  // memcpy into a SIGBUS: such a set is refused whole.
  for (uint32_t i = 0; reply->status == kMapOk && i < count; ++i) {
    struct stat st {};
    int seals = ::fcntl(fds_[i], F_GET_SEALS);
    if (::fstat(fds_[i], &st) != 0 || !S_ISREG(st.st_mode) || ranges[i].length == 0 ||
        ranges[i].length > static_cast<uint64_t>(st.st_size) || seals < 0 ||
        !(seals & F_SEAL_SHRINK)) {
      refuse(kMapBadRange, i,
             "range " + std::to_string(i) + " is empty, not a memfd sealed against "
             "shrinking, or longer than its memfd");
    } else if (ranges[i].length > limits_->max_map_per_conn - total) {
      refuse(kMapOverCap, i,
             "over the per-connection cap of " + std::to_string(limits_->max_map_per_conn) +
                 " bytes (MC_SHM_MAX_MAP_PER_CONN_GB)");
    } else {
      total += ranges[i].length;
    }
  }
  if (reply->status == kMapOk && total > 0) {
    uint64_t before = limits_->mapped.fetch_add(total);
    if (before + total > limits_->max_map_total || before + total < before) {
      limits_->mapped.fetch_sub(total);
      refuse(kMapOverCap, 0,
             "the target maps " + std::to_string(before) + " bytes of its peers' memory and " +
                 std::to_string(total) + " more would pass its total cap of " +
                 std::to_string(limits_->max_map_total) + " (MC_SHM_MAX_MAP_TOTAL_GB)");
    } else {
      mapped_bytes_ = total;
    }
  }
  for (uint32_t i = 0; reply->status == kMapOk && i < count; ++i) {
    void* p = ::mmap(nullptr, ranges[i].length, PROT_READ | PROT_WRITE, MAP_SHARED, fds_[i], 0);
    if (p == MAP_FAILED) {
      int err = errno;
      UnmapAll();
      refuse(kMapFailed, static_cast<uint32_t>(err),
             "mmap of range " + std::to_string(i) + ": " + std::strerror(err));
      break;
    }
    maps_.push_back({ranges[i].addr, ranges[i].length, static_cast<uint8_t*>(p)});
  }
  CloseFds();
  reply->count = static_cast<uint32_t>(maps_.size());
  return Status::OK();
}

uint8_t* ConnMaps::Translate(uint64_t addr, uint64_t len) const {
  for (const Mapped& m : maps_) {
    if (addr >= m.addr && len <= m.length && addr - m.addr <= m.length - len) {
      return m.ptr + (addr - m.addr);
    }
  }
  return nullptr;
}

}  // namespace mooncake::shm
