#include "transport/ucx/ucx_env.h"

#include <cstdlib>
#include <set>
#include <sstream>

namespace mooncake::ucx {
namespace {

const char* Get(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v ? v : nullptr;
}

void SetIfUnset(const char* name, const std::string& value, const std::string& from,
                std::vector<std::string>* log) {
  if (std::getenv(name) != nullptr) return;
  ::setenv(name, value.c_str(), 0);
  log->push_back(std::string(name) + "=" + value + (from.empty() ? "" : " (from " + from + ")"));
}

// The defaults that depend on nothing. setenv beside another thread's getenv is undefined
// (setenv may move `environ`): a program loading UCX in one engine's Init while other threads
// log (glog's mktime reads TZ) crashed in getenv (Load.SixtyFourEnginesOpenOneTargetAtOnce,
// ucx_sm, under ASan in CI). So these are set once when this library is loaded, before any
// engine's threads run; ApplyEnvironment then finds them set, and changes the environment
// only for the MC_* variables a user set (RDMA settings).
void SetDefaults(std::vector<std::string>* log) {
  SetIfUnset("UCX_KEEPALIVE_INTERVAL", "1s", "", log);
  SetIfUnset("UCX_ERROR_SIGNALS", "", "", log);
  SetIfUnset("UCX_HANDLE_ERRORS", "none", "", log);
  SetIfUnset("UCX_MEM_EVENTS", "no", "", log);
  // UCX prints its warnings and errors on stdout unless told otherwise: the application's
  // stdout is its own (a pipe of results, a protocol with a parent process), so they go to
  // stderr beside this engine's log lines.
  SetIfUnset("UCX_LOG_FILE", "stderr", "", log);
}

__attribute__((constructor)) void SetDefaultsAtLoad() {
  std::vector<std::string> ignored;
  SetDefaults(&ignored);
}

}  // namespace

std::vector<std::string> ApplyEnvironment() {
  std::vector<std::string> log;
  if (const char* v = Get("MC_GID_INDEX")) SetIfUnset("UCX_IB_GID_INDEX", v, "MC_GID_INDEX", &log);
  if (const char* list = Get("MC_UCX_DEVICES")) {
    const char* port = Get("MC_IB_PORT");
    std::string devices, item;
    std::istringstream in(list);
    while (std::getline(in, item, ',')) {
      if (item.empty()) continue;
      if (item.find(':') == std::string::npos) item += ":" + std::string(port ? port : "1");
      devices += (devices.empty() ? "" : ",") + item;
    }
    if (!devices.empty()) SetIfUnset("UCX_NET_DEVICES", devices, "MC_UCX_DEVICES", &log);
  }
  if (const char* v = Get("MC_MTU")) SetIfUnset("UCX_IB_PATH_MTU", v, "MC_MTU", &log);
  if (const char* v = Get("MC_IB_SL")) SetIfUnset("UCX_IB_SL", v, "MC_IB_SL", &log);
  if (const char* v = Get("MC_IB_TC")) SetIfUnset("UCX_IB_TRAFFIC_CLASS", v, "MC_IB_TC", &log);
  if (const char* v = Get("MC_IB_PCI_RELAXED_ORDERING")) {
    const std::string s = v;
    SetIfUnset("UCX_IB_PCI_RELAXED_ORDERING", s == "0" ? "no" : s == "1" ? "yes" : "try",
               "MC_IB_PCI_RELAXED_ORDERING", &log);
  }
  if (const char* v = Get("MC_RETRY_CNT")) SetIfUnset("UCX_RC_RETRY_COUNT", v, "MC_RETRY_CNT", &log);
  SetDefaults(&log);  // set at load already, unless the program unset them since
  return log;
}

namespace {

// The transports named on the resource lines of ucp_context_print_info ("resource 1 : md 1
// dev 1 flags -- tcp/lo") or the lane lines of ucp_ep_print_info ("lane[0]: 0:tcp/lo.0 ...").
std::set<std::string> Transports(const std::string& info) {
  std::set<std::string> out;
  std::istringstream in(info);
  std::string line;
  while (std::getline(in, line)) {
    size_t at;
    if (line.find("lane[") != std::string::npos) {
      at = line.find("]:");
      if (at == std::string::npos) continue;
      at = line.find(':', at + 2);  // "0:tcp/lo.0": after the resource index
      if (at == std::string::npos) continue;
      ++at;
    } else if (line.find("resource") != std::string::npos) {
      at = line.find("-- ");
      if (at == std::string::npos) continue;
      at += 3;
    } else {
      continue;
    }
    const size_t end = line.find('/', at);
    if (end != std::string::npos && end > at) out.insert(line.substr(at, end - at));
  }
  return out;
}

}  // namespace

std::string FastLanes(const std::string& info) {
  // ud moves no RMA (UCX emulates puts over it), cuda_copy is a local copy engine: neither
  // is a reason to leave shm and tcp.
  static const char* const kFast[] = {"rc_verbs", "rc_mlx5", "dc_mlx5", "cuda_ipc", "gdr_copy"};
  std::string out;
  for (const std::string& t : Transports(info)) {
    for (const char* f : kFast) {
      if (t == f) out += (out.empty() ? "" : ",") + t;
    }
  }
  return out;
}

std::string TransportList(const std::string& info) {
  std::string out;
  for (const std::string& t : Transports(info)) out += (out.empty() ? "" : ",") + t;
  return out;
}

bool HasPeerFailureLane(const std::string& info) {
  for (const std::string& t : Transports(info)) {
    if (t == "tcp" || t.rfind("rc_", 0) == 0 || t.rfind("dc_", 0) == 0 ||
        t.rfind("ud_", 0) == 0) {
      return true;
    }
  }
  return false;
}
}  // namespace mooncake::ucx
