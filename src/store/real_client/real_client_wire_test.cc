// real_client_wire.h: EncodeConfig / DecodeConfig round trips, and what they do with bytes
// that are not UTF-8 (found by fuzz_real_client_wire: EncodeConfig threw).
#include "store/real_client/real_client_wire.h"

#include <gtest/gtest.h>

#include <string>

namespace mooncake {
namespace store {
namespace {

RealClientConfig Sample() {
  RealClientConfig c;
  c.master_server_address = "127.0.0.1:50051";
  c.metadata_server = "http://127.0.0.1:8080/metadata";
  c.protocol = "tcp";
  c.host = "h\"\\\x01\xc3\xa9";
  c.segment_name = c.host + ":1";
  return c;
}

TEST(RealClientWire, EncodeDecodeRoundTripsEscapesAndUtf8) {
  const std::string line = EncodeConfig(Sample());
  ASSERT_EQ(line.find('\n'), line.size() - 1);
  auto c = DecodeConfig(line.substr(0, line.size() - 1));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->host, Sample().host);
  EXPECT_EQ(c->segment_name, Sample().segment_name);
}

TEST(RealClientWire, EncodeReplacesBytesThatAreNotUtf8InsteadOfThrowing) {
  RealClientConfig c = Sample();
  c.device_names = "mlx5_\xff";
  std::string line;
  ASSERT_NO_THROW(line = EncodeConfig(c));
  auto back = DecodeConfig(line.substr(0, line.size() - 1));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->device_names, "mlx5_\xef\xbf\xbd");  // U+FFFD
  EXPECT_EQ(back->host, c.host);
}

TEST(RealClientWire, AnEtcdMasterAndItsClusterTravelUnchanged) {
  RealClientConfig c = Sample();
  c.master_server_address = "etcd://10.0.0.1:2379;10.0.0.2:2379,[::1]:2379";
  c.store_cluster_id = "prod-a.1";
  const std::string line = EncodeConfig(c);
  auto back = DecodeConfig(line.substr(0, line.size() - 1));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->master_server_address, c.master_server_address);
  EXPECT_EQ(back->store_cluster_id, "prod-a.1");
  EXPECT_TRUE(SameCluster(*back, c));
  RealClientConfig other = c;
  other.store_cluster_id = "prod-b";
  EXPECT_FALSE(SameCluster(other, c));
  // An older real client sends no store_cluster_id: the dummy's own environment decides.
  auto old = DecodeConfig(
      "{\"master_server_address\":\"etcd://h:2379\",\"metadata_server\":\"P2PHANDSHAKE\","
      "\"protocol\":\"tcp\",\"device_names\":\"\",\"host\":\"h\",\"segment_name\":\"h:1\"}");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->store_cluster_id, "");
}

TEST(RealClientWire, TheTenantTravelsToTheDummies) {
  RealClientConfig c = Sample();
  EXPECT_EQ(EncodeConfig(c).find("tenant_id"), std::string::npos);  // "default": as before
  c.tenant_id = "team-a";
  const std::string line = EncodeConfig(c);
  auto back = DecodeConfig(line.substr(0, line.size() - 1));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tenant_id, "team-a");
  RealClientConfig other = c;
  other.tenant_id = "team-b";
  EXPECT_FALSE(SameCluster(other, c));  // a real client back under another tenant
  auto old = DecodeConfig(
      "{\"master_server_address\":\"h:1\",\"metadata_server\":\"P2PHANDSHAKE\","
      "\"protocol\":\"tcp\",\"device_names\":\"\",\"host\":\"h\",\"segment_name\":\"h:1\"}");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->tenant_id, "default");
  EXPECT_FALSE(DecodeConfig(
      "{\"master_server_address\":\"h:1\",\"metadata_server\":\"P2PHANDSHAKE\","
      "\"protocol\":\"tcp\",\"device_names\":\"\",\"host\":\"h\",\"segment_name\":\"h:1\","
      "\"tenant_id\":7}").ok());
}

TEST(RealClientWire, DecodeRefusesWhatIsNotAConfig) {
  EXPECT_FALSE(DecodeConfig("").ok());
  EXPECT_FALSE(DecodeConfig("[]").ok());
  EXPECT_FALSE(DecodeConfig("{\"master_server_address\":1}").ok());
  EXPECT_FALSE(DecodeConfig(std::string(kMaxConfigBytes + 1, ' ')).ok());
}

}  // namespace
}  // namespace store
}  // namespace mooncake
