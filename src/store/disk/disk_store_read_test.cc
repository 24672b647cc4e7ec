// DiskStore::ReadMany: a batch read with the next record in flight, each item on its own.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "store/disk/bucket_file.h"
#include "store/disk/disk_test_util.h"

namespace mooncake {
namespace store {
namespace {

bool DirectReadsWork(const std::string& dir) {
  const std::string path = dir + "/probe";
  { std::ofstream(path) << std::string(8192, 'p'); }
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  bool ok = false;
  if (fd >= 0) {
    void* buf = nullptr;
    if (::posix_memalign(&buf, 4096, 4096) == 0) {
      ok = ::pread(fd, buf, 4096, 0) == 4096;
      std::free(buf);
    }
    ::close(fd);
  }
  ::unlink(path.c_str());
  return ok;
}

TEST(DiskStore, ABatchReadIsByteExactInOrderAndEachItemFailsAlone) {
  TempDir d;
  if (!DirectReadsWork(d.path())) GTEST_SKIP() << "no direct reads on " << d.path();
  auto opened = DiskStore::Open(Config({d.path()}));
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  DiskStore* s = opened->get();
  ASSERT_TRUE(s->config().direct_io);
  // Bucket 1: records read directly (>= 256 KiB; one of 9 MiB, larger than a read chunk, so
  // read in its turn outside the pipeline), one small one through the page cache; bucket 2:
  // two more. Odd sizes, so that records start and end inside blocks.
  const std::vector<std::pair<std::string, size_t>> first = {
      {"k0", (300 << 10) + 7}, {"k1", (1 << 20) + 1}, {"k2", (9 << 20) + 333},
      {"k3", (1 << 20) - 5},   {"k4", 4000},          {"k5", (2 << 20) + 4097}};
  const std::vector<std::pair<std::string, size_t>> second = {{"k6", 1 << 20},
                                                              {"k7", (512 << 10) + 1}};
  std::map<std::string, std::string> vals;
  uint32_t seed = 1;
  for (const auto* set : {&first, &second}) {
    std::vector<DiskStore::Item> items;
    for (const auto& [k, n] : *set) {
      vals[k] = Value(n, seed++);
      items.push_back({k, seed, vals[k].data(), n});
    }
    ASSERT_TRUE(s->Write(items).ok());
  }
  // A byte of k3's value flipped on disk (its value ends 5 bytes short of 1 MiB past its
  // header: the last byte, in a block shared with k4's record).
  const std::vector<std::string> files = Buckets(d.path());
  ASSERT_EQ(files.size(), 2u);
  {
    std::vector<disk::RecordRef> refs;
    uint64_t size = 0;
    bool walked = false;
    uint64_t id = 0;
    ASSERT_TRUE(disk::ParseBucketName(fs::path(files[0]).filename().string(), &id));
    ASSERT_TRUE(disk::ReadBucketIndex(files[0], id, &refs, &size, &walked).ok());
    ASSERT_EQ(refs[3].key, "k3");
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t last = refs[3].offset + disk::kRecordHeaderSize + 2 + refs[3].value_len - 1;
    f.seekp(static_cast<std::streamoff>(last));
    f.put(static_cast<char>(~vals["k3"].back()));
  }
  const std::string absent = "absent";
  struct Want {
    std::string key;
    uint64_t len;
    uint64_t put_id;
    Status::Code code;
  };
  // put ids: k0..k5 are 2..7, k6 8, k7 9.
  const std::vector<Want> want = {
      {"k5", vals["k5"].size(), 7, Status::Code::kOk},   // out of file order
      {"k0", vals["k0"].size(), 2, Status::Code::kOk},
      {"k1", vals["k1"].size(), 0, Status::Code::kOk},   // any version
      {"k2", vals["k2"].size(), 4, Status::Code::kOk},
      {"k3", vals["k3"].size(), 5, Status::Code::kDataLoss},
      {"k4", vals["k4"].size(), 6, Status::Code::kOk},
      {absent, 10, 0, Status::Code::kNotFound},
      {"k6", vals["k6"].size(), 99, Status::Code::kNotFound},  // another value
      {"k7", 12, 0, Status::Code::kInvalidArgument},            // another size
      {"k7", vals["k7"].size(), 9, Status::Code::kOk},
      {"k6", vals["k6"].size(), 8, Status::Code::kOk},
      {"k1", vals["k1"].size(), 3, Status::Code::kOk},  // the same again
  };
  std::vector<std::string> out(want.size());
  std::vector<DiskStore::ReadItem> items(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    out[i].assign(want[i].len, '\xee');
    items[i].key = &want[i].key;
    items[i].dst = out[i].data();
    items[i].len = want[i].len;
    items[i].put_id = want[i].put_id;
  }
  s->ReadMany(&items);
  for (size_t i = 0; i < want.size(); ++i) {
    const std::string& k = want[i].key;
    EXPECT_EQ(items[i].status.code(), want[i].code) << i << " " << k << ": "
                                                    << items[i].status.message();
    if (want[i].code != Status::Code::kOk) continue;
    EXPECT_TRUE(out[i] == vals[k]) << i << " " << k << " is not byte-exact";
    const uint32_t crc = Crc32c(Crc32c(0, k.data(), k.size()), vals[k].data(), vals[k].size());
    EXPECT_EQ(items[i].crc, crc) << k;
  }
  // The corrupted record was dropped (and said so); the others stay readable.
  Status st;
  ReadAll(s, "k3", &st);
  EXPECT_TRUE(st.IsNotFound()) << st.message();
  EXPECT_EQ(s->stats().corrupted_reads, 1u);
  EXPECT_EQ(s->TakeDropped(), std::vector<std::string>{"k3"});
  EXPECT_TRUE(ReadAll(s, "k4") == vals["k4"]);
  EXPECT_TRUE(ReadAll(s, "k5") == vals["k5"]);
  // With the page cache only (MOONCAKE_OFFLOAD_DIRECT_IO=0) the same batch reads the same.
  opened->reset();
  DiskConfig buffered = Config({d.path()});
  buffered.direct_io = false;
  auto again = DiskStore::Open(buffered);
  ASSERT_TRUE(again.ok()) << again.status().message();
  for (auto& it : items) {
    it.status = Status::OK();
    it.crc = 0;
  }
  for (auto& o : out) std::fill(o.begin(), o.end(), '\xee');
  (*again)->ReadMany(&items);
  for (size_t i = 0; i < want.size(); ++i) {
    const Status::Code code = want[i].key == "k3" ? Status::Code::kNotFound : want[i].code;
    EXPECT_EQ(items[i].status.code(), code) << i << " " << want[i].key;
    if (code == Status::Code::kOk) {
      EXPECT_TRUE(out[i] == vals[want[i].key]) << want[i].key;
    }
  }
}

// A batch naming many buckets never holds more than a few of their files open at once: a
// reader's 4096 keys in 4096 buckets must not take the owner past its limit on open files
// (which would fail its reads, and its sockets beside).
TEST(DiskStore, ABatchOverManyBucketsKeepsFewFilesOpen) {
  TempDir d;
  auto opened = DiskStore::Open(Config({d.path()}));
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  DiskStore* s = opened->get();
  constexpr int kBuckets = 120;
  std::vector<std::string> keys, vals;
  for (int i = 0; i < kBuckets; ++i) {
    keys.push_back("m" + std::to_string(i));
    vals.push_back(Value(i % 2 ? 4000 + i : (300 << 10) + i, 100 + i));  // direct and not
    ASSERT_TRUE(s->Write({{keys[i], uint64_t(i + 1), vals[i].data(), vals[i].size()}}).ok());
  }
  ASSERT_EQ(Buckets(d.path()).size(), static_cast<size_t>(kBuckets));
  size_t open_now = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++open_now;
  }
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &before), 0);
  rlimit low = before;
  low.rlim_cur = open_now + 48;  // room for a few dozen, not for 120
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<std::string> out(kBuckets);
  std::vector<DiskStore::ReadItem> items(kBuckets);
  for (int i = 0; i < kBuckets; ++i) {
    out[i].assign(vals[i].size(), '\0');
    items[i].key = &keys[i];
    items[i].dst = out[i].data();
    items[i].len = vals[i].size();
  }
  s->ReadMany(&items);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &before), 0);
  for (int i = 0; i < kBuckets; ++i) {
    ASSERT_TRUE(items[i].status.ok()) << keys[i] << ": " << items[i].status.message();
    EXPECT_TRUE(out[i] == vals[i]) << keys[i];
  }
}

}  // namespace
}  // namespace store
}  // namespace mooncake
