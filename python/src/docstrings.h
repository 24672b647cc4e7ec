// The contract of every name in mooncake.engine, as help() shows it. Keep in step with
// python/mooncake/engine.pyi (tests/python/test_api_surface.py checks that both list the
// same methods and arguments).
#pragma once

namespace mooncake {
namespace pyapi {
namespace doc {

constexpr const char* kModule = R"(Mooncake Transfer Engine: move bytes between the registered memory of processes.

Compatible with upstream Mooncake's `mooncake.engine`: same names, arguments and return
conventions, so its callers (vLLM's and SGLang's Mooncake connectors) run unchanged.

Conventions
  * Integer results: 0 on success, negative on failure; nothing raises on an ordinary failure.
    Each failure logs one line on stderr (glog) that says what was wrong.
  * Batch ids are non-zero integers; 0 means the submit failed.
  * Addresses are plain integers (e.g. tensor.data_ptr()); lengths are in bytes.
  * Every call that can block releases the GIL.
  * Sync transfers wait at most MC_TRANSFER_TIMEOUT seconds (default 30, minimum 5) plus 1 ns
    per byte; a transfer that has not finished by then returns -1 and is cleaned up later.

Error codes (upstream's include/error.h) returned by the methods documented as returning
"an error code":
  -1    ERR_INVALID_ARGUMENT       bad argument (null address, zero length, bad name, ...)
  -2    ERR_TOO_MANY_REQUESTS      a capacity limit was reached
  -3    ERR_ADDRESS_NOT_REGISTERED the address is not the start of a registered buffer
  -4    ERR_BATCH_BUSY             a batch or buffer still has transfers in flight
  -7    ERR_ADDRESS_OVERLAPPED     the range overlaps a registered buffer
  -102  ERR_SOCKET                 the peer is unreachable or did not answer in time
  -103  ERR_MALFORMED_JSON         the peer sent something malformed
  -104  ERR_REJECT_HANDSHAKE       the peer refused
  -303  ERR_NOT_IMPLEMENTED        not built into this engine
Transfer methods return -1 for every failure, as upstream does; the log line says why.

Module attributes: SUPPORT_CUDA, SUPPORT_EFA, SUPPORT_HIP, SUPPORT_MNNVL, SUPPORT_MUSA,
SUPPORT_INTRA_NVLINK (all False in this build: host memory over TCP).)";

constexpr const char* kOpcode =
    "Direction of a transfer: Read (0) copies peer -> local, Write (1) copies local -> peer.";

constexpr const char* kNotify = R"(A message delivered to the target's get_notifies() after a transfer completes.

Fields: name (str, usually the sender's segment name) and msg (str, opaque).)";

constexpr const char* kInner = R"(The C++ engine behind a TransferEngine (opaque; from get_engine()).

It keeps the engine and its managed buffers alive while referenced.)";

constexpr const char* kClass = R"(One transfer engine: a segment of registered memory that peers can read and write,
and the initiator of transfers to the segments of peers.

Create it, call initialize() once, register memory, then transfer. Its segment name, which
peers pass as target_hostname, is "<host of local_hostname>:<get_rpc_port()>".)";

constexpr const char* kInit = R"(Create an engine (not yet started: call initialize()).

Reads MC_TRANSFER_TIMEOUT (seconds, default 30, minimum 5): the base timeout of sync calls.)";

constexpr const char* kInitialize = R"(Start the engine.

local_hostname: "host[:port]" of this process, e.g. "127.0.0.1:16001". Under P2PHANDSHAKE the
    port is ignored: the engine listens on a free port in [MC_MIN_RPC_PORT, MC_MAX_RPC_PORT]
    (default 15000..17000), see get_rpc_port().
metadata_server: "P2PHANDSHAKE" (peers exchange descriptors directly), or a metadata store:
    "etcd://h:p", "redis://h:p", "http://h:p/path", or a bare "h:p" meaning etcd. A store
    this build does not have, or cannot reach, makes initialize return -1 with a log line
    naming it.
protocol: "tcp"; "" (the transports built in, each peer reached by the best one it shares);
    "rdma" (vLLM's and SGLang's default): as "", plus one warning line when RDMA is not among
    them. Any other name ("ascend", "nvlink", ...) must be built in, else initialize returns
    -1 and the log names the missing transport.
device_name: comma-separated RDMA NIC filter; unused by tcp.

Returns 0, or -1 (the log says why). Succeeds once per object; a second call returns -1.)";

