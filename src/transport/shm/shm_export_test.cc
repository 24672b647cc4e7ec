// Target memory lent to same-host initiators (shm_exports.h): two ShmTransports in one
// process move bytes through the mapping, stop using it the moment the target unregisters
// the range (the copy is then the target's, and refused), and a target that lends what must
// not be mapped (unsealed, short, overlapping, over the caps, garbage) is refused with
// nothing left mapped. Also MemoryRegistry::Export's slots and Remove's wait for copiers.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/memory_registry.h"
#include "transport/shm/shm_exports.h"
#include "transport/shm/shm_transport.h"
#include "transport/shm/shm_wire.h"
#include "engine/slice_recorder_test_util.h"

namespace mooncake::shm {
namespace {

using Recorder = testing_util::SliceRecorder;

// A memfd of `size` bytes sealed against shrinking, mapped here: what AllocateSharedMemory
// makes.
struct SharedMem {
  explicit SharedMem(size_t n, bool seal = true) : size(n) {
    fd = ::memfd_create("shm-export-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(n)) != 0) return;
    if (seal && ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) return;
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) data = static_cast<uint8_t*>(p);
  }
  ~SharedMem() {
    if (data) ::munmap(data, size);
    if (fd >= 0) ::close(fd);
  }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(data); }
  size_t size;
  int fd = -1;
  uint8_t* data = nullptr;
};

struct Side {
  MemoryRegistry registry;
  ShmTransport transport;
  SegmentDesc desc;
};

class ShmExport : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(lent_.data, nullptr);
    for (Side* s : {&initiator_, &target_}) {
      TransportContext ctx;
      ctx.options.slice_timeout_ms = 3000;
      ctx.registry = &s->registry;
      s->desc.name = s == &initiator_ ? "initiator" : "target";
      Status st = s->transport.Start(ctx, &s->desc);
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    ASSERT_TRUE(initiator_.registry.Add(reinterpret_cast<uint64_t>(local_.data()), local_.size(),
                                        "cpu:0", true).ok());
    RegionInfo r{lent_.addr(), lent_.size, "cpu:0", true, lent_.fd};
    ASSERT_TRUE(target_.registry.AddBatch({r}).ok());
    ASSERT_TRUE(target_.registry.Add(reinterpret_cast<uint64_t>(plain_.data()), plain_.size(),
                                     "cpu:0", true).ok());
    peer_ = std::make_shared<const SegmentDesc>(target_.desc);
    ASSERT_TRUE(initiator_.transport.CanReach(*peer_));
  }
  void TearDown() override {
    initiator_.transport.Stop();
    target_.transport.Stop();
  }
  // One slice of `len` bytes at local offset `loff` <-> remote address `remote`.
  TransferStatusEnum Move(TransferRequest::OpCode op, uint64_t remote, size_t len,
                          std::string* message, size_t loff = 0) {
    Recorder rec;
    Slice s;
    s.opcode = op;
    s.local = reinterpret_cast<uint64_t>(local_.data()) + loff;
    s.remote = remote;
    s.length = len;
    s.hook = &rec;
    Status st = initiator_.transport.Submit(peer_, &s, 1);
    if (!st.ok()) {
      *message = st.ToString();
      return FAILED;
    }
    EXPECT_TRUE(rec.Wait(1));
    *message = rec.message();
    auto r = rec.results();
    return r.empty() ? WAITING : r[0];
  }

  SharedMem lent_{1 << 20};
  std::vector<uint8_t> plain_ = std::vector<uint8_t>(1 << 20);
  std::vector<uint8_t> local_ = std::vector<uint8_t>(1 << 20);
  Side initiator_, target_;
  std::shared_ptr<const SegmentDesc> peer_;
};

