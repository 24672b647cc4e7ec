#include "store/disk/disk_store.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>

#include "store/disk/bucket_file.h"
#include "store/disk/disk_test_util.h"

namespace mooncake {
namespace store {
namespace {

// --- settings --------------------------------------------------------------------------------

TEST(DiskConfig, ReadsUpstreamsVariablesAndAliases) {
  TempDir d;
  std::map<std::string, std::string> env = {
      {"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", d.sub("a") + ":" + d.sub("b")},
      {"MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "1048576"},
      {"MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT", "77"},
      {"MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "10"},
      {"MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES", "10485760"},
      {"MOONCAKE_BUCKET_EVICTION_POLICY", "LRU"},
      {"MOONCAKE_DISK_EVICTION_HIGH_WATERMARK_RATIO", "0.7"},
      {"MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO", "0.5"},
      {"MOONCAKE_OFFLOAD_FSYNC", "none"},
      {"MOONCAKE_OFFLOAD_DIRECT_IO", "0"},
  };
  auto get = [&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto c = DiskConfig::FromEnvironment("", get);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->roots.size(), 2u);
  EXPECT_EQ(c->total_size_limit, 1048576u);
  EXPECT_EQ(c->total_keys_limit, 77u);
  EXPECT_EQ(c->bucket_keys_limit, 10u);
  EXPECT_EQ(c->eviction_policy, DiskEvictionPolicy::kLru);
  EXPECT_DOUBLE_EQ(c->high_watermark, 0.7);
  EXPECT_DOUBLE_EQ(c->low_watermark, 0.5);
  EXPECT_EQ(c->fsync, DiskFsyncPolicy::kNone);
  EXPECT_FALSE(c->direct_io);

  // The argument wins over the variable.
  auto c2 = DiskConfig::FromEnvironment(d.sub("c"), get);
  ASSERT_TRUE(c2.ok());
  ASSERT_EQ(c2->roots.size(), 1u);
  EXPECT_EQ(c2->roots[0], d.path() + "/c");

  // Defaults.
  auto c3 = DiskConfig::FromEnvironment(d.sub("c"), [](const char*) { return nullptr; });
  ASSERT_TRUE(c3.ok());
  EXPECT_EQ(c3->total_size_limit, 2ull << 40);
  EXPECT_EQ(c3->bucket_keys_limit, 500u);
  EXPECT_EQ(c3->eviction_policy, DiskEvictionPolicy::kFifo);
  EXPECT_EQ(c3->fsync, DiskFsyncPolicy::kBucket);
  EXPECT_TRUE(c3->direct_io);
}

TEST(DiskConfig, BadValuesAreRefusedNamingTheVariable) {
  TempDir d;
  const std::string ok = d.sub("ok");
  auto with = [&](const std::string& name, const std::string& value) {
    return DiskConfig::FromEnvironment(ok, [&](const char* n) -> const char* {
      return name == n ? value.c_str() : nullptr;
    });
  };
  for (auto [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT", "0"},
           {"MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "-5"},
           {"MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "ten"},
           {"MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", "random"},
           {"MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO", "1.5"},
           {"MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO", "0.95"},
           {"MOONCAKE_OFFLOAD_USE_URING", "maybe"},
           {"MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR", "nvme_kv_storage_backend"},
           {"MOONCAKE_OFFLOAD_FSYNC", "always"},
           {"MOONCAKE_OFFLOAD_DIRECT_IO", "sometimes"}}) {
    auto c = with(name, value);
    ASSERT_FALSE(c.ok()) << name << "=" << value;
    EXPECT_NE(c.status().message().find(name.find("LOW_WATERMARK") != std::string::npos
                                            ? "watermark"
                                            : name),
              std::string::npos)
        << c.status().message();
  }
  EXPECT_TRUE(with("MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR", "file_per_key_storage_backend").ok());
}

TEST(DiskConfig, BadDirectoriesAreRefusedNamingThem) {
  TempDir d;
  const std::string dir = d.sub("dir");
  std::ofstream(d.path() + "/file") << "x";
  fs::create_directory_symlink(dir, d.path() + "/link");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"relative/dir", "absolute"},
      {dir + "/../dir", ".."},
      {d.path() + "/missing", "create it"},
      {d.path() + "/file", "not a directory"},
      {d.path() + "/link", "symbolic link"},
      {dir + ":" + dir, "twice"},
  };
  for (const auto& [path, why] : cases) {
    auto c = DiskConfig::FromEnvironment(path, [](const char*) { return nullptr; });
    ASSERT_FALSE(c.ok()) << path;
    EXPECT_NE(c.status().message().find(why), std::string::npos) << c.status().message();
  }
  if (::geteuid() != 0) {
    const std::string ro = d.sub("ro");
    ::chmod(ro.c_str(), 0555);
    EXPECT_FALSE(CheckRoot(ro).ok());
  }
}

// --- bucket files ----------------------------------------------------------------------------

TEST(BucketFile, ADirectWriteLeavesTheSameFileAsOneThroughThePageCache) {
  // O_DIRECT gathers the pieces into aligned 8 MiB chunks and pads the last: the file must
  // still end where the format says (its trailer last), byte for byte as the buffered one but
  // for the file header's id, time and CRC.
  TempDir d;
  const std::vector<std::string> keys = {"a", "big", "c"};
  std::vector<std::string> vals = {Value(5000, 4), Value((9 << 20) + 123, 5), Value(333, 6)};
  std::vector<disk::BucketItem> items;
  for (size_t i = 0; i < keys.size(); ++i) items.push_back({keys[i], i + 1, vals[i].data(), vals[i].size()});
  std::vector<disk::RecordRef> refs;
  uint64_t buffered = 0, direct = 0;
  ASSERT_TRUE(disk::WriteBucket(d.path(), 1, items, true, &refs, &buffered, false).ok());
  ASSERT_TRUE(disk::WriteBucket(d.path(), 2, items, true, &refs, &direct, true).ok());
  ASSERT_EQ(buffered, direct);
  auto read = [&](uint64_t id) {
    std::ifstream f(d.path() + "/" + disk::BucketName(id), std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  std::string a = read(1), b = read(2);
  ASSERT_EQ(a.size(), buffered);
  ASSERT_EQ(b.size(), direct);
  for (std::string* f : {&a, &b}) {
    std::fill(f->begin() + 16, f->begin() + 32, '\0');
    std::fill(f->begin() + 60, f->begin() + 64, '\0');
  }
  EXPECT_TRUE(a == b);
  std::vector<disk::RecordRef> got;
  uint64_t fsz = 0;
  bool walked = true;
  ASSERT_TRUE(disk::ReadBucketIndex(d.path() + "/" + disk::BucketName(2), 2, &got, &fsz, &walked).ok());
  EXPECT_FALSE(walked);
  ASSERT_EQ(got.size(), keys.size());
  const std::string path = d.path() + "/" + disk::BucketName(2);
  const int fd = ::open(path.c_str(), O_RDONLY);
  const int dfd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  ASSERT_GE(dfd, 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    std::string v(got[i].value_len, '\0');
    ASSERT_TRUE(disk::ReadRecord(fd, got[i], v.data()).ok());
    EXPECT_TRUE(v == vals[i]) << keys[i];
    // Directly too (the 9 MiB value spans two of the reader's chunks), byte-exact.
    std::string w(got[i].value_len, '\1');
    Status st = disk::ReadRecordDirect(dfd, got[i], w.data());
    if (st.code() == Status::Code::kInvalidArgument) GTEST_SKIP() << "no direct reads here";
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_TRUE(w == vals[i]) << keys[i];
  }
  // A byte of the big value flipped: the direct read says so, as the buffered one does.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(got[1].offset + 32 + 3 + (8 << 20) + 5));
    f.put(static_cast<char>(~vals[1][(8 << 20) + 5]));
  }
  std::string w(got[1].value_len, '\0');
  EXPECT_EQ(disk::ReadRecordDirect(dfd, got[1], w.data()).code(), Status::Code::kDataLoss);
  EXPECT_EQ(disk::ReadRecord(fd, got[1], w.data()).code(), Status::Code::kDataLoss);
  // Cut short: the last record ends past the file.
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(got[2].offset + 40)), 0);
  EXPECT_EQ(disk::ReadRecordDirect(dfd, got[2], w.data()).code(), Status::Code::kDataLoss);
  ::close(dfd);
  ::close(fd);
}

TEST(BucketFile, WritesReadsAndWalksWhenTheIndexIsDamaged) {
  TempDir d;
  const std::vector<std::string> keys = {"a", "key-two", std::string(4096, 'k')};
  std::vector<std::string> vals = {Value(0, 1), Value(1000, 2), Value(70000, 3)};
  std::vector<disk::BucketItem> items;
  for (size_t i = 0; i < keys.size(); ++i) items.push_back({keys[i], i + 10, vals[i].data(), vals[i].size()});
  std::vector<disk::RecordRef> refs;
  uint64_t size = 0;
  ASSERT_TRUE(disk::WriteBucket(d.path(), 7, items, true, &refs, &size).ok());
  const std::string path = d.path() + "/" + disk::BucketName(7);
  EXPECT_EQ(fs::file_size(path), size);
  EXPECT_EQ(size, disk::BucketFileSize(items));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  for (bool damage : {false, true}) {
    if (damage) {  // the trailer's last byte: the index is not trusted, the records are walked
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(size - 1));
      f.put('\x55');
    }
    std::vector<disk::RecordRef> got;
    uint64_t fsz = 0;
    bool walked = false;
    ASSERT_TRUE(disk::ReadBucketIndex(path, 7, &got, &fsz, &walked).ok());
    EXPECT_EQ(walked, damage);
    ASSERT_EQ(got.size(), keys.size());
    const int fd = ::open(path.c_str(), O_RDONLY);
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(got[i].key, keys[i]);
      EXPECT_EQ(got[i].put_id, i + 10);
      std::string v(got[i].value_len, '\0');
      ASSERT_TRUE(disk::ReadRecord(fd, got[i], v.data()).ok());
      EXPECT_EQ(v, vals[i]);
    }
    ::close(fd);
  }
  // Another bucket's id, or a damaged file header: not a bucket.
  std::vector<disk::RecordRef> got;
  uint64_t fsz = 0;
  bool walked = false;
  EXPECT_EQ(disk::ReadBucketIndex(path, 8, &got, &fsz, &walked).code(), Status::Code::kDataLoss);
}

// --- the store -------------------------------------------------------------------------------

TEST(DiskStore, ObjectsSurviveARestartAndRemovalsStayRemoved) {
  TempDir d;
  const std::string root = d.sub("r");
  std::map<std::string, std::string> want;
  std::string first_id;
  {
    auto s = DiskStore::Open(Config({root}));
    ASSERT_TRUE(s.ok()) << s.status().message();
    first_id = (*s)->id();
    EXPECT_EQ(first_id.size(), 32u);
    for (int b = 0; b < 4; ++b) {
      std::vector<std::string> vals;
      std::vector<DiskStore::Item> items;
      for (int i = 0; i < 5; ++i) vals.push_back(Value(1000 + 4096 * i, b * 10 + i));
      for (int i = 0; i < 5; ++i) {
        const std::string k = "k" + std::to_string(b) + "_" + std::to_string(i);
        items.push_back({k, uint64_t(b * 10 + i), vals[i].data(), vals[i].size()});
        want[k] = vals[i];
      }
      ASSERT_TRUE((*s)->Write(items).ok());
    }
    for (const auto& [k, v] : want) EXPECT_EQ(ReadAll(s->get(), k), v) << k;
    // Removed keys; a whole bucket removed (its file goes); one key replaced by a newer value.
    auto n = (*s)->Remove({"k0_1", "k1_0", "k1_1", "k1_2", "k1_3", "k1_4", "nope"});
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, 6u);
    for (auto k : {"k0_1", "k1_0", "k1_1", "k1_2", "k1_3", "k1_4"}) want.erase(k);
    EXPECT_EQ(Buckets(root).size(), 3u);
    const std::string newer = Value(333, 99);
    ASSERT_TRUE((*s)->Write({{"k2_2", 500, newer.data(), newer.size()}}).ok());
    want["k2_2"] = newer;
    EXPECT_EQ((*s)->stats().keys, want.size());
  }
  // A write cut short leaves a .tmp: deleted at open, its objects never seen.
  std::ofstream(root + "/" + disk::BucketName(99) + ".tmp") << "half a bucket";
  auto s = DiskStore::Open(Config({root}));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ((*s)->id(), first_id);
  EXPECT_FALSE(fs::exists(root + "/" + disk::BucketName(99) + ".tmp"));
  auto objs = (*s)->Objects();
  EXPECT_EQ(objs.size(), want.size());
  for (const auto& o : objs) {
    ASSERT_TRUE(want.count(o.key)) << o.key;
    EXPECT_EQ(o.size, want[o.key].size());
    if (o.key == "k2_2") {
      EXPECT_EQ(o.put_id, 500u);
    }
  }
  for (const auto& [k, v] : want) EXPECT_EQ(ReadAll(s->get(), k), v) << k;
  Status st;
  EXPECT_EQ(ReadAll(s->get(), "k1_3", &st), "<absent>");
  EXPECT_TRUE(st.IsNotFound());
  // A new bucket gets an id above every id ever used (removed buckets' and the cut
  // write's included).
  const std::string v = Value(10, 1);
  ASSERT_TRUE((*s)->Write({{"later", 1, v.data(), v.size()}}).ok());
  auto names = Buckets(root);
  EXPECT_EQ(fs::path(names.back()).filename().string(), disk::BucketName(100));
}

TEST(DiskStore, VersionedReadsAndRemovals) {
  TempDir d;
  auto s = DiskStore::Open(Config({d.path()}));
  ASSERT_TRUE(s.ok());
  const std::string v = Value(100, 1);
  ASSERT_TRUE((*s)->Write({{"k", 7, v.data(), v.size()}, {"j", 9, v.data(), v.size()}}).ok());
  std::string out(100, '\0');
  EXPECT_TRUE((*s)->Read("k", out.data(), out.size(), 7).ok());
  EXPECT_TRUE((*s)->Read("k", out.data(), out.size(), 6).IsNotFound());
  EXPECT_TRUE((*s)->Read("k", out.data(), out.size(), 0).ok());
  // A removal of an older value leaves the newer copy; of this one or newer, removes it.
  auto n = (*s)->RemoveUpTo({{"k", 6}, {"j", 9}});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1u);
  EXPECT_TRUE((*s)->Size("k").ok());
  EXPECT_FALSE((*s)->Size("j").ok());
}

