// Small TCP submits on an idle connection run on the submitting thread (TcpStream::TryInline):
// it sends them and drives the connection for MC_TCP_SPIN_US, leaving what is not done to
// the stream's thread. Two TcpTransports in one process over 127.0.0.1: every byte checked,
// with one submitter and with several racing over the same streams, with replies in time
// and with nearly every one late; and an idle connection the peer closed (the stream's
// thread no longer watches it) is replaced, not failed on.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/memory_registry.h"
#include "engine/slice_recorder_test_util.h"
#include "transport/tcp/tcp_transport.h"

namespace mooncake::tcp {
namespace {

using Recorder = testing_util::SliceRecorder;

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
  // `count` slices of `len` bytes at offset `off` + i * len on both sides, one Submit; true
  // when every one completed.
  bool Batch(TransferRequest::OpCode op, size_t off, size_t len, size_t count, std::string* why) {
    Recorder rec;
    std::vector<Slice> slices(count);
    for (size_t i = 0; i < count; ++i) {
      Slice& s = slices[i];
      s.opcode = op;
      s.local = reinterpret_cast<uint64_t>(local_.data()) + off + i * len;
      s.remote = reinterpret_cast<uint64_t>(remote_.data()) + off + i * len;
      s.length = len;
      s.hook = &rec;
    }
    Status st = initiator_.transport.Submit(peer_, slices.data(), count);
    if (!st.ok()) {
      *why = st.ToString();
      return false;
    }
    if (!rec.Wait(count)) {
      *why = "not every slice was reported within 10 s";
      return false;
    }
    for (TransferStatusEnum r : rec.results()) {
      if (r != COMPLETED) {
        *why = rec.message();
        return false;
      }
    }
    return true;
  }
  void Fill(size_t off, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; ++i) local_[off + i] = static_cast<uint8_t>((off + i) * 29 + seed);
  }
  static bool Matches(const uint8_t* p, size_t off, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; ++i) {
      if (p[i] != static_cast<uint8_t>((off + i) * 29 + seed)) return false;
    }
    return true;
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
  EXPECT_EQ(initiator_.transport.inline_done(), done) << "1 MiB or more: spread over streams";
  EXPECT_EQ(initiator_.transport.inline_left(), left);

  Side other;
  ASSERT_TRUE(StartSide(&other, "other", /*spin_us=*/0, 0).ok());
  ASSERT_TRUE(other.registry.Add(reinterpret_cast<uint64_t>(local_.data()), kBytes, "cpu:0",
                                 true).ok());
  for (int i = 0; i < 5; ++i) {
    Recorder rec;
    Slice s;
    s.opcode = TransferRequest::WRITE;
    s.local = reinterpret_cast<uint64_t>(local_.data());
    s.remote = reinterpret_cast<uint64_t>(remote_.data());
    s.length = 4096;
    s.hook = &rec;
    ASSERT_TRUE(other.transport.Submit(peer_, &s, 1).ok());
    ASSERT_TRUE(rec.Wait(1));
    EXPECT_EQ(rec.results()[0], COMPLETED) << rec.message();
  }
  EXPECT_EQ(other.transport.inline_done() + other.transport.inline_left(), 0u);
  other.transport.Stop();
}

void TcpInline::Race(int spin_us) {
  Start(spin_us);
  std::string why;
  ASSERT_TRUE(Batch(TransferRequest::WRITE, 0, 4096, 1, &why)) << why;
  constexpr int kThreads = 4, kRounds = 120;
  std::atomic<int> failures{0};
  std::vector<std::string> whys(kThreads);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      const size_t area = kBytes / kThreads;
      for (int round = 0; round < kRounds && failures.load() == 0; ++round) {
        const size_t len = size_t{512} << (round % 4);  // 512 B .. 4 KiB
        const size_t count = 1 + (round * 7 + th) % 96;
        const size_t off = th * area + (round % 4) * (area / 4);
        const uint32_t seed = th * 1000 + round;
        Fill(off, len * count, seed);
        std::string w;
        if (!Batch(TransferRequest::WRITE, off, len, count, &w) ||
            !Matches(remote_.data() + off, off, len * count, seed)) {
          whys[th] = "write, round " + std::to_string(round) + ": " + w;
          failures.fetch_add(1);
          return;
        }
        std::memset(local_.data() + off, 0xEE, len * count);
        if (!Batch(TransferRequest::READ, off, len, count, &w) ||
            !Matches(local_.data() + off, off, len * count, seed)) {
          whys[th] = "read, round " + std::to_string(round) + ": " + w;
          failures.fetch_add(1);
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& w : whys) EXPECT_TRUE(w.empty()) << w;
  EXPECT_EQ(failures.load(), 0);
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
    auto move = [&](uint32_t seed) {
      Fill(0, 4096, seed);
      Recorder rec;
      Slice s;
      s.opcode = TransferRequest::WRITE;
      s.local = reinterpret_cast<uint64_t>(local_.data());
      s.remote = reinterpret_cast<uint64_t>(remote_.data());
      s.length = 4096;
      s.hook = &rec;
      EXPECT_TRUE(a.transport.Submit(desc, &s, 1).ok());
      EXPECT_TRUE(rec.Wait(1));
      auto r = rec.results();
      EXPECT_TRUE(!r.empty() && r[0] == COMPLETED) << rec.message();
      EXPECT_TRUE(Matches(remote_.data(), 0, 4096, seed));
    };
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
