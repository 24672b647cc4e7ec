// Unit tests for the P2P handshake frames, client and server (src/metadata/handshake.h).
#include "metadata/handshake.h"

#include <endian.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace mooncake {
namespace {

using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

std::string LengthPrefix(uint64_t len) {
  uint64_t le = htole64(len);
  return std::string(reinterpret_cast<const char*>(&le), 8);
}

// --- frames ------------------------------------------------------------------------------------

TEST(HandshakeFrameTest, EncodeLayout) {
  std::string f = EncodeHandshakeFrame(HandshakeType::kMetadata, "{}");
  ASSERT_EQ(f.size(), 11u);
  EXPECT_EQ(f, std::string("\x03\0\0\0\0\0\0\0\x01{}", 11));  // length counts the type byte

  std::string payload(300, 'p');
  std::string g = EncodeHandshakeFrame(HandshakeType::kProbe, payload);
  ASSERT_EQ(g.size(), 309u);
  EXPECT_EQ(g.substr(0, 8), std::string("\x2d\x01\0\0\0\0\0\0", 8));  // 301, little-endian
  EXPECT_EQ(static_cast<uint8_t>(g[8]), 3);
  EXPECT_EQ(g.substr(9), payload);

  std::string e = EncodeHandshakeFrame(HandshakeType::kConnection, "");
  EXPECT_EQ(e, std::string("\x01\0\0\0\0\0\0\0\0", 9));
}

TEST(HandshakeFrameTest, TypeBytesAndNames) {
  EXPECT_EQ(static_cast<int>(HandshakeType::kConnection), 0);
  EXPECT_EQ(static_cast<int>(HandshakeType::kMetadata), 1);
  EXPECT_EQ(static_cast<int>(HandshakeType::kNotify), 2);
  EXPECT_EQ(static_cast<int>(HandshakeType::kProbe), 3);
  EXPECT_STREQ(HandshakeTypeName(HandshakeType::kConnection), "Connection");
  EXPECT_STREQ(HandshakeTypeName(HandshakeType::kMetadata), "Metadata");
  EXPECT_STREQ(HandshakeTypeName(HandshakeType::kNotify), "Notify");
  EXPECT_STREQ(HandshakeTypeName(HandshakeType::kProbe), "Probe");
}

TEST(HandshakeFrameTest, DecodeRoundTripAllTypes) {
  for (int t = 0; t <= 3; ++t) {
    for (std::string payload : {std::string(), std::string("{}\n"), std::string(1000, 'x')}) {
      SCOPED_TRACE(t);
      auto type = static_cast<HandshakeType>(t);
      std::string f = EncodeHandshakeFrame(type, payload);
      auto r = DecodeHandshakeFrame(f, 1 << 20);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->type, type);
      EXPECT_FALSE(r->legacy);
      EXPECT_EQ(r->payload, payload);
    }
  }
}

TEST(HandshakeFrameTest, TrailingBytesAfterFrameIgnored) {
  std::string f = EncodeHandshakeFrame(HandshakeType::kNotify, "abc") + "garbage";
  auto r = DecodeHandshakeFrame(f, 1 << 20);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->payload, "abc");
}

TEST(HandshakeFrameTest, LengthChecks) {
  EXPECT_EQ(CheckHandshakeLength(0, 100).code(), Status::Code::kDataLoss);
  EXPECT_TRUE(CheckHandshakeLength(1, 100).ok());
  EXPECT_TRUE(CheckHandshakeLength(100, 100).ok());  // the limit is inclusive, like upstream
  EXPECT_EQ(CheckHandshakeLength(101, 100).code(), Status::Code::kDataLoss);
  EXPECT_EQ(CheckHandshakeLength(UINT64_MAX, 100).code(), Status::Code::kDataLoss);

  auto zero = DecodeHandshakeFrame(LengthPrefix(0) + "\x01{}", 1 << 20);
  EXPECT_EQ(zero.status().code(), Status::Code::kDataLoss);
  std::string big = EncodeHandshakeFrame(HandshakeType::kMetadata, std::string(100, ' '));
  EXPECT_EQ(DecodeHandshakeFrame(big, 100).status().code(), Status::Code::kDataLoss);  // 101
  EXPECT_TRUE(DecodeHandshakeFrame(big, 101).ok());
  auto huge = DecodeHandshakeFrame(LengthPrefix(1ull << 62) + "\x01", 1 << 20);
  EXPECT_EQ(huge.status().code(), Status::Code::kDataLoss);
}

