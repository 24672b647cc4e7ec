// SegmentDesc: what a peer needs to reach a segment, and its JSON form.
//
// The JSON is upstream Mooncake's (docs/wire_protocol.md §2): compact, keys sorted, ending in
// "\n"; fields name, protocol, tcp_data_port, tcp_proto_version, timestamp, buffers[]. Fields
// this engine adds for its own transports sit beside them and are ignored by upstream.
// Decoding accepts any field order, ignores unknown fields, bounds nesting depth and size,
// and rejects wrong types with a message naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake/status.h"

namespace mooncake {

struct BufferDesc {
  std::string name;  // tcp: the segment name; rdma/ascend: the memory location
  uint64_t addr = 0;
  uint64_t length = 0;
  // Device memory (our extension, written only for it): "mc_location" ("cuda:N", "npu:N"), and where
  // the owner exported one, "mc_ipc_handle" (128 hex digits, a cudaIpcMemHandle_t) and
  // "mc_ipc_offset" (of addr inside the allocation the handle names).
  std::string location = {};  // "" for host memory
  int device = -1;       // N of "cuda:N" / "npu:N", else -1
  std::string ipc_handle = {};
  uint64_t ipc_offset = 0;
  // UCX transport (our extension, "mc_ucx_rkey"): the packed remote key of this buffer's UCX
  // memory handle, in hex (at most 2 * kMaxUcxRkeyBytes digits). "" when the owner has none.
  std::string ucx_rkey = {};
  uint64_t end() const { return addr + length; }
};

struct SegmentDesc {
  std::string name;
  std::string protocol = "tcp";
  uint16_t tcp_data_port = 0;
  // Host of the TCP data port; upstream writes it (same as the segment name's host). Empty
  // when absent: the segment name's host is used.
  std::string tcp_data_host;
  std::string rdma_server_name;  // upstream writes "" for tcp
  int tcp_proto_version = 1;  // missing in the JSON means 1
  std::string timestamp;      // ignored when comparing
  std::vector<BufferDesc> buffers;
  // Same-host transport (our extension; upstream ignores these). Written only when set.
  std::string mc_host_id;   // boot id + namespaces: equal only within one kernel and pid ns
  uint64_t mc_pid = 0;      // the engine's process id
  std::string mc_shm_path;  // unix socket of the same-host transport
  // The TCP data server applies HELLO/FENCE frames (src/transport/tcp/tcp_fence.h):
  // "mc_tcp_fence": 1. Written only when set.
  bool mc_tcp_fence = false;
  // UCX transport (our extension): the UCP worker address, in hex (at most
  // 2 * kMaxUcxWorkerAddressBytes digits). Written only when set.
  std::string mc_ucx_worker;
  // Shared-secret signature (our extension, only with MC_AUTH_SECRET; docs/wire_protocol.md
  // §5.4): "mc_auth_instance", the owner's random id for this engine start (hex), and
  // "mc_auth_sig", Authenticator::SignEntry("segment", cluster id, SegmentDescSigningBytes)
  // in hex. Written only when set.
  std::string mc_auth_instance;
  std::string mc_auth_sig;
  // Where to reach the peer: set by whoever fetched the descriptor (P2P: the host part of
  // the segment name). Not part of the JSON.
  std::string host;
  // The name this descriptor was fetched under (may differ from `name`, e.g. another
  // address of the same host). Not part of the JSON.
  std::string lookup_name;

  // The buffer wholly containing [addr, addr+len), or nullptr.
  const BufferDesc* FindBuffer(uint64_t addr, uint64_t len) const;
  // Equal in everything but the timestamp.
  bool SameContent(const SegmentDesc& other) const;
};

constexpr size_t kMaxDescriptorBuffers = 1 << 20;
// Bounds on the UCX fields a peer sends (bytes, before hex): far above what UCX 1.13 packs
// (a worker address with several NICs is a few hundred bytes, an rkey tens to hundreds).
constexpr size_t kMaxUcxWorkerAddressBytes = 16384;
constexpr size_t kMaxUcxRkeyBytes = 4096;
constexpr size_t kMaxAuthFieldBytes = 64;  // mc_auth_instance, mc_auth_sig

std::string EncodeSegmentDesc(const SegmentDesc& desc);
// What the signature covers: the encoding of `desc` without "mc_auth_sig". A decoded
// descriptor re-encodes to the bytes its owner signed (every field decoded is encoded, in a
// canonical form), so unknown keys, whitespace or key order added by others do not count.
std::string SegmentDescSigningBytes(const SegmentDesc& desc);
Result<SegmentDesc> DecodeSegmentDesc(std::string_view json);

// "%Y-%m-%d %H:%M:%S.uuuuuu" in local time, as upstream stamps descriptors.
std::string DescriptorTimestampNow();

}  // namespace mooncake
