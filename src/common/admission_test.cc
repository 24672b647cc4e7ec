#include "common/admission.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

namespace mooncake {
namespace {

TEST(Admission, CapsPerAddressBeforeTheTotalAndForgetsWhatLeaves) {
  Admission a("test", {/*max_connections=*/3, /*max_per_address=*/2});
  EXPECT_EQ(a.Check("10.0.0.1"), Admission::Cap::kNone);
  a.Add("10.0.0.1");
  a.Add("10.0.0.1");
  EXPECT_EQ(a.Check("10.0.0.1"), Admission::Cap::kAddress);
  EXPECT_EQ(a.Check("10.0.0.2"), Admission::Cap::kNone);
  a.Add("10.0.0.2");
  EXPECT_EQ(a.live(), 3u);
  EXPECT_EQ(a.Check("10.0.0.3"), Admission::Cap::kTotal);
  a.Remove("10.0.0.1");
  EXPECT_EQ(a.live("10.0.0.1"), 1u);
  EXPECT_EQ(a.Check("10.0.0.1"), Admission::Cap::kNone);
  a.Remove("10.0.0.1");
  EXPECT_EQ(a.live("10.0.0.1"), 0u);
  EXPECT_EQ(a.live(), 1u);
}

TEST(Admission, WithoutAPerAddressCapOnlyTheTotalCounts) {
  Admission a("test", {/*max_connections=*/2, /*max_per_address=*/0});
  a.Add("h");
  a.Add("h");
  EXPECT_EQ(a.live("h"), 0u);  // not tracked
  EXPECT_EQ(a.Check("h"), Admission::Cap::kTotal);
}

TEST(Admission, TheVictimIsTheHighestRankAndTheFirstOfEquals) {
  std::vector<int> ranks = {3, 7, -1, 7, 5};  // -1: may not be closed
  auto rank = [](int r) { return r < 0 ? std::nullopt : std::optional<int>(r); };
  auto v = Admission::Victim(ranks.begin(), ranks.end(), rank);
  EXPECT_EQ(v - ranks.begin(), 1);
  std::vector<int> none = {-1, -1};
  EXPECT_EQ(Admission::Victim(none.begin(), none.end(), rank), none.end());
  std::vector<int> empty;
  EXPECT_EQ(Admission::Victim(empty.begin(), empty.end(), rank), empty.end());
}

TEST(Admission, EveryRefusalIsCounted) {
  Admission a("test", {1, 1});
  for (int i = 0; i < 5; ++i) a.Note(&AdmissionCounters::refused_full, "full");
  a.Note(&AdmissionCounters::evicted, "room");
  EXPECT_EQ(a.counters().refused_full, 5u);
  EXPECT_EQ(a.counters().evicted, 1u);
  EXPECT_EQ(a.counters().refused_address, 0u);
}

}  // namespace
}  // namespace mooncake
