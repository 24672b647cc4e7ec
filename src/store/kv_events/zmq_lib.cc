#include "store/kv_events/zmq_lib.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace mooncake::store::kv_events {
namespace {

template <typename F>
void Bind(void* lib, const char* symbol, F* out, std::string* missing) {
  void* p = ::dlsym(lib, symbol);
  if (p == nullptr) missing->append(missing->empty() ? "" : ", ").append(symbol);
  *out = reinterpret_cast<F>(p);
}

Result<const ZmqLib*> Load() {
  const char* override_path = std::getenv("MC_ZMQ_LIBRARY");
  const std::string path = override_path != nullptr && *override_path ? override_path
                                                                         : "libzmq.so.5";
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    return Status::Unavailable("cannot load ZeroMQ (" + path + "): " +
                               (why != nullptr ? why : "unknown error") +
                               "; install libzmq5 (Debian/Ubuntu) or set MC_ZMQ_LIBRARY");
  }
  static ZmqLib z;  // written once, before any reader (LoadZmq's static initialization)
  std::string missing;
  Bind(lib, "zmq_ctx_new", &z.ctx_new, &missing);
  Bind(lib, "zmq_ctx_term", &z.ctx_term, &missing);
  Bind(lib, "zmq_socket", &z.socket, &missing);
  Bind(lib, "zmq_close", &z.close, &missing);
  Bind(lib, "zmq_setsockopt", &z.setsockopt, &missing);
  Bind(lib, "zmq_getsockopt", &z.getsockopt, &missing);
  Bind(lib, "zmq_bind", &z.bind, &missing);
  Bind(lib, "zmq_connect", &z.connect, &missing);
  Bind(lib, "zmq_send", &z.send, &missing);
  Bind(lib, "zmq_msg_init", &z.msg_init, &missing);
  Bind(lib, "zmq_msg_recv", &z.msg_recv, &missing);
  Bind(lib, "zmq_msg_close", &z.msg_close, &missing);
  Bind(lib, "zmq_msg_data", &z.msg_data, &missing);
  Bind(lib, "zmq_msg_size", &z.msg_size, &missing);
  Bind(lib, "zmq_msg_more", &z.msg_more, &missing);
  Bind(lib, "zmq_poll", &z.poll, &missing);
  Bind(lib, "zmq_errno", &z.errno_fn, &missing);
  Bind(lib, "zmq_strerror", &z.strerror, &missing);
  if (!missing.empty()) {
    return Status::Unavailable(path + " lacks " + missing + " (ZeroMQ 4.x is needed)");
  }
  return &z;
}

}  // namespace

Result<const ZmqLib*> LoadZmq() {
  static const Result<const ZmqLib*> loaded = Load();
  return loaded;
}

}  // namespace mooncake::store::kv_events
