// The disk tier through StoreClient against an in-process master (src/store/disk/README.md):
// setup's checks, eager offload of a holder's objects to its disk, reads from the disk by
// another client once memory has evicted them, a restart of the holder on the same
// directory, removals reaching the disk, and corrupted files never served.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake/store/error_code.h"
#include "mooncake/store/store_client.h"
#include "store/client/client_metrics.h"
#include "store/disk/disk_store.h"
#include "store/disk/disk_test_util.h"
#include "store/testing/client_fixture.h"
#include "store/testing/in_process_master.h"

namespace mooncake {
namespace store {
namespace {

using std::chrono::milliseconds;
using testing::Bytes;
using testing::InProcessMaster;
constexpr uint64_t MiB = 1 << 20;

MasterConfig OffloadMaster() {
  MasterConfig c;
  c.offload.enable = true;
  c.default_kv_lease_ttl_ms = 300;  // offloaded objects may be evicted soon after
  return c;
}

bool WaitFor(const std::function<bool()>& cond, int ms = 10000) {
  for (int i = 0; i < ms / 10; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return cond();
}

class StoreClientDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES", "67108864", 1);
    ::setenv("MOONCAKE_OFFLOAD_FSYNC", "none", 1);  // the test's speed; the format is the same
  }
  std::unique_ptr<StoreClient> Holder(const std::string& dir, uint64_t segment, int* code = nullptr,
                                      std::string* msg = nullptr,
                                      milliseconds heartbeat = milliseconds(50)) {
    StoreClientOptions o;
    o.local_hostname = "127.0.0.1";
    o.global_segment_size = segment;
    o.master = master_;
    o.heartbeat_interval = heartbeat;
    o.enable_offload = true;
    o.offload_path = dir;
    int c = 0;
    std::string m;
    auto client = StoreClient::Create(o, code ? code : &c, msg ? msg : &m);
    return client;
  }
  std::unique_ptr<StoreClient> User() { return testing::MakeClient(master_, 0); }

