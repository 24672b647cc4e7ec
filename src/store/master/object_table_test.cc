// Unit tests for ObjectTable (src/store/master/object_table.h): lookups, inserts and erases against
// std::unordered_map as the model (with keys made to collide), node addresses that never
// move, erase while iterating, Scan across rehashes, and the index shrinking back.
#include "store/master/object_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace mooncake {
namespace store {
namespace {

struct Rec {
  explicit Rec(int v) : value(v) {}
  int value;
};
using Table = ObjectTable<Rec, 4>;  // few shards: long probe runs, frequent rehashes

std::string Key(int i) { return "model@tp0@" + std::to_string(i) + std::string(40, 'k'); }

void ExpectSame(const Table& t, const std::unordered_map<std::string, int>& model) {
  ASSERT_EQ(t.size(), model.size());
  size_t seen = 0;
  for (const auto& [k, r] : t) {
    auto m = model.find(k);
    ASSERT_NE(m, model.end()) << k;
    EXPECT_EQ(r.value, m->second);
    ++seen;
  }
  EXPECT_EQ(seen, model.size());
  for (const auto& [k, v] : model) {
    auto it = t.find(k);
    ASSERT_NE(it, t.end()) << k;
    EXPECT_EQ(it->second.value, v);
  }
}

// The paper's test vectors (SipHash-2-4, key 00..0f, message 00 01 02 ...); SipHash-1-3
// is the same code with fewer rounds.
TEST(SipHashTest, ReferenceVectors) {
  SipKey key;
  unsigned char kb[16], msg[64];
  for (int i = 0; i < 16; ++i) kb[i] = static_cast<unsigned char>(i);
  for (int i = 0; i < 64; ++i) msg[i] = static_cast<unsigned char>(i);
  std::memcpy(&key.k0, kb, 8);
  std::memcpy(&key.k1, kb + 8, 8);
  const std::pair<size_t, uint64_t> want[] = {
      {0, 0x726fdb47dd0e0e31ull},  {1, 0x74f839c593dc67fdull},  {7, 0xab0200f58b01d137ull},
      {8, 0x93f5f5799a932462ull},  {15, 0xa129ca6149be45e5ull}, {16, 0x3f2acc7f57c29bdbull},
      {63, 0x958a324ceb064572ull}};
  for (const auto& [n, h] : want) EXPECT_EQ((SipHash<2, 4>(key, msg, n)), h) << "length " << n;
}

TEST(SipHashTest, TheTablesHashIsKeyedPerProcess) {
  // Two different keys hash the same string differently; the process key is not zero.
  const SipKey& k = ProcessSipKey();
  EXPECT_FALSE(k.k0 == 0 && k.k1 == 0);
  SipKey other{k.k0 ^ 1, k.k1};
  const std::string s = "Qwen2.5-7B-Instruct@tp0@0123456789abcdef0123456789abcdef01234567";
  EXPECT_NE((SipHash<1, 3>(k, s.data(), s.size())), (SipHash<1, 3>(other, s.data(), s.size())));
  EXPECT_EQ(KeyedHash(s), (SipHash<1, 3>(k, s.data(), s.size())));
}

TEST(ObjectTableTest, EmptyTable) {
  Table t;
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t.begin(), t.end());
  EXPECT_EQ(t.find("x"), t.end());
  EXPECT_EQ(t.erase("x"), 0u);
  EXPECT_EQ(t.PrefetchNode(Table::Hash("x")), nullptr);
  Table::Cursor c;
  int visits = 0;
  EXPECT_TRUE(t.Scan(&c, 100, [&](auto&) { ++visits; }));
  EXPECT_EQ(visits, 0);
}

TEST(ObjectTableTest, InsertFindEraseAgainstAModel) {
  Table t;
  std::unordered_map<std::string, int> model;
  std::mt19937 rng(7);
  for (int step = 0; step < 200000; ++step) {
    const int k = static_cast<int>(rng() % 3000);
    const std::string key = Key(k);
    switch (rng() % 3) {
      case 0: {
        auto [it, fresh] = t.emplace(key, step);
        auto [m, mfresh] = model.emplace(key, step);
        ASSERT_EQ(fresh, mfresh);
        ASSERT_EQ(it->first, key);
        ASSERT_EQ(it->second.value, m->second);
        break;
      }
      case 1:
        ASSERT_EQ(t.erase(key), model.erase(key));
        break;
      default: {
        auto it = t.find(key);
        ASSERT_EQ(it != t.end(), model.count(key) == 1);
        if (it != t.end()) {
          ASSERT_EQ(it->second.value, model[key]);
        }
      }
    }
    if (step % 20000 == 0) ExpectSame(t, model);
  }
  ExpectSame(t, model);
}

TEST(ObjectTableTest, NodesNeverMoveAcrossGrowthAndErases) {
  Table t;
  std::map<std::string, const Table::Entry*> where;
  for (int i = 0; i < 20000; ++i) {
    auto [it, fresh] = t.emplace(Key(i), i);
    ASSERT_TRUE(fresh);
    where[Key(i)] = &*it;
    if (i % 3 == 0) {
      const std::string gone = Key(i / 2);
      if (where.erase(gone)) t.erase(gone);
    }
  }
  for (const auto& [k, e] : where) {
    auto it = t.find(k);
    ASSERT_NE(it, t.end());
    EXPECT_EQ(&*it, e) << "the record of " << k << " moved";
  }
}

TEST(ObjectTableTest, EraseWhileIteratingVisitsEveryRecordOnce) {
  Table t;
  for (int i = 0; i < 5000; ++i) t.emplace(Key(i), i);
  std::set<int> seen;
  for (auto it = t.begin(); it != t.end();) {
    EXPECT_TRUE(seen.insert(it->second.value).second);
    if (it->second.value % 2 == 0) {
      it = t.erase(it);
    } else {
      ++it;
    }
  }
  EXPECT_EQ(seen.size(), 5000u);
  EXPECT_EQ(t.size(), 2500u);
  for (int i = 0; i < 5000; ++i) EXPECT_EQ(t.count(Key(i)), i % 2 == 0 ? 0u : 1u) << i;
}

TEST(ObjectTableTest, ChurnDoesNotGrowTheIndexWithoutBound) {
  // Puts and removes of ever new keys at a steady count (what eviction does): tombstones are
  // dropped by rehashes, so the index stays near its size for the live records.
  Table t;
  for (int i = 0; i < 1000; ++i) t.emplace(Key(i), i);
  const size_t steady = t.index_bytes();
  for (int i = 1000; i < 200000; ++i) {
    t.emplace(Key(i), i);
    t.erase(Key(i - 1000));
  }
  EXPECT_EQ(t.size(), 1000u);
  EXPECT_LE(t.index_bytes(), steady * 2);
  for (int i = 199000; i < 200000; ++i) ASSERT_NE(t.find(Key(i)), t.end());
  for (int i = 198000; i < 199000; ++i) ASSERT_EQ(t.find(Key(i)), t.end());
}

TEST(ObjectTableTest, IndexShrinksWhenMostRecordsAreGone) {
  Table t;
  for (int i = 0; i < 100000; ++i) t.emplace(Key(i), i);
  const size_t full = t.index_bytes();
  for (int i = 0; i < 99990; ++i) t.erase(Key(i));
  // Erase never rehashes (iterators stay valid); the next inserts shrink each shard.
  for (int i = 0; i < 64; ++i) t.emplace(Key(1000000 + i), i);
  EXPECT_LT(t.index_bytes(), full / 16);
  for (int i = 99990; i < 100000; ++i) EXPECT_NE(t.find(Key(i)), t.end());
}

TEST(ObjectTableTest, ScanSeesEveryRecordPresentThroughoutAcrossRehashes) {
  Table t;
  for (int i = 0; i < 4000; ++i) t.emplace(Key(i), i);
  Table::Cursor c;
  std::set<int> seen;
  int next = 4000;
  std::deque<int> churn;
  bool done = false;
  while (!done) {
    std::vector<std::string> victims;
    done = t.Scan(&c, 97, [&](Table::Entry& e) {
      seen.insert(e.second.value);
      if (e.second.value < 4000 && e.second.value % 5 == 0) victims.push_back(e.first);
    });
    for (const auto& k : victims) t.erase(k);
    // Between chunks: inserts that grow shards, and churn (insert, erase) that leaves
    // tombstones until a rehash of the same size drops them, pulling displaced records back
    // toward their home slots, possibly behind the cursor.
    for (int j = 0; j < 40; ++j) t.emplace(Key(next++), -1);
    for (int j = 0; j < 300; ++j) {
      t.emplace(Key(next), -1);
      churn.push_back(next++);
      if (churn.size() > 500) {
        t.erase(Key(churn.front()));
        churn.pop_front();
      }
    }
  }
  for (int i = 0; i < 4000; ++i) {
    EXPECT_TRUE(seen.count(i)) << "record " << i << " was never visited";
    EXPECT_EQ(t.count(Key(i)), i % 5 == 0 ? 0u : 1u);
  }
}

// A record displaced from its home slot (probe run), the cursor stopped between its home
// and where it sits, then a rehash that puts it back home, behind the cursor: the scan must
// walk that shard again to see it.
TEST(ObjectTableTest, ScanWalksAgainAShardRehashedBetweenChunks) {
  using Two = ObjectTable<Rec, 2>;
  auto find_keys = [](int n, auto&& want) {
    std::vector<std::string> out;
    for (int i = 0; static_cast<int>(out.size()) < n; ++i) {
      const std::string k = "probe-" + std::to_string(i);
      const uint64_t h = Two::Hash(k);
      if ((h >> 63) == 0 && want(h & 15)) out.push_back(k);
    }
    return out;
  };
  const auto homed3 = find_keys(2, [](uint64_t s) { return s == 3; });  // X, then B
  // Homes 13..15 of 16 (5..7 of 8): their probe runs (5, 6, 7, 0, 1) keep off slot 3, so
  // the tombstone stays and counts toward the rehash.
  const auto high = find_keys(5, [](uint64_t s) { return s >= 13; });
  Two t;
  t.emplace(homed3[0], 0);  // X at slot 3 of 8
  t.emplace(homed3[1], 1);  // B displaced to slot 4
  t.erase(homed3[0]);       // slot 3: a tombstone (B follows it)
  Two::Cursor c;
  std::set<int> seen;
  auto note = [&](Two::Entry& e) { seen.insert(e.second.value); };
  ASSERT_FALSE(t.Scan(&c, 4, note));  // slots 0..3 of shard 0: not B yet
  ASSERT_TRUE(seen.empty());
  // The fifth insert rehashes shard 0 to 16 slots: B goes home to slot 3.
  for (int i = 0; i < 5; ++i) t.emplace(high[i], 10 + i);
  while (!t.Scan(&c, 4, note)) {
  }
  EXPECT_TRUE(seen.count(1)) << "the scan missed a record that a rehash moved behind it";
}

TEST(ObjectTableTest, PrefetchNodeFindsTheRecordOfAHash) {
  Table t;
  for (int i = 0; i < 1000; ++i) t.emplace(Key(i), i);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t h = Table::Hash(Key(i));
    t.PrefetchSlot(h);
    const Table::Entry* e = t.PrefetchNode(h);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->first, Key(i));
    Table::PrefetchKey(e);
    EXPECT_EQ(&*t.find(Key(i), h), e);
  }
  EXPECT_EQ(t.PrefetchNode(Table::Hash(Key(5000))), nullptr);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
