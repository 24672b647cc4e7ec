// Upstream Mooncake's TCP data framing, protocol v1 and v2 (docs/wire_protocol.md §3).
//
// Request header, 24 bytes: u64 LE size, u64 LE addr (absolute address in the target),
// u8 opcode (READ 0 / WRITE 1, | 0x80 for v2), 7 padding bytes (zero when we send, ignored
// when we receive). WRITE: the payload follows. v2 adds an 8-byte LE status frame from the
// target: magic "MCTV" (0x4D435456) in the high 32 bits, code in the low 32 (0 OK,
// 1 ADDR_REJECTED). v2 READ: status OK, then the payload; v2 WRITE: status after the payload
// is applied. A rejected request gets ADDR_REJECTED and the target closes the connection.
#pragma once

#include <endian.h>

#include <cstdint>
#include <cstring>

namespace mooncake::tcp {

constexpr size_t kHeaderSize = 24;
constexpr size_t kStatusSize = 8;
constexpr uint8_t kOpRead = 0;
constexpr uint8_t kOpWrite = 1;
constexpr uint8_t kV2Flag = 0x80;
constexpr uint32_t kStatusMagic = 0x4D435456;
constexpr uint32_t kStatusOk = 0;
constexpr uint32_t kStatusAddrRejected = 1;

struct Header {
  uint64_t size = 0;
  uint64_t addr = 0;
  uint8_t op = kOpRead;  // without the v2 flag
  bool v2 = false;
};

inline void EncodeHeader(const Header& h, uint8_t out[kHeaderSize]) {
  uint64_t size = htole64(h.size), addr = htole64(h.addr);
  std::memcpy(out, &size, 8);
  std::memcpy(out + 8, &addr, 8);
  out[16] = static_cast<uint8_t>(h.op | (h.v2 ? kV2Flag : 0));
  std::memset(out + 17, 0, 7);
}

// False for an opcode other than READ/WRITE (with or without the v2 flag).
inline bool DecodeHeader(const uint8_t in[kHeaderSize], Header* h) {
  uint64_t size, addr;
  std::memcpy(&size, in, 8);
  std::memcpy(&addr, in + 8, 8);
  h->size = le64toh(size);
  h->addr = le64toh(addr);
  h->v2 = (in[16] & kV2Flag) != 0;
  h->op = in[16] & static_cast<uint8_t>(~kV2Flag);
  return h->op == kOpRead || h->op == kOpWrite;
}

inline uint64_t EncodeStatus(uint32_t code) {
  return htole64((static_cast<uint64_t>(kStatusMagic) << 32) | code);
}

// False when the magic is wrong; *code receives the low 32 bits otherwise.
inline bool DecodeStatus(uint64_t wire, uint32_t* code) {
  uint64_t v = le64toh(wire);
  if (static_cast<uint32_t>(v >> 32) != kStatusMagic) return false;
  *code = static_cast<uint32_t>(v);
  return true;
}

}  // namespace mooncake::tcp
