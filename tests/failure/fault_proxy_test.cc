// Faults injected on the TCP data path by FaultProxy (fault_proxy.h): the initiator opens a
// HandshakeProxy's name, whose descriptor points the data connections at the FaultProxy in
// front of the target's data port. Target and initiator are engines of this process; the
// initiator installs only TCP.
#include <gtest/gtest.h>

#include <thread>

#include "engine_util.h"
#include "failure_util.h"
#include "fault_proxy.h"
#include "pattern.h"

namespace mc_failure {
namespace {

using namespace mooncake;
using std::chrono::milliseconds;

constexpr uint64_t kMiB = 1 << 20;
constexpr size_t kSize = 48 * kMiB;
// The faults hit requests in [0, 32 MiB); the recovery checks use [32, 48 MiB), because bytes
// of a failed write can still be applied by the target after the failure was reported
// (KnownLimitation_TimedOutWriteIsNeverAppliedAfterALaterWrite) and must not race the check.
constexpr size_t kRecover = 32 * kMiB;

EngineOptions InitiatorOptions(int streams, int slice_timeout_ms = 5000) {
  EngineOptions o;
  o.tcp_streams_per_peer = streams;
  o.slice_timeout_ms = slice_timeout_ms;
  o.handshake_connect_timeout_ms = 2000;
  o.handshake_io_timeout_ms = 2000;
  o.tcp_connect_timeout_ms = 2000;
  return o;
}

class FaultyLink : public ::testing::Test {
 protected:
  void Start(const EngineOptions& initiator_options) {
    EngineOptions to;
    to.slice_timeout_ms = 5000;
    target_ = std::make_unique<TransferEngine>(to);
    ASSERT_TRUE(target_->Init("P2PHANDSHAKE", "127.0.0.1").ok());
    ASSERT_TRUE(remote_.data() && local_.data());
    ASSERT_TRUE(target_->RegisterLocalMemory(remote_.data(), kSize).ok());
    int data_port = FetchTcpDataPort("127.0.0.1", target_->GetRpcPort());
    ASSERT_GT(data_port, 0);
    data_ = std::make_unique<FaultProxy>("127.0.0.1", static_cast<uint16_t>(data_port));
    ASSERT_TRUE(data_->Start());
    hs_ = std::make_unique<HandshakeProxy>("127.0.0.1", target_->GetRpcPort(), data_->port());
    ASSERT_TRUE(hs_->Start());
    initiator_ = std::make_unique<TransferEngine>(initiator_options);
    ASSERT_TRUE(initiator_->Init("P2PHANDSHAKE", "127.0.0.1", "tcp").ok());
    ASSERT_TRUE(initiator_->RegisterLocalMemory(local_.data(), kSize).ok());
    auto seg = initiator_->OpenSegment(hs_->name());
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    seg_ = *seg;
    ASSERT_EQ(hs_->metadata_replies(), 1u);
  }
  void TearDown() override {
    initiator_.reset();
    hs_.reset();
    data_.reset();
    target_.reset();
  }