TEST(DiskStore, TheObserverSeesWhatWasStoredAndReadNotWhatFailed) {
  TempDir d;
  auto s = DiskStore::Open(Config({d.path()}));
  ASSERT_TRUE(s.ok());
  struct Seen {
    bool write;
    uint64_t keys, bytes;
  };
  std::vector<Seen> seen;
  (*s)->SetIoObserver([&](bool write, uint64_t keys, uint64_t bytes, uint64_t) {
    seen.push_back({write, keys, bytes});
  });
  const std::string v = Value(100, 1), w = Value(300, 2);
  ASSERT_TRUE((*s)->Write({{"k", 7, v.data(), v.size()}, {"j", 9, w.data(), w.size()}}).ok());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_TRUE(seen[0].write);
  EXPECT_EQ(seen[0].keys, 2u);
  EXPECT_EQ(seen[0].bytes, 400u);
  // A refused write (the key twice) is not counted.
  EXPECT_FALSE((*s)->Write({{"x", 1, v.data(), v.size()}, {"x", 2, v.data(), v.size()}}).ok());
  EXPECT_EQ(seen.size(), 1u);
  std::string a(100, '\0'), b(300, '\0');
  const std::string k = "k", j = "j", none = "none";
  std::vector<DiskStore::ReadItem> reads(3);
  const std::string* keys[] = {&k, &j, &none};
  char* dsts[] = {a.data(), b.data(), a.data()};
  const uint64_t lens[] = {a.size(), b.size(), a.size()};
  for (size_t i = 0; i < 3; ++i) {
    reads[i].key = keys[i];
    reads[i].dst = dsts[i];
    reads[i].len = lens[i];
  }
  (*s)->ReadMany(&reads);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_FALSE(seen[1].write);
  EXPECT_EQ(seen[1].keys, 2u);  // the absent one is not
  EXPECT_EQ(seen[1].bytes, 400u);
  EXPECT_TRUE((*s)->Read("none", a.data(), a.size()).IsNotFound());
  EXPECT_EQ(seen.size(), 2u);  // nothing read, nothing told
  EXPECT_TRUE((*s)->Read("j", b.data(), b.size()).ok());
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[2].bytes, 300u);
}

