// Helpers of the same-host adversarial tests: a ShmServer in this process serving one
// registered buffer, and raw wire access (src/transport/shm/shm_wire.h) for the attacker.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/memory_registry.h"
#include "mooncake/options.h"
#include "transport/shm/shm_transport.h"
#include "transport/shm/shm_wire.h"

namespace shm_hostile {

using namespace mooncake;
using namespace mooncake::shm;

constexpr size_t kBufSize = 1 << 20;

// Page-aligned anonymous memory, unmapped on destruction.
struct Pages {
  explicit Pages(size_t n) : size(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~Pages() {
    if (data) ::munmap(data, size);
  }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(data); }
  uint8_t* data;
  size_t size;
};

// The target: a ShmServer over `buf` (registered for remote access).
struct Target {
  explicit Target(EngineOptions o = Default()) : options(o), buf(kBufSize) {}
  static EngineOptions Default() {
    EngineOptions o;
    o.slice_timeout_ms = 3000;
    return o;
  }
  bool Start() {
    if (!buf.data || !registry.Add(buf.addr(), buf.size, "cpu:0", true).ok()) return false;
    server = std::make_unique<ShmServer>(options, &registry);
    return server->Start(&path).ok();
  }
  EngineOptions options;
  Pages buf;
  MemoryRegistry registry;
  std::unique_ptr<ShmServer> server;
  std::string path;
};

inline bool SendAll(int fd, const void* p, size_t n) { return WriteFull(fd, p, n, 3000).ok(); }

inline bool SendRequest(int fd, const std::vector<Item>& items, uint64_t seq) {
  RequestHeader h;
  h.count = static_cast<uint32_t>(items.size());
  h.seq = seq;
  return SendAll(fd, &h, sizeof(h)) && SendAll(fd, items.data(), items.size() * sizeof(Item));
}

// The statuses of the reply to `seq`; false on EOF, timeout or a malformed reply.
inline bool ReadReply(int fd, size_t count, uint64_t seq, std::vector<uint32_t>* st,
                      int timeout_ms = 5000) {
  ReplyHeader rh;
  if (!ReadFull(fd, &rh, sizeof(rh), timeout_ms).ok()) return false;
  if (rh.magic != kMagic || rh.seq != seq || rh.count != count) return false;
  st->resize(count);
  return ReadFull(fd, st->data(), count * sizeof(uint32_t), timeout_ms).ok();
}

// One sendmsg of `bytes` with `fds` attached (SCM_RIGHTS); returns sendmsg's result.
inline ssize_t SendWithFds(int fd, const void* bytes, size_t n, const std::vector<int>& fds) {
  iovec iov{const_cast<void*>(bytes), n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<cmsghdr> control(CMSG_SPACE(sizeof(int) * fds.size()) / sizeof(cmsghdr) + 1);
  AttachFds(&msg, reinterpret_cast<char*>(control.data()), fds.data(), fds.size());
  return ::sendmsg(fd, &msg, MSG_NOSIGNAL);
}

// Announces `ranges` backed by `fds` (one map message) and reads the reply.
inline bool Map(int fd, const std::vector<SharedRange>& ranges, const std::vector<int>& fds,
                uint64_t seq, MapReply* reply) {
  RequestHeader h;
  h.magic = kMapMagic;
  h.count = static_cast<uint32_t>(ranges.size());
  h.seq = seq;
  std::string msg(reinterpret_cast<const char*>(&h), sizeof(h));
  msg.append(reinterpret_cast<const char*>(ranges.data()), ranges.size() * sizeof(SharedRange));
  if (SendWithFds(fd, msg.data(), msg.size(), fds) != static_cast<ssize_t>(msg.size())) {
    return false;
  }
  return ReadFull(fd, reply, sizeof(*reply), 5000).ok() && reply->magic == kMapMagic &&
         reply->seq == seq;
}

// A memfd of `size` bytes sealed against shrinking (what the engine's shareable memory is).
inline int SealedMemfd(uint64_t size) {
  int fd = ::memfd_create("shm-hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the peer closed `fd` (EOF or reset) within `timeout_ms`.
inline bool PeerClosed(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

inline int OpenFdCount() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  while (::readdir(d)) ++n;
  ::closedir(d);
  return n - 3;  // ".", ".." and the directory's own descriptor
}

// A legitimate peer: connects, maps `shared` (a sealed memfd of `shared_size` bytes mapped
// here), writes and reads back through the mapping and through process_vm_*, and checks
// the bytes in the target's buffer. Returns "" or what went wrong.
std::string LegitimateTransfer(Target& t);

}  // namespace shm_hostile
