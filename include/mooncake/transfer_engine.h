// TransferEngine: registers this process's memory as a segment and moves bytes between it and
// the segments of peers, with batched asynchronous requests.
//
// Typical use (same shape as upstream Mooncake):
//   TransferEngine engine;
//   engine.Init("P2PHANDSHAKE", "127.0.0.1");          // segment "127.0.0.1:<rpc port>"
//   engine.RegisterLocalMemory(buf, len);
//   SegmentID peer = engine.OpenSegment("127.0.0.1:15123").value();
//   BatchID b = engine.AllocateBatchID(16).value();
//   engine.SubmitTransfer(b, {{TransferRequest::WRITE, buf, peer, remote_addr, len}});
//   ... poll GetTransferStatus / GetBatchTransferStatus until not WAITING ...
//   engine.FreeBatchID(b);
//
// Thread safety: every method may be called from any thread concurrently, except that Init
// must return before other calls start and the destructor must not race with them.
// Errors: Status codes say what the caller should do (see status.h); messages say what was
// wrong. Nothing here throws.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mooncake/options.h"
#include "mooncake/status.h"
#include "mooncake/types.h"

namespace mooncake {

// What a peer's segment offers, as last fetched.
struct SegmentInfo {
  struct Buffer {
    uint64_t addr;  // address in the peer's process
    uint64_t length;
  };
  std::string name;
  std::string protocol;
  std::vector<Buffer> buffers;
  std::string transport;  // the installed transport requests to it take ("" if none)
};

class TransferEngine {
 public:
  // Options default to EngineOptions::FromEnvironment().
  TransferEngine();
  explicit TransferEngine(const EngineOptions& options);
  // Stops servers and connections; requests still in flight end FAILED.
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // metadata: "P2PHANDSHAKE", or a store: "etcd://h:p[,h2:p2]" (or bare "h:p"), "redis://h:p",
  // "http://h:p/path" (docs/metadata_stores.md).
  // local_server_name: "host[:port]"; under P2PHANDSHAKE the port is ignored and the segment
  // is named "<host>:<rpc port>", the RPC port being a free one in [min_rpc_port,
  // max_rpc_port]. Logs "Transfer Engine RPC using P2P handshake, listening on <ip>:<port>".
  // With a store the segment keeps the name given, published under mooncake/ram/<name> and
  // mooncake/rpc_meta/<name>.
  // `transport`: "" or "auto" picks the best built-in transport; a name asks for that one.
  // Memory may be registered before Init: peers then find it in the very first descriptor
  // they can fetch, i.e. as soon as the "listening on" line is logged. A failed Init keeps
  // those registrations.
  Status Init(const std::string& metadata, const std::string& local_server_name,
              const std::string& transport = "");
  bool initialized() const;

  // This engine's segment name ("host:port" under P2PHANDSHAKE).
  std::string GetLocalSegmentName() const;
  // The handshake (RPC) port; 0 before Init.
  uint16_t GetRpcPort() const;
  // "<host>:<rpc port>".
  std::string GetLocalIpAndPort() const;
  // Names of installed transports.
  std::vector<std::string> GetTransports() const;

  // Registers [addr, addr+length). location: "cpu:N", "cuda:N", or "*" (detect).
  // Errors: InvalidArgument (null, zero length, wrap-around), AlreadyExists (overlap).
  Status RegisterLocalMemory(void* addr, size_t length, const std::string& location = "*",
                             bool remote_accessible = true);
  // `addr` must be the start of a registered buffer (NotFound otherwise). Waits for
  // transfers using the buffer (at most slice_timeout_ms + 1 s); if some remain, the buffer
  // stays registered and FailedPrecondition is returned.
  Status UnregisterLocalMemory(void* addr);
  // All or nothing.
  Status RegisterLocalMemoryBatch(const std::vector<BufferEntry>& buffers,
                                  const std::string& location = "*");
  // Unregisters each; returns the first error, after trying all.
  Status UnregisterLocalMemoryBatch(const std::vector<void*>& addrs);

