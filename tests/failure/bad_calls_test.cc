// Bad calls, in one process (a target engine offering tcp and shm, an initiator installing the
// transport under test): each gives a specific Status code and a non-empty message, none
// crashes, and afterwards the engine still moves bytes correctly.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "engine_util.h"
#include "failure_util.h"
#include "transport_param.h"
#include "pattern.h"

namespace mc_failure {
namespace {

using namespace mooncake;
using Code = Status::Code;
using std::chrono::milliseconds;

constexpr size_t kSize = 8 << 20;

EngineOptions Options() {
  EngineOptions o;
  o.slice_timeout_ms = 2000;
  o.handshake_connect_timeout_ms = 2000;
  o.handshake_io_timeout_ms = 2000;
  o.tcp_connect_timeout_ms = 2000;
  return o;
}

#define EXPECT_CODE(expr, want, substring)                                         \
  do {                                                                             \
    Status _s = (expr);                                                            \
    EXPECT_EQ(_s.code(), (want)) << #expr << " -> " << _s.ToString();              \
    EXPECT_FALSE(_s.message().empty()) << #expr;                                   \
    EXPECT_NE(_s.message().find(substring), std::string::npos)                     \
        << #expr << " -> " << _s.ToString() << " (expected to mention '" << substring \
        << "')";                                                                   \
  } while (0)

class BadCalls : public TransportTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(target_.Init("P2PHANDSHAKE", "127.0.0.1").ok());
    ASSERT_TRUE(initiator_.Init("P2PHANDSHAKE", "127.0.0.1", transport()).ok());
    ASSERT_TRUE(remote_.data() && local_.data());
    ASSERT_TRUE(target_.RegisterLocalMemory(remote_.data(), kSize).ok());
    ASSERT_TRUE(initiator_.RegisterLocalMemory(local_.data(), kSize).ok());
    auto seg = initiator_.OpenSegment(target_.GetLocalSegmentName());
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    seg_ = *seg;
    auto info = initiator_.GetSegmentInfo(seg_);
    ASSERT_TRUE(info.ok());
    ASSERT_EQ(info->transport, transport());
  }

  Status SubmitOne(const TransferRequest& r) {
    auto id = initiator_.AllocateBatchID(4);
    if (!id.ok()) return id.status();
    Status s = initiator_.SubmitTransfer(*id, {r});
    auto st = initiator_.WaitBatch(*id, milliseconds(10000));
    EXPECT_TRUE(st.ok());
    EXPECT_TRUE(initiator_.FreeBatchID(*id).ok());
    return s;
  }
  TransferRequest Write(void* src, uint64_t dst, size_t len) {
    return {TransferRequest::WRITE, src, seg_, dst, len};
  }
  // A valid round trip, verified: the engine is still sound.
  void ExpectHealthy(uint64_t seed) {
    FillPattern(local_.data(), 1 << 20, seed, 0);
    ASSERT_TRUE(initiator_.TransferSync({Write(local_.data(), remote_.addr(4096), 1 << 20)}).ok());
    EXPECT_TRUE(CheckPattern(remote_.data() + 4096, 1 << 20, seed, 0));
    ASSERT_TRUE(initiator_
                    .TransferSync({{TransferRequest::READ, local_.data() + (2 << 20), seg_,
                                    remote_.addr(4096), 1 << 20}})
                    .ok());
    EXPECT_TRUE(CheckPattern(local_.data() + (2 << 20), 1 << 20, seed, 0));
  }

  Buffer remote_{kSize}, local_{kSize};  // outlive the engines
  TransferEngine target_{Options()};
  TransferEngine initiator_{Options()};
  SegmentID seg_ = 0;
};

TEST_P(BadCalls, UnregisteredLocalAddress) {
  std::vector<uint8_t> elsewhere(4096);
  EXPECT_CODE(SubmitOne(Write(elsewhere.data(), remote_.addr(), 4096)), Code::kInvalidArgument,
              "not inside registered memory");
  // Straddling the end of the registered buffer.
  EXPECT_CODE(SubmitOne(Write(local_.data() + kSize - 100, remote_.addr(), 4096)),
              Code::kInvalidArgument, "not inside registered memory");
  EXPECT_CODE(initiator_.TransferSync({Write(elsewhere.data(), remote_.addr(), 4096)}),
              Code::kInvalidArgument, "register it first");
  ExpectHealthy(1);
}

