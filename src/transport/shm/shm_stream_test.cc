// Small same-host requests run on the submitting thread (ShmStream::TryInline): sent there,
// the reply looked for awake for MC_SHM_SPIN_US and completed there, or left to the stream's
// thread when it is late. Two ShmTransports in one process; the target copies into its plain
// memory (not lent), from initiator memory it maps (a sealed memfd) or through
// process_vm_readv/writev. Every byte is checked, with one submitter and with several
// racing over the same streams, with replies in time and with nearly every one late.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "engine/memory_registry.h"
#include "engine/transfer_race_test_util.h"
#include "transport/shm/shm_transport.h"

namespace mooncake::shm {
namespace {

constexpr size_t kBytes = 8 << 20;

struct Side {
  MemoryRegistry registry;
  ShmTransport transport;
  SegmentDesc desc;
};

// A target whose plain memory (registered for remote access) the initiator writes and reads.
// `shared_local`: the initiator's memory is a sealed memfd the target maps and memcpys;
// otherwise the target uses process_vm_readv/writev.
class ShmInline : public ::testing::TestWithParam<bool> {
 protected:
  void Start(int spin_us) {
    const bool shared = GetParam();
    if (shared) {
      memfd_ = ::memfd_create("shm-inline-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      ASSERT_GE(memfd_, 0);
      ASSERT_EQ(::ftruncate(memfd_, kBytes), 0);
      ASSERT_EQ(::fcntl(memfd_, F_ADD_SEALS, F_SEAL_SHRINK), 0);
      void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd_, 0);
      ASSERT_NE(p, MAP_FAILED);
      local_ = static_cast<uint8_t*>(p);
    } else {
      plain_local_.resize(kBytes);
      local_ = plain_local_.data();
    }
    for (Side* s : {&initiator_, &target_}) {
      TransportContext ctx;
      ctx.options.slice_timeout_ms = 5000;
      ctx.options.shm_spin_us = spin_us;
      ctx.registry = &s->registry;
      s->desc.name = s == &initiator_ ? "initiator" : "target";
      Status st = s->transport.Start(ctx, &s->desc);
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    RegionInfo mine{reinterpret_cast<uint64_t>(local_), kBytes, "cpu:0", true,
                    shared ? memfd_ : -1};
    ASSERT_TRUE(initiator_.registry.AddBatch({mine}).ok());
    ASSERT_TRUE(target_.registry.Add(reinterpret_cast<uint64_t>(remote_.data()), kBytes,
                                     "cpu:0", true).ok());
    peer_ = std::make_shared<const SegmentDesc>(target_.desc);
    ASSERT_TRUE(initiator_.transport.CanReach(*peer_));
  }
  void TearDown() override {
    initiator_.transport.Stop();
    target_.transport.Stop();
    if (memfd_ >= 0) {
      ::munmap(local_, kBytes);
      ::close(memfd_);
    }
  }
  bool Batch(TransferRequest::OpCode op, size_t off, size_t len, size_t count,
             std::string* why) {
    return testing_util::SubmitAndWait(initiator_.transport, peer_, op, local_, remote_.data(),
                                       off, len, count, why);
  }
  void Fill(size_t off, size_t n, uint32_t seed) { testing_util::FillPattern(local_, off, n, seed); }
  static bool Matches(const uint8_t* p, size_t off, size_t n, uint32_t seed) {
    return testing_util::HasPattern(p, off, n, seed);
  }
  // Several threads write and read back their own areas over the same two streams.
  void Race(int spin_us);

  int memfd_ = -1;
  std::vector<uint8_t> plain_local_;
  uint8_t* local_ = nullptr;
  std::vector<uint8_t> remote_ = std::vector<uint8_t>(kBytes);
  Side initiator_, target_;
  std::shared_ptr<const SegmentDesc> peer_;
};

TEST_P(ShmInline, SmallBatchesRunOnTheSubmittingThreadByteExact) {
  Start(/*spin_us=*/10000);  // a reply in time under a sanitizer or a loaded machine
  std::string why;
  // Connects, and maps every page once (a target's first touch of the initiator's pages
  // can outlast the spin under a sanitizer).
  ASSERT_TRUE(Batch(TransferRequest::WRITE, 0, 4096, 1024, &why)) << why;
  ASSERT_TRUE(Batch(TransferRequest::READ, 0, 4096, 1024, &why)) << why;
  const uint64_t before = initiator_.transport.inline_done();
  for (uint32_t round = 0; round < 20; ++round) {
    const size_t off = (round % 8) * (512 << 10);
    Fill(off, 512 << 10, round);
    ASSERT_TRUE(Batch(TransferRequest::WRITE, off, 4096, 128, &why)) << why;
    ASSERT_TRUE(Matches(remote_.data() + off, off, 512 << 10, round)) << "round " << round;
    std::memset(local_ + off, 0, 512 << 10);
    ASSERT_TRUE(Batch(TransferRequest::READ, off, 4096, 128, &why)) << why;
    ASSERT_TRUE(Matches(local_ + off, off, 512 << 10, round)) << "round " << round;
  }
  // Each of the 40 is inline unless its submit raced the stream's thread back to idle or
  // its reply outlasted the spin: most must be.
  EXPECT_GE(initiator_.transport.inline_done() - before, 30u)
      << "the batches went through the stream's thread";
  EXPECT_EQ(initiator_.transport.mapped_copies(), 0u) << "plain target memory is not lent";
}

TEST_P(ShmInline, LargerRequestsAndASpinOfZeroGoThroughTheStreams) {
  Start(/*spin_us=*/10000);
  std::string why;
  ASSERT_TRUE(Batch(TransferRequest::WRITE, 0, 4096, 1, &why)) << why;
  const uint64_t done = initiator_.transport.inline_done();
  Fill(0, 2 << 20, 7);
  ASSERT_TRUE(Batch(TransferRequest::WRITE, 0, 64 << 10, 32, &why)) << why;  // 2 MiB
  EXPECT_TRUE(Matches(remote_.data(), 0, 2 << 20, 7));
  EXPECT_EQ(initiator_.transport.inline_done(), done) << "over 1 MiB: split over the streams";
  EXPECT_EQ(initiator_.transport.inline_left(), 0u);

  // MC_SHM_SPIN_US=0: never on the submitting thread.
  Side other;
  TransportContext ctx;
  ctx.options.shm_spin_us = 0;
  ctx.registry = &other.registry;
  other.desc.name = "other";
  ASSERT_TRUE(other.transport.Start(ctx, &other.desc).ok());
  ASSERT_TRUE(other.registry.Add(reinterpret_cast<uint64_t>(local_), kBytes, "cpu:0", true).ok());
  ASSERT_TRUE(other.transport.CanReach(*peer_));
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(testing_util::SubmitAndWait(other.transport, peer_, TransferRequest::WRITE,
                                            local_, remote_.data(), 0, 4096, 1, &why))
        << why;
  }
  EXPECT_EQ(other.transport.inline_done() + other.transport.inline_left(), 0u);
  other.transport.Stop();
}

// Submitters race for the same two streams. A spin of 1 us leaves nearly every reply to the
// stream's thread, so requests sent inline and requests in flight handed over mix on each
// connection; a long one has requests queue behind a caller that holds the connection. Each thread writes its own areas with its own
// pattern and reads them back: a reply matched to the wrong request, a request sent while
// another was in flight, or a slice lost or completed twice shows as a failure or wrong bytes.
void ShmInline::Race(int spin_us) {
  Start(spin_us);
  std::string why;
  ASSERT_TRUE(Batch(TransferRequest::WRITE, 0, 4096, 1, &why)) << why;
  for (const std::string& w : testing_util::RaceOwnAreas(initiator_.transport, peer_, local_,
                                                         remote_.data(), kBytes, 4, 150)) {
    ADD_FAILURE() << w;
  }
  EXPECT_GT(initiator_.transport.inline_done() + initiator_.transport.inline_left(), 0u);
}

TEST_P(ShmInline, RacingSubmittersWithRepliesLeftToTheStreamsLoseNothing) {
  Race(/*spin_us=*/1);
  EXPECT_GT(initiator_.transport.inline_left(), 0u)
      << "with a 1 us spin some replies must have been left to the streams";
}

// Long spins: callers hold a connection while others queue on it and its thread is woken.
TEST_P(ShmInline, RacingSubmittersQueueingBehindAnInlineRequestLoseNothing) {
  Race(/*spin_us=*/10000);
  EXPECT_GT(initiator_.transport.inline_done(), 0u);
}

INSTANTIATE_TEST_SUITE_P(InitiatorMemory, ShmInline, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Shared" : "Plain"; });

}  // namespace
}  // namespace mooncake::shm
