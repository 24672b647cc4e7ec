// Bounds on what one master RPC may carry, checked by the master on every request (a request
// over a bound is refused with INVALID_PARAMS / INVALID_KEY and a message naming the bound)
// and respected by the client library, which splits larger batches. They make every accepted
// request's reply fit kMaxMessageBytes, the RPC wire's payload limit (rpc_wire.h) both ways.
#pragma once

#include <cstddef>
#include <string>

namespace mooncake {
namespace store {

constexpr size_t kMaxKeyBytes = 4096;       // a key (INVALID_KEY above)
constexpr size_t kMaxRegexBytes = 4096;     // a remove_by_regex pattern
constexpr size_t kMaxBatchItems = 4096;     // keys / items of one batch RPC
constexpr size_t kMaxNameBytes = 256;       // client id, segment name, a preferred segment
constexpr size_t kMaxPreferredSegments = 16;
constexpr size_t kMaxReplicaNum = 16;
// Segments one client may have mounted at once, and all clients together (MountSegment
// refuses more with INVALID_PARAMS): each costs placement and unmount work.
constexpr size_t kMaxSegmentsPerClient = 64;
constexpr size_t kMaxSegments = 16384;
// remove_by_regex patterns whose compiled RE2 program is larger are refused: matching costs
// up to the program's size per byte of key when RE2 falls back from its DFA.
constexpr int kMaxRegexProgramSize = 2000;
// The RPC wire's payload limit, both ways. The largest reply an accepted request can get:
// kMaxBatchItems x (a message naming the key + kMaxReplicaNum replicas with their segment
// names) = 4096 x (4.2 KiB + 16 x 0.3 KiB), about 36 MiB.
constexpr int kMaxMessageBytes = 64 << 20;
// RemoveByRegex / RemoveAll look at this many keys per hold of the master's lock.
constexpr size_t kRemoveChunk = 1024;

// "" when `key` is acceptable, else why not.
inline std::string KeyProblem(const std::string& key) {
  if (key.empty()) return "empty key";
  if (key.size() > kMaxKeyBytes) {
    return "key of " + std::to_string(key.size()) + " bytes is longer than the limit of " +
           std::to_string(kMaxKeyBytes) + " bytes";
  }
  return "";
}

// "" when a batch of `n` items is acceptable, else why not.
inline std::string BatchProblem(const char* what, size_t n) {
  if (n <= kMaxBatchItems) return "";
  return std::string(what) + " with " + std::to_string(n) + " items: at most " +
         std::to_string(kMaxBatchItems) + " per request (split the batch)";
}

// "" when a client id / segment name `v` is acceptable, else why not.
inline std::string NameProblem(const char* what, const std::string& v) {
  if (v.size() <= kMaxNameBytes) return "";
  return std::string(what) + " of " + std::to_string(v.size()) +
         " bytes is longer than the limit of " + std::to_string(kMaxNameBytes) + " bytes";
}

}  // namespace store
}  // namespace mooncake
