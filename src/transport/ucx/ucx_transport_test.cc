// UcxTransport against hostile descriptors: a worker address or a remote key that is garbage
// of a plausible length, truncated, or all zeros must end in a clear error (CanReach false,
// the slice FAILED with a message), never a crash; and two transports in one process move
// bytes both ways over UCX_TLS=tcp. Skips itself where libucp cannot be loaded.
#include "transport/ucx/ucx_transport.h"

#include <gtest/gtest.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

#include "transport/ucx/ucx_memory.h"
#include "engine/slice_recorder_test_util.h"

namespace mooncake::ucx {
namespace {

using Recorder = testing_util::SliceRecorder;

struct Side {
  MemoryRegistry registry;
  UcxTransport transport;
  SegmentDesc desc;
  std::vector<uint8_t> mem = std::vector<uint8_t>(1 << 20);
};

class UcxHostile : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("UCX_TLS", "tcp", 1);
    if (!LoadUcxApi().ok()) GTEST_SKIP() << LoadUcxApi().status().ToString();
    for (Side* s : {&a_, &b_}) {
      TransportContext ctx;
      ctx.options.slice_timeout_ms = 3000;
      ctx.registry = &s->registry;
      ctx.chosen_by_name = true;
      s->desc.name = s == &a_ ? "a" : "b";
      ASSERT_TRUE(s->transport.Start(ctx, &s->desc).ok());
      RegionInfo r{reinterpret_cast<uint64_t>(s->mem.data()), s->mem.size(), "cpu:0", true};
      ASSERT_TRUE(s->registry.Add(r.addr, r.length, r.location, true).ok());
      ASSERT_TRUE(s->transport.RegisterMemory(r).ok());
      BufferDesc b{s->desc.name, r.addr, r.length};
      s->transport.DescribeBuffer(r, &b);
      ASSERT_FALSE(b.ucx_rkey.empty());
      s->desc.buffers.push_back(b);
    }
  }
  void TearDown() override {
    a_.transport.Stop();
    b_.transport.Stop();
    ::unsetenv("UCX_TLS");
  }
  // Submits one write of `len` bytes from a_ to `peer`'s first buffer; returns its result.
  TransferStatusEnum WriteTo(const std::shared_ptr<const SegmentDesc>& peer, uint64_t len,
                             std::string* message, uint64_t offset = 0) {
    Recorder rec;
    Slice s;
    s.opcode = TransferRequest::WRITE;
    s.local = reinterpret_cast<uint64_t>(a_.mem.data());
    s.remote = peer->buffers[0].addr + offset;
    s.length = len;
    s.remote_buffer = &peer->buffers[0];
    s.hook = &rec;
    Status st = a_.transport.Submit(peer, &s, 1);
    if (!st.ok()) {
      *message = st.ToString();
      return FAILED;
    }
    EXPECT_TRUE(rec.Wait(1));
    *message = rec.message();
    auto r = rec.results();
    return r.empty() ? WAITING : r[0];
  }

  Side a_, b_;
};

std::string RandomHex(size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string raw(bytes, '\0');
  for (auto& c : raw) c = static_cast<char>(rng());
  return ToHex(raw.data(), raw.size());
}

TEST_F(UcxHostile, UcxInstallsNoSignalHandlers) {
  // ucx_env.cc sets UCX_ERROR_SIGNALS= and UCX_HANDLE_ERRORS=none: the host process (Python,
  // glog's failure handler) keeps its own.
  // (Sanitizers install their own: the check is that none is UCX's.)
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) {
    struct sigaction old {};
    ASSERT_EQ(::sigaction(sig, nullptr, &old), 0);
    if (old.sa_handler == SIG_DFL || old.sa_handler == SIG_IGN) continue;
    Dl_info info{};
    ASSERT_NE(::dladdr(reinterpret_cast<void*>(old.sa_handler), &info), 0);
    const std::string lib = info.dli_fname ? info.dli_fname : "";
    EXPECT_EQ(lib.find("libucs"), std::string::npos) << "signal " << sig << " handled by " << lib;
  }
}

TEST_F(UcxHostile, UcxLogsToStderrNotTheApplicationsStdout) {
  // ucx_env.cc sets UCX_LOG_FILE=stderr where the user did not choose.
  const char* v = std::getenv("UCX_LOG_FILE");
  ASSERT_NE(v, nullptr);
  EXPECT_STREQ(v, "stderr");
}

TEST_F(UcxHostile, RealPeerMovesEveryByte) {
  auto peer = std::make_shared<const SegmentDesc>(b_.desc);
  ASSERT_TRUE(a_.transport.CanReach(*peer));
  for (size_t i = 0; i < a_.mem.size(); ++i) a_.mem[i] = static_cast<uint8_t>(i * 7 + 1);
  std::string msg;
  ASSERT_EQ(WriteTo(peer, a_.mem.size(), &msg), COMPLETED) << msg;
  EXPECT_EQ(std::memcmp(a_.mem.data(), b_.mem.data(), a_.mem.size()), 0);
}