TEST_P(BadCalls, RemoteRangeOutsideRegisteredMemory) {
  EXPECT_CODE(SubmitOne(Write(local_.data(), remote_.addr(kSize - 100), 4096)),
              Code::kInvalidArgument, "not inside any buffer registered");
  EXPECT_CODE(SubmitOne(Write(local_.data(), remote_.addr(kSize), 1)), Code::kInvalidArgument,
              "not inside any buffer registered");
  EXPECT_CODE(SubmitOne(Write(local_.data(), 4096, 4096)), Code::kInvalidArgument,
              "not inside any buffer registered");
  EXPECT_CODE(SubmitOne({TransferRequest::READ, local_.data(), seg_, remote_.addr() - 1, 2}),
              Code::kInvalidArgument, "not inside any buffer registered");
  ExpectHealthy(2);
}

TEST_P(BadCalls, ZeroLength) {
  EXPECT_CODE(SubmitOne(Write(local_.data(), remote_.addr(), 0)), Code::kInvalidArgument,
              "length is 0");
  EXPECT_CODE(initiator_.TransferSync({Write(local_.data(), remote_.addr(), 0)}),
              Code::kInvalidArgument, "length is 0");
  ExpectHealthy(3);
}

TEST_P(BadCalls, AddressPlusLengthOverflows) {
  // Local side: the range wraps past 2^64.
  EXPECT_CODE(SubmitOne(Write(reinterpret_cast<void*>(UINT64_MAX - 100), remote_.addr(), 4096)),
              Code::kInvalidArgument, "wraps");
  EXPECT_CODE(SubmitOne(Write(local_.data(), remote_.addr(), SIZE_MAX)), Code::kInvalidArgument,
              "wraps");
  EXPECT_CODE(SubmitOne(Write(local_.data() + 4096, remote_.addr(), SIZE_MAX - 4000)),
              Code::kInvalidArgument, "wraps");
  // Remote side.
  EXPECT_CODE(SubmitOne(Write(local_.data(), UINT64_MAX - 100, 4096)), Code::kInvalidArgument,
              "wraps");
  EXPECT_CODE(SubmitOne(Write(local_.data(), remote_.addr(), UINT64_MAX)), Code::kInvalidArgument,
              "wraps");
  // Local segment (loopback copy): both checks apply too.
  EXPECT_CODE(SubmitOne({TransferRequest::WRITE, local_.data(), LOCAL_SEGMENT_ID, UINT64_MAX - 10,
                         4096}),
              Code::kInvalidArgument, "wraps");
  ExpectHealthy(4);
}

