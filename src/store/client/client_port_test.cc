// PortHold and NeedsAutoPort (client_port.h): a held port is not handed out again while held,
// is again once released, and only names without a port under a metadata server get one.
#include "store/client/client_port.h"

#include <gtest/gtest.h>

namespace mooncake {
namespace store {
namespace {

// A port nothing holds now (below the ephemeral range), with the next one free as well.
uint16_t FreePair() {
  for (int i = 0; i < 200; ++i) {
    auto a = PortHold::Pick(20000, 31998);
    if (!a) continue;
    auto b = PortHold::Pick(a->port() + 1, a->port() + 1);
    if (b) return a->port();
  }
  return 0;
}

TEST(PortHold, HoldsItsPortUntilReleased) {
  const uint16_t p = FreePair();
  ASSERT_NE(p, 0);
  auto a = PortHold::Pick(p, p);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->port(), p);
  EXPECT_EQ(PortHold::Pick(p, p), nullptr);
  auto b = PortHold::Pick(p, p + 1);  // 20 draws: p + 1 is all but certainly drawn
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->port(), p + 1);
  a.reset();
  auto c = PortHold::Pick(p, p);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->port(), p);
}

TEST(NeedsAutoPort, OnlyHostsWithoutPortUnderAMetadataServer) {
  EXPECT_TRUE(NeedsAutoPort("http://127.0.0.1:8080/metadata", "127.0.0.1"));
  EXPECT_TRUE(NeedsAutoPort("etcd://127.0.0.1:2379", "node-1"));
  EXPECT_TRUE(NeedsAutoPort("redis://127.0.0.1:6379", "[::1]"));
  EXPECT_FALSE(NeedsAutoPort("http://127.0.0.1:8080/metadata", "127.0.0.1:17000"));
  EXPECT_FALSE(NeedsAutoPort("etcd://127.0.0.1:2379", "[::1]:17000"));
  EXPECT_FALSE(NeedsAutoPort("P2PHANDSHAKE", "127.0.0.1"));
  EXPECT_FALSE(NeedsAutoPort("http://127.0.0.1:8080/metadata", ""));
}

TEST(InitClientEngine, FailsWithAMessageWhenNoPortIsFree) {
  auto hold = PortHold::Pick(20000, 31999);
  ASSERT_NE(hold, nullptr);
  EngineOptions o;
  o.store_client_min_port = o.store_client_max_port = hold->port();
  o.store_client_setup_retries = 2;
  std::shared_ptr<TransferEngine> engine;
  std::unique_ptr<PortHold> got;
  Status s = InitClientEngine("http://127.0.0.1:1/metadata", "127.0.0.1", "", o, &engine, &got);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("no free port"), std::string::npos) << s.ToString();
  EXPECT_EQ(got, nullptr);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