TEST_F(ShmExport, LentMemoryIsCopiedHereAndPlainMemoryByTheTarget) {
  for (size_t i = 0; i < local_.size(); ++i) local_[i] = static_cast<uint8_t>(i * 7 + 3);
  std::string msg;
  ASSERT_EQ(Move(TransferRequest::WRITE, lent_.addr() + 100, 5000, &msg), COMPLETED) << msg;
  EXPECT_EQ(initiator_.transport.mapped_copies(), 1u) << "the memfd-backed range is mapped here";
  EXPECT_EQ(std::memcmp(lent_.data + 100, local_.data(), 5000), 0);
  ASSERT_EQ(Move(TransferRequest::WRITE, reinterpret_cast<uint64_t>(plain_.data()), 5000, &msg),
            COMPLETED) << msg;
  EXPECT_EQ(initiator_.transport.mapped_copies(), 1u) << "plain memory is the target's to copy";
  EXPECT_EQ(std::memcmp(plain_.data(), local_.data(), 5000), 0);
  // Back: the lent range's bytes land at local offset 64 KiB.
  for (size_t i = 0; i < 5000; ++i) lent_.data[200 + i] = static_cast<uint8_t>(i * 11 + 1);
  ASSERT_EQ(Move(TransferRequest::READ, lent_.addr() + 200, 5000, &msg, 64 << 10), COMPLETED);
  EXPECT_EQ(std::memcmp(local_.data() + (64 << 10), lent_.data + 200, 5000), 0);
  EXPECT_EQ(initiator_.transport.mapped_copies(), 2u);
  // A range running past the lent memory is not a mapped copy, and the target refuses it.
  ASSERT_EQ(Move(TransferRequest::WRITE, lent_.addr() + lent_.size - 10, 100, &msg), FAILED);
  EXPECT_NE(msg.find("rejected"), std::string::npos) << msg;
  EXPECT_EQ(initiator_.transport.mapped_copies(), 2u);
}

TEST_F(ShmExport, UnregisteredRangeIsNeitherWrittenNorReadThroughTheMapping) {
  std::string msg;
  ASSERT_EQ(Move(TransferRequest::WRITE, lent_.addr(), 4096, &msg), COMPLETED) << msg;
  ASSERT_EQ(initiator_.transport.mapped_copies(), 1u);
  ASSERT_TRUE(target_.registry.Remove(lent_.addr(), 1000).ok());
  std::memset(lent_.data, 0x5A, 4096);
  std::memset(local_.data(), 0x11, 4096);
  EXPECT_EQ(Move(TransferRequest::WRITE, lent_.addr(), 4096, &msg), FAILED)
      << "a write into memory the target no longer lends must fail, not vanish";
  EXPECT_NE(msg.find("rejected"), std::string::npos) << msg;
  EXPECT_EQ(lent_.data[0], 0x5A) << "nothing written";
  EXPECT_EQ(Move(TransferRequest::READ, lent_.addr(), 4096, &msg), FAILED);
  EXPECT_EQ(local_[0], 0x11) << "nothing read";
  EXPECT_EQ(initiator_.transport.mapped_copies(), 1u);
}

TEST_F(ShmExport, ATargetThatStoppedGetsNoMoreCopies) {
  std::string msg;
  ASSERT_EQ(Move(TransferRequest::WRITE, lent_.addr(), 4096, &msg), COMPLETED) << msg;
  ASSERT_EQ(initiator_.transport.mapped_copies(), 1u);
  target_.transport.Stop();  // as its exit does: every connection it served ends
  std::memset(lent_.data, 0x5A, 4096);
  std::memset(local_.data(), 0x11, 4096);
  EXPECT_NE(Move(TransferRequest::WRITE, lent_.addr(), 4096, &msg), COMPLETED)
      << "a write to a target that is gone must not be reported done";
  EXPECT_EQ(lent_.data[0], 0x5A);
  EXPECT_EQ(initiator_.transport.mapped_copies(), 1u);
}

