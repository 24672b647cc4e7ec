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
#include "metadata/handshake.h"
#include "mooncake/transfer_engine.h"

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


// Issue 28, item 3: with MC_AUTH_SECRET set, a peer without the secret (a_, a bare UCX
// transport) takes the worker address and remote key that the engine publishes (in the
// metadata store; here fetched over the handshake, which gives the same descriptor) and
// writes over UCX's tcp lane into the registered buffer, and, by claiming a longer buffer,
// into memory that was never registered. Before: both writes landed (UCX authenticates
// nothing; its emulated RMA applies a put anywhere). After: with a secret the engine does not
// start UCX at all (nothing is published; peers use the authenticated tcp/shm transports)
// unless MC_UCX_ALLOW_UNAUTHENTICATED=1 says otherwise.
class UcxWithSecret : public UcxHostile {
 protected:
  // The target's descriptor as any reader of the metadata store sees it.
  static SegmentDesc Published(TransferEngine& target) {
    HandshakeLimits limits;
    limits.auth_secret = "s3cret";
    auto reply = HandshakeCall("127.0.0.1", target.GetRpcPort(), target.GetLocalSegmentName(),
                               HandshakeType::kMetadata, "{}", limits);
    EXPECT_TRUE(reply.ok()) << reply.status().ToString();
    auto desc = DecodeSegmentDesc(reply.ok() ? *reply : "");
    EXPECT_TRUE(desc.ok()) << desc.status().ToString();
    return desc.ok() ? *desc : SegmentDesc{};
  }
  static EngineOptions WithSecret() {
    EngineOptions o;
    o.auth_secret = "s3cret";
    o.enable_shm = false;
    o.slice_timeout_ms = 3000;
    return o;
  }
};

TEST_F(UcxWithSecret, APeerWithoutTheSecretCannotUseThePublishedWorkerOrKeys) {
  ::unsetenv("MC_UCX_ALLOW_UNAUTHENTICATED");
  TransferEngine target(WithSecret());
  ASSERT_TRUE(target.Init("P2PHANDSHAKE", "127.0.0.1", "ucx").ok());
  std::vector<uint8_t> mem(1 << 20, 0x5A);
  const size_t registered = 65536;  // the rest of `mem` is never registered
  ASSERT_TRUE(target.RegisterLocalMemory(mem.data(), registered).ok());
  SegmentDesc d = Published(target);
  ASSERT_EQ(d.buffers.size(), 1u);
  const bool published = !d.mc_ucx_worker.empty() && !d.buffers[0].ucx_rkey.empty();
  size_t inside = 0, outside = 0;
  if (published) {
    for (size_t i = 0; i < a_.mem.size(); ++i) a_.mem[i] = 0xEE;
    auto peer = std::make_shared<const SegmentDesc>(d);
    std::string msg;
    if (a_.transport.CanReach(*peer)) (void)WriteTo(peer, 4096, &msg);
    SegmentDesc longer = d;  // the attacker claims the buffer goes on
    longer.name = "longer";
    longer.buffers[0].length = mem.size();
    auto lp = std::make_shared<const SegmentDesc>(longer);
    if (a_.transport.CanReach(*lp)) (void)WriteTo(lp, 4096, &msg, registered + 4096);
  }
  for (size_t i = 0; i < mem.size(); ++i) (i < registered ? inside : outside) += mem[i] != 0x5A;
  std::printf("ucx with a secret: worker address published %d, rkey published %d; bytes "
              "changed by a peer without the secret: %zu registered, %zu never registered\n",
              !d.mc_ucx_worker.empty(), !d.buffers[0].ucx_rkey.empty(), inside, outside);
  EXPECT_TRUE(d.mc_ucx_worker.empty()) << "a UCX worker address is published with a secret";
  EXPECT_TRUE(d.buffers[0].ucx_rkey.empty()) << "a UCX rkey is published with a secret";
  EXPECT_EQ(inside, 0u);
  EXPECT_EQ(outside, 0u);

  // Peers with the secret still move data: over the authenticated tcp transport.
  TransferEngine peer(WithSecret());
  ASSERT_TRUE(peer.Init("P2PHANDSHAKE", "127.0.0.1", "ucx").ok());
  std::vector<uint8_t> local(4096, 0x42);
  ASSERT_TRUE(peer.RegisterLocalMemory(local.data(), local.size()).ok());
  auto seg = peer.OpenSegment(target.GetLocalSegmentName());
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_EQ(peer.GetSegmentInfo(*seg)->transport, "tcp");
  Status s = peer.TransferSync({{TransferRequest::WRITE, local.data(), *seg,
                                 reinterpret_cast<uint64_t>(mem.data()), 4096}});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(mem[4095], 0x42);
}

TEST_F(UcxWithSecret, OptInRunsUcxUnauthenticated) {
  ::setenv("MC_UCX_ALLOW_UNAUTHENTICATED", "1", 1);
  TransferEngine target(WithSecret());
  ASSERT_TRUE(target.Init("P2PHANDSHAKE", "127.0.0.1", "ucx").ok());
  std::vector<uint8_t> mem(65536, 0x5A);
  ASSERT_TRUE(target.RegisterLocalMemory(mem.data(), mem.size()).ok());
  SegmentDesc d = Published(target);
  ::unsetenv("MC_UCX_ALLOW_UNAUTHENTICATED");
  ASSERT_EQ(d.buffers.size(), 1u);
  EXPECT_FALSE(d.mc_ucx_worker.empty()) << "opted in: UCX runs (and is not authenticated)";
  EXPECT_FALSE(d.buffers[0].ucx_rkey.empty());
}

}  // namespace
}  // namespace mooncake::ucx
