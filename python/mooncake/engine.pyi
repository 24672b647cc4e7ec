"""Mooncake Transfer Engine: move bytes between the registered memory of processes.

Compatible with upstream Mooncake's ``mooncake.engine``. Conventions:

* Integer results are 0 on success and negative on failure; nothing raises on an ordinary
  failure, and every failure logs one line on stderr saying what was wrong.
* Batch ids are non-zero; 0 means the submit failed.
* Every call that can block releases the GIL.
* Sync transfers wait at most ``MC_TRANSFER_TIMEOUT`` seconds (default 30, minimum 5) plus
  1 ns per byte.

Error codes (upstream's ``include/error.h``) of the methods that return "an error code"
(register/unregister, send_probe, free_managed_buffer); our C++ Status code in brackets:

====  ==========================  ============================================
  -1  ERR_INVALID_ARGUMENT        [InvalidArgument, Internal] bad argument
  -2  ERR_TOO_MANY_REQUESTS       [ResourceExhausted] capacity limit
  -3  ERR_ADDRESS_NOT_REGISTERED  [NotFound] not the start of a registered buffer
  -4  ERR_BATCH_BUSY              [FailedPrecondition] transfers still in flight
  -7  ERR_ADDRESS_OVERLAPPED      [AlreadyExists] overlaps a registered buffer
-102  ERR_SOCKET                  [Unavailable, DeadlineExceeded] peer unreachable/silent
-103  ERR_MALFORMED_JSON          [DataLoss] peer sent something malformed
-104  ERR_REJECT_HANDSHAKE        [PermissionDenied] peer refused
-303  ERR_NOT_IMPLEMENTED         [Unimplemented] not built into this engine
====  ==========================  ============================================

Transfer methods return -1 for every failure, as upstream does.
"""

from typing import List, Optional, overload

__version__: str

SUPPORT_CUDA: bool
SUPPORT_EFA: bool
SUPPORT_HIP: bool
SUPPORT_INTRA_NVLINK: bool
SUPPORT_MNNVL: bool
SUPPORT_MUSA: bool

class TransferOpcode:
    """Direction of a transfer: Read (0) copies peer -> local, Write (1) local -> peer."""

    Read: TransferOpcode
    Write: TransferOpcode
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

Read: TransferOpcode
Write: TransferOpcode

class TransferNotify:
    """A message delivered to the target's get_notifies() after a transfer completes."""

    name: str
    msg: str
    @overload
    def __init__(self) -> None: ...
    @overload
    def __init__(self, name: str, msg: str) -> None: ...

class InnerTransferEngine:
    """The C++ engine behind a TransferEngine (opaque; from get_engine())."""