TEST_F(ShmExport, DisabledByOptionLeavesEveryCopyToTheTarget) {
  Side other;
  TransportContext ctx;
  ctx.options.slice_timeout_ms = 3000;
  ctx.options.shm_map_peers = false;
  ctx.registry = &other.registry;
  other.desc.name = "other";
  ASSERT_TRUE(other.transport.Start(ctx, &other.desc).ok());
  ASSERT_TRUE(other.registry.Add(reinterpret_cast<uint64_t>(local_.data()), local_.size(), "cpu:0",
                                 true).ok());
  ASSERT_TRUE(other.transport.CanReach(*peer_));
  Recorder rec;
  Slice s;
  s.opcode = TransferRequest::WRITE;
  s.local = reinterpret_cast<uint64_t>(local_.data());
  s.remote = lent_.addr();
  s.length = 4096;
  s.hook = &rec;
  std::memset(local_.data(), 0x77, 4096);
  ASSERT_TRUE(other.transport.Submit(peer_, &s, 1).ok());
  ASSERT_TRUE(rec.Wait(1));
  EXPECT_EQ(rec.results()[0], COMPLETED) << rec.message();
  EXPECT_EQ(lent_.data[4095], 0x77);
  EXPECT_EQ(other.transport.mapped_copies(), 0u);
  other.transport.Stop();
}

// --- MemoryRegistry::Export and Remove ---

ExportSlot* MapSlots(int page_fd, uint64_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, page_fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<ExportSlot*>(p);
}

void CloseAll(ExportList& l) {
  for (auto& r : l.ranges) ::close(r.fd);
  if (l.page_fd >= 0) ::close(l.page_fd);
}

TEST(RegistryExport, LendsOnlyMemfdBackedRemoteHostMemory) {
  MemoryRegistry reg;
  SharedMem a(1 << 16), b(1 << 16), c(1 << 16);
  std::vector<uint8_t> plain(1 << 16);
  ASSERT_TRUE(reg.AddBatch({{a.addr(), a.size, "cpu:0", true, a.fd},
                            {b.addr(), b.size, "cpu:0", false, b.fd},
                            {c.addr(), c.size, "cuda:0", true, c.fd, /*device=*/0}}).ok());
  ASSERT_TRUE(reg.Add(reinterpret_cast<uint64_t>(plain.data()), plain.size(), "cpu:0", true).ok());
  auto l = reg.Export(100);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->ranges.size(), 1u) << "not the local-only range, the device one or plain memory";
  EXPECT_EQ(l->ranges[0].addr, a.addr());
  EXPECT_NE(l->ranges[0].fd, a.fd) << "a duplicate the caller closes";
  EXPECT_NE(l->ranges[0].gen, 0u);
  ASSERT_GE(l->page_fd, 0);
  EXPECT_EQ(l->page_bytes, MemoryRegistry::kExportSlots * sizeof(ExportSlot));
  const int seals = ::fcntl(l->page_fd, F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_SHRINK) << "peers refuse a page that could lose its pages";
  auto again = reg.Export(100);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->ranges[0].slot, l->ranges[0].slot) << "one slot per range";
  EXPECT_EQ(again->ranges[0].gen, l->ranges[0].gen);
  CloseAll(*l);
  CloseAll(*again);
}

