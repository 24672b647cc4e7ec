// MasterService's object events (the KV event publisher's source): stored when an object
// becomes readable (PutEnd, an upsert's commit), removed when a readable object goes (remove,
// regex remove, eviction, a silent client's segment, replica clear, an upsert replacing it);
// nothing for puts that never completed; nothing once the sink is cleared.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "store/master/master_service_test_fixture.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_support;  // NOLINT
using std::chrono::seconds;

class Recorder : public ObjectEventSink {
 public:
  void ObjectStored(const std::string& key) override { events.push_back("stored:" + key); }
  void ObjectRemoved(const std::string& key) override { events.push_back("removed:" + key); }
  std::vector<std::string> Take() { return std::exchange(events, {}); }
  std::vector<std::string> events;
};

class MasterEventsTest : public MasterServiceTest {
 protected:
  void SetUp() override {
    MasterConfig c;
    c.client_ttl_s = 10;
    c.default_kv_lease_ttl_ms = 0;  // removes and evictions need no waiting
    Make(c);
    master_->SetEventSink(&sink_);
    ASSERT_EQ(Mount("c1", "seg", 0x100000, MiB), kOk);
  }
  Recorder sink_;
};

TEST_F(MasterEventsTest, PutsAndRemovesOnlyOfReadableObjects) {
  ASSERT_EQ(Put("c1", "a", 1000), kOk);
  ASSERT_EQ(PutStart("c1", "revoked", 1000).code(), kOk);
  ASSERT_EQ(PutRevoke("c1", "revoked"), kOk);
  ASSERT_EQ(PutStart("c1", "in-flight", 1000).code(), kOk);
  EXPECT_EQ(sink_.Take(), (std::vector<std::string>{"stored:a"}));
  Advance(seconds(1));
  ASSERT_EQ(Remove("a"), kOk);
  ASSERT_EQ(Put("c1", "r1", 10), kOk);
  ASSERT_EQ(Put("c1", "r2", 10), kOk);
  Advance(seconds(1));
  EXPECT_EQ(RemoveByRegex("^r").count(), 2);
  const auto events = sink_.Take();
  EXPECT_EQ(events.front(), "removed:a");
  EXPECT_EQ(std::set<std::string>(events.begin() + 1, events.end()),
            (std::set<std::string>{"stored:r1", "stored:r2", "removed:r1", "removed:r2"}));
  std::set<std::string> complete;
  master_->ForEachCompleteKey([&](const std::string& k) { complete.insert(k); });
  EXPECT_TRUE(complete.empty());  // "in-flight" was never completed
}

TEST_F(MasterEventsTest, AnUpsertReplacesTheOldValue) {
  ASSERT_EQ(Put("c1", "k", 1000), kOk);
  ASSERT_EQ(PutStart("c1", "k", 2000, Config(), /*nonce=*/0, /*upsert=*/true).code(), kOk);
  EXPECT_EQ(sink_.Take(), (std::vector<std::string>{"stored:k"}));  // the old value still reads
  ASSERT_EQ(PutEnd("c1", "k"), kOk);
  EXPECT_EQ(sink_.Take(), (std::vector<std::string>{"removed:k", "stored:k"}));
}

TEST_F(MasterEventsTest, ASilentClientAndEvictionRemove) {
  ASSERT_EQ(Mount("c2", "other", 0x900000, MiB), kOk);
  ASSERT_EQ(Put("c1", "on-other", 1000, Config(1, {"other"})), kOk);
  for (int i = 0; i < 10; ++i) {  // c2 stops pinging
    Advance(seconds(1));
    ASSERT_TRUE(Ping("c1").client_known());
    master_->Tick();
  }
  EXPECT_EQ(sink_.Take(), (std::vector<std::string>{"stored:on-other", "removed:on-other"}));
  for (int i = 0; i < 12; ++i) {  // 12 x 100 KiB in 1 MiB: eviction above the watermark
    Advance(seconds(1));
    ASSERT_EQ(Put("c1", "e" + std::to_string(i), 100 * KiB), kOk);
  }
  int removed = 0;
  for (const auto& e : sink_.Take()) removed += e.rfind("removed:e", 0) == 0;
  EXPECT_GT(removed, 0);
  EXPECT_EQ(static_cast<uint64_t>(removed), master_->GetStats().evicted_objects());
  master_->SetEventSink(nullptr);
  ASSERT_EQ(Put("c1", "unseen", 10), kOk);
  EXPECT_TRUE(sink_.Take().empty());
}

}  // namespace
}  // namespace store
}  // namespace mooncake
