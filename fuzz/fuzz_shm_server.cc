// Fuzzes the same-host target (src/transport/shm/shm_server.cc): a real ShmServer on its
// abstract unix socket, a MemoryRegistry holding one 64 KiB remote-accessible buffer between
// guard pages (plus one registered without remote access), and this process as the peer.
// The hello binds the connection to this process (its pidfd, and a nonce the server sends
// and reads back from our memory); the harness says it, well or badly as the input asks, and
// checks the server's answers. The server then copies with process_vm_readv/writev against
// our pid: "initiator" addresses resolve in this process (the arena's scratch area and
// shared-memory slots). Map messages hand it descriptors (SCM_RIGHTS): sealed memfds that
// it maps and then copies to/from with memcpy (mapped in this process too, at the slots),
// and wrong ones (pipes, unsealed memfds, huge sparse memfds over the mapping cap, a regular
// file, an eventfd, too many, on the wrong message) that it must refuse.
//
// Checked after every input, against a model written from shm_wire.h (shm_model.h, not from
// the server): the reply bytes (framing, sequence numbers, per-item status: kRejected
// exactly when op > 1 or the target range is not inside the remote-accessible buffer; kOk
// when the initiator range is in an announced mapping or valid memory here; else
// kCopyFailed; map replies with the number of ranges mapped and why not), when the server
// closes (descriptors on a non-map message or more than 250 before a header is complete),
// and the memory: registered buffer, scratch, every memfd; nothing outside them may change,
// rejected items copy nothing. A copy by the kernel into a guard page does not crash
// (EFAULT), so statuses and memory catch out-of-range copies; a memcpy outside the server's
// own mappings crashes (SEGV/SIGBUS) or is reported by ASan. Within one request the model
// applies items copied through a mapping first, then the others, each in item order, as the
// server does (the protocol does not order the items of one request).
//
// Input format:
//   byte 0: bits 0-2 hello: 0-2 valid; 3 the proof message has a wrong magic; 4 wrong magic
//           (u32 from the input); 5 a wrong nonce written; 6 proof address from the input
//           (u64; the nonce is written at ours); 7 the whole 24-byte HelloRequest from the
//           input (the nonce is not written). bit 3: 3 bytes (LE) follow: the stream (hello
//           included) is cut to that length.
//   then messages, each starting with a byte f:
//     f bit 3 clear - a request: bit 0 raw magic (u32 follows); bit 1 raw count (u32
//           follows; otherwise a byte follows, count = 1 + b % 32); bit 2 raw seq (u64
//           follows; otherwise a counter); bit 4: descriptors on the header's first byte (a
//           byte d follows: 1 + d % 8 pipe ends, 253 with d bit 7); then min(count, 64)
//           items, each: byte g:
//           bits 0-1 target base: 0/1 registered buffer, 2 buffer without remote access,
//           3 none (raw u64 address instead of the offset); bits 2-3 length: 0 u8 + 1,
//           1 u16, 2 u32, 3 u64; bit 4: raw u32 op (else op = bit 5: 1 WRITE, 0 READ);
//           bit 6: own initiator offset (signed 24-bit; else the target's offset);
//           bit 7: raw u32 pad. Then: target offset (signed 24-bit LE) or address, length,
//           [op], [initiator offset], [pad]. The initiator address is the scratch area plus
//           the target's offset, or with bit 6 a 24-bit field: bit 22 clear - a signed offset
//           from the scratch area; set - slot (bits 19-21) plus the low 16 bits.
//     f bit 3 set - a map message: a byte n (n % 4 ranges); bit 0 raw magic (u32), bit 1
//           raw count (u32; otherwise the number of ranges), bit 2 raw seq (u64); bit 4 extra
//           descriptors (a byte e: 1 + e % 4 pipe ends; with e bit 7, 253 in all); bit 5 the
//           descriptors ride on header byte 1 + b % 15 (a byte b) instead of the first; then
//           per range a byte s: memfd size 4 KiB * (1 + s % 16); bit 4: announced length raw
//           (u32 follows; otherwise the size); bit 5: announced address raw (u64 follows;
//           otherwise where this process maps it); bit 6: attach a pipe instead of a memfd;
//           bit 7: another kind (a byte k: k % 4: 0 an unsealed memfd, 1 a sealed sparse
//           memfd of 1 << (30 + k / 4 % 17) bytes announced whole, 2 a regular file, 3 an
//           eventfd); then a byte: the memfd's fill pattern.
// Initiator addresses the server would hand to process_vm_* are kept inside the arena's
// initiator window (scratch and slots with their guards); the model rewrites others to the
// window's first byte (a guard page) before sending. A READ makes the server write at the
// initiator's address in *this* process, which the initiator controls by design.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <glog/logging.h>

