// Fuzzes the same-host target (src/transport/shm/shm_server.cc): a real ShmServer on its
// abstract unix socket, a MemoryRegistry holding one 64 KiB remote-accessible buffer between
// guard pages (plus one registered without remote access), and this process as the peer.
// The server copies with process_vm_readv/writev against the pid it gets from SO_PEERCRED,
// which is ours: "initiator" addresses resolve in this process (the arena's scratch area and
// shared-memory slots). Map messages hand it memfds (SCM_RIGHTS) that it maps and then copies
// to/from with memcpy; the memfds are mapped in this process too, at the slots.
//
// Checked after every input, against a model written from shm_wire.h (not from the server):
// the reply bytes (framing, sequence numbers, per-item status: kRejected exactly when op > 1
// or the target range is not inside the remote-accessible buffer; kOk when the initiator
// range is in an announced mapping or valid memory here; else kCopyFailed; map replies with
// the number of ranges mapped), and the memory: registered buffer, scratch, every memfd;
// nothing outside them may change, rejected items copy nothing. A copy by the kernel into a
// guard page does not crash (EFAULT), so statuses and memory catch out-of-range copies; a
// memcpy outside the server's own mappings crashes (SEGV/SIGBUS) or is reported by ASan.
// Within one request the model applies items copied through a mapping first, then the
// others, each in item order, as the server does (the protocol does not order the items of
// one request).
//
// Input format:
//   byte 0: bits 0-2 hello: 0-3 valid (probe word in this process); 4 wrong magic (u32 from
//           the input); 5 wrong probe value; 6 probe address and value from the input
//           (u64, u64); 7 the whole 24-byte hello from the input.
//           bit 3: 3 bytes (LE) follow: the stream is cut to that length.
//   then messages, each starting with a byte f:
//     f bit 3 clear - a request: bit 0 raw magic (u32 follows); bit 1 raw count (u32
//           follows; otherwise a byte follows, count = 1 + b % 32); bit 2 raw seq (u64
//           follows; otherwise a counter); then min(count, 64) items, each: byte g:
//           bits 0-1 target base: 0/1 registered buffer, 2 buffer without remote access,
//           3 none (raw u64 address instead of the offset); bits 2-3 length: 0 u8 + 1,
//           1 u16, 2 u32, 3 u64; bit 4: raw u32 op (else op = bit 5: 1 WRITE, 0 READ);
//           bit 6: own initiator offset (signed 24-bit; else the target's offset);
//           bit 7: raw u32 pad. Then: target offset (signed 24-bit LE) or address, length,
//           [op], [initiator offset], [pad]. The initiator address is the scratch area plus
//           the target's offset, or with bit 6 a 24-bit field: bit 22 clear - a signed offset
//           from the scratch area; set - slot (bits 19-21) plus the low 16 bits.
//     f bit 3 set - a map message: a byte n (n % 4 ranges); bit 0 raw magic (u32), bit 1
//           raw count (u32; otherwise the number of ranges), bit 2 raw seq (u64); then per
//           range a byte s: memfd size 4 KiB * (1 + s % 16); bit 4: announced length raw
//           (u32 follows; otherwise the size); bit 5: announced address raw (u64 follows;
//           otherwise where this process maps it); bit 6: attach a pipe instead of a memfd;
//           then a byte: the memfd's fill pattern. One descriptor per range rides on the
//           message's first byte.
// Initiator addresses the server would hand to process_vm_* are kept inside the arena's
// initiator window (scratch and slots with their guards); the model rewrites others to the
// window's first byte (a guard page) before sending. A READ makes the server write at the
// initiator's address in *this* process, which the initiator controls by design.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include <glog/logging.h>

#include "common/net.h"
#include "engine/memory_registry.h"
#include "engine/transport.h"
#include "fuzz_common.h"
#include "mooncake/options.h"
#include "transport/shm/shm_wire.h"
#include "transport/shm/shm_transport.h"

using namespace mooncake;
using fuzz::Arena;

