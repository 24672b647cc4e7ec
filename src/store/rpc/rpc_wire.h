// The master's RPC wire (rpc_server.h serves it, rpc_client.h calls it): frames over a TCP
// connection, each a 16-byte header and a payload that is one protobuf message of
// proto/master.proto (the request of `method`, or its response).
//
//   offset 0  u32 magic   "MCR1" (bytes 'M' 'C' 'R' '1')
//          4  u16 method  MasterMethod (the reply echoes it)
//          6  u16 status  RpcStatus: 0 in requests; in replies 0 = the payload is the response,
//                         else the payload is a UTF-8 message saying what was wrong
//          8  u32 seq     chosen by the caller, echoed by the reply
//         12  u32 length  payload bytes, at most kMaxMessageBytes (store/limits.h)
// All integers little-endian. A connection carries one request at a time in each direction
// in order (a client may send the next request once the reply has come); the server reads
// no further request from a connection until its reply is sent.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "store/common/limits.h"

namespace mooncake {
namespace store {

constexpr size_t kFrameHeaderBytes = 16;
constexpr char kFrameMagic[4] = {'M', 'C', 'R', '1'};

// Every RPC of the master, once: X(Name, number, Request, Response, resend), the messages
// those of proto/master.proto (namespace rpc). `resend`: a second arrival changes nothing,
// so a call whose pooled connection the master had closed may be sent again (rpc_client.h).
// The enum, the names, RpcClient's resend rule and the client's typed stub
// (store/client/master_stub.h) are made from it; the master's dispatch (master_rpc.cc)
// switches over the enum, so a method added here and not served there fails its build.
#define MC_MASTER_METHODS(X)                                                          \
  X(Ping, 1, PingRequest, PingResponse, true)                                         \
  X(MountSegment, 2, MountSegmentRequest, MountSegmentResponse, false)                \
  X(UnmountSegment, 3, UnmountSegmentRequest, UnmountSegmentResponse, false)          \
  X(PutStart, 4, PutStartRequest, PutStartResponse, false)                            \
  X(PutEnd, 5, KeysRequest, CodesResponse, false)                                     \
  X(PutRevoke, 6, KeysRequest, CodesResponse, false)                                  \
  X(GetReplicaList, 7, KeysRequest, GetReplicaListResponse, true) /* a lease lapses */ \
  X(ExistKey, 8, KeysRequest, ExistResponse, true)                                    \
  X(Remove, 9, KeysRequest, CodesResponse, false)                                     \
  X(RemoveByRegex, 10, RemoveByRegexRequest, CountResponse, false)                    \
  X(RemoveAll, 11, KeysRequest, CountResponse, false)                                 \
  X(ReplicaClear, 12, ReplicaClearRequest, ReplicaClearResponse, false)               \
  X(GetStats, 13, StatsRequest, StatsResponse, true)                                 \
  X(CreateReplicaTask, 14, ReplicaTaskRequest, ReplicaTaskResponse, false)            \
  X(QueryTask, 15, QueryTaskRequest, QueryTaskResponse, true)                         \
  X(FetchTasks, 16, FetchTasksRequest, FetchTasksResponse, false)                     \
  X(FinishTask, 17, FinishTaskRequest, FinishTaskResponse, false)                     \
  X(MountLocalDisk, 18, MountLocalDiskRequest, MountLocalDiskResponse, false)         \
  X(OffloadFetch, 19, OffloadFetchRequest, OffloadFetchResponse, false)               \
  X(OffloadDone, 20, OffloadDoneRequest, OffloadDoneResponse, false)                  \
  X(EvictDisk, 21, EvictDiskRequest, EvictDiskResponse, false)

// A client's offload service (the disk tier: src/store/disk/README.md), served by clients,
// not the master (which answers them kUnknownMethod), on the same framing.
#define MC_OFFLOAD_METHODS(X)                                                         \
  X(OffloadRead, 101, OffloadReadRequest, OffloadReadResponse, true)                  \
  X(OffloadRelease, 102, OffloadReleaseRequest, OffloadReleaseResponse, true)

enum class MasterMethod : uint16_t {
#define MC_X(Name, number, Req, Resp, resend) k##Name = number,
  MC_MASTER_METHODS(MC_X)
  MC_OFFLOAD_METHODS(MC_X)
#undef MC_X
};
#define MC_X(Name, number, Req, Resp, resend) +1
constexpr uint16_t kMaxMethod = 0 MC_MASTER_METHODS(MC_X);  // numbered 1..kMaxMethod
#undef MC_X

enum class RpcStatus : uint16_t {
  kOk = 0,
  kUnknownMethod = 1,  // the server has no such method (a newer client?)
  kBadRequest = 2,     // the payload is not the method's request message
  kTooLarge = 3,       // length over kMaxMessageBytes; the server closes the connection
  // This master does not serve Store calls now (an HA standby, or a leader that lost its
  // lease); the payload is a message naming the leader it knows of, if any. Changes the
  // request asked for were not made (or, for a reply held until durable, not made durable).
  kNotLeader = 4,
};

struct FrameHeader {
  uint16_t method = 0;
  uint16_t status = 0;
  uint32_t seq = 0;
  uint32_t length = 0;
};

inline void PutU16(char* p, uint16_t v) {
  p[0] = static_cast<char>(v & 0xff);
  p[1] = static_cast<char>(v >> 8);
}
inline void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline uint16_t GetU16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}
inline uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// Writes a header into the 16 bytes at p.
inline void EncodeHeader(char* p, const FrameHeader& h) {
  std::memcpy(p, kFrameMagic, 4);
  PutU16(p + 4, h.method);
  PutU16(p + 6, h.status);
  PutU32(p + 8, h.seq);
  PutU32(p + 12, h.length);
}

enum class HeaderCheck { kOk, kBadMagic, kTooLarge };

// Decodes the 16 bytes at p. kBadMagic: not this protocol (nothing else in *h is meaningful);
// kTooLarge: h->length is over kMaxMessageBytes.
inline HeaderCheck DecodeHeader(const char* p, FrameHeader* h) {
  if (std::memcmp(p, kFrameMagic, 4) != 0) return HeaderCheck::kBadMagic;
  h->method = GetU16(p + 4);
  h->status = GetU16(p + 6);
  h->seq = GetU32(p + 8);
  h->length = GetU32(p + 12);
  if (h->length > static_cast<uint32_t>(kMaxMessageBytes)) return HeaderCheck::kTooLarge;
  return HeaderCheck::kOk;
}

// What the first bytes of a peer that does not speak this protocol look like, for log lines.
inline std::string DescribeForeignBytes(const char* p, size_t n) {
  if (n >= 3 && std::memcmp(p, "PRI", 3) == 0) {
    return "an HTTP/2 client (gRPC: a client library of an older version of this Store?)";
  }
  if (n >= 6 && static_cast<uint8_t>(p[3]) == 0x04 && p[4] == 0 && p[5] == 0) {
    return "an HTTP/2 server (gRPC: an older mooncake_master of this project?)";
  }
  if (n >= 4 && (std::memcmp(p, "GET ", 4) == 0 || std::memcmp(p, "POST", 4) == 0 ||
                 std::memcmp(p, "HTTP", 4) == 0)) {
    return "HTTP/1 (the wrong port: the master's HTTP endpoints are on --metrics_port)";
  }
  return "not this Store's RPC protocol";
}

// The method's name, for log lines and messages ("?" for none).
inline const char* MethodName(uint16_t method) {
  switch (static_cast<MasterMethod>(method)) {
#define MC_X(Name, number, Req, Resp, resend) \
  case MasterMethod::k##Name:                 \
    return #Name;
    MC_MASTER_METHODS(MC_X)
    MC_OFFLOAD_METHODS(MC_X)
#undef MC_X
  }
  return "?";
}

// Whether a second arrival of `method` changes nothing (MC_MASTER_METHODS' `resend`).
inline bool MayResend(MasterMethod method) {
  switch (method) {
#define MC_X(Name, number, Req, Resp, resend) \
  case MasterMethod::k##Name:                 \
    return resend;
    MC_MASTER_METHODS(MC_X)
    MC_OFFLOAD_METHODS(MC_X)
#undef MC_X
  }
  return false;
}

}  // namespace store
}  // namespace mooncake
