// In-process tests of the engine API: two engines in one process talking over TCP loopback.
// Multi-process suites live in tests/.
#include "mooncake/transfer_engine.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <cstring>
#include <thread>
#include <vector>

namespace mooncake {
namespace {

using std::chrono::milliseconds;

EngineOptions FastOptions() {
  EngineOptions o;
  o.slice_timeout_ms = 3000;
  o.handshake_io_timeout_ms = 2000;
  o.handshake_connect_timeout_ms = 2000;
  return o;
}

class EnginePair : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(target_.Init("P2PHANDSHAKE", "127.0.0.1").ok());
    ASSERT_TRUE(initiator_.Init("P2PHANDSHAKE", "127.0.0.1").ok());
    remote_.assign(kSize, 0);
    local_.assign(kSize, 0);
    ASSERT_TRUE(target_.RegisterLocalMemory(remote_.data(), kSize).ok());
    ASSERT_TRUE(initiator_.RegisterLocalMemory(local_.data(), kSize).ok());
    auto seg = initiator_.OpenSegment(target_.GetLocalSegmentName());
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    seg_ = *seg;
  }
  uint64_t Remote(size_t off = 0) { return reinterpret_cast<uint64_t>(remote_.data()) + off; }

  static constexpr size_t kSize = 8 << 20;
  TransferEngine target_{FastOptions()};
  TransferEngine initiator_{FastOptions()};
  std::vector<uint8_t> remote_, local_;
  SegmentID seg_ = 0;
};

TEST_F(EnginePair, SegmentNameIsHostAndRpcPort) {
  EXPECT_EQ(target_.GetLocalSegmentName(), "127.0.0.1:" + std::to_string(target_.GetRpcPort()));
  EXPECT_GE(target_.GetRpcPort(), 15000);
  EXPECT_LE(target_.GetRpcPort(), 17000);
  EXPECT_NE(seg_, LOCAL_SEGMENT_ID);
  auto again = initiator_.OpenSegment("/" + target_.GetLocalSegmentName());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, seg_) << "a second open returns the cached id";
  auto own = initiator_.OpenSegment(initiator_.GetLocalSegmentName());
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(*own, LOCAL_SEGMENT_ID);
}

TEST_F(EnginePair, WriteThenReadBackOddSizes) {
  for (size_t len : {size_t{1}, size_t{7}, size_t{4096}, size_t{65537}, size_t{1234567},
                     size_t{kSize}}) {
    for (size_t i = 0; i < len; ++i) local_[i] = static_cast<uint8_t>(i * 31 + len);
    ASSERT_TRUE(initiator_
                    .TransferSync({{TransferRequest::WRITE, local_.data(), seg_, Remote(), len}})
                    .ok());
    ASSERT_EQ(0, std::memcmp(remote_.data(), local_.data(), len)) << len;
    std::vector<uint8_t> expect(local_.begin(), local_.begin() + len);
    std::memset(local_.data(), 0, len);
    ASSERT_TRUE(initiator_
                    .TransferSync({{TransferRequest::READ, local_.data(), seg_, Remote(), len}})
                    .ok());
    ASSERT_EQ(0, std::memcmp(expect.data(), local_.data(), len)) << len;
  }
}

TEST_F(EnginePair, BatchStatusAndBytes) {
  auto id = initiator_.AllocateBatchID(64);
  ASSERT_TRUE(id.ok());
  std::vector<TransferRequest> reqs;
  for (size_t i = 0; i < 64; ++i) {
    reqs.push_back({TransferRequest::WRITE, local_.data() + i * 1000, seg_, Remote(i * 1000), 1000});
  }
  ASSERT_TRUE(initiator_.SubmitTransfer(*id, reqs).ok());
  auto st = initiator_.WaitBatch(*id, milliseconds(5000));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->s, COMPLETED);
  EXPECT_EQ(st->transferred_bytes, 64000u);
  auto t = initiator_.GetTransferStatus(*id, 63);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->s, COMPLETED);
  EXPECT_EQ(t->transferred_bytes, 1000u);
  EXPECT_FALSE(initiator_.GetTransferStatus(*id, 64).ok()) << "task id out of range";
  // Capacity is the total over submits.
  EXPECT_EQ(initiator_.SubmitTransfer(*id, {reqs[0]}).code(), Status::Code::kResourceExhausted);
  EXPECT_TRUE(initiator_.FreeBatchID(*id).ok());
  EXPECT_EQ(initiator_.FreeBatchID(*id).code(), Status::Code::kNotFound) << "double free";
  EXPECT_FALSE(initiator_.GetBatchTransferStatus(*id).ok()) << "stale id";
  EXPECT_FALSE(initiator_.GetBatchTransferStatus(0xdeadbeef12345ull).ok()) << "garbage id";
}

