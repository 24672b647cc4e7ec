#include "common/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace mooncake {
namespace {

TEST(Crc32c, KnownValues) {
  // RFC 3720 B.4 and the usual check value.
  EXPECT_EQ(Crc32c(0, "123456789", 9), 0xe3069283u);
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(0, zeros.data(), zeros.size()), 0x8a9136aau);
  std::string ones(32, '\xff');
  EXPECT_EQ(Crc32c(0, ones.data(), ones.size()), 0x62a8ab43u);
  EXPECT_EQ(Crc32c(0, nullptr, 0), 0u);
}

TEST(Crc32c, FastAndPortableAgreeOnEveryLengthAndAlignment) {
  std::mt19937_64 rng(7);
  std::string buf(3 * 4096 * 3 + 77, '\0');
  for (auto& ch : buf) ch = static_cast<char>(rng());
  for (size_t off : {0, 1, 3, 7}) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 4095, 4096, 12287, 12288, 12289, 24576 + 5, 36864}) {
      if (off + n > buf.size()) continue;
      EXPECT_EQ(Crc32c(0, buf.data() + off, n), Crc32cPortable(0, buf.data() + off, n))
          << "off " << off << " n " << n;
    }
  }
}

TEST(Crc32c, ExtendsAcrossPieces) {
  std::string s(50000, 'x');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 131 + 7);
  const uint32_t whole = Crc32c(0, s.data(), s.size());
  for (size_t cut : {0, 1, 4096, 12288, 12289, 49999}) {
    uint32_t c = Crc32c(0, s.data(), cut);
    c = Crc32c(c, s.data() + cut, s.size() - cut);
    EXPECT_EQ(c, whole) << cut;
  }
  s[40000] ^= 1;
  EXPECT_NE(Crc32c(0, s.data(), s.size()), whole);
}

}  // namespace
}  // namespace mooncake
