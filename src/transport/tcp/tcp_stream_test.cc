// Small TCP submits on an idle connection run on the submitting thread (TcpStream::TryInline):
// it sends them and drives the connection for MC_TCP_SPIN_US, leaving what is not done to
// the stream's thread. Two TcpTransports in one process over 127.0.0.1: every byte checked,
// with one submitter and with several racing over the same streams, with replies in time
// and with nearly every one late; and an idle connection the peer closed (the stream's
// thread no longer watches it) is replaced, not failed on.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/memory_registry.h"
#include "engine/transfer_race_test_util.h"
#include "transport/tcp/tcp_transport.h"

namespace mooncake::tcp {
namespace {

constexpr size_t kBytes = 8 << 20;

struct Side {
  MemoryRegistry registry;
  TcpTransport transport;
  SegmentDesc desc;
};

class TcpInline : public ::testing::Test {
 protected:
  void Start(int spin_us) {
    ASSERT_TRUE(StartSide(&initiator_, "initiator", spin_us, 0).ok());
    ASSERT_TRUE(StartSide(&target_, "target", spin_us, 0).ok());
    ASSERT_TRUE(initiator_.registry.Add(reinterpret_cast<uint64_t>(local_.data()), kBytes,
                                        "cpu:0", true).ok());
    ASSERT_TRUE(target_.registry.Add(reinterpret_cast<uint64_t>(remote_.data()), kBytes,
                                     "cpu:0", true).ok());
    peer_ = std::make_shared<const SegmentDesc>(target_.desc);
  }
  // `port`: 0 for any free one.
  static Status StartSide(Side* s, const std::string& name, int spin_us, uint16_t port) {
    TransportContext ctx;
    ctx.options.slice_timeout_ms = 5000;
    ctx.options.tcp_spin_us = spin_us;
    if (port != 0) ctx.options.min_rpc_port = ctx.options.max_rpc_port = port;
    ctx.registry = &s->registry;
    s->desc.name = name;
    s->desc.host = "127.0.0.1";
    return s->transport.Start(ctx, &s->desc);
  }
  void TearDown() override {
    initiator_.transport.Stop();
    target_.transport.Stop();
  }
  bool Batch(TransferRequest::OpCode op, size_t off, size_t len, size_t count, std::string* why) {
    return testing_util::SubmitAndWait(initiator_.transport, peer_, op, local_.data(),
                                       remote_.data(), off, len, count, why);
  }
  void Fill(size_t off, size_t n, uint32_t seed) {
    testing_util::FillPattern(local_.data(), off, n, seed);
  }
  static bool Matches(const uint8_t* p, size_t off, size_t n, uint32_t seed) {
    return testing_util::HasPattern(p, off, n, seed);
  }
  // One 4 KiB write of pattern `seed` from the start of local_ to the start of remote_
  // through `from` to `to`, checked.
  void WriteOne(TcpTransport& from, const std::shared_ptr<const SegmentDesc>& to, uint32_t seed) {
    Fill(0, 4096, seed);
    std::string why;
    EXPECT_TRUE(testing_util::SubmitAndWait(from, to, TransferRequest::WRITE, local_.data(),
                                            remote_.data(), 0, 4096, 1, &why))
        << why;
    EXPECT_TRUE(Matches(remote_.data(), 0, 4096, seed));
  }
  // Several threads write and read back their own areas over the peer's streams.
  void Race(int spin_us);

