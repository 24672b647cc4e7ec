// Run-time segments (StoreClient::MountFileSegment / AllocateSegment / UnmountSegment,
// upstream's mount_segment family) against an in-process master: objects land in them and
// read back, unmounting drops their objects and never lets a copy touch the memory, bad
// paths and ranges are refused with nothing left mounted, a grace period defers the
// unmount, and a master that forgot the client gets them mounted again.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mooncake/store/error_code.h"
#include "mooncake/store/store_client.h"
#include "store/testing/client_fixture.h"
#include "store/testing/in_process_master.h"

namespace mooncake {
namespace store {
namespace {

using std::chrono::milliseconds;
using testing::InProcessMaster;
constexpr uint64_t MiB = 1 << 20;
const int kNotFound = ToInt(ErrorCode::OBJECT_NOT_FOUND);
const int kInvalid = ToInt(ErrorCode::INVALID_PARAMS);

using testing::Bytes;

// A file of `size` bytes in the test's temporary directory, removed with the object.
class TempFile {
 public:
  explicit TempFile(uint64_t size) {
    const char* dir = getenv("TEST_TMPDIR");
    path_ = std::string(dir ? dir : "/tmp") + "/mc_segment_XXXXXX";
    int fd = ::mkstemp(path_.data());
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
    ::close(fd);
  }
  ~TempFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }
  std::vector<char> Read() const {
    std::vector<char> v;
    int fd = ::open(path_.c_str(), O_RDONLY);
    char buf[65536];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) v.insert(v.end(), buf, buf + n);
    ::close(fd);
    return v;
  }

 private:
  std::string path_;
};

class StoreClientSegmentsTest : public ::testing::Test {
 protected:
  std::unique_ptr<StoreClient> Client(uint64_t segment, milliseconds heartbeat = milliseconds(1000)) {
    return testing::MakeClient(master_, segment, 16 * MiB, heartbeat);
  }
  size_t Mounted() {
    size_t total = 0;
    master_->service().ListSegments(0, &total);
    return total;
  }
  int Put(StoreClient* c, const std::string& key, std::vector<char>& v) {
    return c->Put(key, {{v.data(), v.size()}}, ReplicateConfig());
  }
  std::vector<char> Get(StoreClient* c, const std::string& key, size_t n, int64_t* rc) {
    std::vector<char> out(n);
    *rc = c->Get(key, {{out.data(), out.size()}});
    return out;
  }