class TransferEngine:
    """One transfer engine: a segment of registered memory that peers can read and write,
    and the initiator of transfers to the segments of peers.

    Its segment name, which peers pass as ``target_hostname``, is
    ``"<host of local_hostname>:<get_rpc_port()>"``.
    """

    TransferOpcode = TransferOpcode

    def __init__(self) -> None:
        """Create an engine; reads MC_TRANSFER_TIMEOUT. Call initialize() next."""

    def initialize(
        self, local_hostname: str, metadata_server: str, protocol: str, device_name: str, /
    ) -> int:
        """Start the engine.

        metadata_server: "P2PHANDSHAKE", or a store ("etcd://h:p", "redis://h:p",
        "http://...", a bare "h:p" meaning etcd); -1 if not built or unreachable.
        protocol: "tcp"; "" (all built in); "rdma" (as "", plus one warning when RDMA is not
        built); any other must be built in, else -1 with a log line naming it.
        local_hostname: "host[:port]" (the port is ignored under P2PHANDSHAKE).
        Returns 0 or -1; succeeds once per object."""

    def initialize_ext(
        self,
        local_hostname: str,
        metadata_server: str,
        protocol: str,
        device_name: str,
        metadata_type: str,
        /,
    ) -> int:
        """As initialize(), with the metadata type given apart. Returns 0 or -1."""

    def get_rpc_port(self) -> int:
        """The handshake (RPC) port: the segment name is "<host>:<port>". -1 before initialize()."""

    def allocate_managed_buffer(self, length: int, /) -> int:
        """Allocate registered memory (size classes 8 KiB..256 MiB; larger: own mapping).
        Returns the address, or 0."""

    def free_managed_buffer(self, buffer_addr: int, length: int, /) -> int:
        """Free a managed block (length as allocated). Returns 0, -3 (unknown block) or -1."""

    def transfer_sync_write(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int:
        """Write local buffer -> peer address and wait (GIL released, MC_TRANSFER_TIMEOUT +
        1 ns/byte). Zero length completes at once. transport_hint is ignored. Returns 0 or -1."""

    def transfer_sync_read(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int:
        """Read peer address -> local buffer and wait. Returns 0 or -1."""

    def transfer_sync(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        opcode: TransferOpcode,
        notify: Optional[TransferNotify] = None,
        transport_hint: str = "",
    ) -> int:
        """Transfer in direction opcode and wait; notify (if given) is sent to the target once
        the transfer completed. One attempt. Returns 0 or -1."""

    def batch_transfer_sync_write(
        self,
        target_hostname: str,
        buffers: List[int],
        peer_buffer_addresses: List[int],
        lengths: List[int],
        transport_hint: str = "",
    ) -> int:
        """Write several ranges as one batch and wait for all. Lists of equal length.
        Thread-safe. Returns 0 or -1."""

    def batch_transfer_sync_read(
        self,
        target_hostname: str,
        buffers: List[int],
        peer_buffer_addresses: List[int],
        lengths: List[int],
        transport_hint: str = "",
    ) -> int:
        """Read several ranges as one batch and wait for all. Returns 0 or -1."""

    def batch_transfer_sync(
        self,
        target_hostname: str,
        buffers: List[int],
        peer_buffer_addresses: List[int],
        lengths: List[int],
        opcode: TransferOpcode,
        notify: Optional[TransferNotify] = None,
        transport_hint: str = "",
    ) -> int:
        """A batch in direction opcode, waited for; notify sent once it completed.
        Returns 0 or -1."""

    def batch_transfer_async_write(
        self,
        target_hostname: str,
        buffers: List[int],
        peer_buffer_addresses: List[int],
        lengths: List[int],
        transport_hint: str = "",
    ) -> int:
        """Start a write batch; returns its id (non-zero) or 0. Report it with
        get_batch_transfer_status() or transfer_check_status()."""

    def batch_transfer_async_read(
        self,
        target_hostname: str,
        buffers: List[int],
        peer_buffer_addresses: List[int],
        lengths: List[int],
        transport_hint: str = "",
    ) -> int:
        """Start a read batch; returns its id (non-zero) or 0."""

    def batch_transfer_async(
        self,
        target_hostname: str,
        buffers: List[int],
        peer_buffer_addresses: List[int],
        lengths: List[int],
        opcode: TransferOpcode,
        transport_hint: str = "",
    ) -> int:
        """Start a batch in direction opcode; returns its id (non-zero) or 0."""

    def get_batch_transfer_status(self, batch_ids: List[int], /) -> int:
        """Wait until all batches completed (each freed), or one failed or timed out (the
        rest freed once they end). Each id is reported once. Returns 0 or -1."""

    def transfer_submit_write(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int:
        """Start one write; returns its batch id (non-zero) or 0."""

    def transfer_check_status(self, batch_id: int, /) -> int:
        """Poll without blocking: 1 completed (freed), 0 in progress, -1 failed or unknown,
        -2 timed out."""

    def write_bytes_to_buffer(self, dest_address: int, src: bytes, length: int, /) -> int:
        """memcpy the first length bytes of src to dest_address. Returns 0 or -1."""

    def read_bytes_from_buffer(self, source_address: int, length: int, /) -> bytes:
        """Copy length bytes at source_address into a new bytes object."""

    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        """Register a range for transfers. Returns 0, -1 (null/zero length), -7 (overlap)."""

    def unregister_memory(self, buffer_addr: int, /) -> int:
        """Unregister the buffer starting at buffer_addr. Returns 0, -3 (not registered),
        -4 (still in use)."""

    def batch_register_memory(
        self, buffer_addresses: List[int], capacities: List[int], location: str = "*"
    ) -> int:
        """Register several buffers, all or none. Returns 0, -1, -7."""

    def batch_unregister_memory(self, buffer_addresses: List[int], /) -> int:
        """Unregister several buffers. Returns 0 or the first error code."""

    def get_local_topology(self, device_name: Optional[str] = None) -> str:
        """Upstream's JSON priority matrix; without RDMA: {"cpu:N": [[], []], ...}."""

    def get_first_buffer_address(self, segment_name: str, /) -> int:
        """Address of the first buffer of a segment (own name allowed), or 0."""

    def warmup_efa_segment(self, segment_name: str) -> int:
        """EFA is not built: does nothing, returns 0."""

    def get_notifies(self) -> List[TransferNotify]:
        """Notifies received since the last call (drained)."""

    def send_probe(self, peer_server_name: str) -> int:
        """0 if the peer's handshake server answers, else -1 (bad name), -102
        (unreachable/silent) or -103 (malformed answer)."""

    def get_engine(self) -> Optional[InnerTransferEngine]:
        """The C++ engine (opaque), or None before initialize()."""

    def get_engine_ptr(self) -> int:
        """Address of the C++ engine, or 0 before initialize()."""

    def _pending_batches(self) -> int:
        """For tests: batches this object still owns."""