namespace {

Arena g_arena;
MemoryRegistry* g_registry = nullptr;
bool g_vm_ok = false;  // process_vm_readv on ourselves works
volatile uint64_t g_probe_word = 0x5eed5eed12345678ULL;

// Initiator addresses handed to process_vm_* must stay inside [guard][scratch][guard][slots][guard].
uint64_t WindowBegin() { return g_arena.scratch_addr() - Arena::kGuard; }
uint64_t WindowEnd() {
  return g_arena.slot_addr(0) + Arena::kSlots * Arena::kSlotStride + Arena::kGuard;
}

int64_t Signed24(fuzz::Reader& r) {
  uint32_t raw = r.U8() | (r.U8() << 8) | (r.U8() << 16);
  return static_cast<int32_t>(raw << 8) >> 8;
}

template <typename T>
void Append(std::string* s, const T& v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Initiator-side memory of one input: the scratch area and the memfds mapped at the slots.
struct Memfd {
  int fd = -1;       // -1: a pipe stands in (pipe_fd)
  int pipe_fd[2] = {-1, -1};
  size_t size = 0;
  int slot = -1;
};

// Descriptors attached to the stream byte at `offset` (indices into Input::memfds).
struct Attachment {
  size_t offset;
  std::vector<int> memfds;
};

struct Input {
  std::string stream;
  std::vector<Attachment> attach;
  std::vector<Memfd> memfds;
  // Stream offsets of items' initiator_addr fields (the model may rewrite them).
  ~Input() {
    for (Memfd& m : memfds) {
      if (m.slot >= 0) {
        void* p = ::mmap(g_arena.slot(m.slot), Arena::kSlotSize, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (p == MAP_FAILED) fuzz::Fail("restoring slot %d: %s", m.slot, std::strerror(errno));
      }
      if (m.fd >= 0) ::close(m.fd);
      for (int f : m.pipe_fd) {
        if (f >= 0) ::close(f);
      }
    }
  }
};

int NewMemfd(Input* in, size_t size, uint8_t pattern, bool pipe) {
  Memfd m;
  m.size = size;
  if (pipe || in->memfds.size() >= Arena::kSlots) {
    if (::pipe2(m.pipe_fd, O_CLOEXEC) != 0) fuzz::Fail("pipe: %s", std::strerror(errno));
  } else {
    m.fd = ::memfd_create("fuzz-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (m.fd < 0 || ::ftruncate(m.fd, static_cast<off_t>(size)) != 0 ||
        ::fcntl(m.fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
      fuzz::Fail("memfd: %s", std::strerror(errno));
    }
    m.slot = static_cast<int>(in->memfds.size());
    void* p = ::mmap(g_arena.slot(m.slot), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                     m.fd, 0);
    if (p == MAP_FAILED) fuzz::Fail("mmap memfd: %s", std::strerror(errno));
    for (size_t i = 0; i < size; ++i) g_arena.slot(m.slot)[i] = static_cast<uint8_t>(pattern + i * 13);
  }
  in->memfds.push_back(m);
  return static_cast<int>(in->memfds.size()) - 1;
}

void BuildStream(const uint8_t* data, size_t size, Input* in) {
  if (size == 0) return;
  std::string& s = in->stream;
  fuzz::Reader r(data, size);
  uint8_t mode = r.U8();
  size_t cut = SIZE_MAX;
  if (mode & 8) cut = r.U8() | (r.U8() << 8) | (r.U8() << 16);
  shm::HelloRequest hello;
  hello.probe_addr = reinterpret_cast<uint64_t>(&g_probe_word);
  hello.probe_value = g_probe_word;
  switch (mode & 7) {
    case 4: hello.magic = r.U32(); break;
    case 5: hello.probe_value = ~hello.probe_value; break;
    case 6:
      hello.probe_addr = r.U64();
      hello.probe_value = r.U64();
      break;
    case 7: {
      std::string raw = r.Bytes(sizeof(hello));
      raw.resize(sizeof(hello), '\0');
      std::memcpy(&hello, raw.data(), sizeof(hello));
      break;
    }
    default: break;
  }
  Append(&s, hello);
  uint64_t seq = 1;
  while (!r.empty() && s.size() < (4u << 20)) {
    uint8_t f = r.U8();
    shm::RequestHeader h;
    if (f & 8) {  // map message
      uint32_t n = r.U8() % 4;
      h.magic = (f & 1) ? r.U32() : shm::kMapMagic;
      h.count = (f & 2) ? r.U32() : n;
      h.seq = (f & 4) ? r.U64() : seq++;
      Attachment a{s.size(), {}};
      std::string ranges;
      for (uint32_t i = 0; i < n; ++i) {
        uint8_t b = r.U8();
        size_t msize = 4096 * (1 + (b & 15));
        uint64_t length = (b & 0x10) ? r.U32() : msize;
        bool raw_addr = b & 0x20;
        uint64_t addr = raw_addr ? r.U64() : 0;
        int k = NewMemfd(in, msize, r.U8(), b & 0x40);
        if (!raw_addr) {
          addr = in->memfds[k].slot >= 0 ? g_arena.slot_addr(in->memfds[k].slot) : 0;
        }
        Append(&ranges, shm::SharedRange{addr, length});
        a.memfds.push_back(k);
      }
      Append(&s, h);
      s += ranges;
      in->attach.push_back(std::move(a));
      continue;
    }
    if (f & 1) h.magic = r.U32();
    h.count = (f & 2) ? r.U32() : 1u + r.U8() % 32;
    h.seq = (f & 4) ? r.U64() : seq++;
    Append(&s, h);
    uint32_t n = std::min<uint32_t>(h.count, 64);
    for (uint32_t i = 0; i < n && !r.empty(); ++i) {
      uint8_t g = r.U8();
      shm::Item it{};
      int64_t toff = 0;
      switch (g & 3) {
        case 0:
        case 1:
          toff = Signed24(r);
          it.target_addr = g_arena.remote_addr() + static_cast<uint64_t>(toff);
          break;
        case 2:
          toff = Signed24(r);
          it.target_addr = g_arena.local_addr() + static_cast<uint64_t>(toff);
          break;
        default:
          it.target_addr = r.U64();
      }
      switch ((g >> 2) & 3) {
        case 0: it.length = uint64_t{r.U8()} + 1; break;
        case 1: it.length = r.U16(); break;
        case 2: it.length = r.U32(); break;
        default: it.length = r.U64();
      }
      it.op = (g & 0x10) ? r.U32() : ((g >> 5) & 1);
      // Initiator: relative to the scratch area; with an own offset whose bit 22 is set,
      // relative to slot (bits 19-21) instead.
      int64_t ioff = toff;
      uint64_t ibase = g_arena.scratch_addr();
      if (g & 0x40) {
        uint32_t raw = r.U8() | (r.U8() << 8) | (r.U8() << 16);
        if (raw & (1u << 22)) {
          ibase = g_arena.slot_addr((raw >> 19) & 7);
          ioff = raw & 0xFFFF;
        } else {
          ioff = static_cast<int32_t>(raw << 8) >> 8;
        }
      }
      it.initiator_addr = ibase + static_cast<uint64_t>(ioff);
      it.pad = (g & 0x80) ? r.U32() : 0;
      Append(&s, it);
    }
  }
  if (s.size() > cut) {
    s.resize(cut);
    while (!in->attach.empty() && in->attach.back().offset >= cut) in->attach.pop_back();
  }
}

// Memory model: a value per byte, or "unknown" after a copy that failed part-way.
struct Mem {
  uint64_t addr = 0;  // where it is mapped in this process
  std::vector<uint8_t> val, unk;
  void Load(const uint8_t* p, size_t n) {
    addr = reinterpret_cast<uint64_t>(p);
    val.assign(p, p + n);
    unk.assign(n, 0);
  }
  bool Holds(uint64_t a, uint64_t len) const {
    return len > 0 && a >= addr && len <= val.size() && a - addr <= val.size() - len;
  }
  void MarkUnknown(uint64_t a, uint64_t len) {  // the part of [a, a+len) inside this memory
    uint64_t end = a + len < a ? UINT64_MAX : a + len;
    uint64_t lo = std::max(a, addr), hi = std::min<uint64_t>(end, addr + val.size());
    if (lo < hi) std::memset(unk.data() + (lo - addr), 1, hi - lo);
  }
  void Check(const uint8_t* p, const char* what) const {
    if (std::memcmp(p, val.data(), val.size()) == 0) return;
    for (size_t i = 0; i < val.size(); ++i) {
      if (!unk[i] && p[i] != val[i]) {
        fuzz::Fail("ShmServer: %s differs from the model at offset %zu (0x%02x, expected 0x%02x)",
                   what, i, p[i], val[i]);
      }
    }
  }
};

void Copy(Mem& dst, uint64_t d, const Mem& src, uint64_t s, uint64_t len) {
  std::memcpy(dst.val.data() + (d - dst.addr), src.val.data() + (s - src.addr), len);
  std::memcpy(dst.unk.data() + (d - dst.addr), src.unk.data() + (s - src.addr), len);
}

struct ShmExpectation {
  bool hello_known = false;  // the hello's outcome follows from the input alone
  std::string full;          // exact expected reply bytes (given the hello outcome)
  Mem target;
  std::vector<Mem> initiator;  // [0]: scratch; [1 + k]: memfd k (if it is a memfd)
  bool sigbus = false;         // the server will copy beyond the end of a memfd
  size_t maps = 0, copies = 0;
};

bool InRemote(uint64_t a, uint64_t len) {
  uint64_t b = g_arena.remote_addr();
  return len > 0 && a + len >= a && a >= b && a + len <= b + Arena::kRemoteSize;
}

// What the server must do with `in` (shm_wire.h). With `sanitize`, also rewrites initiator
// addresses the server would pass to process_vm_* outside the window (see the top comment).
ShmExpectation Model(Input* in, bool hello_ok_actual, bool sanitize) {
  ShmExpectation e;
  std::string& s = in->stream;
  e.target.Load(g_arena.remote(), Arena::kRemoteSize);
  e.initiator.resize(1 + in->memfds.size());
  e.initiator[0].Load(g_arena.scratch(), Arena::kScratchSize);
  for (size_t k = 0; k < in->memfds.size(); ++k) {
    if (in->memfds[k].slot >= 0) {
      e.initiator[1 + k].Load(g_arena.slot(in->memfds[k].slot), in->memfds[k].size);
    }
  }
  e.hello_known = true;  // unless the probe's outcome depends on memory we do not model
  if (s.size() < sizeof(shm::HelloRequest)) return e;
  shm::HelloRequest hello;
  std::memcpy(&hello, s.data(), sizeof(hello));
  if (hello.magic != shm::kMagic) return e;  // closed without a reply
  e.hello_known = false;
  if (!g_vm_ok) {
    e.hello_known = true;  // process_vm_readv is not allowed here: every hello is refused
  } else if (hello.probe_addr == reinterpret_cast<uint64_t>(&g_probe_word)) {
    e.hello_known = true;
  } else if (hello.probe_addr >= g_arena.scratch_addr() - Arena::kGuard &&
             hello.probe_addr + 8 <= g_arena.scratch_addr()) {
    e.hello_known = true;  // a guard page: unreadable
  }
  bool ok = g_vm_ok && (e.hello_known
                            ? hello.probe_addr == reinterpret_cast<uint64_t>(&g_probe_word) &&
                                  hello.probe_value == g_probe_word
                            : hello_ok_actual);
  shm::HelloReply hr;
  if (!ok) hr.status = shm::kRefused;
  e.full.append(reinterpret_cast<const char*>(&hr), offsetof(shm::HelloReply, err));
  e.full.append(8, '\0');  // err and pad: compared separately (err is an errno)
  if (!ok) return e;

  // Descriptors ride on stream bytes: a header read (recvmsg) that covers such a byte
  // receives them; any other read (plain recv) covering it makes the kernel drop them.
  size_t next_attach = 0;
  auto take_fds = [&](size_t from, size_t to, std::vector<int>* got) {
    while (next_attach < in->attach.size() && in->attach[next_attach].offset < from) ++next_attach;
    while (next_attach < in->attach.size() && in->attach[next_attach].offset < to) {
      if (got) {
        for (int k : in->attach[next_attach].memfds) got->push_back(k);
      }
      ++next_attach;
    }
  };
  struct Map {
    uint64_t addr, length;
    int k;
  };
  std::vector<Map> maps;
  auto translate = [&](uint64_t a, uint64_t len) -> const Map* {
    for (const Map& m : maps) {
      if (a >= m.addr && len <= m.length && a - m.addr <= m.length - len) return &m;
    }
    return nullptr;
  };

  size_t pos = sizeof(hello);
  while (s.size() - pos >= sizeof(shm::RequestHeader)) {
    shm::RequestHeader h;
    std::memcpy(&h, s.data() + pos, sizeof(h));
    std::vector<int> fds;
    take_fds(pos, pos + sizeof(h), &fds);
    pos += sizeof(h);
    if (h.magic == shm::kMapMagic && h.count <= shm::kMaxSharedRanges) {
      // MapRanges: the old set goes in every case; the new one only if everything maps.
      maps.clear();
      size_t need = size_t{h.count} * sizeof(shm::SharedRange);
      bool ok_map = s.size() - pos >= need && fds.size() == h.count;
      std::vector<Map> fresh;
      for (uint32_t i = 0; ok_map && i < h.count; ++i) {
        shm::SharedRange sr;
        std::memcpy(&sr, s.data() + pos + i * sizeof(sr), sizeof(sr));
        const Memfd& m = in->memfds[fds[i]];
        // Refused: a pipe, length 0, or a range longer than its memfd (SIGBUS otherwise).
        if (m.fd < 0 || sr.length == 0 || sr.length > m.size) ok_map = false;
        fresh.push_back({sr.addr, sr.length, fds[i]});
      }
      take_fds(pos, pos + std::min(need, s.size() - pos), nullptr);
      if (s.size() - pos < need) {
        pos = s.size();
      } else {
        pos += need;
      }
      if (ok_map) maps = fresh;
      shm::ReplyHeader rh;
      rh.magic = shm::kMapMagic;
      rh.count = static_cast<uint32_t>(maps.size());
      rh.seq = h.seq;
      Append(&e.full, rh);
      e.maps += maps.size();
      if (pos >= s.size()) break;
      continue;
    }
    if (h.magic != shm::kMagic || h.count == 0 || h.count > shm::kMaxItems) break;
    size_t need = size_t{h.count} * sizeof(shm::Item);
    take_fds(pos, pos + std::min(need, s.size() - pos), nullptr);
    if (s.size() - pos < need) break;
    shm::ReplyHeader rh;
    rh.count = h.count;
    rh.seq = h.seq;
    Append(&e.full, rh);
    std::vector<shm::Item> items(h.count);
    std::vector<uint32_t> st(h.count, shm::kOk);
    std::vector<const Map*> via(h.count, nullptr);
    for (uint32_t i = 0; i < h.count; ++i) {
      size_t at = pos + i * sizeof(shm::Item);
      std::memcpy(&items[i], s.data() + at, sizeof(shm::Item));
      shm::Item& it = items[i];
      via[i] = translate(it.initiator_addr, it.length);
      if (via[i] == nullptr && sanitize &&
          !(it.initiator_addr >= WindowBegin() && it.initiator_addr <= WindowEnd() &&
            it.length <= WindowEnd() - it.initiator_addr)) {
        it.initiator_addr = WindowBegin();  // (also for items to be rejected: belt and braces)
        std::memcpy(s.data() + at, &it, sizeof(it));
        via[i] = translate(it.initiator_addr, it.length);
      }
      if (it.op > 1 || !InRemote(it.target_addr, it.length)) st[i] = shm::kRejected;
    }
    pos += need;
    // Pass 1: items in an announced mapping, memcpy through the server's mapping.
    for (uint32_t i = 0; i < h.count; ++i) {
      if (st[i] != shm::kOk || via[i] == nullptr) continue;
      const shm::Item& it = items[i];
      const Memfd& m = in->memfds[via[i]->k];
      uint64_t off = it.initiator_addr - via[i]->addr;
      if (off + it.length > m.size) {  // past the end of the memfd: SIGBUS in the server
        e.sigbus = true;
        continue;
      }
      Mem& mem = e.initiator[1 + via[i]->k];
      uint64_t here = mem.addr + off;  // the same bytes, through our mapping
      if (it.op == 1) {
        Copy(e.target, it.target_addr, mem, here, it.length);
      } else {
        Copy(mem, here, e.target, it.target_addr, it.length);
      }
      ++e.copies;
    }
    // Pass 2: the rest through process_vm_readv/writev at the initiator's addresses.
    for (uint32_t i = 0; i < h.count; ++i) {
      if (st[i] != shm::kOk || via[i] != nullptr) continue;
      const shm::Item& it = items[i];
      Mem* mem = nullptr;
      for (Mem& m : e.initiator) {
        if (!m.val.empty() && m.Holds(it.initiator_addr, it.length)) mem = &m;
      }
      if (mem) {
        if (it.op == 1) {
          Copy(e.target, it.target_addr, *mem, it.initiator_addr, it.length);
        } else {
          Copy(*mem, it.initiator_addr, e.target, it.target_addr, it.length);
        }
        ++e.copies;
      } else {
        st[i] = shm::kCopyFailed;  // part of the range faults; the rest may have been copied
        if (it.op == 1) {
          e.target.MarkUnknown(it.target_addr, it.length);
        } else {
          for (Mem& m : e.initiator) m.MarkUnknown(it.initiator_addr, it.length);
        }
      }
    }
    for (uint32_t v : st) Append(&e.full, v);
  }
  return e;
}

// Sends `s` (descriptors attached at their offsets) on a non-blocking socket while reading
// the replies, until everything is sent and want(in) bytes arrived, or EOF, or `limit_ms`.
bool ExchangeWithFds(int fd, const Input& in, std::string* out, int limit_ms,
                     const std::function<size_t(const std::string&)>& want) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  const std::string& s = in.stream;
  size_t sent = 0, next = 0;
  bool wr_open = true;
  char buf[65536];
  for (;;) {
    if (wr_open && sent == s.size()) {
      ::shutdown(fd, SHUT_WR);
      wr_open = false;
    }
    if (!wr_open && out->size() >= want(*out)) return true;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    int wait = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count()) + 1;
    pollfd p{fd, static_cast<short>(POLLIN | (wr_open ? POLLOUT : 0)), 0};
    int r = ::poll(&p, 1, wait);
    if (r < 0 && errno != EINTR) fuzz::Fail("poll: %s", std::strerror(errno));
    if (r <= 0) continue;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        out->append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) return true;
    }
    if (!wr_open || !(p.revents & POLLOUT)) continue;
    while (next < in.attach.size() && in.attach[next].offset < sent) ++next;
    size_t end = next < in.attach.size() && in.attach[next].offset > sent ? in.attach[next].offset
                                                                          : s.size();
    iovec iov{const_cast<char*>(s.data()) + sent, end - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
    std::vector<int> fds;
    if (next < in.attach.size() && in.attach[next].offset == sent) {
      for (int k : in.attach[next].memfds) {
        const Memfd& m = in.memfds[k];
        fds.push_back(m.fd >= 0 ? m.fd : m.pipe_fd[0]);
      }
      // The message runs until the next attachment.
      size_t stop = next + 1 < in.attach.size() ? in.attach[next + 1].offset : s.size();
      iov.iov_len = stop - sent;
    }
    if (!fds.empty()) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      if (!fds.empty()) ++next;  // the descriptors went with the first byte
    } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
      sent = s.size();  // the server closed; keep reading
    }
  }
}