constexpr const char* kInitializeExt = R"(Start the engine, with the metadata type given apart (upstream's initialize_ext).

The metadata connection string is "P2PHANDSHAKE" when metadata_server is "P2PHANDSHAKE",
metadata_server itself when it contains "://", else "<metadata_type>://<metadata_server>".
Otherwise as initialize(). Returns 0, or -1.)";

constexpr const char* kGetRpcPort = R"(The handshake (RPC) port this engine listens on.

Peers name this engine's segment "<host>:<port>". Returns -1 before initialize().)";

constexpr const char* kAllocateManaged = R"(Allocate length bytes of memory that is registered with this engine.

Blocks up to 256 MiB come from per-size-class free lists (powers of two, 8 KiB .. 256 MiB)
carved from 1 GiB registered arenas; larger ones get a registered mapping of their own.
Returns the address, or 0 (length 0, out of memory, not initialized).)";

constexpr const char* kFreeManaged = R"(Return a block from allocate_managed_buffer().

length must be the length it was allocated with (same size class). Returns 0, -3 for an
address that is not a live managed block, or -1 for a length that does not match.)";

constexpr const char* kTransferSyncWrite = R"(Write length bytes from local address buffer to peer_buffer_address in the segment
target_hostname, and wait until they are there.

target_hostname: the peer's segment name, "<host>:<rpc port>" (own name: a local copy).
buffer: a local address inside registered memory.
peer_buffer_address: an address inside memory the peer registered.
transport_hint: accepted for compatibility (upstream's TENT builds only); ignored.

A zero length completes at once. Blocks (GIL released) up to MC_TRANSFER_TIMEOUT + 1 ns/byte.
Returns 0, or -1: unknown or unreachable peer, local range not registered, peer range not
registered by the peer, transfer failed or timed out (the log says which).)";

constexpr const char* kTransferSyncRead = R"(Read length bytes from peer_buffer_address in the segment target_hostname into the
local address buffer, and wait until they are here.

Arguments and results as transfer_sync_write(). Returns 0, or -1.)";

constexpr const char* kTransferSync = R"(Transfer length bytes between local buffer and peer_buffer_address, and wait.

opcode: TransferOpcode.Read (peer -> local) or TransferOpcode.Write (local -> peer).
notify: optional TransferNotify; once the transfer has completed it is sent to the target,
    which receives it from get_notifies(). Not sent when the transfer fails.
One attempt (no retry). Otherwise as transfer_sync_write(). Returns 0, or -1.)";

constexpr const char* kBatchSyncWrite = R"(Write several ranges to the peer as one batch, and wait for all of them.

buffers, peer_buffer_addresses, lengths: lists of equal length; entry i writes lengths[i]
bytes from buffers[i] to peer_buffer_addresses[i]. Zero-length entries are skipped.
Blocks (GIL released) up to MC_TRANSFER_TIMEOUT + 1 ns per byte of the whole batch. Safe to
call from many threads at once. Returns 0 when every entry completed, else -1 (lists of
different lengths, unknown peer, unregistered range, a failed entry, timeout).)";

constexpr const char* kBatchSyncRead = R"(Read several ranges from the peer as one batch, and wait for all of them.

Entry i reads lengths[i] bytes from peer_buffer_addresses[i] into buffers[i]. Otherwise as
batch_transfer_sync_write(). Returns 0, or -1.)";

constexpr const char* kBatchSync = R"(Transfer several ranges as one batch in the direction opcode, and wait for all of them.

notify: optional TransferNotify sent to the target once the whole batch has completed.
Otherwise as batch_transfer_sync_write(). Returns 0, or -1.)";

constexpr const char* kBatchAsyncWrite = R"(Start writing several ranges to the peer as one batch; return without waiting.

Arguments as batch_transfer_sync_write(). Returns the batch id (non-zero), or 0 when nothing
was submitted (lists of different lengths, unknown peer, unregistered range). Pass the id to
get_batch_transfer_status() or transfer_check_status(), which report it and free it; its
timeout (MC_TRANSFER_TIMEOUT + 1 ns/byte) counts from this call.)";

constexpr const char* kBatchAsyncRead = R"(Start reading several ranges from the peer as one batch; return without waiting.