TEST(HandshakeFrameTest, TruncatedRejected) {
  std::string f = EncodeHandshakeFrame(HandshakeType::kMetadata, "0123456789");
  for (size_t n : {size_t{0}, size_t{7}, size_t{8}, size_t{9}, f.size() - 1}) {
    SCOPED_TRACE(n);
    auto r = DecodeHandshakeFrame(std::string_view(f).substr(0, n), 1 << 20);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Status::Code::kDataLoss);
  }
  EXPECT_EQ(DecodeHandshakeBody("").status().code(), Status::Code::kDataLoss);
}

TEST(HandshakeFrameTest, LegacyFrameIsConnectionWithWholeBody) {
  const std::string json = R"({"local_nic_path":"a"})";
  auto r = DecodeHandshakeFrame(LengthPrefix(json.size()) + json, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->legacy);
  EXPECT_EQ(r->type, HandshakeType::kConnection);
  EXPECT_EQ(r->payload, json);  // the first byte is part of the payload
  for (uint8_t first : {uint8_t{4}, uint8_t{' '}, uint8_t{0x7f}, uint8_t{0xfd}}) {
    SCOPED_TRACE(static_cast<int>(first));
    std::string body = std::string(1, static_cast<char>(first)) + "{}";
    auto b = DecodeHandshakeBody(body);
    ASSERT_TRUE(b.ok());
    EXPECT_TRUE(b->legacy);
    EXPECT_EQ(b->payload, body);
  }
}

TEST(HandshakeFrameTest, ReservedTypeBytesRejected) {
  for (uint8_t first : {uint8_t{0xfe}, uint8_t{0xff}}) {
    auto b = DecodeHandshakeBody(std::string(1, static_cast<char>(first)) + "{}");
    EXPECT_EQ(b.status().code(), Status::Code::kDataLoss);
  }
}

// --- the live server ---------------------------------------------------------------------------

HandshakeLimits ShortLimits(int io_timeout_ms = 500) {
  HandshakeLimits l;
  l.max_length = 4096;
  l.connect_timeout_ms = 1000;
  l.io_timeout_ms = io_timeout_ms;
  l.first_frame_timeout_ms = io_timeout_ms;
  return l;
}

class HandshakeServerTest : public ::testing::Test {
 protected:
  void StartServer(const HandshakeLimits& limits) {
    limits_ = limits;
    auto fd = ListenTcpInRange(24000, 24999, 128, &port_, "127.0.0.1");
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    server_ = std::make_unique<HandshakeServer>(limits);
    Status s = server_->Start(std::move(fd).value(), [this](const HandshakeFrame& req)
                                                         -> Result<std::string> {
      ++requests_;
      if (req.payload == "fail") return Status::PermissionDenied("refused by the test");
      return std::string(HandshakeTypeName(req.type)) + (req.legacy ? "(legacy)" : "") + ":" +
             req.payload;
    }, {"seg"});
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }

  Result<std::string> Call(HandshakeType type, const std::string& payload) {
    return HandshakeCall("127.0.0.1", port_, "seg", type, payload, limits_);
  }
  UniqueFd RawConnect() {
    auto fd = ConnectTcp("127.0.0.1", port_, 1000);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    return fd.ok() ? std::move(fd).value() : UniqueFd();
  }
  // Sends `bytes` and expects the server to close without a reply.
  void ExpectClosedWithoutReply(const std::string& bytes) {
    UniqueFd fd = RawConnect();
    ASSERT_TRUE(fd.valid());
    ASSERT_TRUE(WriteFull(fd.get(), bytes.data(), bytes.size(), 1000).ok());
    char c;
    auto t0 = Clock::now();
    Status s = ReadFull(fd.get(), &c, 1, 3000);
    EXPECT_EQ(s.code(), Status::Code::kUnavailable) << s.ToString();  // EOF or reset
    EXPECT_LT(MsSince(t0), 2000);
  }

  HandshakeLimits limits_;
  uint16_t port_ = 0;
  std::atomic<int> requests_{0};
  std::unique_ptr<HandshakeServer> server_;
};