TEST_P(BadCalls, UnknownSegmentId) {
  for (SegmentID bad : {SegmentID{12345}, INVALID_SEGMENT_ID, seg_ + 1}) {
    EXPECT_CODE(SubmitOne({TransferRequest::WRITE, local_.data(), bad, remote_.addr(), 4096}),
                Code::kNotFound, "segment id");
    EXPECT_EQ(initiator_.GetSegmentInfo(bad).status().code(), Code::kNotFound);
    EXPECT_CODE(initiator_.CloseSegment(bad), Code::kNotFound, "segment id");
    EXPECT_CODE(initiator_.RefreshSegment(bad), Code::kNotFound, "segment id");
  }
  auto missing = initiator_.OpenSegment("127.0.0.1:1");  // nobody listens on port 1
  EXPECT_EQ(missing.status().code(), Code::kUnavailable) << missing.status().ToString();
  EXPECT_FALSE(missing.status().message().empty());
  EXPECT_EQ(initiator_.OpenSegment("").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(initiator_.OpenSegment("///").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(initiator_.OpenSegment("127.0.0.1").status().code(), Code::kInvalidArgument)
      << "a P2P segment name needs a port";
  ExpectHealthy(5);
}

TEST_P(BadCalls, InvalidOpcode) {
  TransferRequest r = Write(local_.data(), remote_.addr(), 4096);
  r.opcode = static_cast<TransferRequest::OpCode>(7);
  EXPECT_CODE(SubmitOne(r), Code::kInvalidArgument, "opcode");
  ExpectHealthy(6);
}

TEST_P(BadCalls, StaleAndGarbageBatchIds) {
  auto id = initiator_.AllocateBatchID(8);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(initiator_.FreeBatchID(*id).ok());
  const BatchID stale = *id;
  auto check_all = [&](BatchID b, Code want) {
    SCOPED_TRACE("batch id " + std::to_string(b));
    EXPECT_EQ(initiator_.SubmitTransfer(b, {Write(local_.data(), remote_.addr(), 4096)}).code(),
              want);
    EXPECT_EQ(initiator_.GetTransferStatus(b, 0).status().code(), want);
    EXPECT_EQ(initiator_.GetBatchTransferStatus(b).status().code(), want);
    EXPECT_EQ(initiator_.WaitBatch(b, milliseconds(10)).status().code(), want);
    EXPECT_EQ(initiator_.GetTransferError(b, 0).status().code(), want);
    Status f = initiator_.FreeBatchID(b);
    EXPECT_EQ(f.code(), want);
    EXPECT_FALSE(f.message().empty());
  };
  check_all(stale, Code::kNotFound);
  // The slot is reused by the next allocation: the stale id still does not reach it.
  auto fresh = initiator_.AllocateBatchID(8);
  ASSERT_TRUE(fresh.ok());
  check_all(stale, Code::kNotFound);
  EXPECT_NE(*fresh, stale);
  for (BatchID garbage : {BatchID{0}, INVALID_BATCH_ID, BatchID{0xdeadbeef12345678ULL},
                          BatchID{(1ULL << 32) | 999999}}) {
    check_all(garbage, Code::kInvalidArgument);
  }
  // A garbage id that hits a live slot with the wrong generation.
  check_all((*fresh & 0xffffffffULL) | (0xabcdULL << 32), Code::kNotFound);
  // The fresh batch was not disturbed by any of that.
  FillPattern(local_.data(), 4096, 8, 0);
  ASSERT_TRUE(initiator_.SubmitTransfer(*fresh, {Write(local_.data(), remote_.addr(), 4096)}).ok());
  auto st = initiator_.WaitBatch(*fresh, milliseconds(10000));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->s, COMPLETED);
  EXPECT_TRUE(CheckPattern(remote_.data(), 4096, 8, 0));
  EXPECT_TRUE(initiator_.FreeBatchID(*fresh).ok());
  EXPECT_CODE(initiator_.GetTransferStatus(*fresh, 0).status(), Code::kNotFound, "freed");
}

TEST_P(BadCalls, DoubleFree) {
  auto id = initiator_.AllocateBatchID(1);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(initiator_.FreeBatchID(*id).ok());
  EXPECT_CODE(initiator_.FreeBatchID(*id), Code::kNotFound, "already freed");
  EXPECT_CODE(initiator_.FreeBatchID(*id), Code::kNotFound, "already freed");
  ExpectHealthy(7);
}

TEST_P(BadCalls, BatchSizeLimitsAndTaskIds) {
  EXPECT_CODE(initiator_.AllocateBatchID(0).status(), Code::kInvalidArgument, "batch size");
  EXPECT_CODE(initiator_.AllocateBatchID((1 << 20) + 1).status(), Code::kInvalidArgument,
              "batch size");
  auto id = initiator_.AllocateBatchID(2);
  ASSERT_TRUE(id.ok());
  TransferRequest r = Write(local_.data(), remote_.addr(), 4096);
  EXPECT_CODE(initiator_.SubmitTransfer(*id, {r, r, r}), Code::kResourceExhausted, "holds 2");
  ASSERT_TRUE(initiator_.SubmitTransfer(*id, {r}).ok());
  EXPECT_CODE(initiator_.SubmitTransfer(*id, {r, r}), Code::kResourceExhausted, "holds 2");
  ASSERT_TRUE(initiator_.WaitBatch(*id, milliseconds(10000)).ok());
  EXPECT_CODE(initiator_.GetTransferStatus(*id, 1).status(), Code::kInvalidArgument,
              "does not exist");
  EXPECT_EQ(initiator_.GetTransferError(*id, 5).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(initiator_.FreeBatchID(*id).ok());
}

// One bad request in a submit: nothing of it is submitted, and the error names the request.
TEST_P(BadCalls, OneBadRequestRejectsTheWholeSubmit) {
  auto id = initiator_.AllocateBatchID(3);
  ASSERT_TRUE(id.ok());
  std::memset(remote_.data(), 0, 8192);
  FillPattern(local_.data(), 8192, 9, 0);
  Status s = initiator_.SubmitTransfer(
      *id, {Write(local_.data(), remote_.addr(), 4096), Write(local_.data(), remote_.addr(kSize), 16),
            Write(local_.data() + 4096, remote_.addr(4096), 4096)});
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("request 1"), std::string::npos) << s.ToString();
  auto st = initiator_.GetBatchTransferStatus(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->transferred_bytes, 0u);
  EXPECT_EQ(initiator_.GetTransferStatus(*id, 0).status().code(), Code::kInvalidArgument)
      << "no task was created";
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_TRUE(std::all_of(remote_.data(), remote_.data() + 8192, [](uint8_t b) { return b == 0; }))
      << "a rejected submit moved bytes";
  // The batch is still usable, with its full capacity.
  ASSERT_TRUE(initiator_
                  .SubmitTransfer(*id, {Write(local_.data(), remote_.addr(), 4096),
                                        Write(local_.data() + 4096, remote_.addr(4096), 4096),
                                        Write(local_.data(), remote_.addr(8192), 1)})
                  .ok());
  st = initiator_.WaitBatch(*id, milliseconds(10000));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->s, COMPLETED);
  EXPECT_TRUE(CheckPattern(remote_.data(), 8192, 9, 0));
  EXPECT_TRUE(initiator_.FreeBatchID(*id).ok());
}

