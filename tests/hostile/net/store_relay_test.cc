// Issue 28, item 2: with MC_AUTH_SECRET set, what an engine fetches from a metadata store must
// be authenticated end to end.
//
// The attacker M has no secret but can write the store (mooncake_http_metadata_server lets
// anyone PUT or DELETE any key). It sits between a victim engine and target S:
//  1. It replaces S's descriptor in the store with one whose tcp_data_port is M's. The victim
//     opens S, connects to M; M relays the MCAUTHv2 exchange to S's real data port (the
//     victim answers for segment S, which S accepts), keeps that authenticated connection for
//     itself, reads S's whole 1 MiB, writes into it, and acknowledges the victim's write,
//     which thus lands at M.
//  2. It replaces S's rpc_meta entry (DELETE then PUT) with M's handshake port: M relays the
//     victim's notify connection, reads the notify and sends S one of its own instead.
//  3. It replays a descriptor S really signed in an earlier run (same name, old data port,
//     which M now holds) and relays to S's new data port.
// Before (descriptors and rpc_meta trusted as fetched): 1 and 2 succeeded (M read 1048576
// bytes, wrote 4096, the victim's write "succeeded"; S queued M's forged notify). After:
// descriptors and rpc_meta entries are signed by their owner (docs/wire_protocol.md §5.4) and
// data connections are bound to the engine start that signed them: the victim refuses the
// substituted entries with PermissionDenied, S refuses the replayed one's relay, M gets
// nothing.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "http_util.h"
#include "relay_util.h"
#include "metadata/handshake.h"
#include "mooncake/transfer_engine.h"
#include "transport/tcp/tcp_wire.h"

#ifdef MC_HTTP_METADATA_SERVER_PATH
namespace mooncake {
namespace {

EngineOptions WithSecret() {
  EngineOptions o;
  o.auth_secret = "s3cret";
  o.enable_shm = false;  // the attack is on the TCP data port
  o.tcp_bind_address = "127.0.0.1";
  o.handshake_io_timeout_ms = 2000;
  o.slice_timeout_ms = 2000;
  return o;
}

// M's data side: one victim connection, relayed to S's data port.
struct DataRelay {
  UniqueFd listener;
  uint16_t port = 0;
  uint16_t target_port = 0;
  uint64_t addr = 0, len = 0;
  std::atomic<bool> authenticated{false};
  std::atomic<uint64_t> bytes_read{0}, bytes_written{0}, victim_bytes{0};
  std::thread thread;

  DataRelay(uint16_t listen_port, uint16_t target, uint64_t a, uint64_t l)
      : target_port(target), addr(a), len(l) {
    auto fd = listen_port ? ListenTcpInRange(listen_port, listen_port, 8, &port, "127.0.0.1")
                          : ListenTcpInRange(29000, 29999, 8, &port, "127.0.0.1");
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    if (fd.ok()) listener = std::move(fd).value();
    thread = std::thread([this] { Serve(); });
  }
  ~DataRelay() { Stop(); }
  void Stop() {
    if (listener.valid()) ::shutdown(listener.get(), SHUT_RDWR);
    if (thread.joinable()) thread.join();
  }