  std::vector<uint8_t> local_ = std::vector<uint8_t>(kBytes);
  std::vector<uint8_t> remote_ = std::vector<uint8_t>(kBytes);
  Side initiator_, target_;
  std::shared_ptr<const SegmentDesc> peer_;
};

TEST_F(TcpInline, SmallSubmitsRunOnTheSubmittingThreadByteExact) {
  Start(/*spin_us=*/10000);  // replies in time under a sanitizer or a loaded machine
  std::string why;
  ASSERT_TRUE(Batch(TransferRequest::WRITE, 0, 4096, 1, &why)) << why;  // connects
  const uint64_t before = initiator_.transport.inline_done();
  for (uint32_t round = 0; round < 20; ++round) {
    const size_t off = (round % 8) * (256 << 10);
    Fill(off, 256 << 10, round);
    ASSERT_TRUE(Batch(TransferRequest::WRITE, off, 4096, 64, &why)) << why;
    ASSERT_TRUE(Matches(remote_.data() + off, off, 256 << 10, round)) << "round " << round;
    std::memset(local_.data() + off, 0, 256 << 10);
    ASSERT_TRUE(Batch(TransferRequest::READ, off, 4096, 64, &why)) << why;
    ASSERT_TRUE(Matches(local_.data() + off, off, 256 << 10, round)) << "round " << round;
  }
  // Each of the 40 runs inline unless it raced the stream's thread back to sleep or
  // outlasted the spin: most must.
  EXPECT_GE(initiator_.transport.inline_done() - before, 30u)
      << "the submits went through the stream's thread";
}

TEST_F(TcpInline, LargeSubmitsAndASpinOfZeroGoThroughTheStreams) {
  Start(/*spin_us=*/10000);
  std::string why;
  ASSERT_TRUE(Batch(TransferRequest::WRITE, 0, 4096, 1, &why)) << why;
  const uint64_t done = initiator_.transport.inline_done();
  const uint64_t left = initiator_.transport.inline_left();
  Fill(0, 2 << 20, 5);
  ASSERT_TRUE(Batch(TransferRequest::WRITE, 0, 64 << 10, 32, &why)) << why;  // 2 MiB
  EXPECT_TRUE(Matches(remote_.data(), 0, 2 << 20, 5));
  Fill(0, 2 << 20, 6);
  ASSERT_TRUE(Batch(TransferRequest::WRITE, 0, 2 << 20, 1, &why)) << why;  // one 2 MiB slice
  EXPECT_TRUE(Matches(remote_.data(), 0, 2 << 20, 6));
  EXPECT_EQ(initiator_.transport.inline_done(), done) << "1 MiB or more: the streams' threads";
  EXPECT_EQ(initiator_.transport.inline_left(), left);

  Side other;
  ASSERT_TRUE(StartSide(&other, "other", /*spin_us=*/0, 0).ok());
  ASSERT_TRUE(other.registry.Add(reinterpret_cast<uint64_t>(local_.data()), kBytes, "cpu:0",
                                 true).ok());
  for (uint32_t i = 0; i < 5; ++i) WriteOne(other.transport, peer_, i);
  EXPECT_EQ(other.transport.inline_done() + other.transport.inline_left(), 0u);
  other.transport.Stop();
}

void TcpInline::Race(int spin_us) {
  Start(spin_us);
  std::string why;
  ASSERT_TRUE(Batch(TransferRequest::WRITE, 0, 4096, 1, &why)) << why;
  for (const std::string& w : testing_util::RaceOwnAreas(
           initiator_.transport, peer_, local_.data(), remote_.data(), kBytes, 4, 120)) {
    ADD_FAILURE() << w;
  }
}

// A 1 us spin leaves nearly every submit's replies to the stream's thread: submits taken
// inline and handed over mix with submits queued behind them on each connection.
TEST_F(TcpInline, RacingSubmittersWithRepliesLeftToTheStreamsLoseNothing) {
  Race(/*spin_us=*/1);
  EXPECT_GT(initiator_.transport.inline_left(), 0u)
      << "with a 1 us spin some submits must have been left to the streams";
}

// Long spins: callers hold a connection while others queue on it and its thread wakes.
TEST_F(TcpInline, RacingSubmittersQueueingBehindAnInlineSubmitLoseNothing) {
  Race(/*spin_us=*/10000);
  EXPECT_GT(initiator_.transport.inline_done(), 0u);
}

// The stream's thread does not watch an idle connection (so that a caller may use it); a
// peer that closed it meanwhile (here: restarted on the same port) must cost the next
// request a new connection, not a failure.
TEST_F(TcpInline, AnIdleConnectionThePeerClosedIsReplacedNotFailedOn) {
  for (int spin : {10000, 0}) {
    SCOPED_TRACE("spin " + std::to_string(spin));
    Side a;
    ASSERT_TRUE(StartSide(&a, "initiator", spin, 0).ok());
    ASSERT_TRUE(a.registry.Add(reinterpret_cast<uint64_t>(local_.data()), kBytes, "cpu:0",
                               true).ok());
    auto first = std::make_unique<Side>();
    ASSERT_TRUE(StartSide(first.get(), "target", spin, 0).ok());
    const uint16_t port = first->transport.data_port();
    ASSERT_TRUE(first->registry.Add(reinterpret_cast<uint64_t>(remote_.data()), kBytes, "cpu:0",
                                    true).ok());
    auto desc = std::make_shared<const SegmentDesc>(first->desc);
    auto move = [&](uint32_t seed) { WriteOne(a.transport, desc, seed); };
    move(1);
    first->transport.Stop();  // closes every connection it served: ours is idle
    first.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the FIN has arrived
    Side second;
    ASSERT_TRUE(StartSide(&second, "target", spin, port).ok());
    ASSERT_TRUE(second.registry.Add(reinterpret_cast<uint64_t>(remote_.data()), kBytes, "cpu:0",
                                    true).ok());
    move(2);
    move(3);
    a.transport.Stop();
    second.transport.Stop();
  }
}

}  // namespace
}  // namespace mooncake::tcp
