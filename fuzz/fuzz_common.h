// Helpers shared by the fuzz targets: an input reader, a guarded memory arena at a fixed
// address, and a non-blocking "send everything, read until EOF" client loop.
#pragma once

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <sanitizer/asan_interface.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace fuzz {

// Prints a message and aborts: libFuzzer saves the input as a crash.
[[noreturn]] inline void Fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void Fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::fputs("\n*** FUZZ ORACLE FAILURE: ", stderr);
  std::vfprintf(stderr, fmt, ap);
  std::fputs("\n", stderr);
  va_end(ap);
  std::abort();
}

// Prints every thread of this process (tid, name, state, kernel wait channel and, where
// readable, kernel stack) on stderr: for oracles that time out waiting on a server thread,
// so that a stall says where the threads were.
inline void DumpThreads() {
  auto slurp = [](const std::string& path, size_t max) {
    std::string out;
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      char buf[512];
      size_t n;
      while (out.size() < max && (n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
      std::fclose(f);
    }
    if (out.size() > max) out.resize(max);
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  };
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string t = std::string("/proc/self/task/") + e->d_name;
    const std::string stat = slurp(t + "/stat", 512);
    const size_t paren = stat.rfind(')');
    const char state = paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '?';
    std::fprintf(stderr, "thread %s %s state %c wchan %s\n%s\n", e->d_name,
                 slurp(t + "/comm", 64).c_str(), state, slurp(t + "/wchan", 64).c_str(),
                 slurp(t + "/stack", 1024).c_str());
  }
  ::closedir(d);
}

// libFuzzer's -timeout runs a periodic SIGALRM: any blocking call of a harness may return
// EINTR. These two wait through it.
//
// connect() on a blocking socket; true once connected. An interrupted connect goes on in
// the background: wait for it to be writable, then read its outcome (errno set on failure).
inline bool Connect(int fd, const void* addr, socklen_t len, int timeout_ms = 10000) {
  if (::connect(fd, static_cast<const sockaddr*>(addr), len) == 0) return true;
  if (errno != EINTR && errno != EINPROGRESS) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      errno = ETIMEDOUT;
      return false;
    }
    pollfd p{fd, POLLOUT, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    if (r == 0) continue;
    int err = 0;
    socklen_t elen = sizeof(err);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) return false;
    errno = err;
    return err == 0;
  }
}

// poll() for `events` on fd, at most timeout_ms in all: > 0 ready, 0 timed out, < 0 error.
inline int PollFor(int fd, short events, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()).count();
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left > 0 ? left : 0));
    if (r < 0 && errno == EINTR) {
      if (left <= 0) return 0;
      continue;
    }
    return r;
  }
}

// MC_SLICE_TIMEOUT of the servers under test: how long they wait for a peer that makes no
// progress within a request. The clients here never stall, so this bounds only a hang; it is
// not smaller because a client thread descheduled that long on a loaded machine would make
// the server give up on a valid stream (a false failure).
constexpr int kSliceTimeoutMs = 1000;

// FUZZ_TRACE=1 in the environment: the targets describe each input's outcome on stderr.
inline bool Trace() {
  static const bool on = std::getenv("FUZZ_TRACE") != nullptr;
  return on;
}