TEST_P(BadCalls, OverlappingRegistration) {
  Buffer extra(1 << 20);
  ASSERT_TRUE(extra.data());
  uint8_t* base = extra.data();
  ASSERT_TRUE(initiator_.RegisterLocalMemory(base + 4096, 65536).ok());
  struct Case {
    uint8_t* addr;
    size_t len;
    const char* what;
  } cases[] = {
      {base + 4096, 65536, "identical"},
      {base, 8192, "overlapping the start"},
      {base + 65536, 8192, "overlapping the end"},
      {base + 8192, 4096, "inside"},
      {base, 1 << 20, "containing"},
      {local_.data() + 100, 10, "inside another registration"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_CODE(initiator_.RegisterLocalMemory(c.addr, c.len), Code::kAlreadyExists, "overlaps");
  }
  // A batch is all or nothing: one overlapping entry rejects the others too.
  EXPECT_EQ(initiator_
                .RegisterLocalMemoryBatch({{base + 200000, 4096}, {base + 8192, 16}})
                .code(),
            Code::kAlreadyExists);
  EXPECT_EQ(initiator_
                .RegisterLocalMemoryBatch({{base + 300000, 8192}, {base + 304096, 16}})
                .code(),
            Code::kAlreadyExists)
      << "entries overlapping each other";
  auto info = initiator_.GetSegmentInfo(LOCAL_SEGMENT_ID);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->buffers.size(), 2u) << "a failed registration left something registered";
  EXPECT_TRUE(initiator_.RegisterLocalMemory(base + 200000, 4096).ok())
      << "the batch's good entry was left registered";
  // Invalid ranges.
  EXPECT_CODE(initiator_.RegisterLocalMemory(nullptr, 4096), Code::kInvalidArgument, "null");
  EXPECT_CODE(initiator_.RegisterLocalMemory(base, 0), Code::kInvalidArgument, "length is 0");
  EXPECT_CODE(initiator_.RegisterLocalMemory(reinterpret_cast<void*>(UINT64_MAX - 10), 4096),
              Code::kInvalidArgument, "wraps");
  // Unregistering what is not the start of a registered buffer.
  EXPECT_CODE(initiator_.UnregisterLocalMemory(base), Code::kNotFound, "not the start");
  EXPECT_CODE(initiator_.UnregisterLocalMemory(base + 8192), Code::kNotFound, "not the start");
  EXPECT_TRUE(initiator_.UnregisterLocalMemory(base + 4096).ok());
  EXPECT_CODE(initiator_.UnregisterLocalMemory(base + 4096), Code::kNotFound, "not the start");
  EXPECT_TRUE(initiator_.UnregisterLocalMemory(base + 200000).ok());
  ExpectHealthy(10);
}

TEST_P(BadCalls, CallsBeforeInit) {
  TransferEngine fresh(Options());
  EXPECT_EQ(fresh.OpenSegment(target_.GetLocalSegmentName()).status().code(),
            Code::kFailedPrecondition);
  auto id = fresh.AllocateBatchID(1);
  ASSERT_TRUE(id.ok());
  EXPECT_CODE(fresh.SubmitTransfer(*id, {Write(local_.data(), remote_.addr(), 1)}),
              Code::kFailedPrecondition, "Init");
  EXPECT_TRUE(fresh.FreeBatchID(*id).ok());
  ExpectHealthy(11);
}

