// Seeded byte patterns and a fast content hash, shared by the failure tests, the soak program
// and their helper target (fail_peer). Header-only.
//
// pattern(seed)[pos] is a byte of a 64-bit word derived from (seed, pos / 8): any range of any
// buffer can be filled or checked knowing only the seed and the position of its first byte,
// so the target and the initiator agree without exchanging data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mc_failure {

inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

inline uint64_t PatternWord(uint64_t seed, uint64_t word) {
  return Mix64(seed * 0x9E3779B97F4A7C15ULL + word + 0x632BE59BD9B4E019ULL);
}

inline uint8_t PatternByte(uint64_t seed, uint64_t pos) {
  return static_cast<uint8_t>(PatternWord(seed, pos >> 3) >> ((pos & 7) * 8));
}

// dst[0, len) = pattern(seed)[pos, pos + len).
inline void FillPattern(uint8_t* dst, size_t len, uint64_t seed, uint64_t pos) {
  size_t i = 0;
  for (; i < len && ((pos + i) & 7) != 0; ++i) dst[i] = PatternByte(seed, pos + i);
  for (; i + 8 <= len; i += 8) {
    uint64_t w = PatternWord(seed, (pos + i) >> 3);
    std::memcpy(dst + i, &w, 8);
  }
  for (; i < len; ++i) dst[i] = PatternByte(seed, pos + i);
}

// True if p[0, len) == pattern(seed)[pos, pos + len); else *bad = first differing index.
inline bool CheckPattern(const uint8_t* p, size_t len, uint64_t seed, uint64_t pos,
                         uint64_t* bad = nullptr) {
  size_t i = 0;
  for (; i < len && ((pos + i) & 7) != 0; ++i) {
    if (p[i] != PatternByte(seed, pos + i)) {
      if (bad) *bad = i;
      return false;
    }
  }
  for (; i + 8 <= len; i += 8) {
    uint64_t w = PatternWord(seed, (pos + i) >> 3), got;
    std::memcpy(&got, p + i, 8);
    if (got != w) {
      for (size_t k = 0; k < 8; ++k) {
        if (p[i + k] != PatternByte(seed, pos + i + k)) {
          if (bad) *bad = i + k;
          return false;
        }
      }
    }
  }
  for (; i < len; ++i) {
    if (p[i] != PatternByte(seed, pos + i)) {
      if (bad) *bad = i;
      return false;
    }
  }
  return true;
}

// Order- and length-sensitive 64-bit hash of a byte string (not cryptographic: it detects
// corruption, misplaced and missing bytes). Independent of the pointer's alignment.
inline uint64_t HashBytes(const uint8_t* p, size_t len) {
  uint64_t h = 0x84222325cbf29ce4ULL ^ (len * 0x9E3779B97F4A7C15ULL);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h ^= w * 0x9E3779B97F4A7C15ULL;
    h = ((h << 29) | (h >> 35)) * 0xBF58476D1CE4E5B9ULL;
  }
  uint64_t tail = 0;
  for (size_t k = 0; i + k < len; ++k) tail |= static_cast<uint64_t>(p[i + k]) << (8 * k);
  h ^= tail * 0x94D049BB133111EBULL;
  return Mix64(h);
}

}  // namespace mc_failure
