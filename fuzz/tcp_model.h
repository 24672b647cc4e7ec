// The TCP data protocol as docs/wire_protocol.md §3 specifies it, written independently of
// src/transport/tcp: given the bytes an initiator sends (then EOF) and the target's memory,
// what the target must send back and what its memory must look like afterwards.
// Also the input format of the TCP fuzz targets (raw bytes or structured requests).
#pragma once

#include <endian.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.h"

namespace fuzz {

struct TcpExpectation {
  // Every reply the target owes, in request order. Replies may be held back and coalesced,
  // but all of them go out before the target closes (§3.3: also on EOF, an unknown opcode or
  // a failed request), so this is exactly what the client must receive ...
  std::string full;
  // ... except over TCP when the target closes with input unread (see
  // closes_with_unread_input): then only a prefix of `full` is certain to arrive.
  size_t min_len = 0;
  // The registered buffer afterwards. Bytes of a WRITE cut short by EOF may hold the old
  // value or the new one (either[i] != 0, new value alt[i]).
  std::vector<uint8_t> mem, either, alt;
  int requests = 0;  // requests fully applied (statistics)
  // The target closes with input still unread (after an unknown opcode or a v1 rejection,
  // with more bytes behind it). Over TCP that close resets the connection and the kernel
  // drops reply bytes not yet transmitted, so only the prefix rule holds then.
  bool closes_with_unread_input = false;
};

inline void AppendStatus(std::string* out, uint32_t code) {
  uint64_t v = htole64((uint64_t{0x4D435456} << 32) | code);
  out->append(reinterpret_cast<const char*>(&v), 8);
}

inline TcpExpectation ModelTcp(const std::string& in, const Arena& arena) {
  TcpExpectation e;
  const uint64_t base = arena.remote_addr();
  const uint64_t size_limit = Arena::kRemoteSize;
  e.mem.assign(arena.remote(), arena.remote() + size_limit);  // caller has just Reset() it
  e.either.assign(size_limit, 0);
  e.alt.assign(size_limit, 0);
  size_t pos = 0;
  int frames = 0;  // frames before this one
  bool hello = false;
  uint64_t hello_session = 0;
  for (;;) {
    if (in.size() - pos < 24) break;  // EOF (possibly inside a header)
    uint64_t size, addr;
    std::memcpy(&size, in.data() + pos, 8);
    std::memcpy(&addr, in.data() + pos + 8, 8);
    size = le64toh(size);
    addr = le64toh(addr);
    uint8_t opbyte = static_cast<uint8_t>(in[pos + 16]);
    pos += 24;
    bool v2 = opbyte & 0x80;
    uint8_t op = opbyte & 0x7f;
    if ((op == 0x10 || op == 0x11) && addr == 0x3156454E43464D4Dull) {
      // HELLO / FENCE (§3.6): no reply. Valid: body 32 + 8n bytes, n <= 64 and equal to the
      // count field (whose high half is zero), non-zero session, a HELLO first with a non-zero
      // connection id, a FENCE only after a HELLO and for its session. Anything else closes.
      // With one connection per input nothing is ever fenced.
      if (size < 32 || size > 32 + 64 * 8 || (size - 32) % 8 != 0) {
        e.closes_with_unread_input = pos < in.size();
        break;
      }
      if (in.size() - pos < size) break;  // EOF inside the body
      uint64_t session, conn, counts;
      std::memcpy(&session, in.data() + pos, 8);
      std::memcpy(&conn, in.data() + pos + 8, 8);
      std::memcpy(&counts, in.data() + pos + 24, 8);
      session = le64toh(session);
      conn = le64toh(conn);
      counts = le64toh(counts);
      pos += size;
      bool ok = session != 0 && counts == (size - 32) / 8;
      if (op == 0x10) {
        ok = ok && conn != 0 && frames == 0;
        hello_session = session;
      } else {
        ok = ok && hello && session == hello_session;
      }
      ++frames;
      if (!ok) {
        e.closes_with_unread_input = pos < in.size();
        break;
      }
      hello = true;
      continue;
    }
    ++frames;
    if (op > 1) {  // unknown operation: closed without a reply
      e.closes_with_unread_input = pos < in.size();
      break;
    }
    bool in_range = size > 0 && addr + size >= addr && addr >= base &&
                    addr + size <= base + size_limit;
    if (!in_range) {
      if (v2) {
        AppendStatus(&e.full, 1);  // then the target drains the input and closes
      } else {
        e.closes_with_unread_input = pos < in.size();
      }
      break;
    }
    size_t off = addr - base;
    if (op == 1) {  // WRITE
      size_t avail = std::min<uint64_t>(size, in.size() - pos);
      if (avail < size) {  // EOF in the payload: a prefix may have been applied
        for (size_t i = 0; i < avail; ++i) {
          e.either[off + i] = 1;
          e.alt[off + i] = static_cast<uint8_t>(in[pos + i]);
        }
        break;
      }
      std::memcpy(e.mem.data() + off, in.data() + pos, size);
      pos += size;
      ++e.requests;
      if (v2) AppendStatus(&e.full, 0);
    } else {  // READ: the memory as it is now, whenever the reply goes out
      if (v2) AppendStatus(&e.full, 0);
      e.full.append(reinterpret_cast<const char*>(e.mem.data() + off), size);
      ++e.requests;
    }
  }
  e.min_len = e.full.size();  // replies still held back go out before the close
  return e;
}

// Checks what the target did against the model. `who` names the target in messages;
// `over_tcp`: the connection is a TCP one (see closes_with_unread_input).
inline void CheckTcp(const TcpExpectation& e, const std::string& got, Arena& arena,
                     const char* who, bool over_tcp) {
  if (got.size() > e.full.size() || e.full.compare(0, got.size(), got) != 0) {
    size_t i = 0;
    while (i < got.size() && i < e.full.size() && got[i] == e.full[i]) ++i;
    Fail("%s: reply differs from the protocol: got %zu bytes, expected a prefix of %zu "
         "(at least %zu); first difference at byte %zu", who, got.size(), e.full.size(),
         e.min_len, i);
  }
  if (got.size() < e.min_len && !(over_tcp && e.closes_with_unread_input)) {
    Fail("%s: reply too short: got %zu bytes, expected %zu (replies held back must go out "
         "before the target closes)", who, got.size(), e.full.size());
  }
  const uint8_t* m = arena.remote();
  if (std::memcmp(m, e.mem.data(), Arena::kRemoteSize) == 0) {
    arena.CheckUntouched(who);
    return;
  }
  for (size_t i = 0; i < Arena::kRemoteSize; ++i) {
    if (m[i] == e.mem[i]) continue;
    if (e.either[i] && m[i] == e.alt[i]) continue;
    Fail("%s: registered buffer differs from the protocol at offset %zu (0x%02x, expected "
         "0x%02x)", who, i, m[i], e.mem[i]);
  }
  arena.CheckUntouched(who);
}

// Input format of the TCP targets.
//   byte 0 (mode): bit 0 clear: raw - the rest of the input is the byte stream, verbatim
//                  (absolute addresses: the arena is at Arena::kFixedBase).
//                  bit 0 set: structured - the rest is a list of requests (below);
//                  bit 1 set (structured): 3 bytes (LE) cut the generated stream to that length.
//                  bits 2-3: the client's SO_SNDBUF, bits 4-5: its SO_RCVBUF, each
//                  kClientBuffers[v] (0: the default): small buffers make the target receive
//                  in pieces and block on sending, as over a real network.
//   structured request: byte k, then fields:
//     k bit 0: WRITE (else READ); bit 1: v2 flag; bits 2-3: address base 0/1 registered
//     buffer, 2 buffer registered without remote access, 3 none (8 raw bytes follow instead
//     of the offset); bits 4-5: size as 0: u8 + 1, 1: u16, 2: u32, 3: u64;
//     bit 6: a raw opcode byte follows (replaces op/v2); bit 7: 7 raw padding bytes follow.
//     Then: offset (signed 24-bit LE, relative to the base), size, [opcode], [padding],
//     and for a WRITE a pattern byte p: the payload is min(size, 256 KiB) bytes p + i * 7.
constexpr size_t kMaxStream = 2 << 20;
constexpr size_t kMaxPayload = 256 << 10;
constexpr int kClientBuffers[4] = {0, 4096, 16384, 65536};

// The client's socket buffer sizes chosen by the input (0: leave the default).
inline void TcpClientBuffers(const uint8_t* data, size_t size, int* sndbuf, int* rcvbuf) {
  uint8_t mode = size ? data[0] : 0;
  *sndbuf = kClientBuffers[(mode >> 2) & 3];
  *rcvbuf = kClientBuffers[(mode >> 4) & 3];
}

inline void ApplyClientBuffers(int fd, const uint8_t* data, size_t size) {
  int snd, rcv;
  TcpClientBuffers(data, size, &snd, &rcv);
  if (snd) ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &snd, sizeof(snd));
  if (rcv) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
}

