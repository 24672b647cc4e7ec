// StoreClient with device memory (CUDA tensors, NPU memory) as the caller's buffers, on
// simulated devices (platform/device_backends.h): their memory is mapped PROT_NONE, so any
// path that touched it with the CPU (a memcpy from the client's own segment, its staging
// buffer or its hot cache) would fault here. Every path a put or a get can take is crossed:
// the own segment, staged through the local buffer (in several chunks), registered memory
// moved by the engine, ranged reads and the hot cache.
// With MC_STORE_DEVICE_TEST_REAL=1 the same tests run on the real backend (a GPU: ctest's
// store_client_device_gpu.* cases, scripts/gpu_check.sh), and skip where none is usable.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mooncake/store/error_code.h"
#include "mooncake/store/store_client.h"
#include "platform/device.h"
#include "platform/device_backends.h"
#include "store/client/device_copy.h"
#include "store/testing/client_fixture.h"
#include "store/testing/in_process_master.h"

namespace mooncake {
namespace store {
namespace {

using testing::InProcessMaster;
constexpr uint64_t MiB = 1 << 20;

using testing::Bytes;

bool RealDevices() {
  const char* v = getenv("MC_STORE_DEVICE_TEST_REAL");
  return v != nullptr && std::string(v) == "1";
}

platform::SimDeviceBackend* Sim() {
  return dynamic_cast<platform::SimDeviceBackend*>(&platform::Devices());
}

// Device memory holding `v` (or zeros when v is empty and n is given).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    auto p = platform::Devices().Malloc(0, n);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    p_ = p.ok() ? static_cast<char*>(*p) : nullptr;
  }
  explicit DeviceBuffer(const std::vector<char>& v) : DeviceBuffer(v.size()) {
    EXPECT_TRUE(platform::Devices().Copy(p_, v.data(), v.size()).ok());
  }
  ~DeviceBuffer() {
    if (p_) (void)platform::Devices().Free(p_);
  }
  char* get() const { return p_; }
  size_t size() const { return n_; }
  std::vector<char> Read() const {
    std::vector<char> v(n_);
    EXPECT_TRUE(platform::Devices().Copy(v.data(), p_, n_).ok());
    return v;
  }

 private:
  size_t n_;
  char* p_ = nullptr;
};

class StoreClientDeviceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!RealDevices()) platform::UseSimulatedDevicesForTesting(1);
  }
  void SetUp() override {
    if (!DeviceMemoryPossible()) {
      GTEST_SKIP() << "no usable device: " << platform::Devices().Available().ToString();
    }
  }

  std::unique_ptr<StoreClient> Client(uint64_t segment, uint64_t local = 16 * MiB) {
    return testing::MakeClient(master_, segment, local);
  }
  int Put(StoreClient* c, const std::string& key, const DeviceBuffer& d) {
    return c->Put(key, {{d.get(), d.size()}}, ReplicateConfig());
  }
  // The object read into fresh device memory, and back to the host for the comparison.
  std::vector<char> Get(StoreClient* c, const std::string& key, int64_t* rc) {
    const int64_t n = c->GetSize(key);
    DeviceBuffer out(n > 0 ? n : 1);
    *rc = c->Get(key, {{out.get(), static_cast<size_t>(n > 0 ? n : 0)}});
    auto v = out.Read();
    v.resize(n > 0 ? n : 0);
    return v;
  }

  std::shared_ptr<InProcessMaster> master_ = std::make_shared<InProcessMaster>();
};

TEST_F(StoreClientDeviceTest, TheDeviceIsInUse) {
  EXPECT_EQ(Sim() == nullptr, RealDevices()) << platform::Devices().name();
  EXPECT_TRUE(DeviceMemoryPossible());
  DeviceBuffer d(4096);
  std::vector<char> host(16);
  EXPECT_TRUE(IsDeviceMemory(d.get()));
  EXPECT_FALSE(IsDeviceMemory(host.data()));
  auto v = Bytes(4096, 1);
  ASSERT_TRUE(CopyBytes(d.get(), v.data(), v.size()).ok());
  EXPECT_EQ(d.Read(), v);
}

TEST_F(StoreClientDeviceTest, UnregisteredDeviceMemoryThroughTheOwnSegmentAndTheStagingBuffer) {
  auto holder = Client(64 * MiB);
  auto user = Client(0, 8 * MiB);  // 4 MiB chunks: the 9 MiB object takes several rounds
  ASSERT_TRUE(holder && user);
  int64_t rc = 0;
  // The holder's own segment: its copies are device copies, not memcpy.
  auto a = Bytes(100000, 2);
  ASSERT_EQ(Put(holder.get(), "a", DeviceBuffer(a)), 0);
  EXPECT_EQ(Get(holder.get(), "a", &rc), a);
  EXPECT_EQ(rc, static_cast<int64_t>(a.size()));
  // The user lends nothing: staged through its local buffer both ways.
  auto b = Bytes(9 * MiB + 5, 3);
  ASSERT_EQ(Put(user.get(), "b", DeviceBuffer(b)), 0);
  EXPECT_EQ(Get(user.get(), "b", &rc), b);
  EXPECT_EQ(rc, static_cast<int64_t>(b.size()));
  EXPECT_EQ(Get(holder.get(), "b", &rc), b);
  EXPECT_EQ(Get(user.get(), "a", &rc), a);
  // A value in two parts, one on the device and one on the host.
  auto h = Bytes(5000, 4);
  DeviceBuffer d(a);
  ASSERT_EQ(user->Put("mixed", {{d.get(), d.size()}, {h.data(), h.size()}}, ReplicateConfig()),
            0);
  auto both = a;
  both.insert(both.end(), h.begin(), h.end());
  EXPECT_EQ(Get(holder.get(), "mixed", &rc), both);
}

