// raw_baselines: the physical limits the engine is measured against, on this machine.
//
// Common flags: --span BYTES (working set per thread, default 64 MiB).
//   raw_baselines memcpy  --block_size B --threads T --duration S
//   raw_baselines tcp     --block_size B --threads T --duration S   (T loopback connections)
//   raw_baselines pvm     --block_size B --threads T --duration S   (process_vm_writev into a
//                                                                     child process)
// Each prints one JSON line: {"baseline":..., "block_size":..., "threads":..., "gbps":...}.
// No engine code is used: plain syscalls and memcpy.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string mode;
  size_t block = 1 << 20;
  int threads = 1;
  double duration = 3;
  size_t span = 0;  // bytes each thread cycles through (0: 64 MiB)
};

uint8_t* Alloc(size_t n) {
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  std::memset(p, 1, n);
  return static_cast<uint8_t*>(p);
}

void Report(const Args& a, double bytes, double secs, double ops) {
  std::printf(
      "{\"baseline\":\"%s\",\"block_size\":%zu,\"threads\":%d,\"duration_s\":%.3f,"
      "\"gbps\":%.4f,\"ops_per_s\":%.1f}\n",
      a.mode.c_str(), a.block, a.threads, secs, bytes / secs / 1e9, ops / secs);
}

// Runs `body(tid, &bytes, &ops)` on T threads until the duration passes.
template <typename F>
void RunThreads(const Args& a, F body) {
  std::atomic<bool> stop{false};
  std::vector<double> bytes(a.threads, 0), ops(a.threads, 0);
  std::vector<std::thread> ts;
  auto start = Clock::now();
  for (int t = 0; t < a.threads; ++t) {
    ts.emplace_back([&, t] {
      while (!stop.load(std::memory_order_relaxed)) body(t, &bytes[t], &ops[t]);
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(a.duration));
  stop.store(true);
  for (auto& th : ts) th.join();
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  double b = 0, o = 0;
  for (int t = 0; t < a.threads; ++t) b += bytes[t], o += ops[t];
  Report(a, b, secs, o);
}

// Bytes each thread cycles through: --span (the harness passes the engine run's working set,
// so that both see the same caches), else 64 MiB; at least one block.
size_t g_span = 0;
size_t Span(size_t block) {
  size_t span = g_span ? g_span : (64 << 20);
  return std::max(block, span) / block * block;
}

void Memcpy(const Args& a) {
  size_t span = Span(a.block);
  std::vector<uint8_t*> src(a.threads), dst(a.threads);
  for (int t = 0; t < a.threads; ++t) src[t] = Alloc(span), dst[t] = Alloc(span);
  std::vector<size_t> off(a.threads, 0);
  RunThreads(a, [&](int t, double* bytes, double* ops) {
    std::memcpy(dst[t] + off[t], src[t] + off[t], a.block);
    off[t] = (off[t] + a.block) % span;
    *bytes += a.block;
    *ops += 1;
  });
}

void Tcp(const Args& a) {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::listen(lfd, 64);
  pid_t child = ::fork();
  if (child == 0) {  // receiver: one thread per connection, recv into a buffer, until EOF
    std::vector<std::thread> ts;
    for (int t = 0; t < a.threads; ++t) {
      int fd = ::accept(lfd, nullptr, nullptr);
      ts.emplace_back([fd, &a] {
        size_t span = Span(a.block);
        uint8_t* buf = Alloc(span);
        size_t off = 0;
        for (;;) {
          ssize_t n = ::recv(fd, buf + off, std::min(a.block, span - off), 0);
          if (n <= 0) break;
          off = (off + n) % span;
        }
        ::close(fd);
      });
    }
    for (auto& th : ts) th.join();
    ::_exit(0);
  }
  ::close(lfd);
  std::vector<int> fds(a.threads);
  std::vector<uint8_t*> bufs(a.threads);
  std::vector<size_t> off(a.threads, 0);
  size_t span = Span(a.block);
  for (int t = 0; t < a.threads; ++t) {
    fds[t] = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fds[t], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (::connect(fds[t], reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      std::perror("connect");
      std::exit(1);
    }
    bufs[t] = Alloc(span);
  }
  RunThreads(a, [&](int t, double* bytes, double* ops) {
    size_t left = a.block;
    while (left > 0) {
      ssize_t n = ::send(fds[t], bufs[t] + off[t] + (a.block - left), left, MSG_NOSIGNAL);
      if (n <= 0) std::exit(1);
      left -= n;
    }
    off[t] = (off[t] + a.block) % span;
    *bytes += a.block;
    *ops += 1;
  });
  for (int fd : fds) ::close(fd);
  ::waitpid(child, nullptr, 0);
}

void Pvm(const Args& a) {
  size_t span = Span(a.block);
  // The child owns the destination; it maps it before fork so the address is known here.
  uint8_t* dst = Alloc(span * a.threads);
  int ready[2];
  if (::pipe(ready) != 0) std::exit(1);
  pid_t child = ::fork();
  if (child == 0) {
    std::memset(dst, 0, span * a.threads);  // private copy, faulted in
    char c = 1;
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c;
  (void)!::read(ready[0], &c, 1);
  std::vector<uint8_t*> src(a.threads);
  std::vector<size_t> off(a.threads, 0);
  for (int t = 0; t < a.threads; ++t) src[t] = Alloc(span);
  RunThreads(a, [&](int t, double* bytes, double* ops) {
    iovec l{src[t] + off[t], a.block}, r{dst + t * span + off[t], a.block};
    if (::process_vm_writev(child, &l, 1, &r, 1, 0) != static_cast<ssize_t>(a.block)) {
      std::perror("process_vm_writev");
      std::exit(1);
    }
    off[t] = (off[t] + a.block) % span;
    *bytes += a.block;
    *ops += 1;
  });
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (argc < 2) {
    std::fprintf(stderr, "usage: raw_baselines memcpy|tcp|pvm [--block_size B] [--threads T] "
                         "[--duration S]\n");
    return 2;
  }
  a.mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--block_size") a.block = std::strtoull(argv[i + 1], nullptr, 0);
    if (k == "--threads") a.threads = std::atoi(argv[i + 1]);
    if (k == "--duration") a.duration = std::atof(argv[i + 1]);
    if (k == "--span") a.span = std::strtoull(argv[i + 1], nullptr, 0);
  }
  if (a.block == 0 || a.threads <= 0) return 2;
  g_span = a.span;
  if (a.mode == "memcpy") {
    Memcpy(a);
  } else if (a.mode == "tcp") {
    Tcp(a);
  } else if (a.mode == "pvm") {
    Pvm(a);
  } else {
    std::fprintf(stderr, "unknown baseline %s\n", a.mode.c_str());
    return 2;
  }
  return 0;
}