inline std::string BuildTcpStream(const uint8_t* data, size_t size, const Arena& arena) {
  if (size == 0) return {};
  uint8_t mode = data[0];
  Reader r(data + 1, size - 1);
  if (!(mode & 1)) return r.Rest();
  size_t cut = SIZE_MAX;
  if (mode & 2) cut = r.U8() | (r.U8() << 8) | (r.U8() << 16);
  std::string s;
  while (!r.empty() && s.size() < kMaxStream) {
    uint8_t k = r.U8();
    uint64_t addr;
    switch ((k >> 2) & 3) {
      case 0:
      case 1:
      case 2: {
        uint32_t raw = r.U8() | (r.U8() << 8) | (r.U8() << 16);
        int64_t off = static_cast<int32_t>(raw << 8) >> 8;  // sign-extend 24 bits
        uint64_t b = ((k >> 2) & 3) == 2 ? arena.local_addr() : arena.remote_addr();
        addr = b + static_cast<uint64_t>(off);
        break;
      }
      default:
        addr = r.U64();
    }
    uint64_t size_field;
    switch ((k >> 4) & 3) {
      case 0: size_field = uint64_t{r.U8()} + 1; break;
      case 1: size_field = r.U16(); break;
      case 2: size_field = r.U32(); break;
      default: size_field = r.U64();
    }
    uint8_t opbyte = static_cast<uint8_t>((k & 1) | ((k & 2) ? 0x80 : 0));
    if (k & 0x40) opbyte = r.U8();
    uint8_t hdr[24] = {};
    uint64_t le = htole64(size_field);
    std::memcpy(hdr, &le, 8);
    le = htole64(addr);
    std::memcpy(hdr + 8, &le, 8);
    hdr[16] = opbyte;
    if (k & 0x80) {
      std::string pad = r.Bytes(7);
      std::memcpy(hdr + 17, pad.data(), pad.size());
    }
    s.append(reinterpret_cast<const char*>(hdr), 24);
    if ((opbyte & 0x7f) == 1) {
      uint8_t p = r.U8();
      size_t n = static_cast<size_t>(std::min<uint64_t>(size_field, kMaxPayload));
      size_t at = s.size();
      s.resize(at + n);
      for (size_t i = 0; i < n; ++i) s[at + i] = static_cast<char>(p + i * 7);
    }
  }
  if (s.size() > cut) s.resize(cut);
  return s;
}

}  // namespace fuzz