Arguments as batch_transfer_sync_read(). Returns the batch id, or 0. See
batch_transfer_async_write().)";

constexpr const char* kBatchAsync = R"(Start a batch in the direction opcode; return without waiting.

Returns the batch id, or 0. See batch_transfer_async_write().)";

constexpr const char* kGetBatchStatus = R"(Wait for batches from batch_transfer_async_*() / transfer_submit_write().

Blocks (GIL released) until every batch has completed, each being freed, or until one fails
or passes its deadline (MC_TRANSFER_TIMEOUT + 1 ns/byte from its submit). After a failure the
remaining batches are not waited for; they are freed once their requests end. Every id is
reported once: an id already reported, or never returned by a submit, counts as a failure.
Returns 0 when all completed, else -1.)";

constexpr const char* kSubmitWrite = R"(Start writing one range to the peer; return without waiting.

Arguments as transfer_sync_write(). Returns the batch id (non-zero), or 0. Poll it with
transfer_check_status().)";

constexpr const char* kCheckStatus = R"(Poll a batch from transfer_submit_write() / batch_transfer_async_*() without blocking.

Returns 1 completed (the batch is freed), 0 still in progress, -1 failed or unknown id (the
batch is freed once its requests end), -2 timed out: past MC_TRANSFER_TIMEOUT + 1 ns/byte
since its submit, or a request timed out (the batch is freed once its requests end).)";

constexpr const char* kWriteBytes = R"(Copy the first length bytes of src to the local address dest_address.

The address is not checked: it must be writable memory of this process (e.g. from
allocate_managed_buffer()). Returns 0, or -1 (null address, length larger than src).)";

constexpr const char* kReadBytes = R"(Copy length bytes from the local address source_address into a new bytes object.

The address is not checked: it must be readable memory of this process. Returns the bytes
(b"" for a null address).)";

constexpr const char* kRegister = R"(Register [buffer_addr, buffer_addr + capacity) so transfers can use it and peers can
read and write it.

location: "*" (detect), "cpu:<numa node>" or "cuda:<device>".
Returns an error code: 0, -1 (null address, zero capacity, not initialized), -7 (overlaps a
registered buffer).)";

constexpr const char* kUnregister = R"(Unregister the buffer that starts at buffer_addr.

Waits briefly for transfers still using it. Returns an error code: 0, -3 (not the start of a
registered buffer), -4 (transfers still use it; it stays registered).)";

constexpr const char* kBatchRegister = R"(Register several buffers, all or none.

buffer_addresses and capacities: lists of equal length. Returns an error code: 0, -1 (lists
of different lengths, a null address or zero capacity), -7 (an overlap, also between
entries).)";

constexpr const char* kBatchUnregister = R"(Unregister several buffers (each must start a registered buffer).

Tries every address; returns 0 or the first error code (-3, -4).)";

constexpr const char* kTopology = R"(This host's transport topology as upstream's JSON priority matrix.

Without RDMA devices every NUMA node maps to empty lists: {"cpu:0": [[], []], ...}.)";

constexpr const char* kFirstBuffer = R"(The address of the first buffer registered in the segment segment_name.

segment_name may be this engine's own name. Returns the address, or 0 (unknown or unreachable
segment, no buffer registered).)";

constexpr const char* kWarmupEfa = "EFA is not built into this engine: does nothing, returns 0.";

constexpr const char* kGetNotifies = R"(The TransferNotify messages received since the last call (drained).)";

constexpr const char* kSendProbe = R"(Ask the peer's handshake server whether it is alive.

peer_server_name: the peer's segment name "<host>:<rpc port>". Blocks (GIL released) up to
the handshake connect and I/O timeouts. Returns 0 if the peer answered, else an error code
(-1 bad name, -102 unreachable or silent, -103 malformed answer).)";

constexpr const char* kGetEngine = R"(The C++ engine, as an opaque InnerTransferEngine (None before initialize()).)";

constexpr const char* kGetEnginePtr = R"(The address of the C++ mooncake::TransferEngine (0 before initialize()).

Valid while this object (or an InnerTransferEngine from get_engine()) is alive.)";

constexpr const char* kPending = R"(For tests: batches this object still owns (submitted and not yet reported, or
abandoned and waiting for their requests to end).)";

}  // namespace doc
}  // namespace pyapi
}  // namespace mooncake
