// HotCache: the environment it is configured from (plain bytes only), (key, version) hits and
// misses, values over one block, least-recently-used eviction by bytes, values split over
// several spans, and a stale fill that must not replace a newer value.
#include "store/client/hot_cache.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

namespace mooncake {
namespace store {
namespace {

struct Env {
  Env(const char* size, const char* block) {
    Set("MC_STORE_LOCAL_HOT_CACHE_SIZE", size);
    Set("MC_STORE_LOCAL_HOT_BLOCK_SIZE", block);
  }
  ~Env() {
    unsetenv("MC_STORE_LOCAL_HOT_CACHE_SIZE");
    unsetenv("MC_STORE_LOCAL_HOT_BLOCK_SIZE");
  }
  static void Set(const char* name, const char* v) {
    if (v == nullptr) {
      unsetenv(name);
    } else {
      setenv(name, v, 1);
    }
  }
};

TEST(HotCacheTest, ConfiguredFromPlainBytesOnly) {
  {
    Env e(nullptr, nullptr);
    auto c = HotCache::FromEnv();
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(c->has_value());  // unset: off
  }
  {
    Env e("0", nullptr);
    ASSERT_TRUE(HotCache::FromEnv().ok());
    EXPECT_FALSE(HotCache::FromEnv()->has_value());
  }
  {
    Env e("1073741824", nullptr);
    auto c = HotCache::FromEnv();
    ASSERT_TRUE(c.ok() && c->has_value());
    EXPECT_EQ((*c)->capacity_bytes, 1073741824u);
    EXPECT_EQ((*c)->block_size, 16u << 20);
  }
  {
    Env e("4096", "1024");
    auto c = HotCache::FromEnv();
    ASSERT_TRUE(c.ok() && c->has_value());
    EXPECT_EQ((*c)->block_size, 1024u);
  }
  for (const char* bad : {"8GB", "8 ", "-1", "+5", "1e9", "0x100", "abc", "99999999999999999999"}) {
    Env e(bad, nullptr);
    auto c = HotCache::FromEnv();
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find(std::string("\"") + bad + "\""), std::string::npos)
        << c.status().message();
  }
  {
    Env e("1000", "4096");  // less than one block
    auto c = HotCache::FromEnv();
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("less than one block"), std::string::npos);
  }
  {
    Env e("4096", "0");
    EXPECT_FALSE(HotCache::FromEnv().ok());
  }
}

std::vector<Span> Of(std::string* s) { return {{s->data(), s->size()}}; }

TEST(HotCacheTest, HitsOnlyTheCachedVersionAndCopiesAcrossSpans) {
  HotCache c({3 * 1024, 1024});
  std::string v = "hello, world";
  c.Fill("k", 7, v.size(), Of(&v));
  std::string a(5, '\0'), b(7, '\0');
  EXPECT_TRUE(c.Read("k", 7, v.size(), {{a.data(), a.size()}, {b.data(), b.size()}}));
  EXPECT_EQ(a + b, v);
  std::string out(v.size(), '\0');
  EXPECT_FALSE(c.Read("k", 8, v.size(), Of(&out)));    // another version: the value changed
  EXPECT_FALSE(c.Read("k", 0, v.size(), Of(&out)));    // no version known: never a hit
  EXPECT_FALSE(c.Read("k", 7, v.size() + 1, Of(&out)));
  EXPECT_FALSE(c.Read("other", 7, v.size(), Of(&out)));
  std::string newer = "new value";
  c.Fill("k", 9, newer.size(), Of(&newer));
  c.Fill("k", 8, v.size(), Of(&v));  // a fill that raced the newer one: dropped
  std::string got(newer.size(), '\0');
  EXPECT_TRUE(c.Read("k", 9, newer.size(), Of(&got)));
  EXPECT_EQ(got, newer);
  c.Fill("v0", 0, v.size(), Of(&v));  // version 0: not kept
  std::string big(2048, 'x');
  c.Fill("big", 1, big.size(), Of(&big));  // over one block: not kept
  EXPECT_EQ(c.stats().entries, 1u);
  c.Erase("k");
  EXPECT_FALSE(c.Read("k", 9, newer.size(), Of(&got)));
}

TEST(HotCacheTest, TheLeastRecentlyUsedGoFirstCountedInBytes) {
  // Room for three entries of 10 bytes and a 2-byte key, not four.
  HotCache c({3 * (10 + 2 + HotCache::kEntryOverhead) + 50, 1024});
  std::string v(10, 'v');
  for (int i = 0; i < 3; ++i) c.Fill("k" + std::to_string(i), 1, v.size(), Of(&v));
  std::string out(10, '\0');
  EXPECT_TRUE(c.Read("k0", 1, 10, Of(&out)));  // k0 recent; k1 is the least
  c.Fill("k3", 1, v.size(), Of(&v));
  EXPECT_FALSE(c.Read("k1", 1, 10, Of(&out)));
  EXPECT_TRUE(c.Read("k0", 1, 10, Of(&out)));
  EXPECT_TRUE(c.Read("k2", 1, 10, Of(&out)));
  EXPECT_TRUE(c.Read("k3", 1, 10, Of(&out)));
  const auto s = c.stats();
  EXPECT_EQ(s.entries, 3u);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.bytes, 30u);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
