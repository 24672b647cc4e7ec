// Plain value types of the public API. Names and numeric values follow upstream Mooncake
// (see docs/api.md) so that callers written for upstream compile and behave the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mooncake {

using SegmentID = uint64_t;
using SegmentHandle = SegmentID;
// A checked handle: (generation << 32) | (slot + 1). Never 0, never a pointer.
using BatchID = uint64_t;

constexpr SegmentID LOCAL_SEGMENT_ID = 0;
constexpr SegmentID INVALID_SEGMENT_ID = UINT64_MAX;  // upstream returns (SegmentHandle)-1
constexpr BatchID INVALID_BATCH_ID = UINT64_MAX;

struct TransferRequest {
  // A fixed underlying type: any int is a valid value to hold, so a caller's garbage opcode is
  // an error SubmitTransfer reports, not undefined behaviour.
  enum OpCode : int { READ = 0, WRITE = 1 };
  OpCode opcode = READ;
  void* source = nullptr;     // local virtual address
  SegmentID target_id = 0;    // from openSegment()
  uint64_t target_offset = 0; // absolute virtual address inside the target process
  size_t length = 0;
};

enum TransferStatusEnum {
  WAITING = 0,
  PENDING = 1,
  INVALID = 2,
  CANCELED = 3,
  COMPLETED = 4,
  TIMEOUT = 5,
  FAILED = 6,
};

const char* TransferStatusName(TransferStatusEnum s);

struct TransferStatus {
  TransferStatusEnum s = WAITING;
  size_t transferred_bytes = 0;
};

struct BufferEntry {
  void* addr = nullptr;
  size_t length = 0;
};

struct NotifyDesc {
  std::string name;        // sender's segment name
  std::string notify_msg;  // opaque message
};

}  // namespace mooncake
