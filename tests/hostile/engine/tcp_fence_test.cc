// Connection fencing of the TCP data server (src/transport/tcp/tcp_fence.h), attacked and
// exercised at the byte level: a real TcpServer over a MemoryRegistry, and raw loopback
// sockets that speak the wire protocol (docs/wire_protocol.md §3) the way a buggy or hostile
// initiator might.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/net.h"
#include "engine/memory_registry.h"
#include "mooncake/options.h"
#include "transport/tcp/tcp_fence.h"
#include "transport/tcp/tcp_server.h"
#include "transport/tcp/tcp_wire.h"

using namespace mooncake;
using namespace mooncake::tcp;
using namespace std::chrono_literals;

namespace {

constexpr size_t kBuf = 4 << 20;

class TcpFence : public ::testing::Test {
 protected:
  void SetUp() override {
    mem_.assign(kBuf, 0);
    ASSERT_TRUE(registry_.Add(addr(), kBuf, "cpu:0", true).ok());
    options_.slice_timeout_ms = 5000;
    server_ = std::make_unique<TcpServer>(options_, &registry_);
    auto fd = ListenTcpInRange(20000, 30000, 64, &port_, "127.0.0.1");
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    ASSERT_TRUE(server_->Start(std::move(fd).value()).ok());
  }
  void TearDown() override { server_->Stop(); }

  uint64_t addr(size_t off = 0) { return reinterpret_cast<uint64_t>(mem_.data()) + off; }

