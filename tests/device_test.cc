// Device (GPU, NPU) memory through the engine. One suite, three runs (tests/CMakeLists.txt):
//   device_sim.*  MC_DEVICE_SIM=1: simulated devices (always runs; the CPU cannot touch
//                 simulated device memory, so a path that forgot to stage fails here);
//   device_sim_npu.*  MC_DEVICE_SIM=npu: the same on simulated Ascend NPUs ("npu:N", and
//                 ACL's rule that memory imported from a peer copies device to device only,
//                 so host memory reaches a same-host peer's NPU memory over TCP);
//   device_gpu.*  label gpu: the real CUDA backend; tests that need a device skip
//                 themselves where none is usable, and DeviceAbsent checks the error there.
// Every byte is verified through host copies.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

#include "child_process.h"
#include "mooncake/transfer_engine.h"
#include "platform/device.h"
#include "platform/device_backends.h"

namespace mooncake {
namespace {

platform::DeviceBackend& Dev() { return platform::Devices(); }
platform::SimDeviceBackend* Sim() { return dynamic_cast<platform::SimDeviceBackend*>(&Dev()); }
// The registration location of device n: "cuda:n" or "npu:n".
std::string Loc(int n) { return std::string(Dev().location_prefix()) + ":" + std::to_string(n); }

#define REQUIRE_DEVICE()                                                             \
  do {                                                                               \
    Status avail = Dev().Available();                                                \
    if (!avail.ok()) GTEST_SKIP() << "no usable GPU here: " << avail.ToString();     \
  } while (0)

// mp_peer, where the build put it, or MC_TEST_MP_PEER (a relocated build: scripts/gpu_check.sh).
std::string MpPeer() {
  const char* e = std::getenv("MC_TEST_MP_PEER");
  return e && *e ? e : MP_PEER_PATH;
}

uint8_t Pattern(uint64_t i, uint64_t seed) { return static_cast<uint8_t>(i * 131 + seed); }

// A buffer on `device` (-1: host memory), filled and checked through host copies.
class Buf {
 public:
  Buf(int device, size_t n) : device_(device), n_(n) {
    if (device < 0) {
      host_.resize(n);
      ptr_ = host_.data();
    } else {
      auto p = Dev().Malloc(device, n);
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      ptr_ = p.ok() ? static_cast<uint8_t*>(*p) : nullptr;
    }
  }
  ~Buf() {
    if (device_ >= 0 && ptr_) {
      EXPECT_TRUE(Dev().Free(ptr_).ok());
    }
  }
  uint8_t* ptr() const { return ptr_; }
  size_t size() const { return n_; }
  void Fill(uint64_t seed) {
    std::vector<uint8_t> h(n_);
    for (size_t i = 0; i < n_; ++i) h[i] = Pattern(i, seed);
    if (device_ < 0) {
      std::memcpy(ptr_, h.data(), n_);
    } else {
      ASSERT_TRUE(Dev().Copy(ptr_, h.data(), n_).ok());
    }
  }
  // First offset whose byte differs from Pattern(seed), or -1.
  long Mismatch(uint64_t seed) {
    std::vector<uint8_t> h(n_);
    if (device_ < 0) {
      std::memcpy(h.data(), ptr_, n_);
    } else if (!Dev().Copy(h.data(), ptr_, n_).ok()) {
      return 0;
    }
    for (size_t i = 0; i < n_; ++i) {
      if (h[i] != Pattern(i, seed)) return static_cast<long>(i);
    }
    return -1;
  }