  void Serve() {
    if (!listener.valid()) return;
    UniqueFd c(::accept(listener.get(), nullptr, nullptr));
    if (!c.valid()) return;
    auto s = ConnectTcp("127.0.0.1", target_port, 2000);
    if (!s.ok() || !RelayAuth(c.get(), s->get())) return;
    authenticated = true;
    // S's side is ours: read its whole buffer, then write into it.
    uint8_t h[tcp::kHeaderSize];
    tcp::EncodeHeader({len, addr, tcp::kOpRead, true}, h);
    uint64_t status = 0;
    uint32_t code = 1;
    std::vector<uint8_t> stolen(len);
    if (WriteFull(s->get(), h, sizeof(h), 2000).ok() &&
        ReadFull(s->get(), &status, 8, 2000).ok() && tcp::DecodeStatus(status, &code) &&
        code == tcp::kStatusOk && ReadFull(s->get(), stolen.data(), stolen.size(), 2000).ok()) {
      bytes_read = stolen.size();
    }
    std::vector<uint8_t> w(tcp::kHeaderSize + 4096, 0xAA);
    tcp::EncodeHeader({4096, addr, tcp::kOpWrite, true}, w.data());
    if (WriteFull(s->get(), w.data(), w.size(), 2000).ok() &&
        ReadFull(s->get(), &status, 8, 2000).ok() && tcp::DecodeStatus(status, &code) &&
        code == tcp::kStatusOk) {
      bytes_written = 4096;
    }
    // The victim's frames: keep its write, acknowledge it (HELLO / FENCE get no reply).
    for (int i = 0; i < 8; ++i) {
      uint8_t vh[tcp::kHeaderSize];
      if (!ReadFull(c.get(), vh, sizeof(vh), 2000).ok()) return;
      tcp::Header hd;
      bool data = tcp::DecodeHeader(vh, &hd);
      if (hd.size > (64u << 20)) return;
      std::vector<uint8_t> body(data && hd.op == tcp::kOpRead ? 0 : hd.size);
      if (!body.empty() && !ReadFull(c.get(), body.data(), body.size(), 2000).ok()) return;
      if (!data) continue;
      uint64_t ok = tcp::EncodeStatus(tcp::kStatusOk);
      if (hd.op == tcp::kOpWrite) {
        victim_bytes += hd.size;
        if (hd.v2) (void)WriteFull(c.get(), &ok, 8, 2000);
      } else {
        std::vector<uint8_t> fake(hd.size, 0x66);
        if (hd.v2) (void)WriteFull(c.get(), &ok, 8, 2000);
        (void)WriteFull(c.get(), fake.data(), fake.size(), 2000);
      }
    }
  }
};

struct Cluster {
  std::unique_ptr<Child> server;
  uint16_t port = 0;
  std::string store;
  Cluster() {
    server = std::make_unique<Child>(
        std::vector<std::string>{MC_HTTP_METADATA_SERVER_PATH, "--port", "0", "--host", "127.0.0.1"});
    port = PortOf(*server);
    store = "http://127.0.0.1:" + std::to_string(port) + "/metadata";
  }
};

size_t Changed(const std::vector<uint8_t>& buf, uint8_t was) {
  size_t n = 0;
  for (uint8_t b : buf) n += b != was;
  return n;
}

TEST(HostileNet, ADescriptorSubstitutedInTheStoreRedirectsNothing) {
  Cluster c;
  ASSERT_NE(c.port, 0);
  TransferEngine target(WithSecret());
  ASSERT_TRUE(target.Init(c.store, "seg-s", "tcp").ok());
  std::vector<uint8_t> buf(1 << 20, 0x5A);
  ASSERT_TRUE(target.RegisterLocalMemory(buf.data(), buf.size()).ok());

  std::string text;
  ASSERT_EQ(Http(c.port, "GET", "mooncake/ram/seg-s", "", "", &text), 200);
  auto j = nlohmann::json::parse(text);
  DataRelay relay(0, static_cast<uint16_t>(j["tcp_data_port"].get<uint64_t>()),
                  reinterpret_cast<uint64_t>(buf.data()), buf.size());
  j["tcp_data_port"] = relay.port;
  ASSERT_EQ(Http(c.port, "PUT", "mooncake/ram/seg-s", "application/json", j.dump(), nullptr), 200);

  TransferEngine victim(WithSecret());
  ASSERT_TRUE(victim.Init(c.store, "seg-c", "tcp").ok());
  std::vector<uint8_t> local(4096, 0xEE);
  ASSERT_TRUE(victim.RegisterLocalMemory(local.data(), local.size()).ok());
  auto seg = victim.OpenSegment("seg-s");
  Status s = seg.status();
  if (seg.ok()) {
    s = victim.TransferSync({{TransferRequest::WRITE, local.data(), *seg,
                              reinterpret_cast<uint64_t>(buf.data()) + 8192, 4096}},
                            std::chrono::seconds(5));
  }
  relay.Stop();
  std::printf("store relay: victim's open+write %s; relay authenticated %d, read %llu bytes of "
              "S, wrote %llu, took %llu bytes of the victim's write; S bytes changed %zu\n",
              s.ok() ? "succeeded" : s.ToString().c_str(), relay.authenticated.load(),
              static_cast<unsigned long long>(relay.bytes_read.load()),
              static_cast<unsigned long long>(relay.bytes_written.load()),
              static_cast<unsigned long long>(relay.victim_bytes.load()), Changed(buf, 0x5A));
  EXPECT_FALSE(seg.ok()) << "the victim opened a substituted descriptor";
  EXPECT_EQ(seg.status().code(), Status::Code::kPermissionDenied) << seg.status().ToString();
  EXPECT_NE(seg.status().message().find("signature"), std::string::npos)
      << seg.status().ToString();
  EXPECT_FALSE(relay.authenticated.load());
  EXPECT_EQ(relay.bytes_read.load(), 0u);
  EXPECT_EQ(relay.victim_bytes.load(), 0u) << "the victim's write landed at the relay";
  EXPECT_EQ(Changed(buf, 0x5A), 0u) << "the relay wrote into the target's buffer";

  // An unsigned descriptor (written by someone without the secret) is refused as well.
  j.erase("mc_auth_sig");
  ASSERT_EQ(Http(c.port, "PUT", "mooncake/ram/seg-s", "application/json", j.dump(), nullptr), 200);
  TransferEngine victim2(WithSecret());
  ASSERT_TRUE(victim2.Init(c.store, "seg-c2", "tcp").ok());
  auto seg2 = victim2.OpenSegment("seg-s");
  EXPECT_EQ(seg2.status().code(), Status::Code::kPermissionDenied) << seg2.status().ToString();
  EXPECT_NE(seg2.status().message().find("not signed"), std::string::npos)
      << seg2.status().ToString();
}

TEST(HostileNet, AnRpcMetaEntrySubstitutedInTheStoreRedirectsNoNotify) {
  Cluster c;
  ASSERT_NE(c.port, 0);
  TransferEngine target(WithSecret());
  ASSERT_TRUE(target.Init(c.store, "seg-s", "tcp").ok());
  uint16_t my_port = 0;
  auto listener = ListenTcpInRange(29000, 29999, 8, &my_port, "127.0.0.1");
  ASSERT_TRUE(listener.ok());
  std::atomic<bool> relayed{false};
  std::string stolen;
  std::thread m([&] {
    UniqueFd v(::accept(listener->get(), nullptr, nullptr));
    if (!v.valid()) return;
    auto s = ConnectTcp("127.0.0.1", target.GetRpcPort(), 2000);
    if (!s.ok() || !RelayAuth(v.get(), s->get())) return;
    relayed = true;
    auto req = ReadHandshakeFrame(v.get(), 1 << 20, 3000);
    if (req.ok()) stolen = req->payload;
    std::string forged = EncodeHandshakeFrame(HandshakeType::kNotify,
                                              R"({"name":"seg-c","notify_msg":"forged"})");
    (void)WriteFull(s->get(), forged.data(), forged.size(), 2000);
    auto reply = ReadHandshakeFrame(s->get(), 1 << 20, 3000);
    if (reply.ok()) {
      std::string f = EncodeHandshakeFrame(reply->type, reply->payload);
      (void)WriteFull(v.get(), f.data(), f.size(), 2000);
    }
  });
  const std::string rpc_key = "mooncake/rpc_meta/seg-s";
  (void)Http(c.port, "DELETE", rpc_key, "", "", nullptr);
  nlohmann::json rpc = {{"ip_or_host_name", "127.0.0.1"}, {"rpc_port", my_port}};
  ASSERT_EQ(Http(c.port, "PUT", rpc_key, "application/json", rpc.dump(), nullptr), 200);

  TransferEngine victim(WithSecret());
  ASSERT_TRUE(victim.Init(c.store, "seg-c", "tcp").ok());
  Status s = victim.SendNotifyByName("seg-s", {"seg-c", "the real message"});
  ::shutdown(listener->get(), SHUT_RDWR);
  m.join();
  bool forged = false;
  for (const auto& n : target.GetNotifies()) forged |= n.notify_msg == "forged";
  std::printf("rpc_meta relay: notify %s; relay authenticated %d, read %zu bytes of it; S got a "
              "forged notify %d\n",
              s.ok() ? "succeeded" : s.ToString().c_str(), relayed.load(), stolen.size(), forged);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied) << s.ToString();
  EXPECT_FALSE(relayed.load());
  EXPECT_TRUE(stolen.empty());
  EXPECT_FALSE(forged) << "the relay delivered its own notify as the victim";
}

TEST(HostileNet, AStaleSignedDescriptorReplayedReachesNothing) {
  Cluster c;
  ASSERT_NE(c.port, 0);
  std::vector<uint8_t> buf(1 << 20, 0x5A);
  std::string old_text;
  uint16_t old_port = 0;
  {
    TransferEngine first(WithSecret());
    ASSERT_TRUE(first.Init(c.store, "seg-s", "tcp").ok());
    ASSERT_TRUE(first.RegisterLocalMemory(buf.data(), buf.size()).ok());
    ASSERT_EQ(Http(c.port, "GET", "mooncake/ram/seg-s", "", "", &old_text), 200);
    old_port = static_cast<uint16_t>(nlohmann::json::parse(old_text)["tcp_data_port"].get<uint64_t>());
  }
  // S restarts (new ports, new instance); M replays the old, genuinely signed descriptor and
  // holds its old data port.
  TransferEngine target(WithSecret());
  ASSERT_TRUE(target.Init(c.store, "seg-s", "tcp").ok());
  ASSERT_TRUE(target.RegisterLocalMemory(buf.data(), buf.size()).ok());
  std::string text;
  ASSERT_EQ(Http(c.port, "GET", "mooncake/ram/seg-s", "", "", &text), 200);
  uint16_t new_port = static_cast<uint16_t>(nlohmann::json::parse(text)["tcp_data_port"].get<uint64_t>());
  DataRelay relay(old_port, new_port, reinterpret_cast<uint64_t>(buf.data()), buf.size());
  if (relay.port != old_port) GTEST_SKIP() << "port " << old_port << " was taken";
  ASSERT_EQ(Http(c.port, "PUT", "mooncake/ram/seg-s", "application/json", old_text, nullptr), 200);

  TransferEngine victim(WithSecret());
  ASSERT_TRUE(victim.Init(c.store, "seg-c", "tcp").ok());
  std::vector<uint8_t> local(4096, 0xEE);
  ASSERT_TRUE(victim.RegisterLocalMemory(local.data(), local.size()).ok());
  auto seg = victim.OpenSegment("seg-s");
  Status s = seg.status();
  if (seg.ok()) {
    s = victim.TransferSync({{TransferRequest::WRITE, local.data(), *seg,
                              reinterpret_cast<uint64_t>(buf.data()) + 8192, 4096}},
                            std::chrono::seconds(5));
  }
  relay.Stop();
  std::printf("stale replay: victim's open+write %s; relay authenticated %d, read %llu bytes, "
              "took %llu of the victim's; S bytes changed %zu\n",
              s.ok() ? "succeeded" : s.ToString().c_str(), relay.authenticated.load(),
              static_cast<unsigned long long>(relay.bytes_read.load()),
              static_cast<unsigned long long>(relay.victim_bytes.load()), Changed(buf, 0x5A));
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(relay.authenticated.load());
  EXPECT_EQ(relay.bytes_read.load(), 0u);
  EXPECT_EQ(relay.victim_bytes.load(), 0u);
  EXPECT_EQ(Changed(buf, 0x5A), 0u);
}

// The control: honest engines with the secret in metadata-store mode still work, data and
// notifies.
TEST(HostileNet, SignedStoreEntriesStillWorkBetweenHonestEngines) {
  Cluster c;
  ASSERT_NE(c.port, 0);
  TransferEngine target(WithSecret());
  ASSERT_TRUE(target.Init(c.store, "seg-s", "tcp").ok());
  std::vector<uint8_t> buf(65536, 0x5A);
  ASSERT_TRUE(target.RegisterLocalMemory(buf.data(), buf.size()).ok());
  TransferEngine peer(WithSecret());
  ASSERT_TRUE(peer.Init(c.store, "seg-c", "tcp").ok());
  std::vector<uint8_t> local(4096, 0x42);
  ASSERT_TRUE(peer.RegisterLocalMemory(local.data(), local.size()).ok());
  auto seg = peer.OpenSegment("seg-s");
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  Status s = peer.TransferSync({{TransferRequest::WRITE, local.data(), *seg,
                                 reinterpret_cast<uint64_t>(buf.data()), 4096}},
                               std::chrono::seconds(5));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(buf[4095], 0x42);
  ASSERT_TRUE(peer.SendNotifyByName("seg-s", {"seg-c", "hello"}).ok());
  auto got = target.GetNotifies();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].notify_msg, "hello");
}

}  // namespace
}  // namespace mooncake
#endif  // MC_HTTP_METADATA_SERVER_PATH
