// Issue 14, point 5, the data connection: authentication is bound to the segment the client
// means to reach, so a descriptor that sends it to another engine's data port gains nothing.
//
// Metadata-store mode: someone without the secret who can write the store copies target S's
// descriptor under a new segment name M ("mooncake/ram/M"). A victim that opens M connects to
// S's data port. Before (MCAUTHv1, bound to nothing but the nonce): S accepted the victim's
// connection and the victim's write meant for M landed in S's buffer. After: S refuses the
// connection (the victim meant M), the write fails and S's memory is untouched.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "http_util.h"
#include "mooncake/transfer_engine.h"

#ifdef MC_HTTP_METADATA_SERVER_PATH
namespace mooncake {
namespace {

EngineOptions WithSecret() {
  EngineOptions o;
  o.auth_secret = "s3cret";
  o.enable_shm = false;
  o.tcp_bind_address = "127.0.0.1";
  o.slice_timeout_ms = 2000;
  return o;
}

TEST(HostileNet, ADescriptorCopiedUnderAnotherNameCannotRedirectWrites) {
  Child server({MC_HTTP_METADATA_SERVER_PATH, "--port", "0", "--host", "127.0.0.1"});
  uint16_t port = PortOf(server);
  ASSERT_NE(port, 0);
  const std::string store = "http://127.0.0.1:" + std::to_string(port) + "/metadata";
  TransferEngine target(WithSecret());
  ASSERT_TRUE(target.Init(store, "seg-s", "tcp").ok());
  std::vector<uint8_t> buf(65536, 0x5A);
  ASSERT_TRUE(target.RegisterLocalMemory(buf.data(), buf.size()).ok());

  std::string desc;
  ASSERT_EQ(Http(port, "GET", "mooncake/ram/seg-s", "", "", &desc), 200);
  ASSERT_EQ(Http(port, "PUT", "mooncake/ram/seg-m", "application/json", desc, nullptr), 200);

  TransferEngine victim(WithSecret());
  ASSERT_TRUE(victim.Init(store, "seg-c", "tcp").ok());
  std::vector<uint8_t> local(4096, 0xEE);
  ASSERT_TRUE(victim.RegisterLocalMemory(local.data(), local.size()).ok());
  // Since issue 28 the descriptor is signed by its owner for the name seg-s: the copy is
  // refused when fetched (PermissionDenied). Either way no write may land in seg-s.
  auto seg = victim.OpenSegment("seg-m");
  Status s = seg.status();
  if (seg.ok()) {
    s = victim.TransferSync({{TransferRequest::WRITE, local.data(), *seg,
                              reinterpret_cast<uint64_t>(buf.data()), 4096}},
                            std::chrono::seconds(5));
  } else {
    EXPECT_EQ(seg.status().code(), Status::Code::kPermissionDenied) << seg.status().ToString();
  }
  size_t touched = 0;
  for (uint8_t b : buf) touched += b != 0x5A;
  std::printf("redirect: a write meant for segment seg-m %s; bytes of seg-s changed: %zu\n",
              s.ok() ? "succeeded" : s.ToString().c_str(), touched);
  EXPECT_FALSE(s.ok()) << "a write meant for seg-m landed in seg-s";
  EXPECT_EQ(touched, 0u);
  // The control: opened by its own name, seg-s takes the write.
  auto direct = victim.OpenSegment("seg-s");
  ASSERT_TRUE(direct.ok()) << direct.status().ToString();
  s = victim.TransferSync({{TransferRequest::WRITE, local.data(), *direct,
                            reinterpret_cast<uint64_t>(buf.data()), 4096}},
                          std::chrono::seconds(5));
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(buf[0], 0xEE);
}

}  // namespace
}  // namespace mooncake
#endif