TEST(DiskStore, OneProcessPerDirectory) {
  TempDir d;
  auto a = DiskStore::Open(Config({d.path()}));
  ASSERT_TRUE(a.ok());
  auto b = DiskStore::Open(Config({d.path()}));
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("in use by another process (pid " +
                                      std::to_string(::getpid())),
            std::string::npos)
      << b.status().message();
  a->reset();
  EXPECT_TRUE(DiskStore::Open(Config({d.path()})).ok());
}

TEST(DiskStore, ACorruptedOrTruncatedRecordIsNeverServed) {
  TempDir d;
  const std::string v1 = Value(100000, 1), v2 = Value(5000, 2), v3 = Value(3000, 3);
  {
    auto s = DiskStore::Open(Config({d.path()}));
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->Write({{"one", 1, v1.data(), v1.size()}, {"two", 2, v2.data(), v2.size()}})
                    .ok());
    ASSERT_TRUE((*s)->Write({{"three", 3, v3.data(), v3.size()}}).ok());
  }
  auto files = Buckets(d.path());
  ASSERT_EQ(files.size(), 2u);
  {  // one bit of "one"'s value flipped
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(disk::kFileHeaderSize + disk::kRecordHeaderSize + 3 + 50000);
    char c = 0;
    f.get(c);
    f.seekp(disk::kFileHeaderSize + disk::kRecordHeaderSize + 3 + 50000);
    f.put(static_cast<char>(c ^ 4));
  }
  // The second bucket cut in the middle of its only record (its trailer and index gone).
  fs::resize_file(files[1], disk::kFileHeaderSize + disk::kRecordHeaderSize + 5 + 1000);
  auto s = DiskStore::Open(Config({d.path()}));
  ASSERT_TRUE(s.ok());
  Status st;
  EXPECT_EQ(ReadAll(s->get(), "two", &st), v2);
  EXPECT_NE(ReadAll(s->get(), "one", &st), v1);
  EXPECT_EQ(st.code(), Status::Code::kDataLoss);
  EXPECT_NE(st.message().find("CRC32C"), std::string::npos) << st.message();
  EXPECT_EQ((*s)->stats().corrupted_reads, 1u);
  // Dropped: gone from the index, and after a restart too.
  EXPECT_FALSE((*s)->Size("one").ok());
  // The cut record: its header says more bytes than the file has, so the walk stops there.
  EXPECT_FALSE((*s)->Size("three").ok());
  s->reset();
  auto s2 = DiskStore::Open(Config({d.path()}));
  ASSERT_TRUE(s2.ok());
  EXPECT_FALSE((*s2)->Size("one").ok());
  EXPECT_EQ(ReadAll(s2->get(), "two"), v2);
}