TEST_F(EnginePair, BadRequestsAreRefusedAndNothingIsSubmitted) {
  auto id = initiator_.AllocateBatchID(8);
  ASSERT_TRUE(id.ok());
  std::vector<uint8_t> unregistered(64);
  struct Case {
    TransferRequest req;
    Status::Code code;
  } cases[] = {
      {{TransferRequest::WRITE, local_.data(), seg_, Remote(), 0}, Status::Code::kInvalidArgument},
      {{TransferRequest::WRITE, unregistered.data(), seg_, Remote(), 64},
       Status::Code::kInvalidArgument},
      {{TransferRequest::WRITE, local_.data(), seg_, Remote(kSize - 10), 64},
       Status::Code::kInvalidArgument},
      {{TransferRequest::WRITE, local_.data(), seg_, UINT64_MAX - 5, 64},
       Status::Code::kInvalidArgument},
      {{TransferRequest::WRITE, local_.data(), 999, Remote(), 64}, Status::Code::kNotFound},
  };
  for (const auto& c : cases) {
    // A good request first: it must not be submitted when a later one is bad.
    Status s = initiator_.SubmitTransfer(
        *id, {{TransferRequest::WRITE, local_.data(), seg_, Remote(), 8}, c.req});
    EXPECT_EQ(s.code(), c.code) << s.ToString();
    EXPECT_FALSE(s.message().empty());
  }
  auto st = initiator_.GetBatchTransferStatus(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->s, COMPLETED) << "an empty batch is complete";
  EXPECT_TRUE(initiator_.FreeBatchID(*id).ok());
}

TEST_F(EnginePair, TargetRejectsRangeItUnregistered) {
  // The initiator's cached descriptor still lists the buffer; the target no longer has it.
  std::vector<uint8_t> extra(1 << 20);
  ASSERT_TRUE(target_.RegisterLocalMemory(extra.data(), extra.size()).ok());
  ASSERT_TRUE(initiator_.RefreshSegment(seg_).ok());
  ASSERT_TRUE(target_.UnregisterLocalMemory(extra.data()).ok());
  auto id = initiator_.AllocateBatchID(3);
  ASSERT_TRUE(id.ok());
  uint64_t gone = reinterpret_cast<uint64_t>(extra.data());
  ASSERT_TRUE(initiator_
                  .SubmitTransfer(*id, {{TransferRequest::WRITE, local_.data(), seg_, Remote(), 100},
                                        {TransferRequest::WRITE, local_.data(), seg_, gone, 100},
                                        {TransferRequest::READ, local_.data(), seg_, Remote(), 100}})
                  .ok());
  auto st = initiator_.WaitBatch(*id, milliseconds(5000));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->s, FAILED);
  EXPECT_EQ(initiator_.GetTransferStatus(*id, 0)->s, COMPLETED);
  EXPECT_EQ(initiator_.GetTransferStatus(*id, 1)->s, FAILED);
  EXPECT_EQ(initiator_.GetTransferStatus(*id, 2)->s, COMPLETED) << "others keep being served";
  EXPECT_NE(initiator_.GetTransferError(*id, 1)->find("rejected"), std::string::npos);
  EXPECT_TRUE(initiator_.FreeBatchID(*id).ok());
}

TEST_F(EnginePair, RefreshFindsNewlyRegisteredMemory) {
  std::vector<uint8_t> later(4096, 0);
  ASSERT_TRUE(target_.RegisterLocalMemory(later.data(), later.size()).ok());
  std::memset(local_.data(), 0xAB, 4096);
  Status s = initiator_.TransferSync({{TransferRequest::WRITE, local_.data(), seg_,
                                       reinterpret_cast<uint64_t>(later.data()), 4096}});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(later[4095], 0xAB);
  ASSERT_TRUE(target_.UnregisterLocalMemory(later.data()).ok());
}

