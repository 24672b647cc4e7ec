#include "common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace mooncake {
namespace {

constexpr uint32_t kPoly = 0x82f63b78;  // reflected Castagnoli polynomial

constexpr std::array<std::array<uint32_t, 256>, 8> MakeTables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
  return t;
}
constexpr auto kTables = MakeTables();

#if defined(__x86_64__)
constexpr size_t kBlock = 4096;

// The register after kBlock zero bytes, as a function of the register before: linear, so
// four byte-indexed tables (built once with the instruction itself).
struct ShiftTables {
  uint32_t t[4][256];
};

__attribute__((target("sse4.2"))) ShiftTables MakeShiftTables() {
  ShiftTables s{};
  for (int j = 0; j < 4; ++j) {
    for (uint32_t v = 0; v < 256; ++v) {
      uint64_t c = static_cast<uint64_t>(v) << (8 * j);
      for (size_t i = 0; i < kBlock; i += 8) c = _mm_crc32_u64(c, 0);
      s.t[j][v] = static_cast<uint32_t>(c);
    }
  }
  return s;
}

__attribute__((target("sse4.2"))) uint64_t ShiftBlock(uint64_t c) {
  static const ShiftTables s = MakeShiftTables();
  const auto x = static_cast<uint32_t>(c);
  return s.t[0][x & 0xff] ^ s.t[1][(x >> 8) & 0xff] ^ s.t[2][(x >> 16) & 0xff] ^
         s.t[3][x >> 24];
}

__attribute__((target("sse4.2"))) uint32_t Crc32cHw(uint32_t crc, const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  uint64_t c = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(b) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *b++);
    --n;
  }
  // Three independent streams hide the instruction's 3-cycle latency.
  while (n >= 3 * kBlock) {
    uint64_t c1 = 0, c2 = 0;
    const auto* b1 = b + kBlock;
    const auto* b2 = b + 2 * kBlock;
    for (size_t i = 0; i < kBlock; i += 8) {
      uint64_t v0, v1, v2;
      std::memcpy(&v0, b + i, 8);
      std::memcpy(&v1, b1 + i, 8);
      std::memcpy(&v2, b2 + i, 8);
      c = _mm_crc32_u64(c, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    // crc(A||B||C) from crc(A), crc'(B), crc'(C) (the primed ones started from 0): the
    // register is linear, so shift crc(A) over |B| zero bytes, xor crc'(B), and again.
    c = ShiftBlock(c) ^ c1;
    c = ShiftBlock(c) ^ c2;
    b += 3 * kBlock;
    n -= 3 * kBlock;
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, b, 8);
    c = _mm_crc32_u64(c, v);
    b += 8;
    n -= 8;
  }
  while (n > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *b++);
    --n;
  }
  return ~static_cast<uint32_t>(c);
}

bool HaveSse42() { return __builtin_cpu_supports("sse4.2"); }
#endif

}  // namespace

uint32_t Crc32cPortable(uint32_t crc, const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  uint32_t c = ~crc;
  while (n >= 8) {
    uint32_t lo;
    uint32_t hi;
    std::memcpy(&lo, b, 4);
    std::memcpy(&hi, b + 4, 4);
    lo ^= c;
    c = kTables[7][lo & 0xff] ^ kTables[6][(lo >> 8) & 0xff] ^ kTables[5][(lo >> 16) & 0xff] ^
        kTables[4][lo >> 24] ^ kTables[3][hi & 0xff] ^ kTables[2][(hi >> 8) & 0xff] ^
        kTables[1][(hi >> 16) & 0xff] ^ kTables[0][hi >> 24];
    b += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ kTables[0][(c ^ *b++) & 0xff];
  return ~c;
}

uint32_t Crc32c(uint32_t crc, const void* p, size_t n) {
#if defined(__x86_64__)
  static const bool hw = HaveSse42();
  if (hw) return Crc32cHw(crc, p, n);
#endif
  return Crc32cPortable(crc, p, n);
}

}  // namespace mooncake
