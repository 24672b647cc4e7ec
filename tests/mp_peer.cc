// mp_peer: one side of a multi-process test, speaking the same line protocol as
// tests/interop/upstream_peer.py so that either side can be ours or upstream's.
//
//   mp_peer target --size N
//     registers N bytes filled with pattern(seed 7), prints
//     "READY <segment> <buffer addr> <size>", then serves stdin commands:
//       CHECK <off> <len> <seed>  -> "OK" | "BAD <first mismatching offset>"
//       FILL <off> <len> <seed>   -> "OK"
//     and exits 0 on EOF.
//   mp_peer initiator --segment S --remote-addr A --size N --op write|read --block B
//                     [--seed S] [--batch K] [--threads T] [--transport NAME]
//     write: fills a local buffer with pattern(seed) and writes [A, A+N) in B-byte requests,
//     K per batch; read: reads [A, A+N) and checks every byte against pattern(seed).
//     T threads share the range. Prints "TRANSPORT <name>" (the transport used), then
//     "RESULT ok <bytes>" or "RESULT fail <reason>".
// --device D (both roles): the buffer is device memory of device D (platform::Devices():
// CUDA, or simulated under MC_DEVICE_SIM=1), registered with location "*"; it is filled
// and checked through host copies.
// Policy flags (simulate a host where cross-process access is refused):
//   --not-dumpable 1    this process may not be ptraced by processes lacking CAP_SYS_PTRACE
//   --no-ptrace-cap 1   this process drops CAP_SYS_PTRACE
// pattern(seed)[i] = (i * 131 + seed) & 0xff, i being the offset from the buffer start.
#include <glog/logging.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mooncake/transfer_engine.h"
#include "platform/device.h"

using namespace mooncake;

namespace {

uint8_t Pattern(uint64_t i, uint64_t seed) { return static_cast<uint8_t>(i * 131 + seed); }

// The buffer is checked and filled when the test asks, after transfers that other processes
// completed: the happens-before edge runs through other processes, which ThreadSanitizer
// cannot see, so these two loops are not instrumented.
__attribute__((no_sanitize("thread"))) uint64_t FirstMismatch(const uint8_t* buf, uint64_t off,
                                                              uint64_t len, uint64_t seed) {
  for (uint64_t i = off; i < off + len; ++i) {
    if (buf[i] != Pattern(i, seed)) return i;
  }
  return UINT64_MAX;
}

__attribute__((no_sanitize("thread"))) void Fill(uint8_t* buf, uint64_t off, uint64_t len,
                                                 uint64_t seed) {
  for (uint64_t i = off; i < off + len; ++i) buf[i] = Pattern(i, seed);
}

std::map<std::string, std::string> Flags(int argc, char** argv) {
  std::map<std::string, std::string> f;
  for (int i = 2; i + 1 < argc; i += 2) f[argv[i]] = argv[i + 1];
  return f;
}

uint64_t Num(const std::map<std::string, std::string>& f, const std::string& k, uint64_t def) {
  auto it = f.find(k);
  return it == f.end() ? def : std::stoull(it->second, nullptr, 0);
}

uint8_t* Alloc(size_t n) {
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(2);
  }
  return static_cast<uint8_t*>(p);
}

// The buffer under test: host memory, or device memory reached through host copies.
struct Buffer {
  uint8_t* ptr = nullptr;
  int device = -1;

  static Buffer Make(const std::map<std::string, std::string>& f, size_t n) {
    Buffer b;
    b.device = f.count("--device") ? std::stoi(f.at("--device")) : -1;
    if (b.device < 0) {
      b.ptr = Alloc(n);
      return b;
    }
    auto p = platform::Devices().Malloc(b.device, n);
    if (!p.ok()) {
      std::printf("FAIL %s\n", p.status().ToString().c_str());
      std::exit(3);
    }
    b.ptr = static_cast<uint8_t*>(*p);
    return b;
  }
  const char* location() const { return device < 0 ? "cpu:0" : "*"; }
  void FillRange(uint64_t off, uint64_t len, uint64_t seed) {
    if (device < 0) return Fill(ptr, off, len, seed);
    std::vector<uint8_t> host(len);
    for (uint64_t i = 0; i < len; ++i) host[i] = Pattern(off + i, seed);
    Status s = platform::Devices().Copy(ptr + off, host.data(), len);
    if (!s.ok()) std::fprintf(stderr, "fill: %s\n", s.ToString().c_str());
  }
  uint64_t Mismatch(uint64_t off, uint64_t len, uint64_t seed) {
    if (device < 0) return FirstMismatch(ptr, off, len, seed);
    std::vector<uint8_t> host(len);
    Status s = platform::Devices().Copy(host.data(), ptr + off, len);
    if (!s.ok()) return off;
    for (uint64_t i = 0; i < len; ++i) {
      if (host[i] != Pattern(off + i, seed)) return off + i;
    }
    return UINT64_MAX;
  }
};