TEST(DiskStore, EvictionTakesWholeBucketsOldestOrLeastRecentlyRead) {
  for (auto policy : {DiskEvictionPolicy::kFifo, DiskEvictionPolicy::kLru}) {
    TempDir d;
    DiskConfig c = Config({d.path()});
    c.eviction_policy = policy;
    auto s = DiskStore::Open(c);
    ASSERT_TRUE(s.ok());
    const std::string v = Value(10000, 5);
    for (int b = 0; b < 3; ++b) {
      ASSERT_TRUE((*s)->Write({{"b" + std::to_string(b) + "x", 0, v.data(), v.size()},
                               {"b" + std::to_string(b) + "y", 0, v.data(), v.size()}})
                      .ok());
    }
    ReadAll(s->get(), "b0x");  // b0 read last: lru keeps it
    auto plan = (*s)->PlanEviction(1);
    ASSERT_EQ(plan.buckets.size(), 1u);
    const std::string victim = policy == DiskEvictionPolicy::kFifo ? "b0" : "b1";
    EXPECT_EQ(plan.keys, (std::vector<std::string>{victim + "x", victim + "y"}));
    // Marked, still readable, not planned twice.
    EXPECT_EQ(ReadAll(s->get(), victim + "x"), v);
    auto plan2 = (*s)->PlanEviction(1);
    ASSERT_EQ(plan2.buckets.size(), 1u);
    EXPECT_NE(plan2.buckets[0], plan.buckets[0]);
    (*s)->CancelEviction(plan2);
    ASSERT_TRUE((*s)->FinishEviction(plan).ok());
    EXPECT_FALSE((*s)->Size(victim + "x").ok());
    EXPECT_EQ(Buckets(d.path()).size(), 2u);
    EXPECT_EQ((*s)->stats().keys, 4u);
  }
  TempDir d;
  DiskConfig c = Config({d.path()});
  c.eviction_policy = DiskEvictionPolicy::kNone;
  auto s = DiskStore::Open(c);
  const std::string v = Value(10, 5);
  ASSERT_TRUE((*s)->Write({{"k", 0, v.data(), v.size()}}).ok());
  EXPECT_TRUE((*s)->PlanEviction(1 << 20).buckets.empty());
}