  std::shared_ptr<InProcessMaster> master_ = std::make_shared<InProcessMaster>();
};

TEST_F(StoreClientSegmentsTest, AnAllocatedSegmentTakesObjectsAndTakesThemAlongWhenUnmounted) {
  auto holder = Client(0);  // lends nothing at setup
  auto user = Client(0);
  ASSERT_TRUE(holder && user);
  auto v = Bytes(300000, 1);
  EXPECT_EQ(Put(user.get(), "before", v), ToInt(ErrorCode::NO_AVAILABLE_HANDLE));
  std::string id;
  uint64_t allocated = 0;
  ASSERT_EQ(holder->AllocateSegment(1, "", &id, &allocated), 0);
  EXPECT_EQ(allocated, 16 * MiB);  // upstream's 16 MiB unit
  EXPECT_NE(id.find('-'), std::string::npos) << id;
  EXPECT_EQ(Mounted(), 1u);
  ASSERT_EQ(Put(user.get(), "k", v), 0);
  int64_t rc = 0;
  EXPECT_EQ(Get(user.get(), "k", v.size(), &rc), v);  // from another client
  EXPECT_EQ(Get(holder.get(), "k", v.size(), &rc), v);  // its own memory
  EXPECT_EQ(rc, static_cast<int64_t>(v.size()));
  // Not this kind, not an id: refused, nothing changes.
  EXPECT_EQ(holder->UnmountSegment(id, /*allocated=*/false), kInvalid);
  EXPECT_EQ(holder->UnmountSegment("1-2", true), kInvalid);
  EXPECT_EQ(Mounted(), 1u);
  ASSERT_EQ(holder->UnmountSegment(id, true), 0);
  EXPECT_EQ(Mounted(), 0u);
  EXPECT_EQ(user->GetSize("k"), kNotFound);  // its only replica went with the segment
  EXPECT_EQ(holder->UnmountSegment(id, true), kInvalid);  // once
  EXPECT_EQ(Put(user.get(), "k", v), ToInt(ErrorCode::NO_AVAILABLE_HANDLE));
  EXPECT_EQ(holder->AllocateSegment(0, "", &id, &allocated), kInvalid);
  EXPECT_EQ(holder->AllocateSegment(UINT64_MAX - 5, "", &id, &allocated), kInvalid);
}

TEST_F(StoreClientSegmentsTest, AFileSegmentHoldsTheObjectsBytesInTheFile) {
  TempFile file(8 * MiB);
  auto holder = Client(0);
  auto user = Client(0);
  ASSERT_TRUE(holder && user);
  std::string id;
  const uint64_t page = ::sysconf(_SC_PAGESIZE);
  ASSERT_EQ(holder->MountFileSegment(file.path(), page, 4 * MiB, "cpu:0", &id), 0);
  auto v = Bytes(200000, 2);
  ASSERT_EQ(Put(user.get(), "f", v), 0);
  int64_t rc = 0;
  EXPECT_EQ(Get(user.get(), "f", v.size(), &rc), v);
  // The bytes are in the file, past the offset and inside the mounted range.
  const auto content = file.Read();
  auto at = std::search(content.begin(), content.end(), v.begin(), v.end());
  ASSERT_NE(at, content.end());
  EXPECT_GE(static_cast<uint64_t>(at - content.begin()), page);
  EXPECT_LE(static_cast<uint64_t>(at - content.begin()) + v.size(), page + 4 * MiB);
  ASSERT_EQ(holder->UnmountSegment(id, false), 0);
  EXPECT_EQ(user->GetSize("f"), kNotFound);
  EXPECT_EQ(Mounted(), 0u);
}

TEST_F(StoreClientSegmentsTest, BadPathsAndRangesAreRefusedWithNothingMounted) {
  TempFile file(2 * MiB);
  auto holder = Client(0);
  ASSERT_TRUE(holder);
  std::string id;
  const uint64_t page = ::sysconf(_SC_PAGESIZE);
  EXPECT_EQ(holder->MountFileSegment("/nonexistent/mc_segment", 0, MiB, "", &id), kInvalid);
  EXPECT_EQ(holder->MountFileSegment("/tmp", 0, MiB, "", &id), kInvalid);  // a directory
  EXPECT_EQ(holder->MountFileSegment(file.path(), 0, 0, "", &id), kInvalid);
  EXPECT_EQ(holder->MountFileSegment(file.path(), 100, MiB, "", &id), kInvalid);  // unaligned
  EXPECT_EQ(holder->MountFileSegment(file.path(), page, 2 * MiB, "", &id), kInvalid);  // past end
  EXPECT_EQ(holder->MountFileSegment(file.path(), 4 * MiB, 4096, "", &id), kInvalid);
  EXPECT_EQ(holder->MountFileSegment(file.path(), 0, UINT64_MAX, "", &id), kInvalid);
  EXPECT_EQ(holder->MountFileSegment(file.path(), 0, MiB, "cuda:99", &id), kInvalid);
  EXPECT_EQ(Mounted(), 0u);
  // The whole file, and twice the same range: two segments of their own.
  std::string a, b;
  ASSERT_EQ(holder->MountFileSegment(file.path(), 0, 2 * MiB, "", &a), 0);
  ASSERT_EQ(holder->MountFileSegment(file.path(), 0, 2 * MiB, "", &b), 0);
  EXPECT_NE(a, b);
  EXPECT_EQ(Mounted(), 2u);
  EXPECT_EQ(holder->Close(), 0);  // Close unmounts them
  EXPECT_EQ(Mounted(), 0u);
  EXPECT_EQ(holder->UnmountSegment(a, false), ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS));
}