void ApplyPolicy(const std::map<std::string, std::string>& f) {
  if (f.count("--not-dumpable")) ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  if (f.count("--no-ptrace-cap")) {
    __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct d[2] = {};
    ::syscall(SYS_capget, &h, d);
    for (auto& x : d) {
      x.effective &= ~(1u << CAP_SYS_PTRACE);
      x.permitted &= ~(1u << CAP_SYS_PTRACE);
    }
    ::syscall(SYS_capset, &h, d);
  }
}

int Target(const std::map<std::string, std::string>& f) {
  ApplyPolicy(f);
  size_t size = Num(f, "--size", 64 << 20);
  TransferEngine engine;
  Status s = engine.Init("P2PHANDSHAKE", "127.0.0.1");
  if (!s.ok()) {
    std::printf("FAIL %s\n", s.ToString().c_str());
    return 1;
  }
  Buffer mem = Buffer::Make(f, size);
  uint8_t* buf = mem.ptr;
  mem.FillRange(0, size, 7);
  s = engine.RegisterLocalMemory(buf, size, mem.location());
  if (!s.ok()) {
    std::printf("FAIL %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("READY %s %lu %lu\n", engine.GetLocalSegmentName().c_str(),
              reinterpret_cast<unsigned long>(buf), static_cast<unsigned long>(size));
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    uint64_t off = 0, len = 0, seed = 0;
    in >> cmd >> off >> len >> seed;
    if (off > size || len > size - off) {
      std::printf("ERR range outside the buffer\n");
    } else if (cmd == "CHECK") {
      uint64_t bad = mem.Mismatch(off, len, seed);
      if (bad == UINT64_MAX) {
        std::printf("OK\n");
      } else {
        std::printf("BAD %lu\n", static_cast<unsigned long>(bad));
      }
    } else if (cmd == "FILL") {
      mem.FillRange(off, len, seed);
      std::printf("OK\n");
    } else if (cmd == "UNREGISTER") {
      Status u = engine.UnregisterLocalMemory(buf);
      std::printf(u.ok() ? "OK\n" : "ERR %s\n", u.ToString().c_str());
    } else {
      std::printf("ERR unknown command\n");
    }
    std::fflush(stdout);
  }
  return 0;
}

int Initiator(const std::map<std::string, std::string>& f) {
  auto fail = [](const std::string& why) {
    std::printf("RESULT fail %s\n", why.c_str());
    return 1;
  };
  auto seg_name = f.count("--segment") ? f.at("--segment") : "";
  uint64_t remote = Num(f, "--remote-addr", 0);
  size_t size = Num(f, "--size", 0), block = Num(f, "--block", 1 << 20);
  size_t batch = Num(f, "--batch", 64), threads = Num(f, "--threads", 1);
  uint64_t seed = Num(f, "--seed", 7);
  bool write = f.count("--op") && f.at("--op") == "write";
  ApplyPolicy(f);
  if (seg_name.empty() || remote == 0 || size == 0 || block == 0 || batch == 0 || threads == 0) {
    return fail("need --segment, --remote-addr, --size, --block > 0");
  }
  TransferEngine engine;
  // --transport: the one transport to install ("" = every built-in one, the default).
  const std::string transport = f.count("--transport") ? f.at("--transport") : "";
  Status s = engine.Init("P2PHANDSHAKE", "127.0.0.1", transport);
  if (!s.ok()) return fail(s.ToString());
  Buffer mem = Buffer::Make(f, size);
  uint8_t* buf = mem.ptr;
  if (write) mem.FillRange(0, size, seed);
  s = engine.RegisterLocalMemory(buf, size, mem.location());
  if (!s.ok()) return fail(s.ToString());
  auto seg = engine.OpenSegment(seg_name);
  if (!seg.ok()) return fail(seg.status().ToString());
  auto info = engine.GetSegmentInfo(*seg);
  std::printf("TRANSPORT %s\n", info.ok() ? info->transport.c_str() : "?");
  std::vector<std::string> errors(threads);
  std::vector<std::thread> workers;
  size_t blocks = (size + block - 1) / block;
  for (size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::vector<TransferRequest> reqs;
      for (size_t b = t; b < blocks;) {
        reqs.clear();
        for (; b < blocks && reqs.size() < batch; b += threads) {
          size_t off = b * block, len = std::min(block, size - off);
          reqs.push_back({write ? TransferRequest::WRITE : TransferRequest::READ, buf + off,
                          *seg, remote + off, len});
        }
        Status st = engine.TransferSync(reqs);
        if (!st.ok()) {
          errors[t] = st.ToString();
          return;
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  for (const auto& e : errors) {
    if (!e.empty()) return fail(e);
  }
  if (!write) {
    uint64_t bad = mem.Mismatch(0, size, seed);
    if (bad != UINT64_MAX) return fail("byte " + std::to_string(bad) + " differs");
  }
  std::printf("RESULT ok %lu\n", static_cast<unsigned long>(size));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  std::string role = argc > 1 ? argv[1] : "";
  auto f = Flags(argc, argv);
  if (role == "target") return Target(f);
  if (role == "initiator") return Initiator(f);
  std::fprintf(stderr, "usage: mp_peer target|initiator [--flag value]...\n");
  return 2;
}
