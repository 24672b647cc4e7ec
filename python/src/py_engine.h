// PyTransferEngine: upstream Mooncake's Python `mooncake.engine.TransferEngine` over our C++
// TransferEngine. module.cc binds it; the docstrings there state each method's contract.
//
// Conventions (upstream's): integer results are 0 or negative (error_codes.h), batch ids are
// non-zero or 0 on failure, nothing raises on an ordinary failure. Every failure logs one
// line (glog WARNING for a caller's mistake, ERROR for a failed transfer) naming the method
// and what was wrong.
//
// Thread safety: every method may be called from any thread at once; module.cc releases the
// GIL around every call that can block. initialize() may succeed only once per object.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "managed_buffer.h"
#include "mooncake/transfer_engine.h"

namespace mooncake {
namespace pyapi {

// upstream's TransferEnginePy::TransferOpcode
enum Opcode : int { kRead = 0, kWrite = 1 };  // unscoped: compares equal to ints

// upstream's TransferNotify: sent to the target after a transfer completes.
struct TransferNotify {
  TransferNotify() = default;
  TransferNotify(std::string n, std::string m) : name(std::move(n)), msg(std::move(m)) {}
  std::string name;
  std::string msg;
};

// The C++ engine plus the managed-buffer memory registered with it; what get_engine() hands
// out (as InnerTransferEngine). Members are destroyed in reverse order: the engine (stopping
// every transfer) before the memory it may touch.
struct EngineHolder {
  ManagedBufferPool pool;
  std::unique_ptr<TransferEngine> engine;
};

// The list arguments of the batch methods.
struct BatchArgs {
  const std::vector<uintptr_t>& buffers;
  const std::vector<uintptr_t>& peer_addresses;
  const std::vector<size_t>& lengths;
};

// Applies MC_LOG_LEVEL (TRACE/INFO, WARNING, ERROR) to glog; called once at import.
void ApplyLogLevelFromEnvironment();

class PyTransferEngine {
 public:
  // Reads MC_TRANSFER_TIMEOUT (seconds, default 30, minimum 5).
  PyTransferEngine();
  ~PyTransferEngine();

  int Initialize(const std::string& local_hostname, const std::string& metadata_server,
                 const std::string& protocol, const std::string& device_name);
  int InitializeExt(const std::string& local_hostname, const std::string& metadata_server,
                    const std::string& protocol, const std::string& device_name,
                    const std::string& metadata_type);
  int GetRpcPort();

  uintptr_t AllocateManagedBuffer(size_t length);
  int FreeManagedBuffer(uintptr_t addr, size_t length);
  int RegisterMemory(uintptr_t addr, size_t capacity, const std::string& location);
  int UnregisterMemory(uintptr_t addr);
  int BatchRegisterMemory(const std::vector<uintptr_t>& addrs,
                          const std::vector<size_t>& capacities, const std::string& location);
  int BatchUnregisterMemory(const std::vector<uintptr_t>& addrs);

  // Transfers (py_transfer.cc). `notify` may be null.
  int TransferSync(const char* method, const std::string& target, uintptr_t buffer,
                   uintptr_t peer_address, size_t length, Opcode op,
                   const TransferNotify* notify);
  int BatchTransferSync(const char* method, const std::string& target, const BatchArgs& args,
                        Opcode op, const TransferNotify* notify);
  uint64_t BatchTransferAsync(const char* method, const std::string& target,
                              const BatchArgs& args, Opcode op);
  int GetBatchTransferStatus(const std::vector<uint64_t>& batch_ids);
  int TransferCheckStatus(uint64_t batch_id);

  uintptr_t GetFirstBufferAddress(const std::string& segment_name);
  int SendProbe(const std::string& peer_server_name);
  std::vector<TransferNotify> GetNotifies();
  // The C++ engine, or null before initialize().
  std::shared_ptr<EngineHolder> GetEngine();

  // Test hook: batches this object still owns (async ones not yet reported, plus abandoned
  // ones waiting for their requests to end before they are freed).
  size_t PendingBatches();
  // The timeout of a sync call moving `bytes`: MC_TRANSFER_TIMEOUT + 1 ns per byte.
  std::chrono::milliseconds TimeoutFor(uint64_t bytes) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct AsyncBatch {
    Clock::time_point deadline;
    size_t requests;
  };

  // The initialized engine, or null after logging "<method>: call initialize() first".
  std::shared_ptr<EngineHolder> Ready(const char* method);
  // Checks the lists and opens the target; fills `out` (zero-length entries dropped, as
  // upstream completes them without moving anything). False after logging why.
  bool BuildRequests(TransferEngine& engine, const std::string& what, const std::string& target,
                     const BatchArgs& args, Opcode op, std::vector<TransferRequest>* out);
  // Allocates a batch and submits `requests` (with `notify` if non-null); 0 after logging.
  uint64_t Submit(TransferEngine& engine, const std::string& what,
                  const std::vector<TransferRequest>& requests, const TransferNotify* notify);
  // Waits for a submitted batch until `deadline`, then frees it (or leaves it to be freed
  // once its requests end). Returns 0, or -1 after logging.
  int Finish(TransferEngine& engine, const std::string& what, uint64_t batch, size_t requests,
             Clock::time_point deadline);
  // Frees the batch, or keeps it in abandoned_ until its requests end.
  void Release(TransferEngine& engine, uint64_t batch);
  // Frees abandoned batches whose requests have all ended.
  void ReapAbandoned(TransferEngine& engine);
  // Why a finished batch did not complete: the first failed request's message, and whether
  // a request timed out.
  struct Failure {
    std::string message;
    bool timed_out = false;
  };
  Failure DescribeFailure(TransferEngine& engine, uint64_t batch, size_t requests);

  std::chrono::milliseconds base_timeout_;

  std::mutex init_mu_;  // serializes initialize()
  std::mutex mu_;
  std::shared_ptr<EngineHolder> holder_;                  // GUARDED_BY(mu_); set once
  std::unordered_map<uint64_t, AsyncBatch> async_;        // GUARDED_BY(mu_)
  std::vector<uint64_t> abandoned_;                       // GUARDED_BY(mu_)
};

}  // namespace pyapi
}  // namespace mooncake