  UniqueFd Connect() {
    auto fd = ConnectTcp("127.0.0.1", port_, 2000);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    return std::move(fd).value();
  }
  static void Send(int fd, const std::string& bytes) {
    ASSERT_TRUE(WriteFull(fd, bytes.data(), bytes.size(), 2000).ok());
  }
  static std::string Hello(uint64_t session, uint64_t id, uint64_t floor,
                           std::vector<uint64_t> live) {
    return EncodeControl({kOpHello, session, id, floor, std::move(live)}, true);
  }
  static std::string Fence(uint64_t session, uint64_t floor, std::vector<uint64_t> live) {
    return EncodeControl({kOpFence, session, 0, floor, std::move(live)}, true);
  }
  static std::string WriteHeader(uint64_t addr, uint64_t size) {
    Header h;
    h.size = size;
    h.addr = addr;
    h.op = kOpWrite;
    h.v2 = true;
    uint8_t out[kHeaderSize];
    EncodeHeader(h, out);
    return std::string(reinterpret_cast<char*>(out), kHeaderSize);
  }
  // Reads one v2 status frame; false on EOF / error / timeout.
  static bool ReadOk(int fd) {
    uint64_t wire = 0;
    if (!ReadFull(fd, &wire, sizeof(wire), 3000).ok()) return false;
    uint32_t code = 1;
    return DecodeStatus(wire, &code) && code == kStatusOk;
  }
  // True once the server has closed `fd` (EOF or reset), within 3 s.
  static bool ClosedByServer(int fd) {
    char c;
    for (int i = 0; i < 300; ++i) {
      ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  bool Region(size_t off, size_t len, char v) {
    for (size_t i = 0; i < len; ++i) {
      if (mem_[off + i] != v) return false;
    }
    return true;
  }

  EngineOptions options_;
  MemoryRegistry registry_;
  std::vector<char> mem_;
  std::unique_ptr<TcpServer> server_;
  uint16_t port_ = 0;
};

// The lost update, at the byte level: connection 1 is in the middle of a 1 MiB WRITE when its
// initiator gives up on it; connection 2 says HELLO with a fence naming 1 and writes the same
// range. Whatever connection 1 sends afterwards must never land.
TEST_F(TcpFence, AbandonedConnectionNeverAppliesAfterTheFence) {
  constexpr size_t kLen = 1 << 20;
  UniqueFd old = Connect();
  Send(old.get(), Hello(77, 1, 1, {1}));
  Send(old.get(), WriteHeader(addr(), kLen));
  std::string half(kLen / 2, 'A');
  Send(old.get(), half);  // half the payload: the server is blocked receiving the rest
  std::this_thread::sleep_for(100ms);

  UniqueFd fresh = Connect();
  Send(fresh.get(), Hello(77, 2, 2, {2}));
  Send(fresh.get(), WriteHeader(addr(), kLen));
  Send(fresh.get(), std::string(kLen, 'B'));
  ASSERT_TRUE(ReadOk(fresh.get())) << "the newer write was not acknowledged";
  EXPECT_TRUE(Region(0, kLen, 'B'));

  // The old connection's rest (and a whole further write) arrive now: nothing may land.
  (void)::send(old.get(), half.data(), half.size(), MSG_NOSIGNAL);
  std::string again = WriteHeader(addr(), kLen) + std::string(kLen, 'A');
  (void)::send(old.get(), again.data(), again.size(), MSG_NOSIGNAL);
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(Region(0, kLen, 'B')) << "bytes of the fenced connection landed after the fence";
  EXPECT_TRUE(ClosedByServer(old.get()));
  EXPECT_GE(server_->fenced_connections(), 1u);
}

// A healthy connection of the same session carries the fence in-band before its next request;
// it stays open and its requests still run, and a live connection it lists is left alone.
TEST_F(TcpFence, InBandFenceSparesLiveConnections) {
  UniqueFd dead = Connect(), a = Connect(), b = Connect();
  Send(dead.get(), Hello(5, 1, 1, {1}));
  Send(a.get(), Hello(5, 2, 2, {1, 2}));
  Send(b.get(), Hello(5, 3, 3, {1, 2, 3}));
  std::this_thread::sleep_for(100ms);
  Send(a.get(), Fence(5, 3, {2, 3}));  // 1 was given up on
  Send(a.get(), WriteHeader(addr(4096), 4096) + std::string(4096, 'x'));
  ASSERT_TRUE(ReadOk(a.get()));
  EXPECT_TRUE(ClosedByServer(dead.get()));
  Send(b.get(), WriteHeader(addr(8192), 4096) + std::string(4096, 'y'));
  ASSERT_TRUE(ReadOk(b.get())) << "a live connection was fenced";
  EXPECT_TRUE(Region(4096, 4096, 'x'));
  EXPECT_TRUE(Region(8192, 4096, 'y'));
  EXPECT_EQ(server_->fenced_connections(), 1u);
}

// A connection whose HELLO arrives after a fence that named it (it was delayed on the way)
// is refused before anything it sends is applied.
TEST_F(TcpFence, LateHelloOfAFencedConnectionIsRefused) {
  UniqueFd fresh = Connect();
  Send(fresh.get(), Hello(9, 4, 4, {4}));
  std::this_thread::sleep_for(50ms);
  UniqueFd late = Connect();
  Send(late.get(), Hello(9, 3, 3, {3}) + WriteHeader(addr(), 4096) + std::string(4096, 'L'));
  EXPECT_TRUE(ClosedByServer(late.get()));
  EXPECT_TRUE(Region(0, 4096, 0)) << "a fenced connection's write landed";
}

// Malformed control frames close the connection and touch nothing; the server keeps serving.
TEST_F(TcpFence, MalformedControlFramesAreRefused) {
  auto header = [](uint8_t op, uint64_t size) {
    uint8_t h[kHeaderSize] = {};
    uint64_t s = htole64(size), m = htole64(kControlMagic);
    std::memcpy(h, &s, 8);
    std::memcpy(h + 8, &m, 8);
    h[16] = op | kV2Flag;
    return std::string(reinterpret_cast<char*>(h), kHeaderSize);
  };
  std::vector<std::string> attacks = {
      header(kOpHello, 1ull << 40),                              // huge body
      header(kOpHello, 31) + std::string(31, '\0'),              // too short
      header(kOpHello, 40) + std::string(40, '\0'),              // zero session, bad count
      Fence(1, 10, {}),                                          // FENCE without HELLO
      Hello(1, 1, 1, {1}) + Hello(1, 2, 2, {2}),                 // second HELLO
      Hello(2, 1, 1, {1}) + Fence(3, 10, {}),                    // FENCE for another session
  };
  for (size_t i = 0; i < attacks.size(); ++i) {
    UniqueFd fd = Connect();
    Send(fd.get(), attacks[i] + WriteHeader(addr(), 4096) + std::string(4096, 'Z'));
    EXPECT_TRUE(ClosedByServer(fd.get())) << "attack " << i << " was not refused";
  }
  EXPECT_TRUE(Region(0, 4096, 0)) << "a refused connection's write landed";
  // A connection without HELLO (an upstream initiator) still works.
  UniqueFd plain = Connect();
  Send(plain.get(), WriteHeader(addr(), 4096) + std::string(4096, 'P'));
  ASSERT_TRUE(ReadOk(plain.get()));
  EXPECT_TRUE(Region(0, 4096, 'P'));
}

// Sessions a peer invents are bounded: the table never grows past its cap, and a session with
// open connections is never forgotten for a new one.
TEST_F(TcpFence, InventedSessionsAreBounded) {
  FenceTable table;
  std::vector<std::shared_ptr<FenceTable::Conn>> conns;
  for (uint64_t s = 1; s <= FenceTable::kMaxSessions + 100; ++s) {
    ControlFrame f{kOpFence, s, 0, 5, {}};
    table.Fence(f, nullptr);  // no connection: remembered while there is room
  }
  auto c = std::make_shared<FenceTable::Conn>();
  c->session = 1u << 30;
  c->id = 1;
  EXPECT_LE(table.session_count(), FenceTable::kMaxSessions);
  EXPECT_TRUE(table.Register(c).ok()) << "empty sessions must make room for a live one";
  EXPECT_LE(table.session_count(), FenceTable::kMaxSessions);
  table.Unregister(*c);
}

}  // namespace
