// IoHelper: a kept helper thread, one job at a time, stopped when idle.
#include "store/disk/io_helper.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>

#include "store/disk/bucket_file.h"
#include "store/disk/disk_test_util.h"

namespace mooncake {
namespace store {
namespace disk {
namespace {

using std::chrono::milliseconds;

size_t ThreadsOfThisProcess() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

// Polls `ok` for up to 5 s.
template <class F>
bool Eventually(F ok) {
  for (int i = 0; i < 500 && !ok(); ++i) std::this_thread::sleep_for(milliseconds(10));
  return ok();
}

TEST(IoHelper, RunsJobsOnOneOtherThreadKeptBetweenThem) {
  IoHelper h;
  std::thread::id first, second;
  ASSERT_TRUE(h.Post([&] { first = std::this_thread::get_id(); }));
  h.Wait();
  ASSERT_TRUE(h.Post([&] { second = std::this_thread::get_id(); }));
  h.Wait();
  EXPECT_NE(first, std::this_thread::get_id());
  EXPECT_EQ(first, second) << "the helper thread is kept between jobs, not started per job";
  // Another thread may use it after its owner (as Close's final flush after the worker).
  std::thread::id third;
  std::thread([&] {
    EXPECT_TRUE(h.Post([&] { third = std::this_thread::get_id(); }));
    h.Wait();
  }).join();
  EXPECT_EQ(third, first);
}

TEST(IoHelper, APostWaitsForThePreviousJobAndWaitSeesWhatTheJobWrote) {
  IoHelper h;
  int value = 0;  // plain memory: ordered by Post and Wait alone
  int seen_by_second = -1;
  ASSERT_TRUE(h.Post([&] {
    std::this_thread::sleep_for(milliseconds(50));
    value = 1;
  }));
  ASSERT_TRUE(h.Post([&] { seen_by_second = value; }));  // once the first has ended
  EXPECT_EQ(value, 1);
  h.Wait();
  EXPECT_EQ(seen_by_second, 1);
  h.Wait();  // nothing posted: returns at once

  long sum = 0;
  for (int i = 1; i <= 2000; ++i) ASSERT_TRUE(h.Post([&sum, i] { sum += i; }));
  h.Wait();
  EXPECT_EQ(sum, 2000L * 2001 / 2);
}

TEST(IoHelper, StopsWhenIdleAndStartsAgainForTheNextJob) {
  const size_t before = ThreadsOfThisProcess();
  IoHelper h(milliseconds(50));
  EXPECT_FALSE(h.running()) << "no thread before the first job";
  std::thread::id first, second;
  ASSERT_TRUE(h.Post([&] { first = std::this_thread::get_id(); }));
  h.Wait();
  EXPECT_TRUE(h.running());
  EXPECT_TRUE(Eventually([&] { return !h.running(); })) << "the idle helper did not stop";
  EXPECT_TRUE(Eventually([&] { return ThreadsOfThisProcess() == before; }));
  ASSERT_TRUE(h.Post([&] { second = std::this_thread::get_id(); }));
  h.Wait();
  EXPECT_NE(second, std::thread::id());
  EXPECT_NE(second, std::this_thread::get_id());
  // A job posted just as the helper stops idle still runs: many short pauses around the
  // idle time.
  int ran = 0;
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(milliseconds(45 + i % 10));
    ASSERT_TRUE(h.Post([&] { ++ran; }));
    h.Wait();
  }
  EXPECT_EQ(ran, 20);
}

TEST(IoHelper, ItsThreadEndsWithItAfterTheJobInFlight) {
  const size_t before = ThreadsOfThisProcess();
  std::atomic<bool> ran{false};
  {
    IoHelper h;
    ASSERT_TRUE(h.Post([&] {
      std::this_thread::sleep_for(milliseconds(20));
      ran = true;
    }));
    EXPECT_EQ(ThreadsOfThisProcess(), before + 1);
  }  // destroyed with the job perhaps still running: it waits for it, then stops the thread
  EXPECT_TRUE(ran.load());
  EXPECT_EQ(ThreadsOfThisProcess(), before) << "the helper thread outlived its IoHelper";
}

// A chunk write the helper thread gets refused is not lost: RLIMIT_FSIZE set to the bucket
// file's own size refuses the direct write of its padded last chunk (EINVAL: the kernel cuts
// it short, and a direct write must be whole blocks), the bucket goes through the page cache
// instead (WriteBucket's fallback), and every byte reads back. Were the helper's errno
// dropped, the file would be cut to its size with the last chunk missing.
TEST(IoHelper, AChunkWriteRefusedOnTheHelperIsNotLost) {
  TempDir d;
  auto opened = DiskStore::Open(Config({d.path()}));
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  DiskStore* s = opened->get();
  IoHelper h;
  const std::string big = Value((20 << 20) + 1000, 1);  // three 8 MiB chunks
  const uint64_t file_size = BucketFileSize({BucketItem{"big", 1, big.data(), big.size()}});
  ASSERT_NE(file_size % 4096, 0u) << "the last chunk must be padded past the file's end";
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* prev = std::signal(SIGXFSZ, SIG_IGN);
  rlimit cap = old;
  cap.rlim_cur = file_size;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &cap), 0);
  Status st = s->Write({{"big", 1, big.data(), big.size()}}, &h);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, prev);
  ASSERT_TRUE(st.ok()) << st.message();
  Status read;
  EXPECT_TRUE(ReadAll(s, "big", &read) == big) << read.message();
  // The same helper writes the next bucket.
  const std::string other = Value(9 << 20, 2);
  ASSERT_TRUE(s->Write({{"other", 2, other.data(), other.size()}}, &h).ok());
  EXPECT_TRUE(ReadAll(s, "other") == other);
}

}  // namespace
}  // namespace disk
}  // namespace store
}  // namespace mooncake
