// LegitimateTransfer: a well-behaved same-host peer, byte-checked (shm_hostile.h).
#include "shm_hostile.h"

namespace shm_hostile {

std::string LegitimateTransfer(Target& t) {
  auto conn = ConnectAndHello(t.path, 3000, "");
  if (!conn.ok()) return "hello: " + conn.status().ToString();
  const int fd = conn->get();
  constexpr size_t kShared = 64 << 10;
  int mfd = SealedMemfd(kShared);
  if (mfd < 0) return "memfd";
  void* p = ::mmap(nullptr, kShared, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  if (p == MAP_FAILED) return "mmap";
  auto* shared = static_cast<uint8_t*>(p);
  std::vector<uint8_t> priv(kShared);
  for (size_t i = 0; i < kShared; ++i) {
    shared[i] = static_cast<uint8_t>(i * 7 + 1);
    priv[i] = static_cast<uint8_t>(i * 13 + 5);
  }
  std::string err;
  MapReply mr;
  if (!Map(fd, {{reinterpret_cast<uint64_t>(shared), kShared}}, {mfd}, 1, &mr)) {
    err = "map message failed";
  } else if (mr.count != 1) {
    err = "the target did not map a legitimate 64 KiB memfd (status " +
          std::to_string(mr.status) + ")";
  }
  // WRITE from shared (memcpy) to buf[0..], from priv (process_vm_readv) to buf[64K..];
  // then READ both back into priv2.
  std::vector<uint8_t> back(2 * kShared, 0);
  uint64_t b = t.buf.addr();
  std::vector<Item> w = {{reinterpret_cast<uint64_t>(shared), b, kShared, 1, 0},
                         {reinterpret_cast<uint64_t>(priv.data()), b + kShared, kShared, 1, 0}};
  std::vector<Item> r = {{reinterpret_cast<uint64_t>(back.data()), b, 2 * kShared, 0, 0}};
  std::vector<uint32_t> st;
  if (err.empty() && (!SendRequest(fd, w, 2) || !ReadReply(fd, 2, 2, &st))) err = "write request";
  if (err.empty() && (st[0] != kOk || st[1] != kOk)) err = "write statuses not kOk";
  if (err.empty() && (!SendRequest(fd, r, 3) || !ReadReply(fd, 1, 3, &st))) err = "read request";
  if (err.empty() && st[0] != kOk) err = "read status not kOk";
  if (err.empty() && (std::memcmp(back.data(), shared, kShared) != 0 ||
                      std::memcmp(back.data() + kShared, priv.data(), kShared) != 0 ||
                      std::memcmp(t.buf.data, shared, kShared) != 0)) {
    err = "bytes differ";
  }
  ::munmap(shared, kShared);
  ::close(mfd);
  return err;
}

}  // namespace shm_hostile