// Reads fields from the front of the input; past the end everything reads as 0.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  bool empty() const { return p_ == end_; }
  uint8_t U8() { return p_ < end_ ? *p_++ : 0; }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  uint32_t U32() { return U16() | (static_cast<uint32_t>(U16()) << 16); }
  uint64_t U64() { return U32() | (static_cast<uint64_t>(U32()) << 32); }
  // Up to n bytes (fewer at the end of the input).
  std::string Bytes(size_t n) {
    n = std::min(n, left());
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  std::string Rest() { return Bytes(left()); }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// The memory the server targets see, mapped once per process at a fixed address so that
// absolute addresses in saved inputs (raw mode, seeds) stay valid from run to run:
//
//   [guard][red][ remote 64 KiB ][red][guard][ local 16 KiB ][guard][ scratch 64 KiB ][guard]
//   [ 8 shared-memory slots: 64 KiB, then 64 KiB PROT_NONE ][guard]
//
// guard: PROT_NONE (any access by the server faults); red: readable/writable but poisoned
// for ASan (an intercepted copy - memcpy, recv, sendmsg - into it is reported); remote: the
// registered, remote-accessible buffer; local: registered with remote_accessible = false
// (must never be touched by a peer); scratch: initiator-side memory (SHM target only);
// slots: PROT_NONE until the SHM target maps a memfd there (initiator shared memory).
struct Arena {
  static constexpr uint64_t kFixedBase = 0x2a0000000000ULL;  // ASan high memory, unused
  static constexpr size_t kPage = 4096;
  static constexpr size_t kGuard = 512 << 10;
  static constexpr size_t kRed = kPage;
  static constexpr size_t kRemoteSize = 64 << 10;
  static constexpr size_t kLocalSize = 16 << 10;
  static constexpr size_t kScratchSize = 64 << 10;

  static constexpr size_t kRedBeforeOff = kGuard;
  static constexpr size_t kRemoteOff = kRedBeforeOff + kRed;
  static constexpr size_t kRedAfterOff = kRemoteOff + kRemoteSize;
  static constexpr size_t kLocalOff = kRedAfterOff + kRed + kGuard;
  static constexpr size_t kScratchOff = kLocalOff + kLocalSize + kGuard;
  // A slot holds a mapping of at most kSlotSize bytes; the rest of its stride stays PROT_NONE,
  // so that no range can run from one mapping into the next.
  static constexpr size_t kSlotSize = 64 << 10;
  static constexpr size_t kSlotStride = 2 * kSlotSize;
  static constexpr size_t kSlots = 8;
  static constexpr size_t kSlotsOff = kScratchOff + kScratchSize + kGuard;
  static constexpr size_t kTotal = kSlotsOff + kSlots * kSlotStride + kGuard;

  uint8_t* base = nullptr;
  bool fixed = false;
  std::vector<uint8_t> init_remote, init_local, init_scratch, init_red;

  uint8_t* remote() const { return base + kRemoteOff; }
  uint8_t* local() const { return base + kLocalOff; }
  uint8_t* scratch() const { return base + kScratchOff; }
  uint64_t remote_addr() const { return reinterpret_cast<uint64_t>(remote()); }
  uint64_t local_addr() const { return reinterpret_cast<uint64_t>(local()); }
  uint64_t scratch_addr() const { return reinterpret_cast<uint64_t>(scratch()); }
  uint8_t* slot(size_t i) const { return base + kSlotsOff + i * kSlotStride; }
  uint64_t slot_addr(size_t i) const { return reinterpret_cast<uint64_t>(slot(i)); }

  static uint8_t RemoteInit(size_t i) { return static_cast<uint8_t>(i * 131 + (i >> 8) + 7); }
  static uint8_t LocalInit(size_t i) { return static_cast<uint8_t>(0xA5 ^ (i * 7)); }
  static uint8_t ScratchInit(size_t i) { return static_cast<uint8_t>(i * 29 + (i >> 8) + 3); }
  static constexpr uint8_t kRedByte = 0xCD;

  void Map() {
    void* want = reinterpret_cast<void*>(kFixedBase);
    void* p = ::mmap(want, kTotal, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                     -1, 0);
    if (p == MAP_FAILED || p != want) {
      if (p != MAP_FAILED) ::munmap(p, kTotal);
      std::fprintf(stderr, "fuzz: arena not at its fixed address (%s); raw-mode inputs with "
                   "absolute addresses will not reproduce\n", std::strerror(errno));
      p = ::mmap(nullptr, kTotal, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) Fail("mmap arena: %s", std::strerror(errno));
    } else {
      fixed = true;
    }
    base = static_cast<uint8_t*>(p);
    Protect(kRedBeforeOff, kRed + kRemoteSize + kRed);
    Protect(kLocalOff, kLocalSize);
    Protect(kScratchOff, kScratchSize);
    std::memset(base + kRedBeforeOff, kRedByte, kRed);
    std::memset(base + kRedAfterOff, kRedByte, kRed);
    PoisonRed(true);
    init_remote.resize(kRemoteSize);
    init_local.resize(kLocalSize);
    init_scratch.resize(kScratchSize);
    for (size_t i = 0; i < kRemoteSize; ++i) init_remote[i] = RemoteInit(i);
    for (size_t i = 0; i < kLocalSize; ++i) init_local[i] = LocalInit(i);
    for (size_t i = 0; i < kScratchSize; ++i) init_scratch[i] = ScratchInit(i);
    init_red.assign(kRed, kRedByte);
    Reset();
  }

  void Protect(size_t off, size_t len) {
    if (::mprotect(base + off, len, PROT_READ | PROT_WRITE) != 0) {
      Fail("mprotect: %s", std::strerror(errno));
    }
  }

  void PoisonRed(bool on) {
    if (on) {
      ASAN_POISON_MEMORY_REGION(base + kRedBeforeOff, kRed);
      ASAN_POISON_MEMORY_REGION(base + kRedAfterOff, kRed);
    } else {
      ASAN_UNPOISON_MEMORY_REGION(base + kRedBeforeOff, kRed);
      ASAN_UNPOISON_MEMORY_REGION(base + kRedAfterOff, kRed);
    }
  }

  // Every input starts from the same memory contents.
  void Reset() {
    std::memcpy(remote(), init_remote.data(), kRemoteSize);
    std::memcpy(local(), init_local.data(), kLocalSize);
    std::memcpy(scratch(), init_scratch.data(), kScratchSize);
  }

  // The red zones and the local-only region must never change.
  void CheckUntouched(const char* who) {
    PoisonRed(false);
    bool before = std::memcmp(base + kRedBeforeOff, init_red.data(), kRed) == 0;
    bool after = std::memcmp(base + kRedAfterOff, init_red.data(), kRed) == 0;
    if (!before || !after) {
      for (size_t i = 0; i < kRed; ++i) {
        if (base[kRedBeforeOff + i] != kRedByte) {
          Fail("%s: red zone before the registered buffer changed at -%zu", who, kRed - i);
        }
        if (base[kRedAfterOff + i] != kRedByte) {
          Fail("%s: red zone after the registered buffer changed at +%zu", who, i);
        }
      }
    }
    PoisonRed(true);
    if (std::memcmp(local(), init_local.data(), kLocalSize) != 0) {
      for (size_t i = 0; i < kLocalSize; ++i) {
        if (local()[i] != init_local[i]) {
          Fail("%s: memory registered WITHOUT remote access changed at offset %zu", who, i);
        }
      }
    }
  }
};

// Sends `out` on a non-blocking stream socket while collecting what comes back, then shuts
// down the write side and reads until EOF (or a reset), or - when `want` is given - until
// everything is sent and at least want(*in) bytes have arrived. Returns false if neither
// happened within `limit_ms` (the caller decides whether that is a hang).
inline bool Exchange(int fd, const std::string& out, std::string* in, int limit_ms,
                     const std::function<size_t(const std::string&)>& want = nullptr) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  size_t sent = 0;
  bool wr_open = true;
  if (out.empty()) {
    ::shutdown(fd, SHUT_WR);
    wr_open = false;
  }
  char buf[65536];
  for (;;) {
    if (!wr_open && want && in->size() >= want(*in)) return true;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    int wait = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count()) + 1;
    pollfd p{fd, static_cast<short>(POLLIN | (wr_open ? POLLOUT : 0)), 0};
    int r = ::poll(&p, 1, wait);
    if (r < 0) {
      if (errno == EINTR) continue;
      Fail("poll: %s", std::strerror(errno));
    }
    if (r == 0) continue;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        in->append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) return true;
      if (errno != EAGAIN && errno != EINTR) return true;  // reset: the peer is gone
    }
    if (wr_open && (p.revents & POLLOUT)) {
      ssize_t n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        sent = out.size();  // the peer closed on us; stop sending, keep reading
      }
      if (sent == out.size()) {
        ::shutdown(fd, SHUT_WR);
        wr_open = false;
      }
    }
  }
}

// Closes without TIME_WAIT (RST), so that many short connections do not exhaust ports.
inline void CloseAbortive(int fd) {
  linger lg{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  ::close(fd);
}

}  // namespace fuzz