// Waits until the server has accepted our connection and its thread has finished (the
// harness checks memory only then).
bool WaitServed(const shm::ShmServer& server, int limit_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    const ConnServer& conns = server.connections();
    if (conns.accepted() > 0 && conns.active() == 0) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;
  FLAGS_logtostderr = true;
  g_arena.Map();
  g_registry = new MemoryRegistry();
  if (!g_registry->Add(g_arena.remote_addr(), Arena::kRemoteSize, "cpu:0", true).ok() ||
      !g_registry->Add(g_arena.local_addr(), Arena::kLocalSize, "cpu:0", false).ok()) {
    fuzz::Fail("registering the arena failed");
  }
  uint64_t seen = 0;
  iovec mine{&seen, 8}, theirs{const_cast<uint64_t*>(&g_probe_word), 8};
  g_vm_ok = ::process_vm_readv(::getpid(), &mine, 1, &theirs, 1, 0) == 8;
  if (!g_vm_ok) {
    std::fprintf(stderr, "fuzz_shm_server: process_vm_readv on itself fails here (%s): only "
                 "the refusal paths can be reached\n", std::strerror(errno));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  g_arena.Reset();
  Input in;
  BuildStream(data, size, &in);
  // What must happen if the hello is accepted, and if it is refused (known in advance
  // unless the probe address came from the input). The first pass also sanitizes.
  ShmExpectation if_ok = Model(&in, true, /*sanitize=*/true);
  ShmExpectation if_refused = Model(&in, false, false);
  auto pick = [&](const std::string& got) -> const ShmExpectation& {
    if (if_ok.hello_known) return if_ok;
    bool refused = got.size() >= 8 && got.compare(4, 4, std::string(4, '\0')) != 0;
    return refused ? if_refused : if_ok;
  };

  EngineOptions options;
  options.slice_timeout_ms = fuzz::kSliceTimeoutMs;
  std::string got;
  {
    shm::ShmServer server(options, g_registry);
    std::string path;
    if (!server.Start(&path).ok()) fuzz::Fail("ShmServer::Start");
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, path.data(), path.size());
    socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size());
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      fuzz::Fail("connect @%s: %s", path.c_str(), std::strerror(errno));
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    // Wait for the expected replies (or EOF), then for the connection thread to finish
    // (older servers keep a finished connection open until their accept loop reaps it);
    // then Stop() and collect anything extra until EOF.
    auto want = [&](const std::string& r) -> size_t {
      if (r.size() < 8 && !if_ok.hello_known) return 8;
      return pick(r).full.size();
    };
    if (!ExchangeWithFds(fd, in, &got, 5000, want)) {
      fuzz::Fail("ShmServer sent %zu of %zu expected reply bytes and then nothing for 5 s",
                 got.size(), want(got));
    }
    if (!WaitServed(server, 5000)) {
      fuzz::Fail("ShmServer's connection thread did not finish within 5 s of the client's EOF");
    }
    server.Stop();
    if (!fuzz::Exchange(fd, std::string(), &got, 5000)) {
      fuzz::Fail("ShmServer: no EOF after Stop()");
    }
    ::close(fd);
  }

  const ShmExpectation& e = pick(got);
  if (fuzz::Trace()) {
    std::fprintf(stderr, "stream %zu bytes, %zu descriptors, reply %zu bytes (expected %zu), "
                 "%zu ranges mapped, %zu copies, hello %s\n", in.stream.size(), in.memfds.size(),
                 got.size(), e.full.size(), e.maps, e.copies,
                 got.size() < 16 ? "-"
                 : got.compare(4, 4, std::string(4, '\0')) == 0 ? "ok" : "refused");
  }
  // Compare the reply; the hello reply's err/pad words are not part of the protocol.
  std::string g = got;
  if (g.size() >= 16) std::memset(g.data() + 8, 0, 8);
  if (g != e.full) {
    size_t i = 0;
    while (i < g.size() && i < e.full.size() && g[i] == e.full[i]) ++i;
    fuzz::Fail("ShmServer: reply differs from the protocol: got %zu bytes, expected %zu; "
               "first difference at byte %zu", g.size(), e.full.size(), i);
  }
  e.target.Check(g_arena.remote(), "registered buffer");
  e.initiator[0].Check(g_arena.scratch(), "initiator scratch memory");
  for (size_t k = 0; k < in.memfds.size(); ++k) {
    if (in.memfds[k].slot >= 0) {
      e.initiator[1 + k].Check(g_arena.slot(in.memfds[k].slot), "initiator shared memory (memfd)");
    }
  }
  g_arena.CheckUntouched("ShmServer");
  return 0;
}
