// Helpers for the tests that run the real mooncake_master binary (MC_MASTER_PATH): those of
// loopback_http.h (free ports, raw-socket HTTP), Prometheus text parsing, and the master as a
// child process.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "store/testing/loopback_http.h"
#include "mooncake/store/store_client.h"

namespace mooncake {
namespace store {
namespace testing_master {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t MiB = 1 << 20;

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A StoreClient of the master at 127.0.0.1:rpc_port lending `segment` bytes; null (with the
// failure recorded) when it cannot be made.
inline std::unique_ptr<StoreClient> MakeClient(int rpc_port, uint64_t segment,
                                               uint64_t local_buffer = 4 * MiB) {
  StoreClientOptions o;
  o.master_server_addr = "127.0.0.1:" + std::to_string(rpc_port);
  o.local_hostname = "127.0.0.1";
  o.global_segment_size = segment;
  o.local_buffer_size = local_buffer;
  int code = 0;
  std::string msg;
  auto c = StoreClient::Create(o, &code, &msg);
  EXPECT_NE(c, nullptr) << code << ": " << msg;
  return c;
}

// The value of the "name value" line in Prometheus text, or nullopt.
inline std::optional<uint64_t> MetricValue(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind(name + " ", 0) == 0) return std::stoull(line.substr(name.size() + 1));
  }
  return std::nullopt;
}

// One mooncake_master process; stderr goes to a file.
class MasterProcess {
 public:
  explicit MasterProcess(std::vector<std::string> args) {
    char tmpl[] = "/tmp/mc_master_test_XXXXXX";
    int fd = ::mkstemp(tmpl);
    log_path_ = tmpl;
    std::vector<std::string> argv_s = {MC_MASTER_PATH};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;  // built before fork: the child only calls async-signal-safe code
    for (auto& a : argv_s) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    ::close(fd);
  }
  ~MasterProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (!log_path_.empty()) ::unlink(log_path_.c_str());
  }
  std::string Log() const { return ReadFile(log_path_); }
  // Exit status (or 128 + signal) once it ended within `timeout`; nullopt while running.
  std::optional<int> WaitExit(Clock::duration timeout) {
    const auto deadline = Clock::now() + timeout;
    while (!exited_) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (Clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return status_;
  }
  // Until the startup line is logged; false if it exited or took longer than `timeout`.
  bool WaitReady(Clock::duration timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (Log().find("Master service started") != std::string::npos) return true;
      if (WaitExit(milliseconds(0))) return false;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int status_ = -1;
  std::string log_path_;
};

}  // namespace testing_master
}  // namespace store
}  // namespace mooncake
