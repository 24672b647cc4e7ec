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
  SetIfUnset("UCX_KEEPALIVE_INTERVAL", "1s", "", &log);
  SetIfUnset("UCX_ERROR_SIGNALS", "", "", &log);
  SetIfUnset("UCX_HANDLE_ERRORS", "none", "", &log);
  SetIfUnset("UCX_MEM_EVENTS", "no", "", &log);
  return log;
}

std::string FastLanes(const std::string& info) {
  // ud moves no RMA (UCX emulates puts over it), cuda_copy is a local copy engine: neither
  // is a reason to leave shm and tcp.
  static const char* const kPrefixes[] = {"rc_verbs", "rc_mlx5", "dc_mlx5", "cuda_ipc",
                                          "gdr_copy"};
  std::set<std::string> found;
  for (const char* p : kPrefixes) {
    if (info.find(p) != std::string::npos) found.insert(p);
  }
  std::string out;
  for (const auto& f : found) out += (out.empty() ? "" : ",") + f;
  return out;
}

}  // namespace mooncake::ucx
