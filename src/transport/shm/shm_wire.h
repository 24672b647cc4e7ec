// Messages of the same-host transport, over a unix stream socket (abstract namespace).
// Host byte order: both ends run on one kernel. See README.md in this folder.
//
// Hello (initiator -> target): HelloRequest. Reply: HelloReply; status kOk means the target
// could read the initiator's probe word with process_vm_readv, i.e. it may copy for it.
// Then any number of messages, answered in order:
//   Request: RequestHeader + count x Item;  Reply: ReplyHeader + count x uint32 status.
//   Map (magic kMapMagic): RequestHeader + count x SharedRange, with `count` memfds attached
//     (SCM_RIGHTS): the initiator's shareable memory. The target maps them and from then on
//     copies to/from those ranges with memcpy; the set replaces the previous one. The
//     initiator sends it before the first request after its registrations changed.
//     Reply: ReplyHeader with count = number of ranges mapped.
#pragma once

#include <cstdint>

namespace mooncake::shm {

constexpr uint32_t kMagic = 0x4853434D;  // "MCSH"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMapMagic = 0x504D434D;  // "MCMP"
constexpr uint32_t kMaxItems = 1024;
constexpr uint32_t kMaxSharedRanges = 250;  // fds in one SCM_RIGHTS message (kernel: 253)

struct SharedRange {
  uint64_t addr;    // where the range starts in the initiator
  uint64_t length;  // the memfd maps it whole, from offset 0
};

enum ItemStatus : uint32_t {
  kOk = 0,
  kRejected = 1,    // range not inside memory registered for remote access
  kCopyFailed = 2,  // process_vm_readv/writev failed (errno in the low byte of `detail`)
  kRefused = 3,     // hello: the target may not access the initiator (ptrace policy)
};

struct HelloRequest {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint64_t probe_addr = 0;  // an 8-byte word in the initiator, holding probe_value
  uint64_t probe_value = 0;
};

struct HelloReply {
  uint32_t magic = kMagic;
  uint32_t status = kOk;
  int32_t err = 0;  // errno of a refused probe
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

static_assert(sizeof(Item) == 32, "wire layout");
static_assert(sizeof(RequestHeader) == 16 && sizeof(ReplyHeader) == 16, "wire layout");

}  // namespace mooncake::shm
