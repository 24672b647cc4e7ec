// Issue 14, point 5: a man in the middle without MC_AUTH_SECRET relays the authentication.
//
// M listens as a segment of its own ("127.0.0.1:<M's port>"). A victim engine that is told
// to open M's segment connects to M; M forwards the authentication exchange to the real
// target S, rewrites the data port in S's descriptor to its own, and when the victim opens
// a data connection M relays that authentication too, then keeps the authenticated data
// connection to S for itself: it reads S's whole buffer and writes into it.
//
// Before (MCAUTHv1: the answer is a MAC of the server's nonce alone): the victim's
// OpenSegment succeeded, M read all 65536 bytes of S's buffer and wrote 4096 into it.
// After (MCAUTHv2): S refuses the relayed handshake (the victim meant segment M), the
// victim gets PermissionDenied, M obtains neither a descriptor nor a data connection.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "common/net.h"
#include "relay_util.h"
#include "metadata/handshake.h"
#include "mooncake/transfer_engine.h"
#include "transport/tcp/tcp_wire.h"

namespace mooncake {
namespace {

EngineOptions Options() {
  EngineOptions o;
  o.auth_secret = "s3cret";
  o.enable_shm = false;  // the attack is on the TCP data port
  o.handshake_io_timeout_ms = 2000;
  o.slice_timeout_ms = 2000;
  return o;
}

struct Relay {
  uint16_t rpc_port = 0, data_port = 0;
  UniqueFd rpc_listener, data_listener;
  uint16_t target_rpc_port;
  std::atomic<bool> got_descriptor{false};
  std::atomic<bool> data_authenticated{false};
  std::atomic<uint64_t> bytes_read{0}, bytes_written{0};
  uint64_t target_data_port = 0, buffer_addr = 0, buffer_len = 0;
  std::vector<uint8_t> stolen;
  std::thread rpc_thread, data_thread;

  explicit Relay(uint16_t target) : target_rpc_port(target) {
    rpc_listener = std::move(ListenTcpInRange(27000, 27999, 8, &rpc_port, "127.0.0.1").value());
    data_listener = std::move(ListenTcpInRange(28000, 28999, 8, &data_port, "127.0.0.1").value());
    rpc_thread = std::thread([this] { ServeHandshake(); });
    data_thread = std::thread([this] { ServeData(); });
  }
  ~Relay() {
    ::shutdown(rpc_listener.get(), SHUT_RDWR);
    ::shutdown(data_listener.get(), SHUT_RDWR);
    rpc_thread.join();
    data_thread.join();
  }
  std::string name() const { return "127.0.0.1:" + std::to_string(rpc_port); }

  // Every handshake the victim makes: relay it to S, rewrite the data port in the reply.
  void ServeHandshake() {
    for (;;) {
      UniqueFd c(::accept(rpc_listener.get(), nullptr, nullptr));
      if (!c.valid()) return;
      auto s = ConnectTcp("127.0.0.1", target_rpc_port, 2000);
      if (!s.ok() || !RelayAuth(c.get(), s->get())) continue;
      auto request = ReadHandshakeFrame(c.get(), 1 << 20, 3000);
      if (!request.ok()) continue;
      std::string frame = EncodeHandshakeFrame(request->type, request->payload);
      if (!WriteFull(s->get(), frame.data(), frame.size(), 3000).ok()) continue;
      auto reply = ReadHandshakeFrame(s->get(), 1 << 20, 3000);
      if (!reply.ok()) continue;
      std::string payload = reply->payload;
      if (request->type == HandshakeType::kMetadata) {
        auto j = nlohmann::json::parse(payload, nullptr, false);
        if (j.is_object() && j.contains("tcp_data_port")) {
          target_data_port = j["tcp_data_port"].get<uint64_t>();
          for (const auto& b : j["buffers"]) {
            buffer_addr = b["addr"].get<uint64_t>();
            buffer_len = b["length"].get<uint64_t>();
          }
          j["tcp_data_port"] = data_port;
          j.erase("mc_shm_path");
          payload = j.dump();
          got_descriptor = true;
        }
      }
      frame = EncodeHandshakeFrame(reply->type, payload);
      (void)WriteFull(c.get(), frame.data(), frame.size(), 3000);
    }
  }