TEST_F(HandshakeServerTest, CallsGetTheirReplies) {
  StartServer(ShortLimits());
  auto m = Call(HandshakeType::kMetadata, "{}");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(*m, "Metadata:{}");
  auto n = Call(HandshakeType::kNotify, R"({"name":"x","notify_msg":"hello"})");
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, R"(Notify:{"name":"x","notify_msg":"hello"})");
  auto p = Call(HandshakeType::kProbe, "{}\n");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, "Probe:{}\n");
  auto c = Call(HandshakeType::kConnection, "{}");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(*c, "Connection:{}");
  EXPECT_EQ(requests_.load(), 4);
}

TEST_F(HandshakeServerTest, RawReplyFrameHasRequestType) {
  StartServer(ShortLimits());
  UniqueFd fd = RawConnect();
  std::string req = EncodeHandshakeFrame(HandshakeType::kNotify, "n");
  ASSERT_TRUE(WriteFull(fd.get(), req.data(), req.size(), 1000).ok());
  auto reply = ReadHandshakeFrame(fd.get(), 4096, 1000);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->type, HandshakeType::kNotify);
  EXPECT_FALSE(reply->legacy);
  EXPECT_EQ(reply->payload, "Notify:n");
  char c;  // then the server half-closes: EOF right after the reply
  EXPECT_EQ(ReadFull(fd.get(), &c, 1, 1000).code(), Status::Code::kUnavailable);
}

TEST_F(HandshakeServerTest, LegacyRequestGetsLegacyReply) {
  StartServer(ShortLimits());
  UniqueFd fd = RawConnect();
  const std::string json = R"({"local_nic_path":"a"})";
  std::string req = LengthPrefix(json.size()) + json;
  ASSERT_TRUE(WriteFull(fd.get(), req.data(), req.size(), 1000).ok());
  const std::string expect = "Connection(legacy):" + json;
  std::string got(8 + expect.size(), '\0');
  ASSERT_TRUE(ReadFull(fd.get(), got.data(), got.size(), 1000).ok());
  EXPECT_EQ(got, LengthPrefix(expect.size()) + expect);  // no type byte, len = reply size
}

TEST_F(HandshakeServerTest, HandlerErrorFailsCallWithoutHanging) {
  StartServer(ShortLimits());
  auto t0 = Clock::now();
  auto r = Call(HandshakeType::kMetadata, "fail");
  EXPECT_FALSE(r.ok());
  EXPECT_LT(MsSince(t0), 1000);
  EXPECT_NE(r.status().message().find("handshake Metadata to 127.0.0.1:"), std::string::npos)
      << r.status().message();
  // The server keeps serving.
  auto ok = Call(HandshakeType::kProbe, "again");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(*ok, "Probe:again");
}

TEST_F(HandshakeServerTest, BadLengthsCloseTheConnectionAndServingGoesOn) {
  StartServer(ShortLimits());
  ExpectClosedWithoutReply(LengthPrefix(0));
  ExpectClosedWithoutReply(LengthPrefix(0) + "\x01{}");
  ExpectClosedWithoutReply(LengthPrefix(4097));  // max_length is 4096
  ExpectClosedWithoutReply(LengthPrefix(1ull << 62) + "\x01{}");
  ExpectClosedWithoutReply(LengthPrefix(3) + "\xfe{}");  // reserved type byte
  EXPECT_EQ(requests_.load(), 0);
  auto r = Call(HandshakeType::kProbe, "next");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "Probe:next");
  // A frame of exactly max_length is accepted (the limit is inclusive).
  UniqueFd fd = RawConnect();
  std::string req = EncodeHandshakeFrame(HandshakeType::kMetadata, std::string(4095, 'b'));
  ASSERT_EQ(req.size(), 8u + 4096);
  ASSERT_TRUE(WriteFull(fd.get(), req.data(), req.size(), 1000).ok());
  auto reply = ReadHandshakeFrame(fd.get(), 1 << 20, 1000);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->payload, "Metadata:" + std::string(4095, 'b'));
}