TEST_F(EnginePair, ConcurrentSubmittersFromEightThreads) {
  constexpr int kThreads = 8;
  constexpr size_t kChunk = kSize / kThreads;
  for (size_t i = 0; i < kSize; ++i) local_[i] = static_cast<uint8_t>(i * 7 + 3);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 4; ++rep) {
        std::vector<TransferRequest> reqs;
        for (size_t off = 0; off < kChunk; off += 16384) {
          size_t at = t * kChunk + off;
          reqs.push_back({TransferRequest::WRITE, local_.data() + at, seg_, Remote(at), 16384});
        }
        if (!initiator_.TransferSync(reqs).ok()) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(0, std::memcmp(remote_.data(), local_.data(), kSize));
}

TEST_F(EnginePair, NotifyRoundTrip) {
  ASSERT_TRUE(initiator_.SendNotify(seg_, {"initiator", "hello"}).ok());
  auto got = target_.GetNotifies();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].name, "initiator");
  EXPECT_EQ(got[0].notify_msg, "hello");
  EXPECT_TRUE(target_.GetNotifies().empty()) << "drained";

  auto id = initiator_.AllocateBatchID(1);
  ASSERT_TRUE(initiator_
                  .SubmitTransferWithNotify(
                      *id, {{TransferRequest::WRITE, local_.data(), seg_, Remote(), 64}},
                      {"initiator", "done"})
                  .ok());
  auto st = initiator_.WaitBatch(*id, milliseconds(5000));
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->s, COMPLETED);
  auto after = target_.GetNotifies();
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].notify_msg, "done");
  EXPECT_TRUE(initiator_.FreeBatchID(*id).ok());
  EXPECT_TRUE(initiator_.Probe(target_.GetLocalSegmentName()).ok());
}

// A receiver that does not drain its notifies is bounded by bytes, not only by count: 1 MiB
// notifies are refused once 64 MiB are queued (before, 65,536 of them were accepted), and
// draining makes room again.
TEST_F(EnginePair, NotifyQueueIsBoundedByBytes) {
  const std::string big(1000 * 1000, 'n');
  int accepted = 0;
  Status refused;
  for (int i = 0; i < 100 && refused.ok(); ++i) {
    refused = initiator_.SendNotify(seg_, {"initiator", big});
    if (refused.ok()) ++accepted;
  }
  EXPECT_FALSE(refused.ok()) << "100 MB of notifies were all queued";
  EXPECT_GE(accepted, 60);
  EXPECT_LE(static_cast<size_t>(accepted) * big.size(), 64u << 20);
  auto got = target_.GetNotifies();
  EXPECT_EQ(got.size(), static_cast<size_t>(accepted));
  EXPECT_TRUE(initiator_.SendNotify(seg_, {"initiator", big}).ok()) << "drained: room again";
  EXPECT_EQ(target_.GetNotifies().size(), 1u);
}

