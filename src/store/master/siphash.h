// SipHash (Aumasson and Bernstein, 2012): a keyed 64-bit hash for tables whose keys come
// from peers. With a secret random key per process, a peer cannot choose keys that collide
// in the master's object table (std::hash's MurmurHash2 has multicollisions that hold for
// every seed, so a seed alone does not stop hash flooding). SipHash<1, 3> is the variant
// hash tables use (Rust's, Python's); SipHash<2, 4> is the paper's, kept for its test
// vectors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string_view>

namespace mooncake {
namespace store {

struct SipKey {
  uint64_t k0 = 0, k1 = 0;
};

template <int kC, int kD>
uint64_t SipHash(const SipKey& key, const void* data, size_t len) {
  uint64_t v0 = key.k0 ^ 0x736f6d6570736575ull;
  uint64_t v1 = key.k1 ^ 0x646f72616e646f6dull;
  uint64_t v2 = key.k0 ^ 0x6c7967656e657261ull;
  uint64_t v3 = key.k1 ^ 0x7465646279746573ull;
  auto rotl = [](uint64_t x, int b) { return (x << b) | (x >> (64 - b)); };
  auto round = [&] {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  };
  auto le64 = [](const unsigned char* p) {
    uint64_t m;
    std::memcpy(&m, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    m = __builtin_bswap64(m);
#endif
    return m;
  };
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t whole = len & ~size_t{7};
  for (size_t off = 0; off < whole; off += 8) {
    const uint64_t m = le64(p + off);
    v3 ^= m;
    for (int i = 0; i < kC; ++i) round();
    v0 ^= m;
  }
  uint64_t last = static_cast<uint64_t>(len) << 56;
  for (size_t i = 0; i < (len & 7); ++i) last |= static_cast<uint64_t>(p[whole + i]) << (8 * i);
  v3 ^= last;
  for (int i = 0; i < kC; ++i) round();
  v0 ^= last;
  v2 ^= 0xff;
  for (int i = 0; i < kD; ++i) round();
  return v0 ^ v1 ^ v2 ^ v3;
}

// This process's key, drawn once from the system's random source.
inline const SipKey& ProcessSipKey() {
  static const SipKey key = [] {
    std::random_device rd;
    SipKey k;
    k.k0 = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    k.k1 = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    return k;
  }();
  return key;
}

inline uint64_t KeyedHash(std::string_view s) {
  return SipHash<1, 3>(ProcessSipKey(), s.data(), s.size());
}

}  // namespace store
}  // namespace mooncake
