// Helpers of the store-mode integration suites: child processes driven over a line protocol
// (store_peer, the upstream driver), with deadlines on every read, stderr captured to a file,
// and no process left behind (each child dies with the test process: PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "metadata/metadata_store.h"

namespace mooncake::store_engine {

// A child process: stdin and stdout piped to us, stderr to a file.
class Proc {
 public:
  // `env` is added to (or overrides) this process's environment. Null with *error set when
  // the process cannot be started.
  static std::unique_ptr<Proc> Start(const std::vector<std::string>& argv,
                                     const std::map<std::string, std::string>& env,
                                     const std::string& stderr_path, std::string* error);
  ~Proc();  // SIGKILLs the child if it still runs, and reaps it

  pid_t pid() const { return pid_; }
  // The next stdout line, or "" on EOF or after `timeout_s`.
  std::string ReadLine(double timeout_s = 15);
  // Sends one line and reads one reply line.
  std::string Command(const std::string& line, double timeout_s = 15);
  // Closes stdin (EOF).
  void CloseStdin();
  // Waits for the exit: the exit status, 128+signal, or -1 after `timeout_s` (the child is
  // then SIGKILLed).
  int Wait(double timeout_s);
  void Kill();  // SIGKILL and reap
  // What the child wrote on stderr so far.
  std::string Stderr() const;
  const std::string& stderr_path() const { return stderr_path_; }

 private:
  Proc() = default;
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::string buffered_;
  std::string stderr_path_;
  bool eof_ = false;
};

// "READY <name> <addr> <size> <rpc port> <ip:port>" as parsed from store_peer (or the upstream
// driver, which prints the same fields).
struct Ready {
  bool ok = false;
  std::string line;  // the whole line (the FAIL line on failure)
  std::string name;
  uint64_t addr = 0, size = 0;
  int rpc_port = 0;
  std::string rpc_address;
};
Ready ParseReady(const std::string& line);

// The environment of every engine process of these suites, plus `extra`:
//   MC_TCP_BIND_ADDRESS=127.0.0.1   publish loopback only (mandatory: see store_peer.cc)
//   MC_SLICE_TIMEOUT=3, MC_HANDSHAKE_CONNECT_TIMEOUT=2   bounded failures
std::map<std::string, std::string> EngineEnv(const std::map<std::string, std::string>& extra = {});

// The proposed variable that would shorten the etcd lease of an engine (seconds); the engine
// does not read it yet (see docs/metadata_stores.md, "Gaps").
inline constexpr char kLeaseTtlEnv[] = "MC_ETCD_LEASE_TTL";

// An engine process (store_peer serve), started and READY.
struct Peer {
  std::unique_ptr<Proc> proc;
  Ready ready;
};
// Starts `argv_prefix` + {peer_path, "serve", "--metadata", conn, "--name", name, extra...}
// with `env`; waits (up to 20 s) for its first line. `peer.ready.ok` says whether it is READY;
// otherwise `peer.ready.line` holds what it printed (the FAIL line), and *error any start error.
Peer StartPeer(const std::string& peer_path, const std::string& conn, const std::string& name,
               const std::map<std::string, std::string>& env, const std::string& stderr_path,
               const std::vector<std::string>& extra_args = {},
               const std::vector<std::string>& argv_prefix = {});

// A temporary directory, removed with its contents.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Reads keys with our store client (no lease, short timeouts).
class StoreReader {
 public:
  explicit StoreReader(const std::string& conn);
  bool ok() const { return store_ != nullptr; }
  const std::string& error() const { return error_; }
  // NotFound when absent.
  Result<std::string> Get(const std::string& key);
  Result<nlohmann::json> GetJson(const std::string& key);

 private:
  std::unique_ptr<MetadataStore> store_;
  std::string error_;
};

// Counts the lines of `text` that contain `needle`.
int CountLines(const std::string& text, const std::string& needle);

// The TCP sockets (IPv4 and IPv6) that process `pid` holds, from /proc/<pid>/net/tcp{,6}.
// Addresses as "a.b.c.d:port" or "[v6]:port"; state "LISTEN", "ESTABLISHED" or the kernel's
// hex code.
struct TcpSocket {
  std::string state, local, remote;
};
std::vector<TcpSocket> TcpSocketsOf(pid_t pid);

// The number of threads of process `pid` (-1 if unknown).
int ThreadCount(pid_t pid);

// Seconds since `start`.
double Since(std::chrono::steady_clock::time_point start);

// Runs a shell command; its exit status (or -1), output in *out when given.
int Shell(const std::string& cmd, std::string* out = nullptr);

}  // namespace mooncake::store_engine
