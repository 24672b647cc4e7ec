// PortHold and NeedsAutoPort (client_port.h): a held port is not handed out again while held,
// is again once released, and only names without a port under a metadata server get one.
#include "store/client_port.h"

#include <gtest/gtest.h>

namespace mooncake {
namespace store {
namespace {

TEST(PortHold, HoldsItsPortUntilReleased) {
  auto a = PortHold::Pick(13390, 13390);
  ASSERT_NE(a, nullptr) << "port 13390 is busy on this host";
  EXPECT_EQ(a->port(), 13390);
  EXPECT_EQ(PortHold::Pick(13390, 13390), nullptr);
  auto b = PortHold::Pick(13390, 13391);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->port(), 13391);
  a.reset();
  auto c = PortHold::Pick(13390, 13390);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->port(), 13390);
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
  auto hold = PortHold::Pick(13392, 13392);
  ASSERT_NE(hold, nullptr);
  EngineOptions o;
  o.store_client_min_port = o.store_client_max_port = 13392;
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