 private:
  int device_;
  size_t n_;
  std::vector<uint8_t> host_;
  uint8_t* ptr_ = nullptr;
};

// Moves [0, n) between local buffer `l` and remote address `r` in requests of `block`.
Status Move(TransferEngine& e, TransferRequest::OpCode op, uint8_t* l, SegmentID seg, uint64_t r,
            size_t n, size_t block) {
  std::vector<TransferRequest> reqs;
  for (size_t off = 0; off < n; off += block) {
    reqs.push_back({op, l + off, seg, r + off, std::min(block, n - off)});
  }
  return e.TransferSync(reqs, std::chrono::seconds(30));
}

TEST(DeviceAbsent, RegisteringCudaMemoryFailsWithAClearMessage) {
  if (Dev().Available().ok()) GTEST_SKIP() << "a device is usable here";
  TransferEngine e;
  ASSERT_TRUE(e.Init("P2PHANDSHAKE", "127.0.0.1").ok());
  std::vector<uint8_t> host(4096);
  Status s = e.RegisterLocalMemory(host.data(), host.size(), "cuda:0");
  EXPECT_TRUE(s.IsFailedPrecondition()) << s.ToString();
  EXPECT_NE(s.message().find("GPU memory cannot be used on this host"), std::string::npos)
      << s.ToString();
  // Host memory still registers, with the location detected.
  EXPECT_TRUE(e.RegisterLocalMemory(host.data(), host.size(), "*").ok());
  // The same-host GPU transport is simply not offered.
  for (const auto& t : e.GetTransports()) EXPECT_NE(t, "cuda_ipc");
}

TEST(AscendAbsent, NpuLocationAndProtocolAscendFailAtOnceNamingLibascendcl) {
  if (Sim()) GTEST_SKIP() << "simulated devices";
  if (platform::SelectDeviceKind("npu").ok()) GTEST_SKIP() << "an NPU is usable here";
  if (Dev().Available().ok()) GTEST_SKIP() << "this process uses " << Dev().name();
  TransferEngine e;
  Status s = e.Init("P2PHANDSHAKE", "127.0.0.1", "ascend");
  EXPECT_TRUE(s.IsFailedPrecondition()) << s.ToString();
  EXPECT_NE(s.message().find("libascendcl.so"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("CANN toolkit"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("set_env.sh"), std::string::npos) << s.ToString();
  ASSERT_TRUE(e.Init("P2PHANDSHAKE", "127.0.0.1").ok());
  std::vector<uint8_t> host(4096);
  s = e.RegisterLocalMemory(host.data(), host.size(), "npu:0");
  EXPECT_TRUE(s.IsFailedPrecondition()) << s.ToString();
  EXPECT_NE(s.message().find("libascendcl.so"), std::string::npos) << s.ToString();
  EXPECT_TRUE(e.RegisterLocalMemory(host.data(), host.size(), "*").ok());
}

TEST(SimulatedNpu, ProtocolAscendAndNpuLocations) {
  if (!Sim() || std::string(Dev().location_prefix()) != "npu") GTEST_SKIP() << "MC_DEVICE_SIM=npu";
  TransferEngine e;
  ASSERT_TRUE(e.Init("P2PHANDSHAKE", "127.0.0.1", "ascend").ok());
  Buf d(0, 8192);
  EXPECT_TRUE(e.RegisterLocalMemory(d.ptr(), 4096, "npu:0").ok());
  // One device runtime per process: cuda:N beside NPUs is refused, saying why.
  Status s = e.RegisterLocalMemory(d.ptr() + 4096, 4096, "cuda:0");
  EXPECT_TRUE(s.IsFailedPrecondition()) << s.ToString();
  EXPECT_NE(s.message().find("npu:N"), std::string::npos) << s.ToString();
  EXPECT_TRUE(e.RegisterLocalMemory(d.ptr() + 4096, 4096, "*").ok());
  EXPECT_TRUE(e.RegisterLocalMemory(d.ptr(), 4096, "npu:x").IsInvalidArgument());
}

class TwoEngines : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = std::make_unique<TransferEngine>();
    b_ = std::make_unique<TransferEngine>();
    ASSERT_TRUE(a_->Init("P2PHANDSHAKE", "127.0.0.1").ok());
    ASSERT_TRUE(b_->Init("P2PHANDSHAKE", "127.0.0.1").ok());
  }
  SegmentID OpenB() {
    auto seg = a_->OpenSegment(b_->GetLocalSegmentName());
    EXPECT_TRUE(seg.ok()) << seg.status().ToString();
    return seg.ok() ? *seg : 0;
  }
  int SecondDevice() { return Dev().DeviceCount() > 1 ? 1 : 0; }
  // Writes a's buffer into b's, checks b; refills b, reads into a, checks a.
  void RoundTrip(Buf& la, Buf& rb, size_t block) {
    ASSERT_TRUE(a_->RegisterLocalMemory(la.ptr(), la.size(), "*").ok());
    ASSERT_TRUE(b_->RegisterLocalMemory(rb.ptr(), rb.size(), "*").ok());
    SegmentID seg = OpenB();
    la.Fill(3);
    Status s = Move(*a_, TransferRequest::WRITE, la.ptr(), seg,
                    reinterpret_cast<uint64_t>(rb.ptr()), la.size(), block);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(rb.Mismatch(3), -1);
    rb.Fill(5);
    s = Move(*a_, TransferRequest::READ, la.ptr(), seg, reinterpret_cast<uint64_t>(rb.ptr()),
             la.size(), block);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(la.Mismatch(5), -1);
  }
  std::unique_ptr<TransferEngine> a_, b_;
};

constexpr size_t kOdd = (16 << 20) + 4321;  // not a multiple of any chunk or slice size

TEST_F(TwoEngines, LocalDeviceToRemoteHostIsStagedAndPipelined) {
  REQUIRE_DEVICE();
  if (Sim()) {
    Sim()->async_delay_us = 300;  // copies slower than the wire: overlap is needed
    Sim()->max_stream_depth = 0;
  }
  Buf la(0, kOdd), rb(-1, kOdd);
  RoundTrip(la, rb, 8 << 20);
  if (Sim()) {
    Sim()->async_delay_us = 0;
    // Several slices' copies were queued at once: staging runs ahead of the socket.
    EXPECT_GE(Sim()->max_stream_depth.load(), 2);
  }
}

TEST_F(TwoEngines, LocalHostToRemoteDeviceIsStagedByTheTarget) {
  REQUIRE_DEVICE();
  Buf la(-1, kOdd), rb(0, kOdd);
  RoundTrip(la, rb, 4 << 20);
}

TEST_F(TwoEngines, DeviceToDeviceOverTcpInSmallAndLargeRequests) {
  REQUIRE_DEVICE();
  Buf la(0, kOdd), rb(SecondDevice(), kOdd);
  RoundTrip(la, rb, 16 << 20);
  Buf sa(0, 64 << 10), sb(SecondDevice(), 64 << 10);
  RoundTrip(sa, sb, 4096);  // many small requests in one batch
}

TEST_F(TwoEngines, LocalSegmentCopiesBetweenDeviceAndHost) {
  REQUIRE_DEVICE();
  Buf d(0, 1 << 20), h(-1, 1 << 20);
  ASSERT_TRUE(a_->RegisterLocalMemory(d.ptr(), d.size(), Loc(0)).ok());
  ASSERT_TRUE(a_->RegisterLocalMemory(h.ptr(), h.size(), "cpu:0").ok());
  d.Fill(9);
  Status s = Move(*a_, TransferRequest::WRITE, d.ptr(), LOCAL_SEGMENT_ID,
                  reinterpret_cast<uint64_t>(h.ptr()), d.size(), 1 << 20);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(h.Mismatch(9), -1);
}

TEST_F(TwoEngines, DeviceBufferRegisteredAfterOpenIsFoundInTheSameBatch) {
  REQUIRE_DEVICE();
  Buf la(-1, 1 << 20), lb(0, 1 << 20), rh(-1, 1 << 20), rd(0, 1 << 20);
  ASSERT_TRUE(a_->RegisterLocalMemory(la.ptr(), la.size(), "*").ok());
  ASSERT_TRUE(a_->RegisterLocalMemory(lb.ptr(), lb.size(), "*").ok());
  ASSERT_TRUE(b_->RegisterLocalMemory(rh.ptr(), rh.size(), "*").ok());
  SegmentID seg = OpenB();  // b's descriptor has the host buffer only
  ASSERT_TRUE(b_->RegisterLocalMemory(rd.ptr(), rd.size(), "*").ok());
  la.Fill(31);
  lb.Fill(32);
  // The second request's range is unknown until the descriptor is fetched again mid-submit;
  // the first was already checked against the old one.
  std::vector<TransferRequest> reqs{
      {TransferRequest::WRITE, la.ptr(), seg, reinterpret_cast<uint64_t>(rh.ptr()), la.size()},
      {TransferRequest::WRITE, lb.ptr(), seg, reinterpret_cast<uint64_t>(rd.ptr()), lb.size()}};
  Status s = a_->TransferSync(reqs, std::chrono::seconds(30));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(rh.Mismatch(31), -1);
  EXPECT_EQ(rd.Mismatch(32), -1);
}

TEST_F(TwoEngines, WrongDeviceInTheLocationIsRefused) {
  REQUIRE_DEVICE();
  if (Dev().DeviceCount() < 2) GTEST_SKIP() << "needs two devices";
  Buf d(1, 4096);
  Status s = a_->RegisterLocalMemory(d.ptr(), d.size(), Loc(0));
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_TRUE(a_->RegisterLocalMemory(d.ptr(), d.size(), Loc(1)).ok());
}

TEST_F(TwoEngines, FailedDeviceCopiesFailTheRequestAndTheNextOneWorks) {
  if (!Sim()) GTEST_SKIP() << "copy failures are injected by the simulated backend";
  Buf la(0, 4 << 20), rb(-1, 4 << 20);
  ASSERT_TRUE(a_->RegisterLocalMemory(la.ptr(), la.size(), "*").ok());
  ASSERT_TRUE(b_->RegisterLocalMemory(rb.ptr(), rb.size(), "*").ok());
  SegmentID seg = OpenB();
  la.Fill(1);
  Sim()->fail_after_copies = 1;  // initiator side: a staging copy fails
  Status s = Move(*a_, TransferRequest::WRITE, la.ptr(), seg,
                  reinterpret_cast<uint64_t>(rb.ptr()), la.size(), 1 << 20);
  Sim()->fail_after_copies = -1;
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("injected copy failure"), std::string::npos) << s.ToString();
  s = Move(*a_, TransferRequest::WRITE, la.ptr(), seg, reinterpret_cast<uint64_t>(rb.ptr()),
           la.size(), 1 << 20);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(rb.Mismatch(1), -1);