  // The victim's data connection: relay its authentication, then use S's side ourselves.
  void ServeData() {
    UniqueFd c(::accept(data_listener.get(), nullptr, nullptr));
    if (!c.valid()) return;
    auto s = ConnectTcp("127.0.0.1", static_cast<uint16_t>(target_data_port), 2000);
    if (!s.ok() || !RelayAuth(c.get(), s->get())) return;
    data_authenticated = true;
    uint8_t h[tcp::kHeaderSize];
    tcp::EncodeHeader({buffer_len, buffer_addr, tcp::kOpRead, true}, h);
    uint64_t status = 0;
    uint32_t code = 1;
    stolen.resize(buffer_len);
    if (WriteFull(s->get(), h, sizeof(h), 2000).ok() &&
        ReadFull(s->get(), &status, 8, 2000).ok() && tcp::DecodeStatus(status, &code) &&
        code == tcp::kStatusOk && ReadFull(s->get(), stolen.data(), stolen.size(), 2000).ok()) {
      bytes_read = stolen.size();
    }
    std::vector<uint8_t> w(tcp::kHeaderSize + 4096, 0xEE);
    tcp::EncodeHeader({4096, buffer_addr, tcp::kOpWrite, true}, w.data());
    if (WriteFull(s->get(), w.data(), w.size(), 2000).ok() &&
        ReadFull(s->get(), &status, 8, 2000).ok() && tcp::DecodeStatus(status, &code) &&
        code == tcp::kStatusOk) {
      bytes_written = 4096;
    }
  }
};

TEST(HostileNet, AuthenticationRelayGainsNothing) {
  TransferEngine target(Options());
  ASSERT_TRUE(target.Init("P2PHANDSHAKE", "127.0.0.1", "tcp").ok());
  std::vector<uint8_t> buf(65536, 0x5A);
  ASSERT_TRUE(target.RegisterLocalMemory(buf.data(), buf.size()).ok());

  Relay relay(target.GetRpcPort());
  TransferEngine victim(Options());
  ASSERT_TRUE(victim.Init("P2PHANDSHAKE", "127.0.0.1", "tcp").ok());
  std::vector<uint8_t> local(4096, 0);
  ASSERT_TRUE(victim.RegisterLocalMemory(local.data(), local.size()).ok());
  auto seg = victim.OpenSegment(relay.name());
  if (seg.ok()) {  // the victim reads from "M": its data connection is what M wants
    (void)victim.TransferSync({{TransferRequest::READ, local.data(), *seg,
                                reinterpret_cast<uint64_t>(buf.data()), 4096}},
                              std::chrono::seconds(3));
  }
  ::shutdown(relay.data_listener.get(), SHUT_RDWR);  // unblocks the relay if no one came
  relay.data_thread.join();
  relay.data_thread = std::thread([] {});
  size_t touched = 0;
  for (uint8_t b : buf) touched += b != 0x5A;
  std::printf("relay: victim OpenSegment %s; relay got descriptor %d, authenticated data "
              "connection %d, read %llu bytes, wrote %llu, target bytes changed %zu\n",
              seg.ok() ? "succeeded" : seg.status().ToString().c_str(),
              relay.got_descriptor.load(), relay.data_authenticated.load(),
              static_cast<unsigned long long>(relay.bytes_read.load()),
              static_cast<unsigned long long>(relay.bytes_written.load()), touched);
  EXPECT_FALSE(seg.ok()) << "the victim opened a segment through a relay";
  if (!seg.ok()) {
    EXPECT_EQ(seg.status().code(), Status::Code::kPermissionDenied);
  }
  EXPECT_FALSE(relay.got_descriptor.load());
  EXPECT_FALSE(relay.data_authenticated.load());
  EXPECT_EQ(relay.bytes_read.load(), 0u);
  EXPECT_EQ(touched, 0u) << "the relay wrote into the target's buffer";
}

// The control: the same victim opening the target directly works.
TEST(HostileNet, DirectConnectionWithTheSecretStillWorks) {
  TransferEngine target(Options());
  ASSERT_TRUE(target.Init("P2PHANDSHAKE", "127.0.0.1", "tcp").ok());
  std::vector<uint8_t> buf(65536, 0x5A);
  ASSERT_TRUE(target.RegisterLocalMemory(buf.data(), buf.size()).ok());
  TransferEngine peer(Options());
  ASSERT_TRUE(peer.Init("P2PHANDSHAKE", "127.0.0.1", "tcp").ok());
  std::vector<uint8_t> local(4096, 0);
  ASSERT_TRUE(peer.RegisterLocalMemory(local.data(), local.size()).ok());
  auto seg = peer.OpenSegment(target.GetLocalSegmentName());
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  Status s = peer.TransferSync({{TransferRequest::READ, local.data(), *seg,
                                 reinterpret_cast<uint64_t>(buf.data()), 4096}},
                               std::chrono::seconds(5));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(local[4095], 0x5A);
}

}  // namespace
}  // namespace mooncake
