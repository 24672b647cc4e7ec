// Helpers of the failure tests and the soak program: child processes with piped stdin/stdout
// and bounded reads, the fail_peer target wrapper, free port ranges, clocks. Header-only.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace mc_failure {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A child process with its stdin and stdout piped to us; stderr is inherited. Reads are
// bounded: a hung or stopped child never hangs the caller. The destructor SIGKILLs it.
class Child {
 public:
  // `env` entries ("NAME=value") are added to (or replace in) our environment for the child.
  explicit Child(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return;
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) {
      std::string kv(*e);
      bool replaced = false;
      for (const auto& x : env) {
        if (kv.compare(0, x.find('=') + 1, x, 0, x.find('=') + 1) == 0) replaced = true;
      }
      if (!replaced) envs.push_back(kv);
    }
    envs.insert(envs.end(), env.begin(), env.end());
    std::vector<char*> envp;
    for (auto& e : envs) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }
  ~Child() {
    Kill();
    if (to_ >= 0) ::close(to_);
    if (from_ >= 0) ::close(from_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  bool alive() const { return pid_ > 0; }

  // One line without its '\n'; "" on EOF or when nothing arrives within timeout_ms.
  std::string ReadLine(int timeout_ms = 30000) {
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (from_ < 0 || left.count() <= 0) return "";
      pollfd p{from_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return "";
      char tmp[4096];
      ssize_t n = ::read(from_, tmp, sizeof(tmp));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return "";
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }
  bool Send(const std::string& line) {
    std::string s = line + "\n";
    const char* p = s.data();
    size_t left = s.size();
    while (left > 0) {
      ssize_t n = ::write(to_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      p += n;
      left -= static_cast<size_t>(n);
    }
    return true;
  }
  std::string Command(const std::string& cmd, int timeout_ms = 30000) {
    if (!Send(cmd)) return "";
    return ReadLine(timeout_ms);
  }
  void Signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // SIGSTOP, then waits until every thread of the child has stopped (the kernel reports the
  // group stop to its parent only then). False if that did not happen within timeout_ms.
  bool Stop(int timeout_ms = 10000) {
    if (pid_ <= 0) return false;
    ::kill(pid_, SIGSTOP);
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WUNTRACED | WNOHANG);
      if (r == pid_ && WIFSTOPPED(status)) return true;
      if (r == pid_ && (WIFEXITED(status) || WIFSIGNALED(status))) {
        pid_ = -1;
        return false;
      }
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  void Continue() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Exit code, or -1 (signalled, or still running after timeout_ms: then it is killed).
  int Wait(int timeout_ms = 30000) {
    if (pid_ <= 0) return -1;
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        Kill();
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  int from_ = -1;
  std::string buf_;
};

// A fail_peer target process (tests/failure/fail_peer.cc).
struct Peer {
  std::unique_ptr<Child> proc;
  std::string segment;  // "127.0.0.1:<rpc port>"
  uint64_t addr = 0;    // its buffer
  uint64_t size = 0;
  int pid = 0;
  std::string error;  // why Start failed

  bool ok() const { return proc && !segment.empty(); }

  struct Options {
    uint64_t seed = 7;
    uint64_t fixed_addr = 0;
    bool fill = true;
    std::string transport;         // "" = all the target offers (tcp and shm)
    std::vector<std::string> env;  // e.g. MC_MIN_RPC_PORT=...
  };

  static Peer Start(const std::string& path, uint64_t size, const Options& o) {
    Peer p;
    std::vector<std::string> args = {path, "--size", std::to_string(size), "--seed",
                                     std::to_string(o.seed)};
    if (o.fixed_addr) {
      args.push_back("--fixed-addr");
      args.push_back(std::to_string(o.fixed_addr));
    }
    if (!o.fill) {
      args.push_back("--no-fill");
      args.push_back("1");
    }
    if (!o.transport.empty()) {
      args.push_back("--transport");
      args.push_back(o.transport);
    }
    p.proc = std::make_unique<Child>(args, o.env);
    std::string line = p.proc->ReadLine(60000);
    std::istringstream in(line);
    std::string ready;
    in >> ready >> p.segment >> p.addr >> p.size >> p.pid;
    if (ready != "READY") {
      p.error = line.empty() ? "no READY line" : line;
      p.segment.clear();
    }
    return p;
  }
  static Peer Start(const std::string& path, uint64_t size) { return Start(path, size, Options{}); }

  std::string Check(uint64_t off, uint64_t len, uint64_t seed) {
    return proc->Command("CHECK " + std::to_string(off) + " " + std::to_string(len) + " " +
                         std::to_string(seed));
  }
  std::string Fill(uint64_t off, uint64_t len, uint64_t seed) {
    return proc->Command("FILL " + std::to_string(off) + " " + std::to_string(len) + " " +
                         std::to_string(seed));
  }
  // HashBytes of [off, off+len) of the target's buffer; 0 with *ok=false on a bad reply.
  uint64_t Hash(uint64_t off, uint64_t len, bool* ok = nullptr) {
    std::string r = proc->Command("HASH " + std::to_string(off) + " " + std::to_string(len));
    if (ok) *ok = r.rfind("HASH ", 0) == 0;
    return r.rfind("HASH ", 0) == 0 ? std::stoull(r.substr(5)) : 0;
  }
  bool Ping(int timeout_ms = 10000) { return proc && proc->Command("PING", timeout_ms) == "PONG"; }
};

// Whether TCP port `port` can be bound on 0.0.0.0 now.
inline bool PortFree(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// `n` consecutive free ports P .. P+n-1 in 20000..31999, outside the engine's default range
// (15000-17000) and the kernel's ephemeral range, chosen at random so that concurrent test
// processes do not collide. 0 if none was found.
inline uint16_t FreePorts(int n) {
  std::mt19937 rng(static_cast<uint32_t>(::getpid()) * 2654435761u ^
                   static_cast<uint32_t>(Clock::now().time_since_epoch().count()));
  for (int i = 0; i < 200; ++i) {
    uint16_t p = static_cast<uint16_t>(20000 + n * (rng() % (12000 / n)));
    bool all = true;
    for (int k = 0; k < n && all; ++k) all = PortFree(static_cast<uint16_t>(p + k));
    if (all) return p;
  }
  return 0;
}

inline std::vector<std::string> PortRangeEnv(uint16_t lo, uint16_t hi) {
  return {"MC_MIN_RPC_PORT=" + std::to_string(lo), "MC_MAX_RPC_PORT=" + std::to_string(hi)};
}

}  // namespace mc_failure