#include "common/net.h"
#include "engine/memory_registry.h"
#include "engine/transport.h"
#include "fuzz_common.h"
#include "mooncake/options.h"
#include "shm_model.h"
#include "transport/shm/shm_transport.h"
#include "transport/shm/shm_wire.h"

using namespace mooncake;
using fuzz::Arena;
using fuzz::Append;
using fuzz::FdKind;
using fuzz::Input;
using fuzz::Memfd;
using fuzz::ShmExpectation;
using fuzz::g_shm_arena;

namespace {

Arena& g_arena = g_shm_arena;
MemoryRegistry* g_registry = nullptr;
bool g_vm_ok = false;  // process_vm_readv on ourselves works
volatile uint8_t g_proof[shm::kNonceSize];

int64_t Signed24(fuzz::Reader& r) {
  uint32_t raw = r.U8() | (r.U8() << 8) | (r.U8() << 16);
  return static_cast<int32_t>(raw << 8) >> 8;
}

int NewMemfd(Input* in, FdKind kind, uint64_t size, uint8_t pattern) {
  Memfd m;
  m.kind = kind;
  m.size = size;
  if (kind == FdKind::kMemfd && in->memfds.size() >= Arena::kSlots) m.kind = kind = FdKind::kPipe;
  switch (kind) {
    case FdKind::kPipe:
      if (::pipe2(m.pipe_fd, O_CLOEXEC) != 0) fuzz::Fail("pipe: %s", std::strerror(errno));
      m.fd = m.pipe_fd[0];
      break;
    case FdKind::kFile:
      m.fd = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
      if (m.fd < 0) fuzz::Fail("open /proc/self/exe: %s", std::strerror(errno));
      break;
    case FdKind::kEventfd:
      m.fd = ::eventfd(0, EFD_CLOEXEC);
      if (m.fd < 0) fuzz::Fail("eventfd: %s", std::strerror(errno));
      break;
    default: {
      bool seal = kind != FdKind::kUnsealed;
      m.fd = ::memfd_create("fuzz-shm", MFD_CLOEXEC | (seal ? MFD_ALLOW_SEALING : 0));
      if (m.fd < 0 || ::ftruncate(m.fd, static_cast<off_t>(size)) != 0 ||
          (seal && ::fcntl(m.fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)) {
        fuzz::Fail("memfd of %llu bytes: %s", static_cast<unsigned long long>(size),
                   std::strerror(errno));
      }
      if (kind != FdKind::kMemfd) break;
      m.slot = static_cast<int>(in->memfds.size());
      void* p = ::mmap(g_arena.slot(m.slot), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                       m.fd, 0);
      if (p == MAP_FAILED) fuzz::Fail("mmap memfd: %s", std::strerror(errno));
      for (size_t i = 0; i < size; ++i) g_arena.slot(m.slot)[i] = static_cast<uint8_t>(pattern + i * 13);
    }
  }
  in->memfds.push_back(m);
  return static_cast<int>(in->memfds.size()) - 1;
}

// A flood is as many as one message may carry (the kernel's SCM_MAX_FD, 253), memfds included.
constexpr size_t kFlood = 253;

size_t ExtraFds(Input* in, uint8_t b, size_t small_mod) {
  if (in->extra_pipe[0] < 0 && ::pipe2(in->extra_pipe, O_CLOEXEC) != 0) {
    fuzz::Fail("pipe: %s", std::strerror(errno));
  }
  return (b & 0x80) ? kFlood : 1 + b % small_mod;
}

void BuildStream(const uint8_t* data, size_t size, Input* in) {
  if (size == 0) return;
  std::string& s = in->stream;
  fuzz::Reader r(data, size);
  uint8_t mode = r.U8();
  in->hello_mode = mode & 7;
  if (mode & 8) in->cut = r.U8() | (r.U8() << 8) | (r.U8() << 16);
  switch (mode & 7) {
    case 4: in->hello_magic = r.U32(); break;
    case 6: in->proof_addr = r.U64(); break;
    case 7:
      in->hello_raw = r.Bytes(sizeof(shm::HelloRequest));
      in->hello_raw.resize(sizeof(shm::HelloRequest), '\0');
      break;
    default: break;
  }
  uint64_t seq = 1;
  while (!r.empty() && s.size() < (4u << 20)) {
    uint8_t f = r.U8();
    shm::RequestHeader h;
    if (f & 8) {  // map message
      uint32_t n = r.U8() % 4;
      h.magic = (f & 1) ? r.U32() : shm::kMapMagic;
      h.count = (f & 2) ? r.U32() : n;
      h.seq = (f & 4) ? r.U64() : seq++;
      size_t extra = (f & 0x10) ? ExtraFds(in, r.U8(), 4) : 0;
      size_t at = (f & 0x20) ? 1 + r.U8() % 15 : 0;
      fuzz::Attachment a{s.size() + at, {}, extra};
      std::string ranges;
      for (uint32_t i = 0; i < n; ++i) {
        uint8_t b = r.U8();
        uint64_t msize = 4096 * (1 + (b & 15));
        FdKind kind = (b & 0x40) ? FdKind::kPipe : FdKind::kMemfd;
        if (b & 0x80) {
          uint8_t k = r.U8();
          kind = std::array<FdKind, 4>{FdKind::kUnsealed, FdKind::kHuge, FdKind::kFile,
                                       FdKind::kEventfd}[k % 4];
          if (kind == FdKind::kHuge) msize = uint64_t{1} << (30 + (k / 4) % 17);
        }
        uint64_t length = (b & 0x10) && kind != FdKind::kHuge ? r.U32() : msize;
        bool raw_addr = b & 0x20;
        uint64_t addr = raw_addr ? r.U64() : 0;
        int k = NewMemfd(in, kind, msize, r.U8());
        if (!raw_addr) {
          addr = in->memfds[k].slot >= 0 ? g_arena.slot_addr(in->memfds[k].slot) : 0x10000;
        }
        Append(&ranges, shm::SharedRange{addr, length});
        a.memfds.push_back(k);
      }
      if (a.extra == kFlood) a.extra -= a.memfds.size();
      Append(&s, h);
      s += ranges;
      if (!a.memfds.empty() || a.extra) in->attach.push_back(std::move(a));
      continue;
    }
    if (f & 1) h.magic = r.U32();
    h.count = (f & 2) ? r.U32() : 1u + r.U8() % 32;
    h.seq = (f & 4) ? r.U64() : seq++;
    if (f & 0x10) in->attach.push_back({s.size(), {}, ExtraFds(in, r.U8(), 8)});
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
  // The cut counts the hello's 24 bytes; attachments past it never go.
  if (in->cut != SIZE_MAX && in->cut >= sizeof(shm::HelloRequest)) {
    size_t cut = in->cut - sizeof(shm::HelloRequest);
    if (s.size() > cut) s.resize(cut);
    while (!in->attach.empty() && in->attach.back().offset >= s.size()) in->attach.pop_back();
  }
}

// Reads exactly n bytes within limit_ms (false on EOF or timeout).
bool RecvN(int fd, void* p, size_t n, int limit_ms) {
  return ReadFull(fd, p, n, limit_ms).ok();
}

// The server closes without sending anything more.
void ExpectEof(int fd, const char* after) {
  char c;
  // (An EINTR from libFuzzer's timer once read as "no EOF": about 2 in 1.2 M executions.)
  if (fuzz::PollFor(fd, POLLIN, 5000) <= 0) {
    fuzz::DumpThreads();  // where the server's threads were
    fuzz::Fail("ShmServer: no EOF within 5 s after %s", after);
  }
  ssize_t n = ::recv(fd, &c, 1, 0);
  if (n > 0) fuzz::Fail("ShmServer: sent data after %s instead of closing", after);
}

// Says the hello as the input asks; returns whether the server accepted it (and then the
// messages are sent). Checks every answer of the server on the way.
bool Hello(int fd, Input& in) {
  shm::HelloRequest hello;
  hello.proof_addr = reinterpret_cast<uint64_t>(&g_proof[0]);
  if (in.hello_mode == 4) hello.magic = in.hello_magic;
  if (in.hello_mode == 6) hello.proof_addr = in.proof_addr;
  if (in.hello_mode == 7) std::memcpy(&hello, in.hello_raw.data(), sizeof(hello));
  if (in.cut < sizeof(hello)) {  // a hello cut short, then EOF
    if (!WriteFull(fd, &hello, in.cut, 3000).ok()) return false;
    ::shutdown(fd, SHUT_WR);
    ExpectEof(fd, "a hello cut short");
    return false;
  }
  if (!WriteFull(fd, &hello, sizeof(hello), 3000).ok()) fuzz::Fail("sending the hello");
  if (hello.magic != shm::kMagic) {
    ExpectEof(fd, "a hello with a wrong magic");
    return false;
  }
  shm::HelloReply r;
  if (!RecvN(fd, &r, sizeof(r), 5000)) fuzz::Fail("ShmServer: no reply to the hello");
  if (r.magic != shm::kMagic) fuzz::Fail("ShmServer: hello reply with a wrong magic");
  if (hello.version != shm::kVersion) {
    if (r.status != shm::kBadVersion || r.version != shm::kVersion) {
      fuzz::Fail("ShmServer: a v%u hello got status %u (version %u), not kBadVersion",
                 hello.version, r.status, r.version);
    }
    ExpectEof(fd, "refusing a hello's version");
    return false;
  }
  if (r.status != shm::kChallenge) fuzz::Fail("ShmServer: hello status %u, not kChallenge", r.status);
  uint8_t nonce[shm::kNonceSize];
  if (!RecvN(fd, nonce, sizeof(nonce), 5000)) fuzz::Fail("ShmServer: no nonce after the challenge");
  if (in.hello_mode != 7) {
    for (uint32_t i = 0; i < shm::kNonceSize; ++i) {
      g_proof[i] = static_cast<uint8_t>(nonce[i] ^ (in.hello_mode == 5 && i == 3 ? 1 : 0));
    }
  }
  shm::HelloProof proof;
  if (in.hello_mode == 3) proof.magic = ~shm::kMagic;
  if (!WriteFull(fd, &proof, sizeof(proof), 3000).ok()) fuzz::Fail("sending the proof");
  if (in.hello_mode == 3) {
    ExpectEof(fd, "a malformed proof message");
    return false;
  }
  if (!RecvN(fd, &r, sizeof(r), 5000)) fuzz::Fail("ShmServer: no answer to the proof");
  if (r.magic != shm::kMagic || (r.status != shm::kOk && r.status != shm::kRefused)) {
    fuzz::Fail("ShmServer: malformed answer to the proof (status %u)", r.status);
  }
  // Known outcomes: our own proof word with the right nonce passes (where process_vm_readv
  // works at all); a wrong nonce, or nothing written, does not.
  bool ours = hello.proof_addr == reinterpret_cast<uint64_t>(&g_proof[0]);
  bool must_pass = g_vm_ok && ours && in.hello_mode != 5 && in.hello_mode != 7;
  bool must_fail = !g_vm_ok || in.hello_mode == 5 || (in.hello_mode == 7 && !ours);
  if (must_pass && r.status != shm::kOk) fuzz::Fail("ShmServer: refused a valid proof (err %d)", r.err);
  if (must_fail && r.status == shm::kOk) fuzz::Fail("ShmServer: accepted a wrong proof");
  if (r.status != shm::kOk) {
    ExpectEof(fd, "refusing the proof");
    return false;
  }
  return true;
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
    std::vector<int> fds;
    if (next < in.attach.size() && in.attach[next].offset == sent) {
      for (int k : in.attach[next].memfds) fds.push_back(in.memfds[k].fd);
      for (size_t i = 0; i < in.attach[next].extra; ++i) fds.push_back(in.extra_pipe[0]);
      // The message runs until the next attachment.
      size_t stop = next + 1 < in.attach.size() ? in.attach[next + 1].offset : s.size();
      iov.iov_len = stop - sent;
    }
    std::vector<cmsghdr> control(CMSG_SPACE(sizeof(int) * fds.size()) / sizeof(cmsghdr) + 1);
    shm::AttachFds(&msg, reinterpret_cast<char*>(control.data()), fds.data(), fds.size());
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
  FLAGS_minloglevel = fuzz::Trace() ? 0 : 3;  // FUZZ_TRACE=1: the server's log too
  FLAGS_logtostderr = true;
  g_arena.Map();
  g_registry = new MemoryRegistry();
  if (!g_registry->Add(g_arena.remote_addr(), Arena::kRemoteSize, "cpu:0", true).ok() ||
      !g_registry->Add(g_arena.local_addr(), Arena::kLocalSize, "cpu:0", false).ok()) {
    fuzz::Fail("registering the arena failed");
  }
  uint64_t seen = 0, word = 0x5eed5eed12345678ULL;
  iovec mine{&seen, 8}, theirs{&word, 8};
  g_vm_ok = ::process_vm_readv(::getpid(), &mine, 1, &theirs, 1, 0) == 8 && seen == word;
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
  // What must happen if the hello is accepted. The model also sanitizes the stream.
  ShmExpectation e = fuzz::Model(&in, /*sanitize=*/true);

  EngineOptions options;
  options.slice_timeout_ms = fuzz::kSliceTimeoutMs;
  options.shm_max_map_per_conn = fuzz::kShmMapCapPerConn;
  options.shm_max_map_total = fuzz::kShmMapCapTotal;
  std::string got;
  bool accepted = false;
  uint64_t refused = 0;
  {
    shm::ShmServer server(options, g_registry);
    std::string path;
    if (!server.Start(&path).ok()) fuzz::Fail("ShmServer::Start");
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, path.data(), path.size());
    socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size());
    if (fd < 0 || !fuzz::Connect(fd, &addr, len)) {
      fuzz::Fail("connect @%s: %s", path.c_str(), std::strerror(errno));
    }
    accepted = Hello(fd, in);
    if (accepted) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      // Wait for the expected replies (or EOF), then for the connection thread to finish;
      // then Stop() and collect anything extra until EOF.
      auto want = [&](const std::string&) -> size_t { return e.full.size(); };
      if (!ExchangeWithFds(fd, in, &got, 5000, want)) {
        fuzz::Fail("ShmServer sent %zu of %zu expected reply bytes and then nothing for 5 s",
                   got.size(), e.full.size());
      }
    }
    if (!WaitServed(server, 5000)) {
      fuzz::Fail("ShmServer's connection thread did not finish within 5 s of the client's EOF");
    }
    if (server.limits().held_fds.load() != 0 || server.limits().mapped.load() != 0) {
      fuzz::Fail("ShmServer: %zu descriptors held and %llu bytes mapped after its connection "
                 "ended", server.limits().held_fds.load(),
                 static_cast<unsigned long long>(server.limits().mapped.load()));
    }
    refused = server.limits().maps_refused.load();
    server.Stop();
    if (accepted && !fuzz::Exchange(fd, std::string(), &got, 5000)) {
      fuzz::Fail("ShmServer: no EOF after Stop()");
    }
    ::close(fd);
  }
  if (fuzz::Trace()) {
    std::fprintf(stderr, "hello %s, stream %zu bytes, %zu descriptors, reply %zu bytes "
                 "(expected %zu), %zu ranges mapped, %zu refused, %zu copies%s\n",
                 accepted ? "ok" : "refused", in.stream.size(), in.memfds.size(), got.size(),
                 e.full.size(), e.maps, e.refused_maps, e.copies,
                 e.dropped ? ", dropped for its descriptors" : "");
  }
  if (!accepted) {
    g_arena.CheckUntouched("ShmServer");
    return 0;
  }
  if (got != e.full) {
    size_t i = 0;
    while (i < got.size() && i < e.full.size() && got[i] == e.full[i]) ++i;
    fuzz::Fail("ShmServer: reply differs from the protocol: got %zu bytes, expected %zu; "
               "first difference at byte %zu", got.size(), e.full.size(), i);
  }
  if (refused != e.refused_maps) {
    fuzz::Fail("ShmServer refused %llu announcements, the model %zu",
               static_cast<unsigned long long>(refused), e.refused_maps);
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