TEST_F(UcxHostile, GarbageWorkerAddressesAreRefused) {
  int n = 0;
  // Random bytes whose format version is not one UCX knows (it would abort on them), and
  // addresses too short to hold a header.
  std::string bad_version = RandomHex(79, 1);
  bad_version[1] = 'f';  // low nibble of the first byte: version 15
  for (const std::string& hex : {bad_version, std::string("25") + RandomHex(200, 2),
                                 RandomHex(1, 3), b_.desc.mc_ucx_worker.substr(0, 10)}) {
    SegmentDesc bad = b_.desc;
    bad.name = "bad" + std::to_string(n++);
    bad.mc_ucx_worker = hex;
    EXPECT_FALSE(a_.transport.CanReach(bad)) << hex.size() / 2 << " bytes";
  }
  EXPECT_NE(CheckWorkerAddress(std::string(79, '\x0f')).ToString().find("format version 15"),
            std::string::npos);
  EXPECT_NE(CheckWorkerAddress("abc").ToString().find("too short"), std::string::npos);
  std::string real;
  ASSERT_TRUE(FromHex(b_.desc.mc_ucx_worker, &real));
  EXPECT_TRUE(CheckWorkerAddress(real).ok());
  // Still healthy.
  auto peer = std::make_shared<const SegmentDesc>(b_.desc);
  std::string msg;
  EXPECT_EQ(WriteTo(peer, 4096, &msg), COMPLETED) << msg;
}

TEST_F(UcxHostile, GarbageKeysFailTheSliceWithAMessage) {
  const std::string real = b_.desc.buffers[0].ucx_rkey;
  int n = 0;
  for (const std::string& hex : {RandomHex(real.size() / 2, 4), std::string(real.size(), '0'),
                                 real.substr(0, 4), RandomHex(3000, 5)}) {
    SegmentDesc bad = b_.desc;
    bad.name = "badkey" + std::to_string(n++);
    bad.buffers[0].ucx_rkey = hex;
    auto peer = std::make_shared<const SegmentDesc>(bad);
    if (!a_.transport.CanReach(*peer)) continue;
    std::string msg;
    TransferStatusEnum r = WriteTo(peer, 4096, &msg);
    // UCX may accept a key it cannot tell from a real one (the software lanes carry little
    // in it): then the write lands where the descriptor said, inside b's registered buffer.
    if (r == COMPLETED) continue;
    EXPECT_EQ(r, FAILED);
    EXPECT_NE(msg.find("UCX"), std::string::npos) << msg;
  }
  SegmentDesc none = b_.desc;
  none.name = "nokey";
  none.buffers[0].ucx_rkey.clear();
  auto peer = std::make_shared<const SegmentDesc>(none);
  ASSERT_TRUE(a_.transport.CanReach(*peer));
  EXPECT_FALSE(a_.transport.CanMove(*peer, peer->buffers[0], -1)) << "a buffer without a key";
  std::string msg;
  EXPECT_EQ(WriteTo(peer, 4096, &msg), FAILED);
  EXPECT_NE(msg.find("has no UCX key"), std::string::npos) << msg;
}

TEST_F(UcxHostile, RangeOutsideTheRemoteBufferIsNeverPosted) {
  auto peer = std::make_shared<const SegmentDesc>(b_.desc);
  std::memset(b_.mem.data(), 0x5a, b_.mem.size());
  std::string msg;
  EXPECT_EQ(WriteTo(peer, 8192, &msg, b_.mem.size() - 4096), FAILED);
  EXPECT_NE(msg.find("not inside the peer's registered buffer"), std::string::npos) << msg;
  for (uint8_t c : b_.mem) ASSERT_EQ(c, 0x5a);
}

TEST_F(UcxHostile, UnregisteredRangeLosesItsKey) {
  const uint64_t addr = reinterpret_cast<uint64_t>(b_.mem.data());
  b_.transport.UnregisterMemory(addr);
  BufferDesc d;
  b_.transport.DescribeBuffer(RegionInfo{addr, b_.mem.size(), "cpu:0", true}, &d);
  EXPECT_TRUE(d.ucx_rkey.empty()) << "no key is published for an unregistered range";
  // After Stop (an engine shutting down), registration calls do nothing and fail cleanly.
  a_.transport.Stop();
  const uint64_t mine = reinterpret_cast<uint64_t>(a_.mem.data());
  a_.transport.UnregisterMemory(mine);
  EXPECT_FALSE(a_.transport.RegisterMemory(RegionInfo{mine, 4096, "cpu:0", true}).ok());
  BufferDesc after;
  a_.transport.DescribeBuffer(RegionInfo{mine, 4096, "cpu:0", true}, &after);
  EXPECT_TRUE(after.ucx_rkey.empty());
  EXPECT_FALSE(a_.transport.CanReach(b_.desc));
}

}  // namespace
}  // namespace mooncake::ucx
