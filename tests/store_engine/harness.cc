#include "harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

extern char** environ;

namespace mooncake::store_engine {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::unique_ptr<Proc> Proc::Start(const std::vector<std::string>& argv,
                                  const std::map<std::string, std::string>& env,
                                  const std::string& stderr_path, std::string* error) {
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : env) merged[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);

  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
    *error = std::string("pipe: ") + std::strerror(errno);
    return nullptr;
  }
  int err_fd = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (err_fd < 0) {
    *error = "open " + stderr_path + ": " + std::strerror(errno);
    return nullptr;
  }
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    *error = std::string("fork: ") + std::strerror(errno);
    return nullptr;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::dup2(err_fd, 2);
    ::execve(args[0], args.data(), envp.data());
    const char msg[] = "exec failed\n";
    (void)!::write(2, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  ::close(err_fd);
  std::unique_ptr<Proc> p(new Proc);
  p->pid_ = pid;
  p->to_ = in[1];
  p->from_ = out[0];
  p->stderr_path_ = stderr_path;
  return p;
}

Proc::~Proc() {
  Kill();
  if (to_ >= 0) ::close(to_);
  if (from_ >= 0) ::close(from_);
}

std::string Proc::ReadLine(double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    size_t nl = buffered_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    if (eof_ || from_ < 0) return "";
    double left = timeout_s - Since(start);
    if (left <= 0) return "";
    pollfd pfd{from_, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(left * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    ssize_t n = ::read(from_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      eof_ = true;
      continue;
    }
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

std::string Proc::Command(const std::string& line, double timeout_s) {
  if (to_ < 0) return "";
  std::string s = line + "\n";
  // A dead child: EPIPE, not SIGPIPE (ignored for the whole test process).
  ::signal(SIGPIPE, SIG_IGN);
  if (::write(to_, s.data(), s.size()) != static_cast<ssize_t>(s.size())) return "";
  return ReadLine(timeout_s);
}

void Proc::CloseStdin() {
  if (to_ >= 0) ::close(to_);
  to_ = -1;
}

int Proc::Wait(double timeout_s) {
  if (pid_ <= 0) return -1;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    if (Since(start) > timeout_s) {
      Kill();
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void Proc::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string Proc::Stderr() const { return ReadFile(stderr_path_); }

Ready ParseReady(const std::string& line) {
  Ready r;
  r.line = line;
  std::istringstream in(line);
  std::string word;
  in >> word;
  if (word != "READY") return r;
  in >> r.name >> r.addr >> r.size >> r.rpc_port >> r.rpc_address;
  r.ok = !r.name.empty() && r.addr != 0 && r.size != 0 && r.rpc_port > 0;
  return r;
}

std::map<std::string, std::string> EngineEnv(const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> env = {{"MC_TCP_BIND_ADDRESS", "127.0.0.1"},
                                            {"MC_SLICE_TIMEOUT", "3"},
                                            {"MC_HANDSHAKE_CONNECT_TIMEOUT", "2"}};
  for (const auto& [k, v] : extra) env[k] = v;
  return env;
}

Peer StartPeer(const std::string& peer_path, const std::string& conn, const std::string& name,
               const std::map<std::string, std::string>& env, const std::string& stderr_path,
               const std::vector<std::string>& extra_args,
               const std::vector<std::string>& argv_prefix) {
  std::vector<std::string> argv = argv_prefix;
  for (const std::string& a : {peer_path, std::string("serve"), std::string("--metadata"), conn,
                               std::string("--name"), name}) {
    argv.push_back(a);
  }
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  Peer p;
  std::string error;
  p.proc = Proc::Start(argv, env, stderr_path, &error);
  if (!p.proc) {
    p.ready.line = "cannot start " + peer_path + ": " + error;
    return p;
  }
  p.ready = ParseReady(p.proc->ReadLine(20));
  return p;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/mc_store_engine.XXXXXX";
  if (::mkdtemp(tmpl)) path_ = tmpl;
}

TempDir::~TempDir() {
  if (!path_.empty()) Shell("rm -rf '" + path_ + "'");
}

StoreReader::StoreReader(const std::string& conn) {
  StoreOptions o;
  o.lease_ttl_s = 0;  // a reader writes nothing and takes no lease
  o.connect_timeout_ms = 1000;
  o.request_timeout_ms = 2000;
  auto s = CreateMetadataStore(conn, o);
  if (s.ok()) {
    store_ = std::move(s).value();
  } else {
    error_ = s.status().ToString();
  }
}

Result<std::string> StoreReader::Get(const std::string& key) {
  if (!store_) return Status::FailedPrecondition("no store client: " + error_);
  return store_->Get(key);
}

Result<nlohmann::json> StoreReader::GetJson(const std::string& key) {
  MC_ASSIGN_OR_RETURN(std::string text, Get(key));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::DataLoss("value of '" + key + "' is not JSON: " + text);
  return j;
}

int CountLines(const std::string& text, const std::string& needle) {
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (line.find(needle) != std::string::npos) ++n;
  }
  return n;
}

namespace {

// "0100007F:3A98" (IPv4) or 32 hex digits + ":PORT" (IPv6) from /proc/net/tcp{,6}.
std::string DecodeProcAddress(const std::string& s, bool v6) {
  size_t colon = s.find(':');
  if (colon == std::string::npos) return s;
  unsigned port = std::stoul(s.substr(colon + 1), nullptr, 16);
  std::string hex = s.substr(0, colon);
  char text[INET6_ADDRSTRLEN] = {0};
  if (!v6 && hex.size() == 8) {
    in_addr a{};
    a.s_addr = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));  // already network order
    ::inet_ntop(AF_INET, &a, text, sizeof(text));
    return std::string(text) + ":" + std::to_string(port);
  }
  if (v6 && hex.size() == 32) {
    in6_addr a{};
    for (int w = 0; w < 4; ++w) {
      uint32_t word = static_cast<uint32_t>(std::stoul(hex.substr(w * 8, 8), nullptr, 16));
      std::memcpy(&a.s6_addr[w * 4], &word, 4);
    }
    ::inet_ntop(AF_INET6, &a, text, sizeof(text));
    return "[" + std::string(text) + "]:" + std::to_string(port);
  }
  return s;
}

}  // namespace

std::vector<TcpSocket> TcpSocketsOf(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = ::opendir(fd_dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      char target[256];
      ssize_t n = ::readlink((fd_dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = 0;
      std::string t(target);
      if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
    }
    ::closedir(d);
  }
  std::vector<TcpSocket> out;
  for (bool v6 : {false, true}) {
    std::istringstream in(ReadFile("/proc/" + std::to_string(pid) + "/net/tcp" + (v6 ? "6" : "")));
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (!inodes.count(inode)) continue;
      std::string name = state == "0A" ? "LISTEN" : state == "01" ? "ESTABLISHED" : state;
      out.push_back({name, DecodeProcAddress(local, v6), DecodeProcAddress(remote, v6)});
    }
  }
  return out;
}

int ThreadCount(pid_t pid) {
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/task").c_str());
  if (!d) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n;
}

int Shell(const std::string& cmd, std::string* out) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::string text;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p)) text += buf;
  int rc = ::pclose(p);
  if (out) *out = text;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace mooncake::store_engine
