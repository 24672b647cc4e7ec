// Issue 14, point 7: a handful of idle or slow sockets must not delay a legitimate peer.
// Each test prints its figure; the figures before the fix are in tests/hostile/README.md.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <arpa/inet.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "../../child_process.h"
#include "common/net.h"
#include "metadata/handshake.h"
#include "metadata/segment_desc.h"
#include "mooncake/transfer_engine.h"

namespace mooncake {
namespace {

using Clock = std::chrono::steady_clock;
int64_t MsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// A TCP connection from `from_ip` (any 127.x address is local) that sends nothing.
UniqueFd IdleConnection(uint16_t port, const char* from_ip = "127.0.0.1") {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, from_ip, &a.sin_addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return UniqueFd();
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return UniqueFd();
  return fd;
}

EngineOptions Quick() {
  EngineOptions o;
  o.enable_shm = false;
  o.slice_timeout_ms = 5000;
  return o;
}

// (a) Idle connections to the handshake port. Before: 4 delayed OpenSegment by 10 s, 8 made
// it fail (4 workers, 10 s each, an unbounded queue).
TEST(HostileNet, IdleHandshakeConnectionsDoNotDelayOpenSegment) {
  for (int idle_count : {4, 8, 64}) {
    TransferEngine target(Quick());
    ASSERT_TRUE(target.Init("P2PHANDSHAKE", "127.0.0.1", "tcp").ok());
    std::vector<UniqueFd> idle;
    for (int i = 0; i < idle_count; ++i) idle.push_back(IdleConnection(target.GetRpcPort()));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // all accepted
    TransferEngine peer(Quick());
    ASSERT_TRUE(peer.Init("P2PHANDSHAKE", "127.0.0.1", "tcp").ok());
    auto t0 = Clock::now();
    auto seg = peer.OpenSegment(target.GetLocalSegmentName());
    int64_t ms = MsSince(t0);
    std::printf("handshake: %d idle connections: OpenSegment %s in %lld ms\n", idle_count,
                seg.ok() ? "ok" : "FAILED", static_cast<long long>(ms));
    EXPECT_TRUE(seg.ok()) << idle_count << " idle: " << seg.status().ToString();
    EXPECT_LT(ms, 1000) << idle_count << " idle connections delayed OpenSegment";
  }
}

// Many idle connections from one other address: they cannot take every slot.
TEST(HostileNet, OneAddressCannotFillTheHandshakeServer) {
  TransferEngine target(Quick());
  ASSERT_TRUE(target.Init("P2PHANDSHAKE", "127.0.0.1", "tcp").ok());
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 600; ++i) {
    UniqueFd fd = IdleConnection(target.GetRpcPort(), "127.0.0.2");
    if (fd.valid()) idle.push_back(std::move(fd));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  TransferEngine peer(Quick());
  ASSERT_TRUE(peer.Init("P2PHANDSHAKE", "127.0.0.1", "tcp").ok());
  auto t0 = Clock::now();
  auto seg = peer.OpenSegment(target.GetLocalSegmentName());
  int64_t ms = MsSince(t0);
  std::printf("handshake: %zu idle connections from 127.0.0.2: OpenSegment %s in %lld ms\n",
              idle.size(), seg.ok() ? "ok" : "FAILED", static_cast<long long>(ms));
  EXPECT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_LT(ms, 1000);
}

// (b) Idle data connections. Before: 4,096 of them locked every new peer out (a cap and no
// idle timeout).
TEST(HostileNet, IdleDataConnectionsDoNotLockOutAPeer) {
  TransferEngine target(Quick());
  ASSERT_TRUE(target.Init("P2PHANDSHAKE", "127.0.0.1", "tcp").ok());
  std::vector<uint8_t> remote(1 << 16, 0);
  ASSERT_TRUE(target.RegisterLocalMemory(remote.data(), remote.size()).ok());
  // The data port, from the descriptor (no secret is set: a plain handshake).
  auto fd = ConnectTcp("127.0.0.1", target.GetRpcPort(), 2000);
  ASSERT_TRUE(fd.ok());
  std::string req = EncodeHandshakeFrame(HandshakeType::kMetadata, "{}");
  ASSERT_TRUE(WriteFull(fd->get(), req.data(), req.size(), 2000).ok());
  auto reply = ReadHandshakeFrame(fd->get(), 1 << 20, 2000);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  auto desc = DecodeSegmentDesc(reply->payload);
  ASSERT_TRUE(desc.ok());
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 4096; ++i) {
    UniqueFd c = IdleConnection(desc->tcp_data_port);
    if (!c.valid()) break;
    idle.push_back(std::move(c));
  }
  ASSERT_EQ(idle.size(), 4096u);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // all accepted by the server
  TransferEngine peer(Quick());
  ASSERT_TRUE(peer.Init("P2PHANDSHAKE", "127.0.0.1", "tcp").ok());
  std::vector<uint8_t> local(4096, 0x42);
  ASSERT_TRUE(peer.RegisterLocalMemory(local.data(), local.size()).ok());
  auto seg = peer.OpenSegment(target.GetLocalSegmentName());
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  auto t0 = Clock::now();
  Status s = peer.TransferSync({{TransferRequest::WRITE, local.data(), *seg,
                                 reinterpret_cast<uint64_t>(remote.data()), 4096}},
                               std::chrono::seconds(10));
  int64_t ms = MsSince(t0);
  std::printf("data: 4096 idle connections: a new peer's write %s in %lld ms\n",
              s.ok() ? "ok" : s.ToString().c_str(), static_cast<long long>(ms));
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_LT(ms, 2000);
  EXPECT_EQ(remote[4095], 0x42);
}

#ifdef MC_HTTP_METADATA_SERVER_PATH
// (c) Slow connections to the http metadata server. Before: 16 of them (each sending a byte
// every 2 s, under the 5 s read timeout) held all 8 workers and a new engine failed to start.
TEST(HostileNet, SlowClientsDoNotStallTheHttpMetadataServer) {
  Child server({MC_HTTP_METADATA_SERVER_PATH, "--port", "0", "--host", "127.0.0.1"});
  std::string line = server.ReadLine();
  auto colon = line.rfind(':');
  ASSERT_NE(colon, std::string::npos) << line;
  uint16_t port = static_cast<uint16_t>(std::stoi(line.substr(colon + 1)));
  std::vector<UniqueFd> slow;
  for (int i = 0; i < 16; ++i) {
    UniqueFd c = IdleConnection(port);
    ASSERT_TRUE(c.valid());
    ASSERT_TRUE(WriteFull(c.get(), "PUT /metadata?key=x HTTP/1.1\r\n", 30, 1000).ok());
    slow.push_back(std::move(c));
  }
  std::atomic<bool> stop{false};
  std::thread dripper([&] {  // one header byte per connection every 2 s
    while (!stop.load()) {
      for (auto& c : slow) (void)!::send(c.get(), "X", 1, MSG_NOSIGNAL);
      for (int i = 0; i < 20 && !stop.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string store = "http://127.0.0.1:" + std::to_string(port) + "/metadata";
  auto t0 = Clock::now();
  TransferEngine engine(Quick());
  Status s = engine.Init(store, "127.0.0.1:" + std::to_string(port + 1), "tcp");
  int64_t ms = MsSince(t0);
  stop = true;
  dripper.join();
  std::printf("http metadata server: 16 slow connections: engine Init %s in %lld ms\n",
              s.ok() ? "ok" : s.ToString().c_str(), static_cast<long long>(ms));
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_LT(ms, 2000);
}
#endif

}  // namespace
}  // namespace mooncake
