#include "transport/ucx/ucx_api.h"

#include <dlfcn.h>
#include <glog/logging.h>

#include <cstdlib>
#include <mutex>

#include "transport/ucx/ucx_env.h"

namespace mooncake::ucx {
namespace {

struct Loaded {
  UcxApi api{};
  Status status;
};

template <typename F>
bool Bind(void* lib, const char* symbol, F* out, std::string* missing) {
  void* p = ::dlsym(lib, symbol);
  if (p == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += symbol;
    return false;
  }
  *out = reinterpret_cast<F>(p);
  return true;
}

Loaded LoadOnce() {
  Loaded out;
  // Before the library is loaded: libucs reads some of its settings (signal handlers) then.
  std::string set;
  for (const auto& line : ApplyEnvironment()) set += (set.empty() ? "" : ", ") + line;
  if (!set.empty()) VLOG(1) << "UCX environment set: " << set;
  const char* override_path = std::getenv("MC_UCX_LIBRARY");
  const std::string path = override_path != nullptr && *override_path ? override_path
                                                                         : "libucp.so.0";
  // RTLD_LOCAL: UCX's symbols stay out of the global namespace of the host process.
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    out.status = Status::Unavailable("cannot load UCX (" + path + "): " +
                                     (why ? why : "unknown error") +
                                     "; install libucx0 (Debian/Ubuntu) or set MC_UCX_LIBRARY");
    return out;
  }
  UcxApi& a = out.api;
  std::string missing;
  Bind(lib, "ucp_get_version", &a.get_version, &missing);
  Bind(lib, "ucs_status_string", &a.status_string, &missing);
  Bind(lib, "ucp_config_read", &a.config_read, &missing);
  Bind(lib, "ucp_config_release", &a.config_release, &missing);
  Bind(lib, "ucp_config_modify", &a.config_modify, &missing);
  Bind(lib, "ucp_init_version", &a.init_version, &missing);
  Bind(lib, "ucp_cleanup", &a.cleanup, &missing);
  Bind(lib, "ucp_context_query", &a.context_query, &missing);
  Bind(lib, "ucp_worker_create", &a.worker_create, &missing);
  Bind(lib, "ucp_worker_destroy", &a.worker_destroy, &missing);
  Bind(lib, "ucp_worker_query", &a.worker_query, &missing);
  Bind(lib, "ucp_worker_release_address", &a.worker_release_address, &missing);
  Bind(lib, "ucp_worker_progress", &a.worker_progress, &missing);
  Bind(lib, "ucp_worker_get_efd", &a.worker_get_efd, &missing);
  Bind(lib, "ucp_worker_arm", &a.worker_arm, &missing);
  Bind(lib, "ucp_context_print_info", &a.context_print_info, &missing);
  Bind(lib, "ucp_ep_create", &a.ep_create, &missing);
  Bind(lib, "ucp_ep_close_nbx", &a.ep_close_nbx, &missing);
  Bind(lib, "ucp_ep_flush_nbx", &a.ep_flush_nbx, &missing);
  Bind(lib, "ucp_ep_print_info", &a.ep_print_info, &missing);
  Bind(lib, "ucp_mem_map", &a.mem_map, &missing);
  Bind(lib, "ucp_mem_unmap", &a.mem_unmap, &missing);
  Bind(lib, "ucp_rkey_pack", &a.rkey_pack, &missing);
  Bind(lib, "ucp_rkey_buffer_release", &a.rkey_buffer_release, &missing);
  Bind(lib, "ucp_ep_rkey_unpack", &a.ep_rkey_unpack, &missing);
  Bind(lib, "ucp_rkey_destroy", &a.rkey_destroy, &missing);
  Bind(lib, "ucp_put_nbx", &a.put_nbx, &missing);
  Bind(lib, "ucp_get_nbx", &a.get_nbx, &missing);
  Bind(lib, "ucp_request_check_status", &a.request_check_status, &missing);
  Bind(lib, "ucp_request_free", &a.request_free, &missing);
  if (!missing.empty()) {
    ::dlclose(lib);
    out.status = Status::Unavailable(path + " lacks " + missing + " (this engine needs UCX 1.12 or newer)");
    return out;
  }
  unsigned major = 0, minor = 0, release = 0;
  a.get_version(&major, &minor, &release);
  if (major != UCP_API_MAJOR || minor < 12) {
    out.status = Status::Unavailable("UCX " + a.Version() + " at " + path +
                                     " is too old or of another major version (need 1.12+)");
  }
  return out;  // the library stays loaded for the life of the process
}

}  // namespace

std::string UcxApi::Version() const {
  unsigned major = 0, minor = 0, release = 0;
  get_version(&major, &minor, &release);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

Status UcxApi::Error(const std::string& what, ucs_status_t status) const {
  return Status::Unavailable(what + ": " + status_string(status));
}

Result<const UcxApi*> LoadUcxApi() {
  static const Loaded* loaded = new Loaded(LoadOnce());
  if (!loaded->status.ok()) return loaded->status;
  return &loaded->api;
}

}  // namespace mooncake::ucx
