// Test helpers: throwaway etcd / redis / HTTP metadata servers on 127.0.0.1, run through
// scripts/store_servers.sh, each in a temporary directory of its own.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "metadata/metadata_store.h"

namespace mooncake::testing {

class StoreServer {
 public:
  // Starts a server of `kind` ("etcd", "redis", "http"); `extra_args` are appended to its
  // command line (shell words). Null with *error set (the script's message) on failure.
  static std::unique_ptr<StoreServer> Start(const std::string& kind,
                                            const std::string& extra_args, std::string* error);
  ~StoreServer();  // stops the server and removes its directory

  const std::string& kind() const { return kind_; }
  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }
  // "etcd://127.0.0.1:P", "redis://127.0.0.1:P", "http://127.0.0.1:P/metadata".
  std::string ConnString() const;
  // SIGKILLs the server and waits (up to 5 s) until it is gone.
  void Kill();

 private:
  StoreServer() = default;
  std::string kind_, dir_;
  uint16_t port_ = 0;
  pid_t pid_ = -1;
};

// The server of `kind` shared by the tests of this process, started on first use and stopped
// when the process's tests end. Null with *error set when it cannot be started.
StoreServer* SharedServer(const std::string& kind, std::string* error);

// True when MC_REQUIRE_STORE_SERVERS is set to a non-empty value other than "0": a server
// that cannot be started fails the test instead of skipping it.
bool StoreServersRequired();

// A 127.0.0.1 port that refuses connections (bound once, then closed).
uint16_t RefusingPort();

// Store options with short timeouts, for tests of unreachable stores.
StoreOptions ShortTimeouts();

// True while `pid` runs (a zombie counts as gone: our servers are not our children).
bool ProcessAlive(pid_t pid);

// Seconds since `start`.
double SecondsSince(std::chrono::steady_clock::time_point start);

}  // namespace mooncake::testing

// Starts (or reuses, when `shared`) a server, or skips / fails the test with the reason.
#define MC_SERVER_OR_SKIP(var, kind, extra_args)                                     \
  std::unique_ptr<::mooncake::testing::StoreServer> var##_owner;                     \
  ::mooncake::testing::StoreServer* var = nullptr;                                   \
  do {                                                                               \
    std::string _mc_err;                                                             \
    var##_owner = ::mooncake::testing::StoreServer::Start(kind, extra_args, &_mc_err); \
    var = var##_owner.get();                                                         \
    if (!var) {                                                                      \
      if (::mooncake::testing::StoreServersRequired()) {                             \
        FAIL() << "cannot start " << kind << " server: " << _mc_err;                 \
      }                                                                              \
      GTEST_SKIP() << "cannot start " << kind << " server: " << _mc_err;             \
    }                                                                                \
  } while (0)