TEST_F(EnginePair, RequestsInOneRegionShareItsPinAndAllReleaseIt) {
  // Consecutive requests in one registered region take one pin of it between them; a batch
  // refused part way and a batch that ends must both leave every region unpinned.
  std::vector<uint8_t> a(1 << 16, 0xA1), b(1 << 16, 0xB2), unregistered(64);
  ASSERT_TRUE(initiator_.RegisterLocalMemory(a.data(), a.size()).ok());
  ASSERT_TRUE(initiator_.RegisterLocalMemory(b.data(), b.size()).ok());
  auto req = [&](std::vector<uint8_t>& from, size_t i) {
    return TransferRequest{TransferRequest::WRITE, from.data() + 4096 * i, seg_,
                           Remote(4096 * i), 4096};
  };
  auto id = initiator_.AllocateBatchID(8);
  ASSERT_TRUE(id.ok());
  Status refused = initiator_.SubmitTransfer(
      *id, {req(a, 0), req(a, 1), req(b, 2),
            {TransferRequest::WRITE, unregistered.data(), seg_, Remote(), 64}});
  EXPECT_EQ(refused.code(), Status::Code::kInvalidArgument) << refused.ToString();
  ASSERT_TRUE(initiator_.SubmitTransfer(*id, {req(a, 0), req(a, 1), req(b, 2), req(a, 3),
                                              req(a, 4), req(a, 5)})
                  .ok());
  auto st = initiator_.WaitBatch(*id, milliseconds(5000));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->s, COMPLETED);
  ASSERT_TRUE(initiator_.FreeBatchID(*id).ok());
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(remote_[4096 * i + 7], i == 2 ? 0xB2 : 0xA1) << i;
  Status ua = initiator_.UnregisterLocalMemory(a.data());
  Status ub = initiator_.UnregisterLocalMemory(b.data());
  EXPECT_TRUE(ua.ok()) << "a pin of region a was left: " << ua.ToString();
  EXPECT_TRUE(ub.ok()) << "a pin of region b was left: " << ub.ToString();
}

TEST_F(EnginePair, ARangeJustPastTheRunsRegionIsNotTakenForIt) {
  // Request 0 pins the first half of `two`; request 1 starts in the unregistered second half,
  // above the region's end: it is refused, not counted in request 0's run.
  std::vector<uint8_t> two(2 << 20, 0x11);
  ASSERT_TRUE(initiator_.RegisterLocalMemory(two.data(), 1 << 20).ok());
  auto id = initiator_.AllocateBatchID(2);
  ASSERT_TRUE(id.ok());
  for (size_t past : {size_t{1} << 20, (size_t{1} << 20) + 4096, (size_t{2} << 20) - 64}) {
    Status s = initiator_.SubmitTransfer(
        *id, {{TransferRequest::WRITE, two.data(), seg_, Remote(), 64},
              {TransferRequest::WRITE, two.data() + past, seg_, Remote(4096), 64}});
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << past << ": " << s.ToString();
  }
  ASSERT_TRUE(initiator_.FreeBatchID(*id).ok());
  EXPECT_TRUE(initiator_.UnregisterLocalMemory(two.data()).ok()) << "no pin left";
}

TEST_F(EnginePair, LocalSegmentIsAMemcpy) {
  std::vector<uint8_t> other(4096, 0);
  ASSERT_TRUE(initiator_.RegisterLocalMemory(other.data(), other.size()).ok());
  std::memset(local_.data(), 0x5A, 4096);
  ASSERT_TRUE(initiator_
                  .TransferSync({{TransferRequest::WRITE, local_.data(), LOCAL_SEGMENT_ID,
                                  reinterpret_cast<uint64_t>(other.data()), 4096}})
                  .ok());
  EXPECT_EQ(other[0], 0x5A);
  EXPECT_EQ(other[4095], 0x5A);
  ASSERT_TRUE(initiator_.UnregisterLocalMemory(other.data()).ok());
}

TEST(Engine, UnreachablePeerFailsFast) {
  TransferEngine e(FastOptions());
  ASSERT_TRUE(e.Init("P2PHANDSHAKE", "127.0.0.1").ok());
  auto start = std::chrono::steady_clock::now();
  auto seg = e.OpenSegment("127.0.0.1:1");  // nothing listens on port 1
  EXPECT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), Status::Code::kUnavailable) << seg.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_EQ(e.OpenSegment("").status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(e.OpenSegment("127.0.0.1").status().code(), Status::Code::kInvalidArgument);
}

