// The master's compact record parts (master_records.h): interned client names, replicas kept
// inline, and the lists threaded through the records.
#include "store/master/master_records.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

namespace {


using mooncake::store::ClientName;
using mooncake::store::ClientNames;
using mooncake::store::Placement;
using mooncake::store::Replicas;

TEST(MasterRecordsTest, ClientNamesAreSharedAndDroppedWithTheirLastReference) {
  ClientNames names;
  ClientName a = names.Get("0123456789abcdef0123456789abcdef");
  ClientName b = names.Get("0123456789abcdef0123456789abcdef");
  EXPECT_EQ(names.size(), 1u);
  EXPECT_TRUE(a == "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(&a.str(), &b.str());  // one copy of the id
  ClientName c = names.Get("other");
  EXPECT_EQ(names.size(), 2u);
  EXPECT_TRUE(c != a.str());
  ClientName moved = std::move(c);
  EXPECT_TRUE(c == "");  // a moved-from name is empty
  moved = a;             // the last reference to "other" goes
  EXPECT_EQ(names.size(), 1u);
  a = ClientName();
  b = ClientName();
  EXPECT_EQ(names.size(), 1u);  // `moved` still names it
  moved = ClientName();
  EXPECT_EQ(names.size(), 0u);
}

TEST(MasterRecordsTest, ReplicasKeepOneInlineAndGrowOnTheHeap) {
  Replicas r;
  EXPECT_TRUE(r.empty());
  for (uint64_t i = 0; i < 5; ++i) r.push_back(Placement{static_cast<uint32_t>(i), 0, i * 100});
  ASSERT_EQ(r.size(), 5u);
  Replicas copy = r;
  r.erase(r.begin() + 1, r.begin() + 3);  // drops 1 and 2
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r.begin()[0].segment_id, 0u);
  EXPECT_EQ(r.begin()[1].segment_id, 3u);
  EXPECT_EQ(r.begin()[2].offset, 400u);
  ASSERT_EQ(copy.size(), 5u);
  EXPECT_EQ(copy.begin()[2].offset, 200u);
  Replicas moved = std::move(copy);
  EXPECT_EQ(moved.size(), 5u);
  EXPECT_TRUE(copy.empty());
  Replicas one;
  one.push_back(Placement{7, 0, 8});
  Replicas one_moved = std::move(one);
  ASSERT_EQ(one_moved.size(), 1u);
  EXPECT_EQ(one_moved.begin()->offset, 8u);
  one_moved.erase(one_moved.begin());
  EXPECT_TRUE(one_moved.empty());
  moved = one_moved;
  EXPECT_TRUE(moved.empty());
}

}  // namespace