  // Allocates `length` bytes of shareable memory (memfd-backed, page aligned, zeroed) and
  // registers it. Same-host peers map it and copy with memcpy instead of
  // process_vm_readv/writev. Free it with FreeSharedMemory (which unregisters it first).
  // `huge_page_size` 2 MiB or 1 GiB: HugeTLB pages from the host's reserved pool
  // (/proc/sys/vm/nr_hugepages, or .../hugepages-<size>kB/nr_hugepages), one fault per huge
  // page instead of per 4 KiB; `length` is rounded up to a multiple of it and registered so.
  // ResourceExhausted when the pool has too few free pages (nothing falls back to small pages).
  Result<void*> AllocateSharedMemory(size_t length, const std::string& location = "cpu:0",
                                     size_t huge_page_size = 0);
  Status FreeSharedMemory(void* addr);

  // Resolves a segment by name (leading '/' stripped): a cached id, or a fresh handshake.
  // Our own name gives LOCAL_SEGMENT_ID. Errors: InvalidArgument (empty/malformed name),
  // Unavailable (peer unreachable), DataLoss (malformed descriptor).
  Result<SegmentID> OpenSegment(const std::string& name);
  // Forgets the cached descriptor; the id stays valid and is refetched on next use.
  Status CloseSegment(SegmentID id);
  // Fetches the descriptor again now (e.g. after the peer registered more memory).
  Status RefreshSegment(SegmentID id);
  Result<SegmentInfo> GetSegmentInfo(SegmentID id);

  // A batch holds at most `batch_size` requests over all its submits (1 .. 2^20).
  Result<BatchID> AllocateBatchID(size_t batch_size);
  // Checks every request first; if any is invalid nothing is submitted and the error names
  // the request. Checks: length > 0, no wrap-around, the local range inside registered
  // memory, the segment known, the remote range inside one of its registered buffers
  // (refreshing the descriptor once if not). Errors: NotFound/InvalidArgument for the batch
  // id, ResourceExhausted when the batch would exceed its size.
  Status SubmitTransfer(BatchID batch, const std::vector<TransferRequest>& requests);
  // As SubmitTransfer; once the batch is seen COMPLETED by GetBatchTransferStatus, `notify`
  // is sent to the segment of requests[0].
  Status SubmitTransferWithNotify(BatchID batch, const std::vector<TransferRequest>& requests,
                                  const NotifyDesc& notify);
  // WAITING while slices are out; then COMPLETED, FAILED or TIMEOUT.
  Result<TransferStatus> GetTransferStatus(BatchID batch, size_t task_id);
  // COMPLETED when all tasks are (or there are none); FAILED if any failed or timed out;
  // else WAITING. transferred_bytes sums the tasks.
  Result<TransferStatus> GetBatchTransferStatus(BatchID batch);
  // Blocks until every request of the batch has ended or `timeout` passes (no busy
  // polling); returns the batch status (WAITING on timeout).
  Result<TransferStatus> WaitBatch(BatchID batch, std::chrono::milliseconds timeout);
  // The first failure's message of a task (empty while WAITING or when it succeeded).
  Result<std::string> GetTransferError(BatchID batch, size_t task_id);
  // FailedPrecondition while any request is in flight (the id stays valid).
  Status FreeBatchID(BatchID batch);

  // Submits and waits. DeadlineExceeded after `timeout` (the batch is kept until its
  // requests end, then freed); otherwise OK or the first failure.
  Status TransferSync(const std::vector<TransferRequest>& requests,
                      std::chrono::milliseconds timeout = std::chrono::seconds(60));

  // Notify messages (upstream's Notify RPC).
  Status SendNotify(SegmentID target, const NotifyDesc& notify);
  Status SendNotifyByName(const std::string& segment_name, const NotifyDesc& notify);
  // Drains the messages received so far.
  std::vector<NotifyDesc> GetNotifies();
  // Probe RPC: OK if the peer's handshake daemon answers.
  Status Probe(const std::string& segment_name);

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mooncake
