// StoreClient: one process's handle on the Mooncake Store (a distributed KV-cache pool).
//
// It contributes a global segment of its memory to the pool (allocated shareable and
// registered with its transfer engine, then mounted at the master), keeps a local buffer for
// staging, and stores / fetches objects by key: the master says where the replicas lie, the
// engine moves the bytes (a memcpy when the replica is in this process's own segment).
//
// Results are upstream Mooncake's codes: 0 (or a count / size) on success, a negative
// ErrorCode (src/store/error_code.h) on failure; every failure logs one line saying why.
//
// Memory handed to Put*/Get* may be any host memory. Ranges inside memory this client knows
// as registered (its segment, its local buffer, RegisterBuffer) move with no extra copy;
// others are staged through the local buffer in chunks.
//
// Thread safety: every method may be called from any thread at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mooncake {
class TransferEngine;

namespace store {

struct ReplicateConfig {
  size_t replica_num = 1;
  bool with_soft_pin = false;
  uint64_t soft_pin_ttl_ms = 0;  // 0: the master's --default_kv_soft_pin_ttl
  bool with_hard_pin = false;
  std::vector<std::string> preferred_segments;  // transfer-engine segment names, tried first
  bool prefer_alloc_in_same_node = false;
};

struct StoreClientOptions {
  // The engine's server name (host or host:port). Under a metadata server a host without
  // ":port" becomes host:<free port> (client_port.h; segment_name() says which).
  std::string local_hostname;
  std::string metadata_server = "P2PHANDSHAKE";  // as TransferEngine::Init
  uint64_t global_segment_size = 0;              // bytes contributed to the pool (0: none)
  uint64_t local_buffer_size = 16 << 20;         // staging buffer
  std::string protocol = "tcp";
  std::string master_server_addr = "127.0.0.1:50051";
  // A running engine to share (the Python `engine=` argument); null: the client makes its own.
  std::shared_ptr<TransferEngine> engine;
  std::chrono::milliseconds rpc_timeout{10000};
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds transfer_timeout{30000};  // plus 1 ms per MiB moved
};

// One piece of local memory.
struct Span {
  void* ptr;
  size_t size;
};

class StoreClient {
 public:
  // Connects to the master (a Ping within rpc_timeout), starts or adopts the engine, mounts the
  // segment. Returns null and sets *code (and *message) on failure.
  static std::unique_ptr<StoreClient> Create(StoreClientOptions options, int* code,
                                             std::string* message);
  ~StoreClient();  // Close()
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // Unmounts the segment (its objects leave the pool), stops the heartbeat; idempotent.
  int Close();

  // The engine's segment name (host:port with P2PHANDSHAKE).
  std::string segment_name() const;
  TransferEngine* engine() const;
  // Where the staging buffer lies (diagnostics: tests check that peers cannot reach it; it is
  // registered for local use only and never published in the segment's descriptor).
  Span local_buffer() const;
  // 0 when the master answers, RPC_FAIL otherwise.
  int HealthCheck();

  // The object is the concatenation of `parts`. 0, OBJECT_ALREADY_EXISTS, NO_AVAILABLE_HANDLE...
  int Put(const std::string& key, const std::vector<Span>& parts, const ReplicateConfig& config);
  std::vector<int> BatchPut(const std::vector<std::string>& keys,
                            const std::vector<std::vector<Span>>& parts,
                            const ReplicateConfig& config);
  // Reads the object into `parts` (filled in order). Returns its size, or a negative code
  // (OBJECT_NOT_FOUND, INVALID_PARAMS when the parts are smaller than the object, ...).
  int64_t Get(const std::string& key, const std::vector<Span>& parts);
  std::vector<int64_t> BatchGet(const std::vector<std::string>& keys,
                                const std::vector<std::vector<Span>>& parts);
  // As BatchGet, with the destination chosen once the size is known (one round trip to the
  // master): parts_for(i, size) returns where key i's `size` bytes go (empty: skip the key,
  // which then reports INVALID_PARAMS).
  using PartsFor = std::function<std::vector<Span>(size_t index, uint64_t size)>;
  std::vector<int64_t> BatchGetWith(const std::vector<std::string>& keys,
                                    const PartsFor& parts_for);
  // Size of a complete object, or a negative code.
  int64_t GetSize(const std::string& key);
  std::vector<int64_t> BatchGetSize(const std::vector<std::string>& keys);
  // 1 exists, 0 does not, negative on error.
  std::vector<int> BatchIsExist(const std::vector<std::string>& keys);

  // OBJECT_HAS_LEASE while a reader's lease lasts, unless `force`.
  int Remove(const std::string& key, bool force = false);
  std::vector<int> BatchRemove(const std::vector<std::string>& keys, bool force = false);
  int64_t RemoveByRegex(const std::string& regex, bool force = false);  // count, or negative
  int64_t RemoveAll(bool force = false);                                // count, or negative

  // Registers memory with the engine so Put/Get move it without staging.
  int RegisterBuffer(void* ptr, size_t size);
  int UnregisterBuffer(void* ptr);
  // Allocates `size` bytes of shareable memory (TransferEngine::AllocateSharedMemory: a
  // same-host peer maps it and copies with memcpy), registered as RegisterBuffer does. Freed
  // by Close(). Null (and a log line) on failure. A dummy client's memory pool. RegisterBuffer
  // of a range inside it succeeds without registering anything (it is registered as a whole);
  // UnregisterBuffer of that range undoes it.
  void* AllocateSharedBuffer(size_t size);

  class Impl;

 private:
  explicit StoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace store
}  // namespace mooncake