TEST(Engine, RegistrationErrors) {
  TransferEngine e(FastOptions());
  ASSERT_TRUE(e.Init("P2PHANDSHAKE", "127.0.0.1").ok());
  std::vector<uint8_t> buf(1 << 16);
  EXPECT_EQ(e.RegisterLocalMemory(buf.data(), 0).code(), Status::Code::kInvalidArgument);
  ASSERT_TRUE(e.RegisterLocalMemory(buf.data(), 4096).ok());
  EXPECT_EQ(e.RegisterLocalMemory(buf.data() + 100, 10).code(), Status::Code::kAlreadyExists);
  EXPECT_EQ(e.UnregisterLocalMemory(buf.data() + 1).code(), Status::Code::kNotFound);
  EXPECT_TRUE(e.UnregisterLocalMemory(buf.data()).ok());
  EXPECT_EQ(e.UnregisterLocalMemory(buf.data()).code(), Status::Code::kNotFound);
  EXPECT_TRUE(e.RegisterLocalMemoryBatch({{buf.data(), 100}, {buf.data() + 100, 100}}).ok());
  EXPECT_TRUE(e.UnregisterLocalMemoryBatch({buf.data(), buf.data() + 100}).ok());
  EXPECT_EQ(e.RegisterLocalMemoryBatch({{buf.data(), 100}, {buf.data() + 50, 100}}).code(),
            Status::Code::kAlreadyExists);
}

TEST(Engine, InitErrors) {
  TransferEngine e(FastOptions());
  // Nothing listens on port 1: the store is unreachable, and the message names it.
  Status store = e.Init("etcd://127.0.0.1:1", "127.0.0.1");
  if (store.code() == Status::Code::kUnimplemented) {  // built with -DUSE_ETCD=OFF
    EXPECT_NE(store.message().find("USE_ETCD"), std::string::npos) << store.ToString();
  } else {
    EXPECT_EQ(store.code(), Status::Code::kUnavailable) << store.ToString();
    EXPECT_NE(store.message().find("etcd://127.0.0.1:1"), std::string::npos) << store.ToString();
  }
  EXPECT_EQ(e.Init("zookeeper://127.0.0.1:1", "127.0.0.1").code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(e.Init("P2PHANDSHAKE", "127.0.0.1", "nvlink").code(), Status::Code::kUnimplemented);
  {
    // Upstream's "rdma": every transport starts (ucx takes peers over RDMA lanes where UCX
    // has them); without RDMA it still initializes, over shm and tcp, with one warning.
    TransferEngine rdma(FastOptions());
    Status s = rdma.Init("P2PHANDSHAKE", "127.0.0.1", "rdma");
    EXPECT_TRUE(s.ok()) << s.ToString();
    auto names = rdma.GetTransports();
    EXPECT_NE(std::find(names.begin(), names.end(), "tcp"), names.end());
  }
  EXPECT_EQ(e.Init("P2PHANDSHAKE", ":80").code(), Status::Code::kInvalidArgument);
  EXPECT_FALSE(e.initialized());
  EXPECT_TRUE(e.Init("P2PHANDSHAKE", "127.0.0.1:16001").ok()) << "usable after failed inits";
  EXPECT_EQ(e.Init("P2PHANDSHAKE", "127.0.0.1").code(), Status::Code::kFailedPrecondition);
}

// The seeds' flow: an initiator opens the target's segment the moment the target logs
// "listening on". Memory the target registered before Init is in that first descriptor.
TEST(Engine, MemoryRegisteredBeforeInitIsInTheFirstDescriptor) {
  std::vector<uint8_t> remote(1 << 20, 0), local(1 << 20, 0x5A);
  TransferEngine target(FastOptions()), initiator(FastOptions());
  ASSERT_TRUE(target.RegisterLocalMemory(remote.data(), remote.size(), "cpu:0").ok());
  // A failed Init keeps the registration.
  ASSERT_FALSE(target.Init("P2PHANDSHAKE", ":80").ok());
  ASSERT_TRUE(target.Init("P2PHANDSHAKE", "127.0.0.1").ok());
  ASSERT_TRUE(initiator.Init("P2PHANDSHAKE", "127.0.0.1").ok());
  ASSERT_TRUE(initiator.RegisterLocalMemory(local.data(), local.size()).ok());
  auto seg = initiator.OpenSegment(target.GetLocalSegmentName());
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  auto info = initiator.GetSegmentInfo(*seg);
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->buffers.size(), 1u);
  EXPECT_EQ(info->buffers[0].addr, reinterpret_cast<uint64_t>(remote.data()));
  Status s = initiator.TransferSync(
      {{TransferRequest::WRITE, local.data(), *seg, info->buffers[0].addr, local.size()}});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(remote, local);
}

}  // namespace
}  // namespace mooncake