  // Submits `n` requests of `len` bytes at offsets 0, len, 2*len...; waits (bounded).
  BatchID Submit(TransferRequest::OpCode op, size_t n, size_t len) {
    auto id = initiator_->AllocateBatchID(n);
    EXPECT_TRUE(id.ok());
    std::vector<TransferRequest> reqs;
    for (size_t i = 0; i < n; ++i) {
      reqs.push_back({op, local_.data() + i * len, seg_, remote_.addr(i * len), len});
    }
    EXPECT_TRUE(initiator_->SubmitTransfer(*id, reqs).ok());
    return *id;
  }
  // *ended_s: seconds from `since` until every request had ended; ended_at_: that moment.
  Outcome WaitAndCount(BatchID id, size_t n, double* ended_s, Clock::time_point since) {
    (void)initiator_->WaitBatch(id, milliseconds(20000));
    ended_at_ = Clock::now();
    *ended_s = std::chrono::duration<double>(ended_at_ - since).count();
    Outcome out;
    Count(*initiator_, id, n, &out);
    EXPECT_TRUE(initiator_->FreeBatchID(id).ok());
    return out;
  }
  // After a fault: the next transfers (a write and a read of 8 MiB) succeed and are verified;
  // the engine opened a new connection for them.
  void ExpectRecovered(uint64_t seed) {
    uint64_t conns = data_->connections();
    const uint64_t w_off = kRecover, r_off = kRecover + 8 * kMiB;
    FillPattern(local_.data() + w_off, 8 * kMiB, seed, 0);
    Status w = initiator_->TransferSync(
        {{TransferRequest::WRITE, local_.data() + w_off, seg_, remote_.addr(w_off), 8 * kMiB}},
        milliseconds(10000));
    ASSERT_TRUE(w.ok()) << "first transfer after the fault: " << w.ToString();
    EXPECT_TRUE(CheckPattern(remote_.data() + w_off, 8 * kMiB, seed, 0));
    FillPattern(remote_.data() + r_off, 8 * kMiB, seed + 1, 0);
    Status r = initiator_->TransferSync(
        {{TransferRequest::READ, local_.data() + r_off, seg_, remote_.addr(r_off), 8 * kMiB}},
        milliseconds(10000));
    ASSERT_TRUE(r.ok()) << r.ToString();
    EXPECT_TRUE(CheckPattern(local_.data() + r_off, 8 * kMiB, seed + 1, 0));
    EXPECT_GT(data_->connections(), conns) << "the engine should have reconnected";
  }
  void WarmUp() {
    ASSERT_TRUE(initiator_
                    ->TransferSync({{TransferRequest::WRITE, local_.data(), seg_, remote_.addr(), 4096}})
                    .ok());
  }

