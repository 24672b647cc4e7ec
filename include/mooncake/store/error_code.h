// The Store's result codes: upstream Mooncake's ErrorCode values (mooncake-store/include/types.h),
// which the Python API returns as negative integers (see docs/store_upstream.md). The master
// answers every RPC with one of these, and the client passes them through unchanged.
#pragma once

#include <cstdint>

namespace mooncake {
namespace store {

enum class ErrorCode : int32_t {
  OK = 0,
  INTERNAL_ERROR = -1,
  BUFFER_OVERFLOW = -10,
  SHARD_INDEX_OUT_OF_RANGE = -100,
  SEGMENT_NOT_FOUND = -101,
  SEGMENT_ALREADY_EXISTS = -102,
  CLIENT_NOT_FOUND = -103,
  NO_AVAILABLE_HANDLE = -200,
  INVALID_VERSION = -300,
  INVALID_KEY = -400,
  WRITE_FAIL = -500,
  INVALID_PARAMS = -600,
  ILLEGAL_CLIENT = -601,
  INVALID_WRITE = -700,
  INVALID_READ = -701,
  INVALID_REPLICA = -702,
  REPLICA_IS_NOT_READY = -703,
  OBJECT_NOT_FOUND = -704,
  OBJECT_ALREADY_EXISTS = -705,
  OBJECT_HAS_LEASE = -706,
  LEASE_EXPIRED = -707,
  OBJECT_HAS_REPLICATION_TASK = -708,  // a replica task of the object is in flight
  REPLICA_NOT_FOUND = -710,            // a move's source holds no replica of the object
  REPLICA_ALREADY_EXISTS = -711,       // a task's target holds a replica of it already
  REPLICA_IS_GONE = -712,              // a task's source or target went away while it ran
  OBJECT_REPLICA_BUSY = -714,  // upsert: another put or upsert of the key is in flight
  TRANSFER_FAIL = -800,
  RPC_FAIL = -900,
  ETCD_OPERATION_ERROR = -1000,
  ETCD_KEY_NOT_EXIST = -1001,
  ETCD_TRANSACTION_FAIL = -1002,
  ETCD_CTX_CANCELLED = -1003,
  UNAVAILABLE_IN_CURRENT_STATUS = -1010,
  UNAVAILABLE_IN_CURRENT_MODE = -1011,
  FILE_NOT_FOUND = -1100,
  FILE_OPEN_FAIL = -1101,
  FILE_READ_FAIL = -1102,
  FILE_WRITE_FAIL = -1103,
  FILE_INVALID_BUFFER = -1104,
  FILE_LOCK_FAIL = -1105,
  FILE_INVALID_HANDLE = -1106,
  BUCKET_NOT_FOUND = -1200,
  BUCKET_ALREADY_EXISTS = -1201,
  KEYS_EXCEED_BUCKET_LIMIT = -1202,
  KEYS_ULTRA_LIMIT = -1203,
  UNABLE_OFFLOAD = -1300,     // the master runs without --enable_offload
  UNABLE_OFFLOADING = -1301,  // no disk can take the object
  TASK_NOT_FOUND = -1400,               // no such replica task (or it was pruned)
  TASK_PENDING_LIMIT_EXCEEDED = -1401,  // too many replica tasks waiting
  TENANT_QUOTA_EXCEEDED = -1700,  // strict mode: the tenant's memory quota is used up
  TENANT_NOT_REGISTERED = -1701,  // strict mode: the tenant has no quota policy
  TENANT_NOT_EMPTY = -1702,       // a policy removed while its tenant still holds objects
};

inline int32_t ToInt(ErrorCode c) { return static_cast<int32_t>(c); }
const char* ErrorCodeName(ErrorCode c);
inline const char* ErrorCodeName(int32_t c) { return ErrorCodeName(static_cast<ErrorCode>(c)); }

}  // namespace store
}  // namespace mooncake
