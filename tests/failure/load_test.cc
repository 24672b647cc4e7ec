// Load: 64 engines (threads of this process, each its own TransferEngine) open the same
// target at the same moment; all succeed, then each does a small verified write and read in
// its own slot of the target's buffer.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "engine_util.h"
#include "failure_util.h"
#include "transport_param.h"
#include "pattern.h"

namespace mc_failure {
namespace {

using namespace mooncake;
using std::chrono::milliseconds;

constexpr int kEngines = 64;
constexpr size_t kSlot = 64 << 10;

class Load : public TransportTest {};

TEST_P(Load, SixtyFourEnginesOpenOneTargetAtOnce) {
  Peer t = Peer::Start(FAIL_PEER_PATH, kEngines * kSlot);
  ASSERT_TRUE(t.ok()) << t.error;

  struct Result {
    Status init, open, write, read;
    bool verified = false;
    double open_ms = 0;
    std::string transport;
  };
  std::vector<Result> results(kEngines);
  Barrier ready(kEngines), opened(kEngines);
  std::vector<std::thread> threads;
  auto start = Clock::now();
  for (int i = 0; i < kEngines; ++i) {
    threads.emplace_back([&, i] {
      Result& r = results[i];
      EngineOptions o;
      o.slice_timeout_ms = 10000;
      Buffer local(2 * kSlot);  // outlives the engine that registers it
      TransferEngine e(o);
      r.init = e.Init("P2PHANDSHAKE", "127.0.0.1", transport());
      if (r.init.ok()) r.init = e.RegisterLocalMemory(local.data(), local.size());
      ready.Wait();  // every engine is up: now all open at once
      if (!r.init.ok()) {
        opened.Wait();
        return;
      }
      auto t0 = Clock::now();
      auto seg = e.OpenSegment(t.segment);
      r.open_ms = SecondsSince(t0) * 1000;
      r.open = seg.status();
      opened.Wait();
      if (!seg.ok()) return;
      auto info = e.GetSegmentInfo(*seg);
      if (info.ok()) r.transport = info->transport;
      const uint64_t off = i * kSlot, seed = 300 + i;
      FillPattern(local.data(), kSlot, seed, off);
      r.write = e.TransferSync({{TransferRequest::WRITE, local.data(), *seg, t.addr + off, kSlot}},
                               milliseconds(30000));
      if (!r.write.ok()) return;
      r.read = e.TransferSync(
          {{TransferRequest::READ, local.data() + kSlot, *seg, t.addr + off, kSlot}},
          milliseconds(30000));
      r.verified = r.read.ok() && CheckPattern(local.data() + kSlot, kSlot, seed, off);
    });
  }
  for (auto& th : threads) th.join();
  double total_s = SecondsSince(start);

  double max_open = 0;
  int opened_ok = 0, verified = 0;
  for (int i = 0; i < kEngines; ++i) {
    const Result& r = results[i];
    SCOPED_TRACE("engine " + std::to_string(i));
    EXPECT_TRUE(r.init.ok()) << r.init.ToString();
    EXPECT_TRUE(r.open.ok()) << r.open.ToString();
    EXPECT_TRUE(r.write.ok()) << r.write.ToString();
    EXPECT_TRUE(r.read.ok()) << r.read.ToString();
    EXPECT_TRUE(r.verified);
    EXPECT_EQ(r.transport, transport());
    opened_ok += r.open.ok();
    verified += r.verified;
    max_open = std::max(max_open, r.open_ms);
  }
  std::printf("[load %s] %d engines: %d opened (slowest open %.0f ms), %d verified, %.2f s in "
              "all\n",
              GetParam().c_str(), kEngines, opened_ok, max_open, verified, total_s);
  // The target holds what each wrote, in its own slot.
  for (int i = 0; i < kEngines; ++i) {
    if (results[i].write.ok()) {
      EXPECT_EQ(t.Check(i * kSlot, kSlot, 300 + i), "OK") << i;
    }
  }
  EXPECT_TRUE(t.Ping());
}

INSTANTIATE_TEST_SUITE_P(Transports, Load, ::testing::ValuesIn(WithUcx({"tcp", "shm"}, {"ucx_tcp", "ucx_sm"})),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace mc_failure
