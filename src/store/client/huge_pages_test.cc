// MC_STORE_USE_HUGEPAGE: the environment's reading, and a Store client's segment and local
// buffer on HugeTLB pages against an in-process master. The tests that need a pool of huge
// pages reserve one (root: /proc/sys/vm/nr_hugepages) and give it back; without root they
// skip.
#include "store/client/huge_pages.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "mooncake/store/store_client.h"
#include "store/testing/client_fixture.h"
#include "store/testing/in_process_master.h"

namespace mooncake {
namespace store {
namespace {

constexpr uint64_t MiB = 1 << 20;

struct Env {
  Env(const char* use, const char* size) {
    Set("MC_STORE_USE_HUGEPAGE", use);
    Set("MC_STORE_HUGEPAGE_SIZE", size);
  }
  ~Env() {
    unsetenv("MC_STORE_USE_HUGEPAGE");
    unsetenv("MC_STORE_HUGEPAGE_SIZE");
  }
  static void Set(const char* name, const char* v) {
    if (v) {
      setenv(name, v, 1);
    } else {
      unsetenv(name);
    }
  }
};

TEST(HugePagesEnv, OffUnlessAskedThenTwoMegabytesOrAGigabyte) {
  EXPECT_EQ((Env(nullptr, "1GB"), HugePageSizeFromEnv()), 0u);
  for (const char* off : {"", "0", "false", "No", "OFF"}) {
    Env e(off, nullptr);
    EXPECT_EQ(HugePageSizeFromEnv(), 0u) << off;
  }
  for (const char* on : {"1", "true", "yes"}) {
    Env e(on, nullptr);
    EXPECT_EQ(HugePageSizeFromEnv(), 2 * MiB) << on;
  }
  for (const char* two : {"2MB", "2mb", "2M", "2MiB", "2097152"}) {
    Env e("1", two);
    EXPECT_EQ(HugePageSizeFromEnv(), 2 * MiB) << two;
  }
  for (const char* one : {"1GB", "1g", "1GiB", "1073741824"}) {
    Env e("1", one);
    EXPECT_EQ(HugePageSizeFromEnv(), 1024 * MiB) << one;
  }
  Env bad("1", "4KB");  // upstream's answer: a warning, and 2MB
  EXPECT_EQ(HugePageSizeFromEnv(), 2 * MiB);
}

TEST(HugePagesEnv, SizesRoundUpToWholePages) {
  EXPECT_EQ(RoundUpToPage(0, 2 * MiB), 0u);
  EXPECT_EQ(RoundUpToPage(1, 2 * MiB), 2 * MiB);
  EXPECT_EQ(RoundUpToPage(2 * MiB, 2 * MiB), 2 * MiB);
  EXPECT_EQ(RoundUpToPage(33 * MiB, 2 * MiB), 34 * MiB);
  EXPECT_EQ(RoundUpToPage(33 * MiB, 0), 33 * MiB);
}

// A "Name: value ..." field of a /proc file.
uint64_t ProcField(const char* file, const std::string& field) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::strtoull(line.c_str() + field.size() + 1, nullptr, 10);
  }
  return 0;
}
uint64_t Meminfo(const std::string& field) { return ProcField("/proc/meminfo", field); }
// Huge pages this process maps (kB): other processes of the machine do not move it.
uint64_t OursKb() { return ProcField("/proc/self/status", "HugetlbPages"); }

// Reserves kPages more 2 MiB huge pages for the test and gives them back after. One such
// test at a time on the machine (ctest runs tests in parallel): a lock file.
class HugePool : public ::testing::Test {
 protected:
  void SetUp() override {
    lock_ = ::open("/tmp/mooncake-hugepage-tests.lock", O_CREAT | O_RDWR | O_CLOEXEC, 0666);
    if (lock_ >= 0) (void)::flock(lock_, LOCK_EX);
    std::ifstream in(kKnob);
    if (!(in >> before_)) GTEST_SKIP() << "no " << kKnob;
    if (!Write(before_ + kPages) || Meminfo("HugePages_Free") < kPages) {
      Write(before_);
      GTEST_SKIP() << "cannot reserve " << kPages << " huge pages (needs root and free memory)";
    }
    reserved_ = true;
  }
  void TearDown() override {
    if (reserved_) Write(before_);
    if (lock_ >= 0) ::close(lock_);  // and the lock with it
  }
  static bool Write(uint64_t n) {
    std::ofstream out(kKnob);
    out << n;
    out.flush();
    return static_cast<bool>(out);
  }
  static constexpr const char* kKnob = "/proc/sys/vm/nr_hugepages";
  static constexpr uint64_t kPages = 40;
  uint64_t before_ = 0;
  bool reserved_ = false;
  int lock_ = -1;
  std::shared_ptr<testing::InProcessMaster> master_ = std::make_shared<testing::InProcessMaster>();
};

TEST_F(HugePool, TheSegmentAndTheLocalBufferLiveOnHugePagesAndMoveBytesExactly) {
  ASSERT_EQ(OursKb(), 0u);
  std::unique_ptr<StoreClient> holder;
  {
    Env e("1", "2MB");
    holder = testing::MakeClient(master_, 33 * MiB, 8 * MiB);  // 17 + 4 pages
  }
  ASSERT_TRUE(holder);
  auto user = testing::MakeClient(master_, 0);  // ordinary pages
  ASSERT_TRUE(user);
  std::vector<std::vector<char>> values;
  for (int i = 0; i < 12; ++i) {
    values.push_back(testing::Bytes(2 * MiB + 4096 * i + 7, 40 + i));
    const auto& v = values.back();
    ASSERT_EQ(user->Put("hp" + std::to_string(i), {{const_cast<char*>(v.data()), v.size()}},
                        ReplicateConfig()),
              0);
  }
  for (int i = 0; i < 12; ++i) {
    for (StoreClient* c : {user.get(), holder.get()}) {
      std::vector<char> back(values[i].size());
      EXPECT_EQ(c->Get("hp" + std::to_string(i), {{back.data(), back.size()}}),
                static_cast<int64_t>(back.size()));
      EXPECT_EQ(back, values[i]) << "object " << i;
    }
  }
  // The holder's segment is on huge pages (34 MiB: rounded up to whole pages; the user's
  // mapping of it counts again).
  EXPECT_GE(OursKb(), 34u << 10);
  user.reset();
  holder.reset();
  EXPECT_EQ(OursKb(), 0u) << "every huge page unmapped";
}

TEST_F(HugePool, ADummyClientsSharedPoolIsOnHugePagesToo) {
  ASSERT_EQ(OursKb(), 0u);
  Env e("1", "2MB");
  auto c = testing::MakeClient(master_, 0, 0);  // no segment, no local buffer
  ASSERT_TRUE(c);
  auto* pool = static_cast<char*>(c->AllocateSharedBuffer(3 * MiB));  // 2 pages
  ASSERT_NE(pool, nullptr);
  std::memset(pool, 0x5A, 3 * MiB);
  EXPECT_EQ(OursKb(), 4u << 10) << "two pages of 2 MiB";
  c.reset();
  EXPECT_EQ(OursKb(), 0u) << "freed with the client";
}

TEST_F(HugePool, TooFewFreeHugePagesFailSetupAndSaySo) {
  const uint64_t free_pages = Meminfo("HugePages_Free");
  Env e("1", nullptr);
  StoreClientOptions o;
  o.local_hostname = "127.0.0.1";
  o.global_segment_size = (free_pages + 1) * 2 * MiB;
  o.local_buffer_size = 0;
  o.master = master_;
  int code = 0;
  std::string msg;
  auto c = StoreClient::Create(o, &code, &msg);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(code, 0);
  EXPECT_NE(msg.find("huge pages"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nr_hugepages"), std::string::npos) << msg;
  EXPECT_EQ(OursKb(), 0u) << "nothing held after the failure";
}

}  // namespace
}  // namespace store
}  // namespace mooncake
