// Shared-secret authentication between engines (MC_AUTH_SECRET), over both transports.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cstring>
#include <vector>

#include "common/net.h"
#include "metadata/handshake.h"
#include "metadata/segment_desc.h"
#include "mooncake/transfer_engine.h"
#include "transport/tcp/tcp_wire.h"

namespace mooncake {
namespace {

EngineOptions WithSecret(const std::string& secret) {
  EngineOptions o;
  o.auth_secret = secret;
  o.handshake_io_timeout_ms = 1000;
  o.slice_timeout_ms = 2000;
  return o;
}

class Auth : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(target_.Init("P2PHANDSHAKE", "127.0.0.1", GetParam()).ok());
    ASSERT_TRUE(target_.RegisterLocalMemory(remote_.data(), remote_.size()).ok());
  }
  TransferEngine target_{WithSecret("s3cret")};
  std::vector<uint8_t> remote_ = std::vector<uint8_t>(1 << 20, 0);
};

TEST_P(Auth, SameSecretWorks) {
  TransferEngine e(WithSecret("s3cret"));
  ASSERT_TRUE(e.Init("P2PHANDSHAKE", "127.0.0.1", GetParam()).ok());
  std::vector<uint8_t> local(4096, 0x42);
  ASSERT_TRUE(e.RegisterLocalMemory(local.data(), local.size()).ok());
  auto seg = e.OpenSegment(target_.GetLocalSegmentName());
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_EQ(e.GetSegmentInfo(*seg)->transport, GetParam());
  Status s = e.TransferSync({{TransferRequest::WRITE, local.data(), *seg,
                              reinterpret_cast<uint64_t>(remote_.data()), 4096}});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(remote_[4095], 0x42);
}

TEST_P(Auth, MissingOrWrongSecretIsRefusedAtTheHandshake) {
  for (const char* secret : {"", "wrong"}) {
    TransferEngine e(WithSecret(secret));
    ASSERT_TRUE(e.Init("P2PHANDSHAKE", "127.0.0.1", GetParam()).ok());
    auto seg = e.OpenSegment(target_.GetLocalSegmentName());
    EXPECT_FALSE(seg.ok()) << "secret '" << secret << "'";
    EXPECT_FALSE(e.Probe(target_.GetLocalSegmentName()).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, Auth, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

TEST(AuthTcpData, UnauthenticatedWriteNeverTouchesMemory) {
  TransferEngine target(WithSecret("s3cret"));
  ASSERT_TRUE(target.Init("P2PHANDSHAKE", "127.0.0.1", "tcp").ok());
  std::vector<uint8_t> remote(65536, 0);
  ASSERT_TRUE(target.RegisterLocalMemory(remote.data(), remote.size()).ok());
  // Learn the data port through an authenticated handshake, then attack the data port.
  HandshakeLimits limits;
  limits.auth_secret = "s3cret";
  auto reply = HandshakeCall("127.0.0.1", target.GetRpcPort(), target.GetLocalSegmentName(),
                             HandshakeType::kMetadata, "{}", limits);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  auto desc = DecodeSegmentDesc(*reply);
  ASSERT_TRUE(desc.ok());
  auto fd = ConnectTcp("127.0.0.1", desc->tcp_data_port, 1000);
  ASSERT_TRUE(fd.ok());
  uint8_t challenge[40];
  ASSERT_TRUE(ReadFull(fd->get(), challenge, sizeof(challenge), 2000).ok());
  EXPECT_EQ(0, std::memcmp(challenge, "MCAUTHv2", 8));
  // A wrong MAC, then a valid-looking v2 WRITE of 0xFF bytes into the registered buffer.
  std::vector<uint8_t> attack(32 + tcp::kHeaderSize + 4096, 0xFF);
  std::memset(attack.data(), 0, 32);
  tcp::EncodeHeader({4096, reinterpret_cast<uint64_t>(remote.data()), tcp::kOpWrite, true},
                    attack.data() + 32);
  (void)WriteFull(fd->get(), attack.data(), attack.size(), 1000);
  // The target answers at most its one-byte verdict (3: malformed) and closes.
  uint8_t sink[64];
  size_t got = 0;
  while (got < sizeof(sink) && ReadFull(fd->get(), sink + got, 1, 3000).ok()) ++got;
  EXPECT_LE(got, 1u) << "the target must close the connection, not answer requests";
  if (got == 1) {
    EXPECT_EQ(sink[0], 3);
  }
  for (uint8_t b : remote) ASSERT_EQ(b, 0) << "memory was touched";
}

}  // namespace
}  // namespace mooncake
