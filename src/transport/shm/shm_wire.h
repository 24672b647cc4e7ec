// Messages of the same-host transport, over a unix stream socket (abstract namespace).
// Host byte order: both ends run on one kernel. See README.md in this folder.
//
// Hello, binding the connection to the initiator's process (version 2):
//   1. initiator -> target: HelloRequest (proof_addr: 16 bytes of the initiator's memory).
//   2. target -> initiator: HelloReply with status kChallenge, then a 16-byte random nonce
//      (or status kBadVersion with the target's version in `version`, then EOF).
//   3. initiator: writes the nonce at proof_addr; -> target: HelloProof.
//   4. target: reads proof_addr with process_vm_readv through the pid of the pidfd it took
//      at accept, checks the nonce and that the pidfd's process is still alive; -> initiator:
//      HelloReply kOk, or kRefused (err: the errno, EBADMSG for a wrong nonce) and EOF.
// Then any number of messages, answered in order:
//   Request: RequestHeader + count x Item;  Reply: ReplyHeader + count x uint32 status.
//   Map (magic kMapMagic): RequestHeader + count x SharedRange, with `count` memfds attached
//     (SCM_RIGHTS) to the message's first byte: the initiator's shareable memory. The target
//     maps them and from then on copies to/from those ranges with memcpy; the set replaces
//     the previous one. The initiator sends it before the first request after its
//     registrations changed. Reply: MapReply (count = ranges mapped, status why not).
//   Export (magic kExportMagic): RequestHeader with count 0: the initiator asks for the
//     target's memory it may map. Reply: ExportReply + count x ExportItem, with count + 1
//     memfds attached to its first byte when count > 0: the export page (ExportSlots, see
//     engine/memory_registry.h), then one per range. The initiator then copies to and from
//     those ranges with memcpy itself while each range's slot holds the gen it was given,
//     counting itself in the slot's users meanwhile (shm_exports.h).
//   Descriptors on any other message, or more than kMaxSharedRanges before a header is
//   complete, make the target close the connection.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace mooncake::shm {

// Attaches `n` descriptors to `msg` as one SCM_RIGHTS message (none when n == 0), using
// `control` (at least CMSG_SPACE(n * sizeof(int)) bytes, aligned for cmsghdr) as the buffer.
inline void AttachFds(msghdr* msg, char* control, const int* fds, size_t n) {
  if (n == 0) return;
  msg->msg_control = control;
  msg->msg_controllen = CMSG_SPACE(sizeof(int) * n);
  cmsghdr* c = CMSG_FIRSTHDR(msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * n);
  std::memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
}

// One non-blocking recvmsg of up to `len` bytes into `p`, appending the descriptors that
// come with them (SCM_RIGHTS, close-on-exec) to `fds`. Returns recvmsg's result (errno set
// when negative); *truncated: the kernel dropped descriptors past the kernel's per-message
// most (MSG_CTRUNC).
inline ssize_t RecvWithFds(int fd, void* p, size_t len, std::vector<int>* fds, bool* truncated) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 253)];  // SCM_MAX_FD
  iovec iov{p, len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  *truncated = n >= 0 && (msg.msg_flags & MSG_CTRUNC);
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const int* in = reinterpret_cast<const int*>(CMSG_DATA(c));
      fds->insert(fds->end(), in, in + count);
    }
  }
  return n;
}

constexpr uint32_t kMagic = 0x4853434D;  // "MCSH"
constexpr uint32_t kVersion = 2;
constexpr uint32_t kMapMagic = 0x504D434D;  // "MCMP"
constexpr uint32_t kExportMagic = 0x5845434D;  // "MCEX"
constexpr uint32_t kMaxItems = 1024;
constexpr uint32_t kMaxSharedRanges = 250;  // fds in one SCM_RIGHTS message (kernel: 253)
constexpr uint32_t kNonceSize = 16;

struct SharedRange {
  uint64_t addr;    // where the range starts in the initiator
  uint64_t length;  // the memfd maps it whole, from offset 0
};

enum ItemStatus : uint32_t {
  kOk = 0,
  kRejected = 1,    // range not inside memory registered for remote access
  kCopyFailed = 2,  // process_vm_readv/writev failed
  kRefused = 3,     // hello: the target may not access the initiator (ptrace policy, proof)
  kPeerExited = 4,  // the process that opened the connection has exited: nothing copied
                    // (its pid may name another process now); the target closes
  kBadVersion = 5,  // hello: another protocol version (HelloReply.version: the target's)
  kChallenge = 6,   // hello: a nonce follows
};

enum MapStatus : uint32_t {
  kMapOk = 0,
  kMapBadDescriptors = 1,  // not `count` descriptors attached
  kMapBadRange = 2,        // not a memfd sealed against shrinking, or shorter than announced
  kMapOverCap = 3,         // over the per-connection or the target's total mapping cap
  kMapFailed = 4,          // mmap failed (detail: errno)
  kMapBusy = 5,            // the target holds its limit of passed descriptors; retry later
};

struct HelloRequest {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint64_t proof_addr = 0;  // kNonceSize bytes in the initiator, written in step 3
  uint64_t pad = 0;         // 0 (v1's probe value)
};

struct HelloReply {
  uint32_t magic = kMagic;
  uint32_t status = kOk;
  int32_t err = 0;  // errno of a refused proof
  uint32_t version = kVersion;
};

struct HelloProof {
  uint32_t magic = kMagic;
  uint32_t pad = 0;
};

struct RequestHeader {
  uint32_t magic = kMagic;
  uint32_t count = 0;
  uint64_t seq = 0;
};

struct Item {
  uint64_t initiator_addr;
  uint64_t target_addr;
  uint64_t length;
  uint32_t op;  // TransferRequest::READ (target -> initiator) or WRITE
  uint32_t pad;
};

struct ReplyHeader {
  uint32_t magic = kMagic;
  uint32_t count = 0;
  uint64_t seq = 0;
};

struct MapReply {
  uint32_t magic = kMapMagic;
  uint32_t count = 0;  // ranges mapped
  uint64_t seq = 0;
  uint32_t status = kMapOk;
  uint32_t detail = 0;  // kMapBadRange: the range's index; kMapFailed: errno
};

struct ExportReply {
  uint32_t magic = kExportMagic;
  uint32_t count = 0;       // ranges (at most kMaxSharedRanges - 1: the page takes a descriptor)
  uint64_t seq = 0;
  uint64_t page_bytes = 0;  // length of the export page
};

struct ExportItem {
  uint64_t addr;    // where the range starts in the target
  uint64_t length;  // its memfd maps it whole, from offset 0
  uint64_t gen;     // the slot's gen while the range is lent
  uint32_t slot;    // index of its ExportSlot (16 bytes each) in the export page
  uint32_t pad;
};

static_assert(sizeof(Item) == 32, "wire layout");
static_assert(sizeof(ExportReply) == 24 && sizeof(ExportItem) == 32, "wire layout");
static_assert(sizeof(RequestHeader) == 16 && sizeof(ReplyHeader) == 16, "wire layout");
static_assert(sizeof(HelloRequest) == 24 && sizeof(HelloReply) == 16, "wire layout");
static_assert(sizeof(MapReply) == 24 && sizeof(HelloProof) == 8, "wire layout");

}  // namespace mooncake::shm
