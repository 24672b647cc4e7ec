#include "common/prefault.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace mooncake {
namespace {

constexpr size_t kMiB = 1 << 20;

// Minor faults of writing a byte into each of `pages` pages from p. (Under ASan the first
// check of a range's shadow faults too, so tests compare with a range not prefaulted.)
long MinorFaults();
long FaultsWriting(char* p, size_t pages) {
  const long before = MinorFaults();
  for (size_t i = 0; i < pages; ++i) p[i * 4096 + 1] = 7;
  return MinorFaults() - before;
}

long MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// A shared memfd mapping, as a Store segment is.
struct SharedMap {
  explicit SharedMap(size_t n) : len(n) {
    fd = ::memfd_create("prefault-test", MFD_CLOEXEC);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(n)), 0);
    p = static_cast<char*>(::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    EXPECT_NE(p, MAP_FAILED);
  }
  ~SharedMap() {
    ::munmap(p, len);
    ::close(fd);
  }
  size_t len;
  int fd = -1;
  char* p = nullptr;
};

bool Supported() {
  void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  const bool ok = ::madvise(p, 4096, 23 /* MADV_POPULATE_WRITE */) == 0;
  ::munmap(p, 4096);
  return ok;
}

TEST(Prefault, APopulatedRangeTakesNoFaultsOnFirstWriteAndKeepsItsBytes) {
  if (!Supported()) GTEST_SKIP() << "no MADV_POPULATE_WRITE on this kernel";
  const size_t n = 64 * kMiB, pages = n / 4096;
  SharedMap m(n);
  // Bytes written before the prefault (a copy that raced ahead of it) are kept.
  for (size_t i = 0; i < pages; i += 2) m.p[i * 4096] = static_cast<char>(i | 1);
  auto job = Prefaulter::Start(m.p, n, "test range");
  ASSERT_NE(job, nullptr);
  ASSERT_TRUE(Prefaulter::WaitDone(job, 30000));
  EXPECT_EQ(Prefaulter::Populated(job), n);
  SharedMap control(n);  // the same writes into a range not prefaulted
  const long faults = FaultsWriting(m.p, pages), without = FaultsWriting(control.p, pages);
  EXPECT_GE(without, static_cast<long>(pages * 9 / 10));
  EXPECT_LT(faults, without / 4) << faults << " faults on " << pages << " pages, " << without
                                 << " without the prefault";
  for (size_t i = 0; i < pages; i += 2) ASSERT_EQ(m.p[i * 4096], static_cast<char>(i | 1)) << i;
}

TEST(Prefault, CancelReturnsAtOnceAndTheRangeCanBeUnmapped) {
  if (!Supported()) GTEST_SKIP() << "no MADV_POPULATE_WRITE on this kernel";
  for (int round = 0; round < 20; ++round) {
    auto* m = new SharedMap(512 * kMiB);
    auto job = Prefaulter::Start(m->p, m->len, "cancelled range");
    ASSERT_NE(job, nullptr);
    if (round % 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const auto t0 = std::chrono::steady_clock::now();
    Prefaulter::Cancel(job);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
    delete m;  // unmapped: nothing of the job touches it any more
    ASSERT_TRUE(Prefaulter::WaitDone(job, 10000));
    EXPECT_LT(Prefaulter::Populated(job), 512 * kMiB);
    Prefaulter::Cancel(job);  // idempotent
  }
}

TEST(Prefault, JobsRunInOrderAndPrivateMemoryToo) {
  if (!Supported()) GTEST_SKIP() << "no MADV_POPULATE_WRITE on this kernel";
  const size_t n = 8 * kMiB;
  void* a = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  SharedMap b(n);
  auto ja = Prefaulter::Start(a, n, "private");
  auto jb = Prefaulter::Start(b.p, n, "shared");
  ASSERT_TRUE(Prefaulter::WaitDone(jb, 30000));
  EXPECT_TRUE(Prefaulter::WaitDone(ja, 0));  // queued first, so ended first
  EXPECT_EQ(Prefaulter::Populated(ja), n);
  ::munmap(a, n);
}

// Another process's memory: only the pages its owner has are mapped here, none allocated.
TEST(Prefault, ResidentOnlyMapsTheOwnersPagesAndAllocatesNone) {
  if (!Supported()) GTEST_SKIP() << "no MADV_POPULATE_WRITE on this kernel";
  const size_t n = 32 * kMiB, pages = n / 4096;
  SharedMap owner(n);
  for (size_t i = 0; i < pages / 2; ++i) owner.p[i * 4096] = 1;  // the owner has the first half
  char* peer = static_cast<char*>(::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, owner.fd, 0));
  ASSERT_NE(peer, MAP_FAILED);
  auto job = Prefaulter::Start(peer, n, "peer's range", Prefaulter::Mode::kResidentOnly);
  // One pass, then (pages were missing) a second one a second later: cancel after the first.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Prefaulter::Populated(job) < n && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Prefaulter::Cancel(job);
  std::vector<unsigned char> in(pages);
  ASSERT_EQ(::mincore(owner.p, n, in.data()), 0);
  size_t resident = 0;
  for (unsigned char c : in) resident += c & 1;
  EXPECT_EQ(resident, pages / 2);  // nothing allocated by the peer's prefault
  // The owner's pages are mapped in the peer's view: writing them takes (almost) no fault,
  // against one per page in a second view of the same pages that was not prefaulted.
  char* other = static_cast<char*>(::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, owner.fd, 0));
  ASSERT_NE(other, MAP_FAILED);
  const long faults = FaultsWriting(peer, pages / 2), without = FaultsWriting(other, pages / 2);
  EXPECT_GE(without, static_cast<long>(pages / 2 * 9 / 10));
  EXPECT_LT(faults, without / 4) << faults << " against " << without;
  ::munmap(other, n);
  ::munmap(peer, n);
}

