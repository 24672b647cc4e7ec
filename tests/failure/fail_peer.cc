// fail_peer: the target process of the failure tests and of the soak program.
//
//   fail_peer --size N [--seed S] [--fixed-addr A] [--transport T] [--no-fill 1]
//
// Starts an engine (P2PHANDSHAKE on 127.0.0.1; ports from MC_MIN_RPC_PORT/MC_MAX_RPC_PORT as
// usual), maps N bytes (at address A exactly when --fixed-addr is given, so that a restarted
// target can publish the same buffer), fills them with pattern(S) (tests/failure/pattern.h;
// positions are offsets from the buffer start), registers them and prints
//   READY <segment name> <buffer address> <size> <pid>
// Then serves one command per stdin line, one reply line each:
//   CHECK <off> <len> <seed>  -> OK | BAD <first differing offset>
//   FILL <off> <len> <seed>   -> OK
//   HASH <off> <len>          -> HASH <HashBytes of the range, decimal>
//   UNREGISTER                -> OK | ERR <status>
//   PING                      -> PONG
//   QUIT                      -> BYE (then exits 0); EOF exits 0 too
// A range outside the buffer answers "ERR range". The process dies with its parent
// (PR_SET_PDEATHSIG), so a crashed test leaves no target behind.
#include <glog/logging.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "mooncake/transfer_engine.h"
#include "pattern.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

using namespace mooncake;
using namespace mc_failure;

int main(int argc, char** argv) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() == 1) return 3;  // the parent is already gone
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // warnings and errors only: the tests read our stdout, not stderr
  google::InitGoogleLogging(argv[0]);

  std::map<std::string, std::string> f;
  for (int i = 1; i + 1 < argc; i += 2) f[argv[i]] = argv[i + 1];
  auto num = [&](const char* k, uint64_t def) {
    return f.count(k) ? std::stoull(f[k], nullptr, 0) : def;
  };
  const uint64_t size = num("--size", 64 << 20);
  const uint64_t seed = num("--seed", 7);
  const uint64_t fixed = num("--fixed-addr", 0);
  const std::string transport = f.count("--transport") ? f["--transport"] : "";

  void* want = reinterpret_cast<void*>(fixed);
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | (fixed ? MAP_FIXED_NOREPLACE : 0);
  void* p = ::mmap(want, size, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED || (fixed && p != want)) {
    std::printf("FAIL mmap of %lu bytes%s: %s\n", static_cast<unsigned long>(size),
                fixed ? " at the fixed address" : "", std::strerror(errno));
    return 1;
  }
  auto* buf = static_cast<uint8_t*>(p);
  if (!f.count("--no-fill")) FillPattern(buf, size, seed, 0);

  TransferEngine engine;
  Status s = engine.Init("P2PHANDSHAKE", "127.0.0.1", transport);
  if (s.ok()) s = engine.RegisterLocalMemory(buf, size, "cpu:0");
  if (!s.ok()) {
    std::printf("FAIL %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("READY %s %lu %lu %d\n", engine.GetLocalSegmentName().c_str(),
              static_cast<unsigned long>(reinterpret_cast<uintptr_t>(buf)),
              static_cast<unsigned long>(size), static_cast<int>(::getpid()));
  std::fflush(stdout);

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    uint64_t off = 0, len = 0, arg = 0;
    in >> cmd >> off >> len >> arg;
    if (cmd == "PING") {
      std::printf("PONG\n");
    } else if (cmd == "QUIT") {
      std::printf("BYE\n");
      std::fflush(stdout);
      return 0;
    } else if (cmd == "UNREGISTER") {
      Status u = engine.UnregisterLocalMemory(buf);
      if (u.ok()) {
        std::printf("OK\n");
      } else {
        std::printf("ERR %s\n", u.ToString().c_str());
      }
    } else if (off > size || len > size - off) {
      std::printf("ERR range\n");
    } else if (cmd == "CHECK") {
      uint64_t bad = 0;
      if (CheckPattern(buf + off, len, arg, off, &bad)) {
        std::printf("OK\n");
      } else {
        std::printf("BAD %lu\n", static_cast<unsigned long>(off + bad));
      }
    } else if (cmd == "FILL") {
      FillPattern(buf + off, len, arg, off);
      std::printf("OK\n");
    } else if (cmd == "HASH") {
      std::printf("HASH %lu\n", static_cast<unsigned long>(HashBytes(buf + off, len)));
    } else {
      std::printf("ERR unknown command\n");
    }
    std::fflush(stdout);
  }
  return 0;
}