TEST(DiskStore, CapsRefuseWritesAndWatermarksAskForEviction) {
  TempDir d;
  DiskConfig c = Config({d.path()});
  c.total_size_limit = 100000;
  c.total_keys_limit = 5;
  auto s = DiskStore::Open(c);
  ASSERT_TRUE(s.ok());
  const std::string v = Value(20000, 5);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE((*s)->Write({{"k" + std::to_string(i), 0, v.data(), v.size()}}).ok());
  }
  EXPECT_EQ((*s)->WatermarkExcess(), 0u);  // ~80 KB of 100 KB: under the high mark (0.9)
  Status full = (*s)->Write({{"k9", 0, v.data(), v.size()}});
  EXPECT_EQ(full.code(), Status::Code::kResourceExhausted) << full.message();
  EXPECT_GT((*s)->NeedFreed(v.size() + 200), 0u);
  EXPECT_FALSE((*s)->Size("k9").ok());
  const std::string ten = Value(10000, 6);
  ASSERT_TRUE((*s)->Write({{"w", 0, ten.data(), ten.size()}}).ok());
  const uint64_t used = (*s)->stats().used_bytes;
  EXPECT_GT(used, 90000u);
  EXPECT_EQ((*s)->WatermarkExcess(), used - 80000);  // back down to the low mark (0.8)
  // Five keys held: a replaced key does not count twice against the keys limit.
  const std::string small = Value(10, 1);
  ASSERT_TRUE((*s)->Remove({"w"}).ok());
  ASSERT_TRUE((*s)->Write({{"k0", 0, small.data(), small.size()}}).ok());
  ASSERT_TRUE((*s)->Write({{"k5", 0, small.data(), small.size()}}).ok());
  Status keys = (*s)->Write({{"k6", 0, small.data(), small.size()}});
  EXPECT_EQ(keys.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(keys.message().find("limit is 5"), std::string::npos) << keys.message();
  // Batches over a bucket's limits are the caller's error.
  c.bucket_keys_limit = 1;
  TempDir d2;
  c.roots = {d2.path()};
  auto s2 = DiskStore::Open(c);
  EXPECT_EQ((*s2)->Write({{"a", 0, small.data(), 1}, {"b", 0, small.data(), 1}}).code(),
            Status::Code::kInvalidArgument);
}