TEST_F(StoreClientSegmentsTest, AGracePeriodDefersTheUnmount) {
  auto holder = Client(0, milliseconds(50));
  auto user = Client(0);
  ASSERT_TRUE(holder && user);
  std::string id;
  uint64_t allocated = 0;
  ASSERT_EQ(holder->AllocateSegment(MiB, "", &id, &allocated), 0);
  auto v = Bytes(1000, 3);
  ASSERT_EQ(Put(user.get(), "g", v), 0);
  const auto asked = std::chrono::steady_clock::now();
  ASSERT_EQ(holder->UnmountSegment(id, true, /*grace_s=*/1), 0);
  int64_t rc = 0;
  EXPECT_EQ(Get(user.get(), "g", v.size(), &rc), v);  // still served
  for (int i = 0; i < 300 && Mounted() > 0; ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(Mounted(), 0u);
  EXPECT_GE(std::chrono::steady_clock::now() - asked, milliseconds(1000));
  EXPECT_EQ(user->GetSize("g"), kNotFound);
}

TEST_F(StoreClientSegmentsTest, ReadsRacingAnUnmountGetTheBytesOrAnErrorNeverACrash) {
  auto holder = Client(0);
  auto user = Client(0);
  ASSERT_TRUE(holder && user);
  std::string id;
  uint64_t allocated = 0;
  ASSERT_EQ(holder->AllocateSegment(16 * MiB, "", &id, &allocated), 0);
  std::vector<std::vector<char>> values;
  for (int i = 0; i < 32; ++i) {
    values.push_back(Bytes(100000, 10 + i));
    ASSERT_EQ(Put(user.get(), "r" + std::to_string(i), values.back()), 0);
  }
  std::atomic<bool> stop{false};
  std::atomic<int> good{0}, failed{0}, wrong{0};
  auto reader = [&](StoreClient* c) {
    while (!stop) {
      for (int i = 0; i < 32 && !stop; ++i) {
        std::vector<char> out(100000);
        const int64_t rc = c->Get("r" + std::to_string(i), {{out.data(), out.size()}});
        if (rc < 0) {
          ++failed;
        } else if (out == values[i]) {
          ++good;
        } else {
          ++wrong;
        }
      }
    }
  };
  std::thread own(reader, holder.get()), other(reader, user.get());
  while (good < 64) std::this_thread::sleep_for(milliseconds(1));
  ASSERT_EQ(holder->UnmountSegment(id, true), 0);
  std::this_thread::sleep_for(milliseconds(50));
  stop = true;
  own.join();
  other.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(failed, 0);  // the reads after the unmount
}

// The window made certain: the holder's get learns of the replica in its own run-time
// segment, then the segment is unmounted and freed before the get copies. The copy must see
// that the memory is gone (it would read unmapped memory otherwise).
TEST_F(StoreClientSegmentsTest, AGetThatLearnedOfAReplicaBeforeTheUnmountDoesNotTouchTheMemory) {
  std::atomic<bool> hold{false}, asked{false}, unmounted{false};
  master_->on_GetReplicaList = [&](const rpc::KeysRequest& q, rpc::GetReplicaListResponse* r) {
    Status s = master_->ServeGetReplicaList(q, r);
    if (hold.exchange(false)) {
      asked = true;
      while (!unmounted) std::this_thread::sleep_for(milliseconds(1));
    }
    return s;
  };
  auto user = Client(0);
  ASSERT_TRUE(user);
  auto v = Bytes(100000, 4);
  for (bool own : {true, false}) {  // the holder reads its own memory; another client reads it
    auto holder = Client(0);
    ASSERT_TRUE(holder);
    std::string id;
    uint64_t allocated = 0;
    ASSERT_EQ(holder->AllocateSegment(MiB, "", &id, &allocated), 0);
    ASSERT_EQ(Put(user.get(), "k", v), 0);
    StoreClient* reader = own ? holder.get() : user.get();
    hold = true;
    asked = unmounted = false;
    int64_t rc = 1;
    std::vector<char> out(v.size());
    std::thread get([&] { rc = reader->Get("k", {{out.data(), out.size()}}); });
    while (!asked) std::this_thread::sleep_for(milliseconds(1));
    ASSERT_EQ(holder->UnmountSegment(id, true), 0);
    unmounted = true;
    get.join();
    if (own) {
      EXPECT_LT(rc, 0);  // its memory is gone: an error, not the bytes of other memory
    } else {
      // A peer that mapped the freed shared memory still sees the object's bytes there (the
      // pages stay with its mapping); else its read fails. Never other bytes.
      EXPECT_TRUE(rc < 0 || out == v) << rc;
    }
  }
}

TEST_F(StoreClientSegmentsTest, AMasterThatForgetsTheClientGetsItsSegmentsMountedAgain) {
  auto now = std::make_shared<std::atomic<int64_t>>(0);
  MasterConfig config;
  config.client_ttl_s = 1;
  master_ = std::make_shared<InProcessMaster>(config, [now] {
    return MasterService::Clock::now() + std::chrono::seconds(now->load());
  });
  std::atomic<bool> deaf{false};
  master_->on_Ping = [this, &deaf](const rpc::PingRequest& q, rpc::PingResponse* r) {
    if (deaf) return Status::Unavailable("lost");
    return master_->ServePing(q, r);
  };
  auto holder = Client(4 * MiB, milliseconds(20));
  ASSERT_TRUE(holder);
  TempFile file(MiB);
  std::string a, b;
  uint64_t allocated = 0;
  ASSERT_EQ(holder->AllocateSegment(MiB, "", &a, &allocated), 0);
  ASSERT_EQ(holder->MountFileSegment(file.path(), 0, MiB, "", &b), 0);
  EXPECT_EQ(Mounted(), 3u);
  deaf = true;
  now->store(5);
  master_->service().Tick();  // the client expired: its three segments dropped
  EXPECT_EQ(Mounted(), 0u);
  deaf = false;
  for (int i = 0; i < 300 && Mounted() < 3; ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(Mounted(), 3u);
  EXPECT_EQ(holder->UnmountSegment(b, false), 0);
  EXPECT_EQ(Mounted(), 2u);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