TEST(RegistryExport, RemoveEndsTheLoanAndWaitsForCopiers) {
  MemoryRegistry reg;
  SharedMem a(1 << 16), b(1 << 16);
  ASSERT_TRUE(reg.AddBatch({{a.addr(), a.size, "cpu:0", true, a.fd}}).ok());
  auto l = reg.Export(10);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->ranges.size(), 1u);
  ExportSlot* slots = MapSlots(l->page_fd, l->page_bytes);
  ASSERT_NE(slots, nullptr);
  ExportSlot& slot = slots[l->ranges[0].slot];
  const uint64_t gen = l->ranges[0].gen;
  ASSERT_EQ(slot.gen.load(), gen);
  // A peer mid-copy (counted, gen checked) holds the removal until it is done.
  slot.users.fetch_add(1);
  std::thread peer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    slot.users.fetch_sub(1);
  });
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(reg.Remove(a.addr(), 5000).ok());
  const auto waited = std::chrono::steady_clock::now() - t0;
  peer.join();
  EXPECT_GE(waited, std::chrono::milliseconds(90)) << "Remove returned while a peer copied";
  EXPECT_NE(slot.gen.load(), gen) << "the loan is over for every peer";
  // The freed slot goes to the next range, under a new gen.
  ASSERT_TRUE(reg.AddBatch({{b.addr(), b.size, "cpu:0", true, b.fd}}).ok());
  auto l2 = reg.Export(10);
  ASSERT_TRUE(l2.ok());
  ASSERT_EQ(l2->ranges.size(), 1u);
  EXPECT_NE(l2->ranges[0].gen, gen);
  ::munmap(slots, l->page_bytes);
  CloseAll(*l);
  CloseAll(*l2);
}

TEST(RegistryExport, APeerThatNeverFinishesCannotKeepMemoryRegistered) {
  MemoryRegistry reg;
  SharedMem a(1 << 16), b(1 << 16);
  ASSERT_TRUE(reg.AddBatch({{a.addr(), a.size, "cpu:0", true, a.fd}}).ok());
  auto l = reg.Export(10);
  ASSERT_TRUE(l.ok());
  ExportSlot* slots = MapSlots(l->page_fd, l->page_bytes);
  ASSERT_NE(slots, nullptr);
  const uint32_t stuck = l->ranges[0].slot;
  slots[stuck].users.store(7);  // hostile: counted forever
  ASSERT_TRUE(reg.Remove(a.addr(), 50).ok()) << "the range goes after the wait";
  EXPECT_FALSE(reg.Contains(a.addr(), 1));
  ASSERT_TRUE(reg.AddBatch({{b.addr(), b.size, "cpu:0", true, b.fd}}).ok());
  auto l2 = reg.Export(10);
  ASSERT_TRUE(l2.ok());
  ASSERT_EQ(l2->ranges.size(), 1u);
  EXPECT_NE(l2->ranges[0].slot, stuck) << "the stuck slot is retired, not handed out again";
  ::munmap(slots, l->page_bytes);
  CloseAll(*l);
  CloseAll(*l2);
}

// --- a hostile target: FetchExports over a socket pair, the "target" end crafted here ---

class HostileLender : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv_), 0);
    limits_.max_map_per_conn = 1 << 20;
    limits_.max_map_total = 2 << 20;
  }
  void TearDown() override {
    ::close(sv_[0]);
    ::close(sv_[1]);
    EXPECT_EQ(limits_.mapped.load(), 0u) << "nothing stays mapped or counted";
  }
  // The target's reply: `items` with `fds` (page first), sent before the request is read.
  Status Fetch(const std::vector<ExportItem>& items, const std::vector<int>& fds,
               uint64_t page_bytes = MemoryRegistry::kExportSlots * sizeof(ExportSlot),
               uint32_t count = UINT32_MAX) {
    ExportReply er;
    er.seq = 1;
    er.count = count == UINT32_MAX ? static_cast<uint32_t>(items.size()) : count;
    er.page_bytes = page_bytes;
    std::string msg(reinterpret_cast<const char*>(&er), sizeof(er));
    msg.append(reinterpret_cast<const char*>(items.data()), items.size() * sizeof(ExportItem));
    iovec iov{msg.data(), msg.size()};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)];
    AttachFds(&m, control, fds.data(), fds.size());
    EXPECT_EQ(::sendmsg(sv_[1], &m, MSG_NOSIGNAL), static_cast<ssize_t>(msg.size()));
    auto got = FetchExports(UniqueFd(::dup(sv_[0])), 1000, &limits_);
    if (got.ok()) {
      held_ = *got;
      return Status::OK();
    }
    return got.status();
  }
  int sv_[2];
  ShmLimits limits_;
  std::shared_ptr<const PeerExports> held_;
};