TEST(DiskStore, BucketsSpreadOverSeveralRoots) {
  TempDir d;
  const std::string a = d.sub("a"), b = d.sub("b");
  std::map<std::string, std::string> want;
  {
    auto s = DiskStore::Open(Config({a, b}));
    ASSERT_TRUE(s.ok());
    for (int i = 0; i < 6; ++i) {
      const std::string k = "k" + std::to_string(i);
      want[k] = Value(5000 + i, i);
      ASSERT_TRUE((*s)->Write({{k, 0, want[k].data(), want[k].size()}}).ok());
    }
    ASSERT_TRUE((*s)->Remove({"k0"}).ok());
    want.erase("k0");
  }
  EXPECT_EQ(Buckets(a).size() + Buckets(b).size(), 5u);
  EXPECT_GE(Buckets(a).size(), 2u);
  EXPECT_GE(Buckets(b).size(), 2u);
  auto s = DiskStore::Open(Config({a, b}));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->stats().keys, want.size());
  for (const auto& [k, v] : want) EXPECT_EQ(ReadAll(s->get(), k), v) << k;
}

// A full file system: the write fails, nothing is recorded, what was stored stays readable.
TEST(DiskStore, AFullDiskRefusesTheWriteAndLosesNothing) {
  TempDir d;
  const std::string mnt = d.sub("small");
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root)";
  }
  {
    DiskConfig c = Config({mnt});
    c.bucket_max_total_size = 64ull << 20;  // more than the disk: only ENOSPC stops it
    auto s = DiskStore::Open(c);
    ASSERT_TRUE(s.ok());
    const std::string v = Value(100000, 1);
    ASSERT_TRUE((*s)->Write({{"fits", 0, v.data(), v.size()}}).ok());
    const std::string big = Value(150000, 2);
    Status st = (*s)->Write({{"too-big", 0, big.data(), big.size()}});
    EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.message();
    EXPECT_FALSE((*s)->Size("too-big").ok());
    EXPECT_EQ(ReadAll(s->get(), "fits"), v);
    EXPECT_EQ(Buckets(mnt).size(), 1u);
    for (const auto& e : fs::directory_iterator(mnt)) {
      EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
    }
  }
  ::umount(mnt.c_str());
}

}  // namespace
}  // namespace store
}  // namespace mooncake