// Forks while a job runs: the child gets no job (the thread is the parent's) and never finds
// the worker's mutex held by a thread it does not have.
TEST(Prefault, AForkedChildNeitherHangsNorPopulates) {
  if (!Supported()) GTEST_SKIP() << "no MADV_POPULATE_WRITE on this kernel";
  SharedMap big(256 * kMiB);
  auto job = Prefaulter::Start(big.p, big.len, "big");
  for (int i = 0; i < 50; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      char small[8192];
      auto j = Prefaulter::Start(small, sizeof(small), "child");
      Prefaulter::Cancel(job);  // the parent's job: returns at once here
      _exit(j == nullptr ? 0 : 1);
    }
    int status = 0;
    const auto t0 = std::chrono::steady_clock::now();
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        FAIL() << "a forked child hung";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  Prefaulter::Cancel(job);
}

TEST(Prefault, TurnedOffOrEmptyGivesNoJob) {
  EXPECT_EQ(Prefaulter::Start(nullptr, 4096, "null"), nullptr);
  char c;
  EXPECT_EQ(Prefaulter::Start(&c, 0, "empty"), nullptr);
  ::setenv("MC_PREFAULT", "0", 1);
  SharedMap m(kMiB);
  EXPECT_FALSE(Prefaulter::Enabled());
  EXPECT_EQ(Prefaulter::Start(m.p, m.len, "off"), nullptr);
  ::unsetenv("MC_PREFAULT");
  Prefaulter::Cancel(nullptr);
  EXPECT_TRUE(Prefaulter::WaitDone(nullptr, 0));
}

// A range that cannot be populated (here: no access; an unmapped one is the same, ENOMEM)
// ends its job with one log line; the next job runs.
TEST(Prefault, ARangeThatCannotBePopulatedEndsTheJobWithoutHarm) {
  if (!Supported()) GTEST_SKIP() << "no MADV_POPULATE_WRITE on this kernel";
  void* p = ::mmap(nullptr, 8 * kMiB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto job = Prefaulter::Start(p, 8 * kMiB, "no access");
  ASSERT_TRUE(Prefaulter::WaitDone(job, 10000));
  EXPECT_EQ(Prefaulter::Populated(job), 0u);
  SharedMap next(4 * kMiB);
  auto after = Prefaulter::Start(next.p, next.len, "next");
  ASSERT_TRUE(Prefaulter::WaitDone(after, 10000));
  EXPECT_EQ(Prefaulter::Populated(after), next.len);
  ::munmap(p, 8 * kMiB);
}

}  // namespace
}  // namespace mooncake