TEST_F(HandshakeServerTest, IdleClientDoesNotBlockOthers) {
  StartServer(ShortLimits(/*io_timeout_ms=*/1000));
  UniqueFd idle = RawConnect();  // connects and sends nothing
  UniqueFd partial = RawConnect();
  ASSERT_TRUE(WriteFull(partial.get(), "\x03\0\0", 3, 100).ok());  // 3 of 8 length bytes
  std::this_thread::sleep_for(std::chrono::milliseconds(50));       // both taken by workers
  auto t0 = Clock::now();
  auto r = Call(HandshakeType::kProbe, "{}");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_LT(MsSince(t0), 500) << "a call waited for the idle clients' timeout";
  // The idle client is dropped after the io timeout.
  char c;
  Status s = ReadFull(idle.get(), &c, 1, 3000);
  EXPECT_EQ(s.code(), Status::Code::kUnavailable) << s.ToString();
}

TEST_F(HandshakeServerTest, ConcurrentCalls) {
  StartServer(ShortLimits(/*io_timeout_ms=*/2000));
  constexpr int kThreads = 32;
  std::vector<std::thread> threads;
  std::vector<std::string> replies(kThreads);
  std::vector<std::string> errors(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      auto r = Call(HandshakeType::kMetadata, "req-" + std::to_string(i));
      if (r.ok()) {
        replies[i] = *r;
      } else {
        errors[i] = r.status().ToString();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(errors[i], "") << i;
    EXPECT_EQ(replies[i], "Metadata:req-" + std::to_string(i));
  }
  EXPECT_EQ(requests_.load(), kThreads);
}

TEST_F(HandshakeServerTest, StopIsPromptAndIdempotent) {
  StartServer(ShortLimits());
  auto t0 = Clock::now();
  server_->Stop();
  server_->Stop();
  EXPECT_LT(MsSince(t0), 1000);
  auto r = Call(HandshakeType::kProbe, "{}");
  EXPECT_FALSE(r.ok());
}

// --- the client against fake servers -----------------------------------------------------------

TEST(HandshakeCallTest, ClosedPortIsUnavailable) {
  uint16_t port = 0;
  {
    auto fd = ListenTcpInRange(25000, 25999, 1, &port, "127.0.0.1");
    ASSERT_TRUE(fd.ok());
  }
  auto r = HandshakeCall("127.0.0.1", port, "seg", HandshakeType::kProbe, "{}", ShortLimits());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kUnavailable);
  EXPECT_NE(r.status().message().find("handshake Probe to 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << r.status().message();
}

// A one-shot fake server: reads the request frame, then writes `reply` (if any) and waits.
struct FakeServer {
  uint16_t port = 0;
  UniqueFd listener;
  std::thread thread;
  explicit FakeServer(std::string reply, int hold_ms) {
    auto fd = ListenTcpInRange(26000, 26999, 4, &port, "127.0.0.1");
    EXPECT_TRUE(fd.ok());
    listener = std::move(fd).value();
    thread = std::thread([this, reply, hold_ms] {
      UniqueFd c(::accept(listener.get(), nullptr, nullptr));
      if (!c.valid()) return;
      [[maybe_unused]] auto req = ReadHandshakeFrame(c.get(), 4096, 2000);
      if (!reply.empty()) (void)WriteFull(c.get(), reply.data(), reply.size(), 1000);
      char sink;
      (void)ReadFull(c.get(), &sink, 1, hold_ms);  // until the client closes or hold_ms
    });
  }
  ~FakeServer() { thread.join(); }
};

TEST(HandshakeCallTest, ReplyOfOtherTypeIsDataLoss) {
  FakeServer fake(EncodeHandshakeFrame(HandshakeType::kProbe, "{}"), 2000);
  auto r = HandshakeCall("127.0.0.1", fake.port, "seg", HandshakeType::kMetadata, "{}", ShortLimits());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kDataLoss) << r.status().ToString();
}

TEST(HandshakeCallTest, OversizedReplyIsDataLoss) {
  FakeServer fake(LengthPrefix(1 << 30), 2000);
  auto r = HandshakeCall("127.0.0.1", fake.port, "seg", HandshakeType::kMetadata, "{}", ShortLimits());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kDataLoss) << r.status().ToString();
}

TEST(HandshakeCallTest, SilentServerTimesOut) {
  FakeServer fake("", 3000);
  auto t0 = Clock::now();
  auto r = HandshakeCall("127.0.0.1", fake.port, "seg", HandshakeType::kProbe, "{}", ShortLimits(300));
  int64_t ms = MsSince(t0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kDeadlineExceeded) << r.status().ToString();
  EXPECT_GE(ms, 200);
  EXPECT_LT(ms, 2000);
}

}  // namespace
}  // namespace mooncake