  std::shared_ptr<InProcessMaster> master_ = std::make_shared<InProcessMaster>(OffloadMaster());
};

TEST_F(StoreClientDiskTest, SetupRefusesAMasterWithoutOffloadAndBadDirectories) {
  TempDir d;
  auto plain = std::make_shared<InProcessMaster>();
  StoreClientOptions o;
  o.local_hostname = "127.0.0.1";
  o.global_segment_size = 16 * MiB;
  o.master = plain;
  o.enable_offload = true;
  o.offload_path = d.path();
  int code = 0;
  std::string msg;
  EXPECT_EQ(StoreClient::Create(o, &code, &msg), nullptr);
  EXPECT_EQ(code, ToInt(ErrorCode::UNABLE_OFFLOAD));
  EXPECT_NE(msg.find("--enable_offload"), std::string::npos) << msg;
  for (const std::string& bad : {std::string("relative/dir"), d.path() + "/missing",
                                d.path() + "/../x"}) {
    EXPECT_EQ(Holder(bad, 16 * MiB, &code, &msg), nullptr);
    EXPECT_EQ(code, ToInt(ErrorCode::INVALID_PARAMS)) << bad;
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;
  }
  // One client per directory.
  auto a = Holder(d.path(), 16 * MiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(Holder(d.path(), 16 * MiB, &code, &msg), nullptr);
  EXPECT_EQ(code, ToInt(ErrorCode::FILE_LOCK_FAIL));
  EXPECT_NE(msg.find("in use"), std::string::npos) << msg;
}

TEST_F(StoreClientDiskTest, EvictedObjectsAreReadFromTheHoldersDiskByteExact) {
  TempDir d;
  auto a = Holder(d.path(), 8 * MiB);  // room for 7 objects of 1 MiB
  ASSERT_NE(a, nullptr);
  auto b = User();
  ASSERT_NE(b, nullptr);
  std::vector<std::vector<char>> values;
  constexpr int kN = 24;
  for (int i = 0; i < kN; ++i) {
    values.push_back(Bytes(MiB - 1000 + i, 100 + i));
    ASSERT_EQ(b->Put("k" + std::to_string(i), {{values[i].data(), values[i].size()}}, ReplicateConfig{}), 0) << i;
    // Each on disk before the next evicts it (eager offload within a heartbeat or two).
    ASSERT_TRUE(WaitFor([&] { return a->offloaded() >= static_cast<uint64_t>(i + 1); })) << i;
    std::this_thread::sleep_for(milliseconds(i >= 6 ? 320 : 0));  // the offload's lease lapses
  }
  EXPECT_EQ(a->disk_store()->stats().keys, static_cast<uint64_t>(kN));
  for (int i = 0; i < kN; ++i) {
    std::vector<char> out(values[i].size() + 10, 'x');
    const int64_t rc = b->Get("k" + std::to_string(i), {{out.data(), out.size()}});
    ASSERT_EQ(rc, static_cast<int64_t>(values[i].size())) << i;
    out.resize(values[i].size());
    EXPECT_EQ(out, values[i]) << i;
  }
  EXPECT_GT(b->offload_rpc_reads(), 10u);  // the evicted ones came from A's disk
  // A's mooncake_ssd_* metrics count what it wrote and what its disk served.
  ASSERT_NE(a->metrics(), nullptr);
  const std::string m = a->metrics()->Prometheus();
  EXPECT_NE(m.find("mooncake_ssd_write_ops_total{client_mode=\"real\"} " + std::to_string(kN) +
                   "\n"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("mooncake_ssd_read_ops_total{client_mode=\"real\"} 0\n"), std::string::npos)
      << m;
  // A reads its own disk directly, in pieces too.
  std::vector<char> p1(300000), p2(MiB);
  ASSERT_EQ(a->Get("k0", {{p1.data(), p1.size()}, {p2.data(), p2.size()}}),
            static_cast<int64_t>(values[0].size()));
  EXPECT_TRUE(std::equal(p1.begin(), p1.end(), values[0].begin()));
  EXPECT_TRUE(std::equal(values[0].begin() + p1.size(), values[0].end(), p2.begin()));
  // Exist and the descriptors see the disk replica.
  auto reps = b->BatchQueryReplicas({"k0"});
  ASSERT_EQ(reps[0].code, 0);
  ASSERT_FALSE(reps[0].replicas.empty());
  EXPECT_TRUE(reps[0].replicas.back().disk);
  // A removal reaches the disk.
  ASSERT_EQ(b->Remove("k0"), 0);
  EXPECT_TRUE(WaitFor([&] { return a->disk_store()->stats().keys == kN - 1; }));
  std::vector<char> out(MiB);
  EXPECT_EQ(b->Get("k0", {{out.data(), out.size()}}), ToInt(ErrorCode::OBJECT_NOT_FOUND));
}

TEST_F(StoreClientDiskTest, TheOffloadStartsWithoutWaitingForAHeartbeat) {
  // The holder's worker asks the master for work on its own (every 200 ms): a burst of puts
  // into a pool full of objects waiting for its disk does not wait a heartbeat for the write.
  TempDir d;
  auto a = Holder(d.path(), 8 * MiB, nullptr, nullptr, milliseconds(60000));
  ASSERT_NE(a, nullptr);
  auto b = User();
  ASSERT_NE(b, nullptr);
  auto value = Bytes(300000, 5);
  // Past the first beat (at once after setup) and the worker's lingering after any work.
  std::this_thread::sleep_for(milliseconds(700));
  ASSERT_EQ(b->Put("p", {{value.data(), value.size()}}, ReplicateConfig{}), 0);
  EXPECT_TRUE(WaitFor([&] { return a->offloaded() == 1; }, 3000));
}

TEST_F(StoreClientDiskTest, AHolderRestartedOnTheSameDirectoryServesItsObjectsAgain) {
  TempDir d;
  std::vector<std::vector<char>> values;
  auto b = User();
  {
    auto a = Holder(d.path(), 16 * MiB);
    ASSERT_NE(a, nullptr);
    for (int i = 0; i < 5; ++i) {
      values.push_back(Bytes(100000 + i, 7 + i));
      ASSERT_EQ(b->Put("r" + std::to_string(i), {{values[i].data(), values[i].size()}}, ReplicateConfig{}), 0);
    }
    ASSERT_TRUE(WaitFor([&] { return a->offloaded() == 5; }));
    // a stops: its segment leaves (memory replicas gone), its disk stays attached until its
    // TTL; the restarted client takes it over at once.
  }
  auto a2 = Holder(d.path(), 16 * MiB);
  ASSERT_NE(a2, nullptr);
  for (int i = 0; i < 5; ++i) {
    std::vector<char> out(values[i].size());
    ASSERT_EQ(b->Get("r" + std::to_string(i), {{out.data(), out.size()}}),
              static_cast<int64_t>(out.size()))
        << i;
    EXPECT_EQ(out, values[i]);
  }
  // A corrupted file is never served: the get fails, the key is dropped.
  a2.reset();
  for (const auto& e : fs::directory_iterator(d.path())) {
    if (e.path().extension() != ".bucket") continue;
    const auto size = fs::file_size(e.path());
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    for (uint64_t off = 200; off + 4096 < size; off += 4096) {
      f.seekp(static_cast<std::streamoff>(off));
      f.put('\x5a');
    }
  }
  auto a3 = Holder(d.path(), 16 * MiB);
  ASSERT_NE(a3, nullptr);
  int failed = 0;
  for (int i = 0; i < 5; ++i) {
    std::vector<char> out(values[i].size());
    const int64_t rc = b->Get("r" + std::to_string(i), {{out.data(), out.size()}});
    if (rc < 0) {
      ++failed;
      EXPECT_TRUE(rc == ToInt(ErrorCode::FILE_READ_FAIL) ||
                  rc == ToInt(ErrorCode::OBJECT_NOT_FOUND))
          << rc;
    } else {
      EXPECT_EQ(out, values[i]) << "wrong bytes served for r" << i;
    }
  }
  EXPECT_EQ(failed, 5);
  EXPECT_GT(a3->disk_store()->stats().corrupted_reads, 0u);
}

TEST_F(StoreClientDiskTest, ABatchFromAnothersDiskComesInChunksByteExactAndABadRecordFailsAlone) {
  // 24 objects of ~700 KB read in one batch from another client's disk: several chunks
  // (store_client_disk_read.cc), two in flight, each released as it is taken (the batch is
  // more than the quarter of the owner's 64 MiB buffer one reader may hold at once).
  TempDir d;
  constexpr int kN = 24;
  std::vector<std::vector<char>> values;
  std::vector<std::string> keys;
  auto b = User();
  ASSERT_NE(b, nullptr);
  {
    auto a = Holder(d.path(), 32 * MiB);
    ASSERT_NE(a, nullptr);
    for (int i = 0; i < kN; ++i) {
      keys.push_back("c" + std::to_string(i));
      values.push_back(Bytes(700000 + 13 * i, 40 + i));
      ASSERT_EQ(b->Put(keys[i], {{values[i].data(), values[i].size()}}, ReplicateConfig{}), 0);
    }
    ASSERT_TRUE(WaitFor([&] { return a->offloaded() == kN; }));
  }  // its segment leaves: the objects are on its disk only
  // One record in the middle of the batch is corrupted (a byte of its value).
  bool flipped = false;
  for (const auto& e : fs::directory_iterator(d.path())) {
    if (e.path().extension() != ".bucket") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    std::string file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t at = file.find(std::string(values[13].data(), 256));
    if (at == std::string::npos) continue;
    f.clear();
    f.seekp(static_cast<std::streamoff>(at + 350000));
    f.put(static_cast<char>(~values[13][350000]));
    flipped = true;
  }
  ASSERT_TRUE(flipped);
  auto a2 = Holder(d.path(), 16 * MiB);
  ASSERT_NE(a2, nullptr);
  std::vector<std::vector<char>> outs(kN);
  std::vector<std::vector<Span>> parts(kN);
  for (int i = 0; i < kN; ++i) {
    outs[i].assign(values[i].size(), 'x');
    parts[i] = {{outs[i].data(), outs[i].size()}};
  }
  const uint64_t reads0 = b->offload_rpc_reads();
  auto rcs = b->BatchGet(keys, parts);
  ASSERT_EQ(rcs.size(), static_cast<size_t>(kN));
  for (int i = 0; i < kN; ++i) {
    if (i == 13) {
      EXPECT_EQ(rcs[i], ToInt(ErrorCode::FILE_READ_FAIL));
      continue;
    }
    ASSERT_EQ(rcs[i], static_cast<int64_t>(values[i].size())) << i;
    EXPECT_EQ(outs[i], values[i]) << "wrong bytes for " << keys[i];
  }
  EXPECT_EQ(b->offload_rpc_reads() - reads0, static_cast<uint64_t>(kN - 1));
  // Again, twice: what the first batch held in the owner's buffer was released.
  keys.erase(keys.begin() + 13);
  values.erase(values.begin() + 13);
  outs.erase(outs.begin() + 13);
  parts.erase(parts.begin() + 13);
  for (int round = 0; round < 2; ++round) {
    for (auto& o : outs) std::fill(o.begin(), o.end(), 'y');
    rcs = b->BatchGet(keys, parts);
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_EQ(rcs[i], static_cast<int64_t>(values[i].size())) << round << " " << keys[i];
      EXPECT_EQ(outs[i], values[i]) << keys[i];
    }
  }
}

// A master promoting after one read, a holder A lending 4 MiB with its disk, a user B.
class StoreClientDiskPromotion : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES", "67108864", 1);
    ::setenv("MOONCAKE_OFFLOAD_FSYNC", "none", 1);
    MasterConfig c = OffloadMaster();
    c.offload.promotion_on_hit = true;
    c.offload.promotion_threshold = 1;
    master = std::make_shared<InProcessMaster>(c);
    StoreClientOptions o;
    o.local_hostname = "127.0.0.1";
    o.global_segment_size = 4 * MiB;
    o.master = master;
    o.heartbeat_interval = milliseconds(50);
    o.enable_offload = true;
    o.offload_path = d.path();
    int code = 0;
    std::string msg;
    a = StoreClient::Create(o, &code, &msg);
    ASSERT_NE(a, nullptr) << msg;
    b = testing::MakeClient(master, 0);
  }
  std::shared_ptr<InProcessMaster> master;
  TempDir d;
  std::unique_ptr<StoreClient> a, b;
};

TEST_F(StoreClientDiskPromotion, AnObjectReadOftenFromDiskComesBackToMemoryByteExact) {
  std::vector<std::vector<char>> values;
  for (int i = 0; i < 10; ++i) {
    values.push_back(Bytes(MiB, 50 + i));
    while (b->Put("p" + std::to_string(i), {{values[i].data(), MiB}}, ReplicateConfig{}) != 0) {
      std::this_thread::sleep_for(milliseconds(20));  // the pool waits for the disk
    }
  }
  auto where = [&](const std::string& k) {
    auto r = b->BatchQueryReplicas({k});
    bool mem = false, disk = false;
    for (const auto& x : r[0].replicas) (x.disk ? disk : mem) = true;
    return std::make_pair(mem, disk);
  };
  ASSERT_TRUE(WaitFor([&] { return where("p0") == std::make_pair(false, true); }));
  std::vector<char> out(MiB);
  ASSERT_EQ(b->Get("p0", {{out.data(), MiB}}), static_cast<int64_t>(MiB));  // from the disk
  EXPECT_EQ(out, values[0]);
  // The owner's worker brings it back; then reads come from memory, same bytes.
  ASSERT_TRUE(WaitFor([&] { return where("p0").first; }));
  const uint64_t before = b->offload_rpc_reads();
  std::fill(out.begin(), out.end(), 0);
  ASSERT_EQ(b->Get("p0", {{out.data(), MiB}}), static_cast<int64_t>(MiB));
  EXPECT_EQ(out, values[0]);
  EXPECT_EQ(b->offload_rpc_reads(), before);
}

// A promotion the owner's pool has no room for (here every byte hard-pinned) is kept by the
// owner and tried again: once room comes (a pinned object removed), the object is back in
// memory without another read.
TEST_F(StoreClientDiskPromotion, APromotionRefusedForRoomIsTriedAgainWhenRoomComes) {
  std::vector<char> value = Bytes(MiB, 77);
  ASSERT_EQ(b->Put("cold", {{value.data(), MiB}}, ReplicateConfig{}), 0);
  auto where = [&](const std::string& k) {
    auto r = b->BatchQueryReplicas({k});
    bool mem = false, disk = false;
    for (const auto& x : r[0].replicas) (x.disk ? disk : mem) = true;
    return std::make_pair(mem, disk);
  };
  ASSERT_TRUE(WaitFor([&] { return where("cold").second; }));  // written to the disk
  // Pinned objects push it out of memory and then hold every MiB of the pool.
  ReplicateConfig pinned;
  pinned.with_hard_pin = true;
  std::vector<char> filler = Bytes(MiB, 5);
  int pins = 0;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       pins < 4 && std::chrono::steady_clock::now() < until;) {
    if (b->Put("pin" + std::to_string(pins), {{filler.data(), MiB}}, pinned) == 0) {
      ++pins;
    } else {
      std::this_thread::sleep_for(milliseconds(20));  // "cold" leaves once its lease ends
    }
  }
  ASSERT_GE(pins, 3);
  ASSERT_NE(b->Put("probe", {{filler.data(), MiB}}, ReplicateConfig{}), 0) << "the pool is not full";
  ASSERT_EQ(where("cold"), std::make_pair(false, true));
  std::vector<char> out(MiB);
  ASSERT_EQ(b->Get("cold", {{out.data(), MiB}}), static_cast<int64_t>(MiB));  // from the disk
  EXPECT_EQ(out, value);
  // Handed to the owner, refused for room: still disk-only while the pool stays full.
  ASSERT_TRUE(WaitFor([&] {
    return master->service().MetricsText().find("master_promotion_started_total 1") !=
           std::string::npos;
  }));
  std::this_thread::sleep_for(milliseconds(700));
  ASSERT_EQ(where("cold"), std::make_pair(false, true));
  // Room again: promoted without another read.
  ASSERT_EQ(b->Remove("pin0"), 0);
  EXPECT_TRUE(WaitFor([&] { return where("cold").first; }, 5000));
  const uint64_t before = b->offload_rpc_reads();
  std::fill(out.begin(), out.end(), 0);
  ASSERT_EQ(b->Get("cold", {{out.data(), MiB}}), static_cast<int64_t>(MiB));
  EXPECT_EQ(out, value);
  EXPECT_EQ(b->offload_rpc_reads(), before);  // from memory
}

}  // namespace
}  // namespace store
}  // namespace mooncake