  Buffer remote_{kSize}, local_{kSize};
  std::unique_ptr<TransferEngine> target_, initiator_;
  std::unique_ptr<FaultProxy> data_;
  std::unique_ptr<HandshakeProxy> hs_;
  SegmentID seg_ = 0;
  Clock::time_point ended_at_;
};

double MsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// The proxy is transparent when it injects nothing.
TEST_F(FaultyLink, PassThroughIsTransparent) {
  Start(InitiatorOptions(2));
  ExpectRecovered(1);
  EXPECT_EQ(data_->cuts(), 0u);
  EXPECT_GT(data_->bytes(FaultProxy::kToTarget), 8 * kMiB);
}

TEST_F(FaultyLink, CutInTheMiddleOfAWriteFrame) {
  Start(InitiatorOptions(1));
  WarmUp();
  FillPattern(local_.data(), 16 * kMiB, 2, 0);
  // Header of the first slice (24 bytes), then 300000 bytes of its 1 MiB payload.
  data_->CutAfter(FaultProxy::kToTarget, 24 + 300000);
  auto t = Clock::now();
  BatchID id = Submit(TransferRequest::WRITE, 16, kMiB);
  double ended_s = 0;
  Outcome out = WaitAndCount(id, 16, &ended_s, t);
  double detect_ms = MsBetween(data_->last_cut(), ended_at_);
  std::printf("[proxy] write frame cut after 300024 bytes: %s, ended %.0f ms after the cut; %s\n",
              out.ToString().c_str(), detect_ms, out.first_error.c_str());
  EXPECT_EQ(data_->cuts(), 1u);
  EXPECT_EQ(out.failed, 16u) << "one stream: every request queued on the cut connection fails";
  EXPECT_LT(detect_ms, 1000);
  ExpectRecovered(3);
}

TEST_F(FaultyLink, CutInTheMiddleOfAReadReply) {
  Start(InitiatorOptions(1));
  WarmUp();
  FillPattern(remote_.data(), 16 * kMiB, 4, 0);
  // Status frame (8 bytes), then 400000 bytes of the first 1 MiB payload.
  data_->CutAfter(FaultProxy::kToInitiator, 8 + 400000);
  auto t = Clock::now();
  BatchID id = Submit(TransferRequest::READ, 16, kMiB);
  double ended_s = 0;
  Outcome out = WaitAndCount(id, 16, &ended_s, t);
  double detect_ms = MsBetween(data_->last_cut(), ended_at_);
  std::printf("[proxy] read reply cut after 400008 bytes: %s, ended %.0f ms after the cut\n",
              out.ToString().c_str(), detect_ms);
  EXPECT_EQ(data_->cuts(), 1u);
  EXPECT_EQ(out.failed, 16u);
  EXPECT_LT(detect_ms, 1000);
  ExpectRecovered(5);
}

TEST_F(FaultyLink, CutInsideARequestHeader) {
  Start(InitiatorOptions(1));
  WarmUp();
  data_->CutAfter(FaultProxy::kToTarget, 10);
  auto t = Clock::now();
  BatchID id = Submit(TransferRequest::WRITE, 4, 4096);
  double ended_s = 0;
  Outcome out = WaitAndCount(id, 4, &ended_s, t);
  std::printf("[proxy] header cut after 10 bytes: %s in %.0f ms\n", out.ToString().c_str(),
              ended_s * 1000);
  EXPECT_EQ(out.failed, 4u);
  EXPECT_LT(ended_s, 2.0);
  ExpectRecovered(6);
}

TEST_F(FaultyLink, CutInsideAStatusFrame) {
  Start(InitiatorOptions(1));
  WarmUp();
  data_->CutAfter(FaultProxy::kToInitiator, 4);  // half of the first OK frame
  auto t = Clock::now();
  BatchID id = Submit(TransferRequest::WRITE, 8, 4096);
  double ended_s = 0;
  Outcome out = WaitAndCount(id, 8, &ended_s, t);
  std::printf("[proxy] status frame cut after 4 bytes: %s in %.0f ms\n", out.ToString().c_str(),
              ended_s * 1000);
  EXPECT_EQ(out.failed, 8u);
  EXPECT_LT(ended_s, 2.0);
  ExpectRecovered(7);
}

// Two streams: the cut connection's requests fail, the other stream's complete, and every
// request reported COMPLETED really is in the target's memory.
TEST_F(FaultyLink, OneOfTwoStreamsCut) {
  Start(InitiatorOptions(2));
  WarmUp();
  FillPattern(local_.data(), kRecover, 8, 0);
  std::memset(remote_.data(), 0, kRecover);
  data_->CutAfter(FaultProxy::kToTarget, 5 * kMiB + 1000);
  auto t = Clock::now();
  BatchID id = Submit(TransferRequest::WRITE, 32, kMiB);
  (void)initiator_->WaitBatch(id, milliseconds(20000));
  double ended_s = SecondsSince(t);
  Outcome out;
  Count(*initiator_, id, 32, &out);
  size_t verified = 0;
  for (size_t i = 0; i < 32; ++i) {
    auto st = initiator_->GetTransferStatus(id, i);
    ASSERT_TRUE(st.ok());
    if (st->s != COMPLETED) continue;
    EXPECT_TRUE(CheckPattern(remote_.data() + i * kMiB, kMiB, 8, i * kMiB))
        << "request " << i << " COMPLETED but its bytes are not at the target";
    ++verified;
  }
  EXPECT_TRUE(initiator_->FreeBatchID(id).ok());
  std::printf("[proxy] one of two streams cut: %s in %.0f ms; %zu completed verified\n",
              out.ToString().c_str(), ended_s * 1000, verified);
  EXPECT_EQ(out.waiting, 0u);
  EXPECT_GE(out.failed, 1u);
  EXPECT_EQ(out.completed + out.failed, 32u);
  EXPECT_LT(ended_s, 5.0);
  ExpectRecovered(9);
}

TEST_F(FaultyLink, DelayedBytesArriveIntact) {
  Start(InitiatorOptions(2));
  data_->SetDelay(3);  // every forwarded chunk waits 3 ms
  auto t = Clock::now();
  ExpectRecovered(10);
  std::printf("[proxy] 16 MiB through a 3 ms-per-chunk delay in %.0f ms\n", SecondsSince(t) * 1000);
}

// A slow connection that keeps moving is not a silent one: the slice timeout is about no
// progress, so a transfer longer than it completes.
TEST_F(FaultyLink, SlowButMovingConnectionIsNotTimedOut) {
  Start(InitiatorOptions(1, /*slice_timeout_ms=*/1000));
  WarmUp();
  data_->SetRate(2 * kMiB);  // bytes per second, each direction
  FillPattern(local_.data(), 4 * kMiB, 11, 0);
  auto t = Clock::now();
  Status s = initiator_->TransferSync(
      {{TransferRequest::WRITE, local_.data(), seg_, remote_.addr(), 4 * kMiB}}, milliseconds(20000));
  double took = SecondsSince(t);
  std::printf("[proxy] 4 MiB at 2 MiB/s with a 1 s slice timeout: %s in %.0f ms\n",
              s.ToString().c_str(), took * 1000);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(took, 1.0);
  EXPECT_TRUE(CheckPattern(remote_.data(), 4 * kMiB, 11, 0));
}

TEST_F(FaultyLink, StalledConnectionTimesOutThenRecovers) {
  constexpr int kTimeoutMs = 1000;
  Start(InitiatorOptions(2, kTimeoutMs));
  WarmUp();
  data_->SetStalled(true);
  // Small enough to sit in the socket buffers at once: with more, the kernel keeps taking a
  // few bytes now and then (window probes) and each counts as progress, which pushes the
  // timeout out by up to about a second.
  auto t = Clock::now();
  BatchID id = Submit(TransferRequest::WRITE, 8, 16 << 10);
  double ended_s = 0;
  Outcome out = WaitAndCount(id, 8, &ended_s, t);
  std::printf("[proxy] stalled link, slice timeout %d ms: %s after %.0f ms; %s\n", kTimeoutMs,
              out.ToString().c_str(), ended_s * 1000, out.first_error.c_str());
  EXPECT_EQ(out.timeout, 8u);
  EXPECT_LE(ended_s, kTimeoutMs / 1000.0 + 1.5);
  data_->SetStalled(false);
  ExpectRecovered(12);
}

TEST_F(FaultyLink, RefusedConnectionsFailFastThenRecover) {
  Start(InitiatorOptions(2));
  data_->SetRefuse(true);
  auto t = Clock::now();
  Status s = initiator_->TransferSync(
      {{TransferRequest::WRITE, local_.data(), seg_, remote_.addr(), kMiB}}, milliseconds(10000));
  double took = SecondsSince(t);
  std::printf("[proxy] connection reset at accept: %s in %.0f ms\n", s.ToString().c_str(),
              took * 1000);
  EXPECT_EQ(s.code(), Status::Code::kUnavailable) << s.ToString();
  EXPECT_LT(took, 2.0);
  data_->SetRefuse(false);
  // The engine dropped the descriptor after the failure; it refetches it through the
  // handshake proxy.
  ExpectRecovered(13);
}

// A WRITE that ended TIMEOUT must not be applied after a later WRITE to the same range that
// COMPLETED. Here the first connection's bytes are held back (as in a stopped target's
// socket buffers, or a slow network path) while the retry goes over a new connection.
// BUG (design, both transports): after a TIMEOUT the initiator only closes its connection
// (tcp_stream.cc FailAll -> ResetConnection: a plain close(), so its kernel still delivers
// the queued bytes, FIN last); the target applies whatever arrives on a connection until EOF
// (tcp_server.cc Session::Run), with nothing that lets it tell a request the initiator gave
// up on. The late bytes overwrite the newer data: a lost update, with both calls having
// reported their outcome. The same happens after a connection is cut: payload bytes already
// in the target's receive queue are still read and applied by the old session after the
// initiator reported FAILED (seen under CPU load in CutInTheMiddleOfAWriteFrame, before its
// recovery check moved to a range the cut request does not cover).
// (shm: see SilentPeer.TimedOutReadNeverWritesLocalMemoryLater.)
TEST_F(FaultyLink, TimedOutWriteIsNeverAppliedAfterALaterWrite) {
  Start(InitiatorOptions(1, /*slice_timeout_ms=*/1000));
  WarmUp();
  data_->FreezeExisting();
  FillPattern(local_.data(), kMiB, 60, 0);  // A
  Status a = initiator_->TransferSync(
      {{TransferRequest::WRITE, local_.data(), seg_, remote_.addr(), kMiB}}, milliseconds(10000));
  EXPECT_EQ(a.code(), Status::Code::kDeadlineExceeded) << a.ToString();
  FillPattern(local_.data() + kMiB, kMiB, 61, 0);  // B, newer
  Status b = initiator_->TransferSync(
      {{TransferRequest::WRITE, local_.data() + kMiB, seg_, remote_.addr(), kMiB}},
      milliseconds(10000));
  ASSERT_TRUE(b.ok()) << b.ToString();
  ASSERT_TRUE(CheckPattern(remote_.data(), kMiB, 61, 0));
  data_->ThawAll();  // the first connection's bytes arrive now
  std::this_thread::sleep_for(milliseconds(300));
  bool still_b = CheckPattern(remote_.data(), kMiB, 61, 0);
  bool is_a = CheckPattern(remote_.data(), kMiB, 60, 0);
  std::printf("[proxy] after the held-back write arrived: target holds %s\n",
              still_b ? "the newer write (B)" : is_a ? "the write that timed out (A)" : "a mix");
  EXPECT_TRUE(still_b) << "lost update: the write reported TIMEOUT was applied after a later "
                          "write to the same range had COMPLETED";
}

// Unregistering a buffer that a slow (but moving) transfer still reads: the call gives up
// after slice_timeout + 1 s with FailedPrecondition, the buffer stays registered and usable,
// and the transfer completes intact.
TEST_F(FaultyLink, UnregisterWhileASlowTransferUsesTheBuffer) {
  constexpr int kTimeoutMs = 1000;
  Start(InitiatorOptions(1, kTimeoutMs));
  WarmUp();
  Buffer src(24 * kMiB);
  ASSERT_TRUE(src.data());
  FillPattern(src.data(), src.size(), 14, 0);
  ASSERT_TRUE(initiator_->RegisterLocalMemory(src.data(), src.size()).ok());
  data_->SetRate(6 * kMiB);
  auto id = initiator_->AllocateBatchID(24);
  ASSERT_TRUE(id.ok());
  std::vector<TransferRequest> reqs;
  for (size_t i = 0; i < 24; ++i) {
    reqs.push_back({TransferRequest::WRITE, src.data() + i * kMiB, seg_, remote_.addr(i * kMiB), kMiB});
  }
  ASSERT_TRUE(initiator_->SubmitTransfer(*id, reqs).ok());
  auto t = Clock::now();
  Status u = initiator_->UnregisterLocalMemory(src.data());
  double took = SecondsSince(t);
  Outcome mid;
  Count(*initiator_, *id, 24, &mid);
  std::printf("[proxy] unregister during a slow transfer: %s after %.0f ms (requests: %s)\n",
              u.ToString().c_str(), took * 1000, mid.ToString().c_str());
  EXPECT_EQ(u.code(), Status::Code::kFailedPrecondition) << u.ToString();
  EXPECT_FALSE(u.message().empty());
  EXPECT_EQ(mid.timeout + mid.failed, 0u) << "the slow transfer was not supposed to fail";
  // Still registered: listed, and usable by a new request.
  auto info = initiator_->GetSegmentInfo(LOCAL_SEGMENT_ID);
  ASSERT_TRUE(info.ok());
  bool listed = false;
  for (const auto& b : info->buffers) listed |= b.addr == src.addr() && b.length == src.size();
  EXPECT_TRUE(listed) << "a refused unregister must leave the buffer registered";
  EXPECT_TRUE(initiator_
                  ->TransferSync({{TransferRequest::WRITE, src.data(), LOCAL_SEGMENT_ID,
                                   local_.addr(), 4096}})
                  .ok());
  data_->SetRate(0);
  auto st = initiator_->WaitBatch(*id, milliseconds(20000));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->s, COMPLETED);
  EXPECT_TRUE(CheckPattern(remote_.data(), 24 * kMiB, 14, 0)) << "data corrupted";
  EXPECT_TRUE(initiator_->FreeBatchID(*id).ok());
  EXPECT_TRUE(initiator_->UnregisterLocalMemory(src.data()).ok());
}

}  // namespace
}  // namespace mc_failure