TEST_F(HostileLender, AWellFormedLoanIsMappedAndCounted) {
  SharedMem page(MemoryRegistry::kExportSlots * sizeof(ExportSlot)), mem(1 << 16);
  Status s = Fetch({{0x100000, 1 << 16, 5, 3, 0}}, {page.fd, mem.fd});
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_NE(held_, nullptr);
  EXPECT_EQ(held_->ranges(), 1u);
  EXPECT_EQ(limits_.mapped.load(), uint64_t{1} << 16);
  // Copies only while the slot holds the gen it was given.
  auto* slots = reinterpret_cast<ExportSlot*>(page.data);
  std::vector<uint8_t> local(4096, 0x42);
  Slice sl;
  sl.opcode = TransferRequest::WRITE;
  sl.local = reinterpret_cast<uint64_t>(local.data());
  sl.remote = 0x100000 + 4096;
  sl.length = 4096;
  EXPECT_FALSE(held_->Copy(sl)) << "slot 3 holds gen 0, not 5";
  slots[3].gen.store(5);
  EXPECT_TRUE(held_->Copy(sl));
  EXPECT_EQ(mem.data[4096 + 4095], 0x42);
  EXPECT_EQ(slots[3].users.load(), 0u) << "counted only during the copy";
  sl.remote = 0x100000 + (1 << 16) - 100;
  EXPECT_FALSE(held_->Copy(sl)) << "past the lent range";
  sl.remote = 0xFFFFF;
  EXPECT_FALSE(held_->Copy(sl)) << "before it";
  EXPECT_TRUE(held_->Alive());
  ASSERT_EQ(::write(sv_[1], "x", 1), 1);
  EXPECT_FALSE(held_->Alive()) << "a target may send nothing on the export connection";
  held_.reset();
}

TEST_F(HostileLender, ARunOfSlicesIsCopiedPerRangeWhileItsLoanHolds) {
  SharedMem page(MemoryRegistry::kExportSlots * sizeof(ExportSlot)), a(1 << 16), b(1 << 16);
  Status s = Fetch({{0x100000, 1 << 16, 5, 3, 0}, {0x200000, 1 << 16, 7, 4, 0}},
                   {page.fd, a.fd, b.fd});
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto* slots = reinterpret_cast<ExportSlot*>(page.data);
  slots[3].gen.store(5);
  slots[4].gen.store(6);  // range b was unregistered since: its loan is over
  std::vector<uint8_t> local(4 * 4096);
  for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<uint8_t>(i / 4096 + 1);
  // a, a, b, a, beyond both: two runs of range a around one of range b, and a stray.
  const uint64_t remotes[] = {0x100000, 0x100000 + 4096, 0x200000, 0x100000 + 8192, 0x300000};
  std::vector<Slice> slices(5);
  for (size_t i = 0; i < slices.size(); ++i) {
    slices[i].opcode = TransferRequest::WRITE;
    slices[i].local = reinterpret_cast<uint64_t>(local.data()) + 4096 * (i % 4);
    slices[i].remote = remotes[i];
    slices[i].length = 4096;
  }
  uint8_t copied[5];
  held_->Copy(slices.data(), slices.size(), copied);
  EXPECT_EQ(copied[0], 1);
  EXPECT_EQ(copied[1], 1);
  EXPECT_EQ(copied[2], 0) << "range b's slot holds another gen";
  EXPECT_EQ(copied[3], 1);
  EXPECT_EQ(copied[4], 0) << "in no lent range";
  EXPECT_EQ(a.data[0], 1);
  EXPECT_EQ(a.data[4096], 2);
  EXPECT_EQ(a.data[8192 + 4095], 4);
  EXPECT_EQ(b.data[0], 0) << "nothing written into the range whose loan ended";
  EXPECT_EQ(slots[3].users.load(), 0u) << "counted only while copying";
  EXPECT_EQ(slots[4].users.load(), 0u);
  held_.reset();
}