  // Target side: its copy into device memory fails; the request fails, the next works.
  Buf lh(-1, 2 << 20), rd(0, 2 << 20);
  ASSERT_TRUE(a_->RegisterLocalMemory(lh.ptr(), lh.size(), "*").ok());
  ASSERT_TRUE(b_->RegisterLocalMemory(rd.ptr(), rd.size(), "*").ok());
  lh.Fill(2);
  Sim()->fail_after_copies = 0;
  s = Move(*a_, TransferRequest::WRITE, lh.ptr(), seg, reinterpret_cast<uint64_t>(rd.ptr()),
           lh.size(), 1 << 20);
  Sim()->fail_after_copies = -1;
  EXPECT_FALSE(s.ok());
  s = Move(*a_, TransferRequest::WRITE, lh.ptr(), seg, reinterpret_cast<uint64_t>(rd.ptr()),
           lh.size(), 1 << 20);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(rd.Mismatch(2), -1);
}

// The target is another process (tests/mp_peer.cc) holding device memory.
class OtherProcess : public ::testing::Test {
 protected:
  struct Target {
    std::unique_ptr<Child> proc;
    std::string segment;
    uint64_t addr = 0;
  };
  static Target Start(int device, uint64_t size) {
    Target t;
    std::vector<std::string> args{MpPeer(), "target", "--size", std::to_string(size)};
    if (device >= 0) args.insert(args.end(), {"--device", std::to_string(device)});
    t.proc = std::make_unique<Child>(args);
    std::istringstream in(t.proc->ReadLine());
    std::string ready;
    uint64_t n = 0;
    in >> ready >> t.segment >> t.addr >> n;
    EXPECT_EQ(ready, "READY");
    return t;
  }
  static std::string Check(Target& t, uint64_t len, uint64_t seed) {
    return t.proc->Command("CHECK 0 " + std::to_string(len) + " " + std::to_string(seed));
  }
};

TEST_F(OtherProcess, SameHostDeviceMemoryMovesThroughIpcHandles) {
  REQUIRE_DEVICE();
  const size_t n = (8 << 20) + 77;
  Target t = Start(0, n);
  ASSERT_FALSE(t.segment.empty());
  {
    TransferEngine e;
    ASSERT_TRUE(e.Init("P2PHANDSHAKE", "127.0.0.1").ok());
    auto seg = e.OpenSegment(t.segment);
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    Buf d(0, n), h(-1, n);
    ASSERT_TRUE(e.RegisterLocalMemory(d.ptr(), n, "*").ok());
    ASSERT_TRUE(e.RegisterLocalMemory(h.ptr(), n, "*").ok());
    // Device to device.
    d.Fill(11);
    Status s = Move(e, TransferRequest::WRITE, d.ptr(), *seg, t.addr, n, 4 << 20);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(Check(t, n, 11), "OK");
    ASSERT_EQ(t.proc->Command("FILL 0 " + std::to_string(n) + " 12"), "OK");
    s = Move(e, TransferRequest::READ, d.ptr(), *seg, t.addr, n, 16 << 20);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(d.Mismatch(12), -1);
    // Host memory here, device memory there.
    h.Fill(13);
    s = Move(e, TransferRequest::WRITE, h.ptr(), *seg, t.addr, n, 1 << 20);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(Check(t, n, 13), "OK");
    if (Sim()) {
      // The peer's allocation was opened once, by handle, not reached over TCP.
      EXPECT_EQ(Sim()->open_ipc_mappings.load(), 1);
    }
  }
  if (Sim()) {
    EXPECT_EQ(Sim()->open_ipc_mappings.load(), 0) << "closed at shutdown";
  }
}

TEST_F(OtherProcess, LocalDeviceToSameHostHostMemoryGoesOverTcp) {
  REQUIRE_DEVICE();
  const size_t n = (4 << 20) + 5;
  Target t = Start(-1, n);
  ASSERT_FALSE(t.segment.empty());
  TransferEngine e;
  ASSERT_TRUE(e.Init("P2PHANDSHAKE", "127.0.0.1").ok());
  auto seg = e.OpenSegment(t.segment);
  ASSERT_TRUE(seg.ok());
  Buf d(0, n);
  ASSERT_TRUE(e.RegisterLocalMemory(d.ptr(), n, "*").ok());
  d.Fill(21);
  Status s = Move(e, TransferRequest::WRITE, d.ptr(), *seg, t.addr, n, 1 << 20);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Check(t, n, 21), "OK");
  ASSERT_EQ(t.proc->Command("FILL 0 " + std::to_string(n) + " 22"), "OK");
  s = Move(e, TransferRequest::READ, d.ptr(), *seg, t.addr, n, 1 << 20);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(d.Mismatch(22), -1);
}

}  // namespace
}  // namespace mooncake
