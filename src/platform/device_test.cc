#include "platform/device.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "platform/device_backends.h"

namespace mooncake::platform {
namespace {

TEST(IpcHandleHex, RoundTripsAndRejectsGarbage) {
  IpcHandle h;
  for (size_t i = 0; i < kIpcHandleSize; ++i) h.bytes[i] = static_cast<uint8_t>(i * 37);
  std::string hex = IpcHandleToHex(h);
  EXPECT_EQ(hex.size(), 128u);
  auto back = IpcHandleFromHex(hex);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(std::memcmp(back->bytes, h.bytes, kIpcHandleSize), 0);
  EXPECT_FALSE(IpcHandleFromHex(hex.substr(1)).ok());
  hex[5] = 'g';
  EXPECT_FALSE(IpcHandleFromHex(hex).ok());
}

TEST(CudaBackend, WithoutAGpuSaysSoAndRefusesWork) {
  auto cuda = MakeCudaBackend();
  Status s = cuda->Available();
  if (s.ok()) GTEST_SKIP() << "a GPU is usable here";
  EXPECT_TRUE(s.IsFailedPrecondition());
  EXPECT_NE(s.message().find("GPU memory cannot be used on this host"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(cuda->DeviceCount(), 0);
  int x = 0;
  EXPECT_EQ(cuda->DeviceOf(&x), kHostMemory);
  EXPECT_FALSE(cuda->Malloc(0, 4096).ok());
  EXPECT_FALSE(cuda->MallocHost(4096).ok());
}

TEST(AscendBackend, WithoutAclSaysWhatToInstallAndRefusesWork) {
  auto npu = MakeAscendBackend();
  EXPECT_STREQ(npu->location_prefix(), "npu");
  EXPECT_FALSE(npu->IpcCopiesWithHost());
  Status s = npu->Available();
  if (s.ok()) GTEST_SKIP() << "an NPU is usable here";
  EXPECT_TRUE(s.IsFailedPrecondition());
  if (s.message().find("not found") != std::string::npos) {
    EXPECT_NE(s.message().find("libascendcl.so"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("CANN toolkit"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("set_env.sh"), std::string::npos) << s.ToString();
  }
  EXPECT_NE(s.message().find("NPU memory cannot be used on this host"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(npu->DeviceCount(), 0);
  int x = 0;
  EXPECT_EQ(npu->DeviceOf(&x), kHostMemory);
  EXPECT_FALSE(npu->Malloc(0, 4096).ok());
  EXPECT_FALSE(npu->MallocHost(4096).ok());
  EXPECT_FALSE(npu->CreateStream().ok());
  IpcHandle h;
  EXPECT_FALSE(npu->IpcOpen(h, 0).ok());
}

TEST(SimBackend, AsNpuCopiesImportedMemoryDeviceToDeviceOnly) {
  SimDeviceBackend sim(2, 0, /*npu=*/true);
  EXPECT_STREQ(sim.location_prefix(), "npu");
  EXPECT_FALSE(sim.IpcCopiesWithHost());
  // A handle exported by a child process, opened here: device-to-device copies only.
  int pipefd[2], done[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  ASSERT_EQ(::pipe(done), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    SimDeviceBackend child(2, 0, true);
    auto p = child.Malloc(1, 4096);
    std::vector<uint8_t> fill(4096, 0x5a);
    if (p.ok()) (void)child.Copy(*p, fill.data(), fill.size());
    auto ex = p.ok() ? child.IpcExportRange(*p) : Result<IpcExport>(p.status());
    IpcHandle h;
    if (ex.ok()) h = ex->handle;
    (void)!::write(pipefd[1], h.bytes, sizeof(h.bytes));
    char c;
    ::close(done[1]);
    (void)!::read(done[0], &c, 1);  // until the parent closes its end
    ::_exit(0);
  }
  IpcHandle h;
  ASSERT_EQ(::read(pipefd[0], h.bytes, sizeof(h.bytes)), static_cast<ssize_t>(sizeof(h.bytes)));
  auto opened = sim.IpcOpen(h, 1);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::vector<uint8_t> host(4096);
  Status s = sim.Copy(host.data(), *opened, host.size());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("device to device only"), std::string::npos) << s.ToString();
  auto dev = sim.Malloc(0, 4096);
  ASSERT_TRUE(dev.ok());
  ASSERT_TRUE(sim.Copy(*dev, *opened, 4096).ok());
  ASSERT_TRUE(sim.Copy(host.data(), *dev, 4096).ok());
  EXPECT_EQ(host[0], 0x5a);
  EXPECT_EQ(host[4095], 0x5a);
  EXPECT_TRUE(sim.IpcClose(*opened).ok());
  EXPECT_TRUE(sim.Free(*dev).ok());
  ::close(done[1]);
  ::close(done[0]);
  ::close(pipefd[1]);
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

TEST(SimBackend, DeviceMemoryIsRecognizedAndNotTouchableByTheCpu) {
  SimDeviceBackend sim(2);
  auto p = sim.Malloc(1, 1 << 16);
  ASSERT_TRUE(p.ok());
  auto* d = static_cast<uint8_t*>(*p);
  EXPECT_EQ(sim.DeviceOf(d + 100), 1);
  int x = 0;
  EXPECT_EQ(sim.DeviceOf(&x), kHostMemory);
  // A syscall on it fails as on real device memory (no bytes reachable by the CPU).
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  EXPECT_EQ(::write(fds[1], d, 16), -1);
  EXPECT_EQ(errno, EFAULT);
  ::close(fds[0]);
  ::close(fds[1]);
  std::vector<uint8_t> in(1 << 16), out(1 << 16);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7);
  ASSERT_TRUE(sim.Copy(d, in.data(), in.size()).ok());
  ASSERT_TRUE(sim.Copy(out.data(), d, out.size()).ok());
  EXPECT_EQ(in, out);
  EXPECT_FALSE(sim.Copy(out.data(), d + 100, 1 << 16).ok()) << "leaves the allocation";
  EXPECT_TRUE(sim.Free(d).ok());
  EXPECT_FALSE(sim.Free(d).ok());
  EXPECT_FALSE(sim.Malloc(2, 4096).ok()) << "device 2 does not exist";
}

TEST(SimBackend, AsyncCopiesRunInOrderAndEventsWaitForThem) {
  // Each queued copy takes 100 ms, so the second is queued behind the first even when this
  // thread loses its core for a while (with 2 ms, a loaded CI machine saw depth 1).
  SimDeviceBackend sim(1, /*async_delay_us=*/100000);
  auto d = sim.Malloc(0, 1 << 20);
  auto h = sim.MallocHost(1 << 20);
  auto s = sim.CreateStream();
  auto e = sim.CreateEvent();
  ASSERT_TRUE(d.ok() && h.ok() && s.ok() && e.ok());
  auto* hp = static_cast<uint8_t*>(*h);
  std::memset(hp, 0xab, 1 << 20);
  ASSERT_TRUE(sim.CopyAsync(*d, hp, 1 << 20, *s).ok());
  std::vector<uint8_t> back(1 << 20, 0);
  ASSERT_TRUE(sim.CopyAsync(back.data(), *d, 1 << 20, *s).ok());
  ASSERT_TRUE(sim.RecordEvent(*e, *s).ok());
  // (Not read here while queued: the stream's thread writes `back` meanwhile.)
  ASSERT_TRUE(sim.EventSynchronize(*e).ok());
  EXPECT_EQ(back[0], 0xab);
  EXPECT_EQ(back[(1 << 20) - 1], 0xab);
  EXPECT_GE(sim.max_stream_depth.load(), 2);
  // An injected failure surfaces at the next event; later copies work again.
  sim.async_delay_us = 0;
  sim.fail_after_copies = 0;
  ASSERT_TRUE(sim.CopyAsync(*d, hp, 16, *s).ok());
  ASSERT_TRUE(sim.RecordEvent(*e, *s).ok());
  Status st = sim.EventSynchronize(*e);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("injected"), std::string::npos);
  sim.fail_after_copies = -1;
  ASSERT_TRUE(sim.CopyAsync(*d, hp, 16, *s).ok());
  ASSERT_TRUE(sim.RecordEvent(*e, *s).ok());
  EXPECT_TRUE(sim.EventSynchronize(*e).ok());
  sim.DestroyEvent(*e);
  sim.DestroyStream(*s);
  EXPECT_TRUE(sim.FreeHost(hp).ok());
  EXPECT_TRUE(sim.Free(*d).ok());
}

TEST(SimBackend, OwnIpcHandlesCannotBeOpenedAsInCuda) {
  SimDeviceBackend sim(1);
  auto d = sim.Malloc(0, 8192);
  ASSERT_TRUE(d.ok());
  auto ex = sim.IpcExportRange(static_cast<uint8_t*>(*d) + 4096);
  ASSERT_TRUE(ex.ok());
  EXPECT_EQ(ex->offset, 4096u);
  EXPECT_FALSE(sim.IpcOpen(ex->handle, 0).ok());
  int x = 0;
  EXPECT_FALSE(sim.IpcExportRange(&x).ok()) << "host memory has no handle";
  EXPECT_TRUE(sim.Free(*d).ok());
}

}  // namespace
}  // namespace mooncake::platform