TEST_F(HostileLender, AnUnsealedMemfdIsRefused) {
  SharedMem page(4096), mem(1 << 16, /*seal=*/false);
  Status s = Fetch({{0x100000, 1 << 16, 5, 0, 0}}, {page.fd, mem.fd}, 4096);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("sealed"), std::string::npos) << s.ToString();
}

TEST_F(HostileLender, ARangeLongerThanItsMemfdIsRefused) {
  SharedMem page(4096), mem(1 << 12);
  EXPECT_FALSE(Fetch({{0x100000, 1 << 16, 5, 0, 0}}, {page.fd, mem.fd}, 4096).ok());
}

TEST_F(HostileLender, APageShorterThanSaidOrASlotOutsideItIsRefused) {
  SharedMem page(4096), mem(1 << 12);
  EXPECT_FALSE(Fetch({{0x100000, 1 << 12, 5, 0, 0}}, {page.fd, mem.fd}, 8192).ok());
}

TEST_F(HostileLender, ASlotOutsideThePageIsRefused) {
  SharedMem page(4096), mem(1 << 12);
  EXPECT_FALSE(Fetch({{0x100000, 1 << 12, 5, 256, 0}}, {page.fd, mem.fd}, 4096).ok());
}

TEST_F(HostileLender, OverlappingRangesAreRefused) {
  SharedMem page(4096), m1(1 << 12), m2(1 << 12);
  Status s = Fetch({{0x100000, 1 << 12, 5, 0, 0}, {0x100800, 1 << 12, 6, 1, 0}},
                   {page.fd, m1.fd, m2.fd}, 4096);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("overlapping"), std::string::npos) << s.ToString();
}

TEST_F(HostileLender, MissingDescriptorsAreRefused) {
  SharedMem page(4096), m1(1 << 12);
  EXPECT_FALSE(Fetch({{0x100000, 1 << 12, 5, 0, 0}, {0x200000, 1 << 12, 6, 1, 0}},
                     {page.fd, m1.fd}, 4096).ok());
}

TEST_F(HostileLender, DescriptorsOnAnEmptyReplyAreRefused) {
  SharedMem page(4096);
  EXPECT_FALSE(Fetch({}, {page.fd}, 4096).ok());
}

TEST_F(HostileLender, MoreThanThePerPeerCapIsRefused) {
  SharedMem page(4096), m1(1 << 20), m2(1 << 12);
  Status s = Fetch({{0x100000, 1 << 20, 5, 0, 0}, {0x300000, 1 << 12, 6, 1, 0}},
                   {page.fd, m1.fd, m2.fd}, 4096);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.ToString();
}

TEST_F(HostileLender, MoreThanTheTotalCapIsRefused) {
  limits_.mapped.store(limits_.max_map_total - 100);  // other peers' loans
  SharedMem page(4096), m1(1 << 12);
  Status s = Fetch({{0x100000, 1 << 12, 5, 0, 0}}, {page.fd, m1.fd}, 4096);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.ToString();
  limits_.mapped.store(0);
}

TEST_F(HostileLender, AHugeCountIsRefusedBeforeAnythingIsRead) {
  SharedMem page(4096);
  Status s = Fetch({}, {}, 4096, /*count=*/1u << 30);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("malformed"), std::string::npos) << s.ToString();
}

TEST_F(HostileLender, ATargetThatClosesIsAnError) {
  ::shutdown(sv_[1], SHUT_RDWR);
  auto got = FetchExports(UniqueFd(::dup(sv_[0])), 1000, &limits_);
  EXPECT_FALSE(got.ok());
}

}  // namespace
}  // namespace mooncake::shm
