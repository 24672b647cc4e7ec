#include "store_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

namespace mooncake::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string ScriptCommand(const std::string& args) {
  // The owner pid: a test that crashes or times out leaves no server behind.
  return "MC_STORE_SERVERS_OWNER_PID=" + std::to_string(getpid()) +
         " MC_HTTP_METADATA_SERVER='" + MC_HTTP_METADATA_SERVER_PATH + "' bash '" +
         MC_STORE_SERVERS_SCRIPT + "' " + args;
}

struct Shared {
  std::map<std::string, std::unique_ptr<StoreServer>> servers;
  std::map<std::string, std::string> errors;
};

Shared& GetShared() {
  static Shared* shared = new Shared;
  return *shared;
}

// Stops the shared servers when the process's tests end.
class SharedServersEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { GetShared().servers.clear(); }
};

[[maybe_unused]] ::testing::Environment* const kSharedServersEnvironment =
    ::testing::AddGlobalTestEnvironment(new SharedServersEnvironment);

}  // namespace

std::unique_ptr<StoreServer> StoreServer::Start(const std::string& kind,
                                                const std::string& extra_args,
                                                std::string* error) {
  char tmpl[] = "/tmp/mc_store_test.XXXXXX";
  if (!mkdtemp(tmpl)) {
    *error = "mkdtemp failed";
    return nullptr;
  }
  std::unique_ptr<StoreServer> server(new StoreServer);
  server->kind_ = kind;
  server->dir_ = tmpl;
  const std::string err_path = server->dir_ + "/start.err";
  std::string cmd = ScriptCommand("start " + kind + " " + server->dir_ + " " + extra_args +
                                  " 2>" + err_path);
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) {
    *error = "popen failed";
    return nullptr;
  }
  char buf[64] = {0};
  std::string out;
  while (fgets(buf, sizeof(buf), pipe)) out += buf;
  int rc = pclose(pipe);
  int port = std::atoi(out.c_str());
  if (rc != 0 || port <= 0 || port > 65535) {
    *error = "store_servers.sh start " + kind + " failed (status " + std::to_string(rc) +
             "): " + ReadFile(err_path);
    return nullptr;  // the destructor removes the directory
  }
  server->port_ = static_cast<uint16_t>(port);
  const std::string pid = ReadFile(server->dir_ + "/" + kind + ".pid");
  server->pid_ = static_cast<pid_t>(std::atol(pid.c_str()));
  return server;
}

StoreServer::~StoreServer() {
  if (dir_.empty()) return;
  if (port_ != 0) {
    int rc = std::system(ScriptCommand("stop " + dir_ + " >/dev/null 2>&1").c_str());
    (void)rc;
  }
  int rc = std::system(("rm -rf '" + dir_ + "'").c_str());
  (void)rc;
}

std::string StoreServer::ConnString() const {
  std::string hp = "127.0.0.1:" + std::to_string(port_);
  if (kind_ == "http") return "http://" + hp + "/metadata";
  return kind_ + "://" + hp;
}

void StoreServer::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  auto start = std::chrono::steady_clock::now();
  while (ProcessAlive(pid_) && SecondsSince(start) < 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

StoreServer* SharedServer(const std::string& kind, std::string* error) {
  Shared& shared = GetShared();
  auto it = shared.servers.find(kind);
  if (it != shared.servers.end()) return it->second.get();
  auto err = shared.errors.find(kind);
  if (err != shared.errors.end()) {
    *error = err->second;
    return nullptr;
  }
  auto server = StoreServer::Start(kind, "", error);
  if (!server) {
    shared.errors[kind] = *error;
    return nullptr;
  }
  return (shared.servers[kind] = std::move(server)).get();
}

bool ProcessAlive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(')');  // "pid (comm) S ..."
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

bool StoreServersRequired() {
  const char* v = std::getenv("MC_REQUIRE_STORE_SERVERS");
  return v && *v && std::string(v) != "0";
}

uint16_t RefusingPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  uint16_t port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

StoreOptions ShortTimeouts() {
  StoreOptions o;
  o.connect_timeout_ms = 500;
  o.request_timeout_ms = 1000;
  o.lease_ttl_s = 5;
  return o;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace mooncake::testing