TEST_F(StoreClientDeviceTest, RegisteredDeviceMemoryIsMovedByTheEngineAsDeviceMemory) {
  auto holder = Client(64 * MiB);
  auto user = Client(0);
  ASSERT_TRUE(holder && user);
  auto v = Bytes(3 * MiB + 1, 5);
  DeviceBuffer src(v), dst(v.size());
  ASSERT_EQ(user->RegisterBuffer(src.get(), src.size(), false), 0);
  ASSERT_EQ(user->RegisterBuffer(dst.get(), dst.size(), false), 0);
  auto copies = [] { return Sim() ? Sim()->sync_copies + Sim()->async_copies : 0; };
  const uint64_t before = copies();
  ASSERT_EQ(Put(user.get(), "r", src), 0);
  EXPECT_EQ(user->Get("r", {{dst.get(), dst.size()}}), static_cast<int64_t>(v.size()));
  EXPECT_EQ(dst.Read(), v);
  if (Sim()) {
    EXPECT_GT(copies(), before);  // moved by device copies
  }
  // Ranges of an object, into registered and unregistered device memory.
  DeviceBuffer part(1000);
  auto r = user->GetRanges({"r"}, {{0, 17, {dst.get(), 4096}}, {0, MiB, {part.get(), 1000}}});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], 4096);
  EXPECT_EQ(r[1], 1000);
  EXPECT_EQ(std::memcmp(dst.Read().data(), v.data() + 17, 4096), 0);
  EXPECT_EQ(part.Read(), std::vector<char>(v.begin() + MiB, v.begin() + MiB + 1000));
  EXPECT_EQ(user->UnregisterBuffer(src.get()), 0);
  EXPECT_EQ(user->UnregisterBuffer(dst.get()), 0);
}

TEST_F(StoreClientDeviceTest, TheHotCacheFillsFromAndServesIntoDeviceMemory) {
  auto holder = Client(64 * MiB);
  setenv("MC_STORE_LOCAL_HOT_CACHE_SIZE", "4000000", 1);
  setenv("MC_STORE_LOCAL_HOT_BLOCK_SIZE", "1000000", 1);
  auto reader = Client(0);
  unsetenv("MC_STORE_LOCAL_HOT_CACHE_SIZE");
  unsetenv("MC_STORE_LOCAL_HOT_BLOCK_SIZE");
  ASSERT_TRUE(holder && reader);
  ASSERT_TRUE(reader->GetHotCacheStats().enabled);
  auto v = Bytes(300000, 6);
  std::vector<char> host = v;
  ASSERT_EQ(holder->Put("k", {{host.data(), host.size()}}, ReplicateConfig()), 0);
  int64_t rc = 0;
  EXPECT_EQ(Get(reader.get(), "k", &rc), v);
  EXPECT_EQ(reader->GetHotCacheStats().fills, 1u);
  EXPECT_EQ(Get(reader.get(), "k", &rc), v);
  EXPECT_EQ(reader->GetHotCacheStats().hits, 1u);
}

TEST_F(StoreClientDeviceTest, AFailedDeviceCopyFailsTheCallAndLosesNothing) {
  if (!Sim()) GTEST_SKIP() << "failures are injected on simulated devices only";
  auto holder = Client(64 * MiB);
  auto user = Client(0);
  ASSERT_TRUE(holder && user);
  auto v = Bytes(200000, 7);
  DeviceBuffer d(v);
  Sim()->fail_after_copies = 0;  // every device copy fails from now on
  EXPECT_LT(Put(user.get(), "k", d), 0);
  EXPECT_LT(Put(holder.get(), "k", d), 0);
  Sim()->fail_after_copies = -1;
  EXPECT_EQ(holder->GetSize("k"), ToInt(ErrorCode::OBJECT_NOT_FOUND));  // no half-written put
  ASSERT_EQ(Put(user.get(), "k", d), 0);
  DeviceBuffer out(v.size());
  Sim()->fail_after_copies = 0;
  EXPECT_LT(user->Get("k", {{out.get(), out.size()}}), 0);
  Sim()->fail_after_copies = -1;
  int64_t rc = 0;
  EXPECT_EQ(Get(user.get(), "k", &rc), v);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