// BUG (src/engine/transfer_engine.cc, TransferEngine::Init): a second Init on a running engine
// is refused (FailedPrecondition, engine_impl.cc), but the wrapper treats every failed Init as
// a failed first Init: it Shutdown()s the running Impl and replaces it with a fresh,
// uninitialized one. The engine silently loses its servers, registrations, segments and
// batches; every later call fails ("call Init first"), and peers can no longer reach it.
TEST_P(BadCalls, SecondInitIsRefusedAndLeavesTheEngineWorking) {
  const std::string name = initiator_.GetLocalSegmentName();
  Status again = initiator_.Init("P2PHANDSHAKE", "127.0.0.1", transport());
  EXPECT_EQ(again.code(), Code::kFailedPrecondition) << again.ToString();
  EXPECT_FALSE(again.message().empty());
  EXPECT_TRUE(initiator_.initialized()) << "a refused second Init tore the engine down";
  EXPECT_EQ(initiator_.GetLocalSegmentName(), name);
  auto info = initiator_.GetSegmentInfo(LOCAL_SEGMENT_ID);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->buffers.size(), 1u) << "registrations lost";
  ExpectHealthy(12);
  // Peers still reach it.
  EXPECT_TRUE(target_.Probe(name).ok());
}

// Unregistering the initiator's buffer while requests read from it: the call waits for them
// (bounded by slice_timeout + 1 s); here they finish in time, so it succeeds, after which no
// request is still running and nothing can use the range.
TEST_P(BadCalls, UnregisterWhileRequestsUseTheMemory) {
  Buffer src(32 << 20);
  ASSERT_TRUE(src.data());
  FillPattern(src.data(), src.size(), 12, 0);
  ASSERT_TRUE(initiator_.RegisterLocalMemory(src.data(), src.size()).ok());
  Buffer dst(32 << 20);
  ASSERT_TRUE(target_.RegisterLocalMemory(dst.data(), dst.size()).ok());
  auto id = initiator_.AllocateBatchID(256);
  ASSERT_TRUE(id.ok());
  std::vector<TransferRequest> reqs;
  for (int rep = 0; rep < 8; ++rep) {
    for (size_t off = 0; off < src.size(); off += 1 << 20) {
      reqs.push_back({TransferRequest::WRITE, src.data() + off, seg_, dst.addr(off), 1 << 20});
    }
  }
  ASSERT_TRUE(initiator_.SubmitTransfer(*id, reqs).ok());
  auto t = Clock::now();
  Status u = initiator_.UnregisterLocalMemory(src.data());
  double took = SecondsSince(t);
  auto st = initiator_.GetBatchTransferStatus(*id);
  ASSERT_TRUE(st.ok());
  Outcome out;
  Count(initiator_, *id, reqs.size(), &out);
  std::printf("[unregister in use %s] %s after %.0f ms; requests then: %s\n", GetParam().c_str(),
              u.ToString().c_str(), took * 1000, out.ToString().c_str());
  if (u.ok()) {
    EXPECT_EQ(out.waiting, 0u) << "Unregister returned OK while requests still used the memory";
    EXPECT_CODE(SubmitOne(Write(src.data(), dst.addr(), 4096)), Code::kInvalidArgument,
                "not inside registered memory");
  } else {
    EXPECT_EQ(u.code(), Code::kFailedPrecondition) << u.ToString();
    EXPECT_FALSE(u.message().empty());
  }
  ASSERT_TRUE(initiator_.WaitBatch(*id, milliseconds(10000)).ok());
  Count(initiator_, *id, reqs.size(), &(out = Outcome{}));
  EXPECT_EQ(out.completed, reqs.size()) << out.ToString() << ": " << out.first_error;
  EXPECT_TRUE(CheckPattern(dst.data(), dst.size(), 12, 0)) << "data corrupted";
  EXPECT_TRUE(initiator_.FreeBatchID(*id).ok());
  if (!u.ok()) {
    EXPECT_TRUE(initiator_.UnregisterLocalMemory(src.data()).ok());
  }
  EXPECT_TRUE(target_.UnregisterLocalMemory(dst.data()).ok());
  ExpectHealthy(13);
}

INSTANTIATE_TEST_SUITE_P(Transports, BadCalls, ::testing::ValuesIn(WithUcx({"tcp", "shm"}, {"ucx_tcp"})),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace mc_failure
