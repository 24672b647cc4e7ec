// Issue 14, point 8a: a client's staging buffer holds the values it just put or got, so a peer
// must not reach it. Before the fix it was allocated shareable and registered for remote
// access: it was listed in the segment's descriptor and any peer could READ the value a client
// had just put into another client's segment. Now it is registered local-only: it is not in
// the descriptor, a peer's request for a range in it is refused, and puts and gets through it
// still work.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "master_process.h"
#include "mooncake/store/store_client.h"
#include "mooncake/transfer_engine.h"
#include "mooncake/store/error_code.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_master;  // NOLINT

TEST(StoreStaging, PeersCannotReachTheStagingBuffer) {
  const int rpc_port = FreePort();
  MasterProcess master({"--rpc_address=127.0.0.1", "--rpc_port=" + std::to_string(rpc_port),
                        "--enable_metric_reporting=false"});
  ASSERT_TRUE(master.WaitReady(seconds(20))) << master.Log();
  // 3 MiB: a staging buffer size no other buffer has.
  auto make = [&](uint64_t segment) { return MakeClient(rpc_port, segment, 3 * MiB); };
  auto a = make(8 * MiB);
  auto b = make(16 * MiB);
  ASSERT_TRUE(a && b);
  // a puts a secret from plain memory into b's segment: it passes through a's staging buffer.
  std::string secret(64 << 10, 0);
  for (size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<char>('A' + (i * 7) % 26);
  ReplicateConfig on_b;
  on_b.preferred_segments = {b->segment_name()};
  ASSERT_EQ(a->Put("secret", {{secret.data(), secret.size()}}, on_b), 0);
  const Span staging = a->local_buffer();
  ASSERT_NE(staging.ptr, nullptr);
  ASSERT_EQ(staging.size, 3 * MiB);

  // A peer opens a's segment: the staging buffer is not in its descriptor...
  TransferEngine peer;
  ASSERT_TRUE(peer.Init("P2PHANDSHAKE", "127.0.0.1").ok());
  std::vector<char> mine(staging.size);
  ASSERT_TRUE(peer.RegisterLocalMemory(mine.data(), mine.size(), "cpu:0").ok());
  auto seg = peer.OpenSegment(a->segment_name());
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  auto info = peer.GetSegmentInfo(*seg);
  ASSERT_TRUE(info.ok());
  const uint64_t at = reinterpret_cast<uint64_t>(staging.ptr);
  for (const auto& buf : info->buffers) {
    EXPECT_FALSE(at < buf.addr + buf.length && buf.addr < at + staging.size)
        << "the staging buffer is published in the descriptor";
  }
  // ... and reading or writing it is refused.
  for (auto op : {TransferRequest::READ, TransferRequest::WRITE}) {
    auto batch = peer.AllocateBatchID(1);
    ASSERT_TRUE(batch.ok());
    Status s = peer.SubmitTransfer(*batch, {{op, mine.data(), *seg, at, secret.size()}});
    bool reached = false;
    if (s.ok()) {
      auto st = peer.WaitBatch(*batch, seconds(10));
      reached = st.ok() && st->s == COMPLETED;
    }
    EXPECT_FALSE(reached) << (op == TransferRequest::READ ? "read" : "wrote")
                          << " the staging buffer of another process";
    (void)peer.FreeBatchID(*batch);
  }
  EXPECT_EQ(std::memcmp(mine.data(), secret.data(), secret.size()) == 0, false)
      << "the peer read the secret";

  // Puts and gets through staging still work, both ways.
  std::vector<char> out(secret.size());
  ASSERT_EQ(a->Get("secret", {{out.data(), out.size()}}), static_cast<int64_t>(secret.size()));
  EXPECT_EQ(std::memcmp(out.data(), secret.data(), secret.size()), 0);
  ASSERT_EQ(b->Get("secret", {{out.data(), out.size()}}), static_cast<int64_t>(secret.size()));
  EXPECT_EQ(std::memcmp(out.data(), secret.data(), secret.size()), 0);
  std::vector<char> big(5 * MiB, 'z');  // larger than the staging buffer: chunked
  ReplicateConfig on_a;
  on_a.preferred_segments = {a->segment_name()};
  ASSERT_EQ(b->Put("big", {{big.data(), big.size()}}, on_a), 0);
  std::vector<char> big_out(big.size());
  ASSERT_EQ(b->Get("big", {{big_out.data(), big_out.size()}}), static_cast<int64_t>(big.size()));
  EXPECT_TRUE(big == big_out);
  EXPECT_EQ(a->Close(), 0);
  EXPECT_EQ(b->Close(), 0);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
