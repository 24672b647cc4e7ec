// libzmq, loaded at run time (dlopen of libzmq.so.5): mooncake_master links no ZeroMQ, so it
// starts on a machine without it, and only --enable_kv_events needs it (Debian: libzmq5).
// The C API's constants come from <zmq.h> (libzmq3-dev at build time).
#pragma once

#include <zmq.h>

#include "mooncake/status.h"

namespace mooncake::store::kv_events {

struct ZmqLib {
  void* (*ctx_new)();
  int (*ctx_term)(void*);
  void* (*socket)(void*, int);
  int (*close)(void*);
  int (*setsockopt)(void*, int, const void*, size_t);
  int (*getsockopt)(void*, int, void*, size_t*);
  int (*bind)(void*, const char*);
  int (*connect)(void*, const char*);
  int (*send)(void*, const void*, size_t, int);
  int (*msg_init)(zmq_msg_t*);
  int (*msg_recv)(zmq_msg_t*, void*, int);
  int (*msg_close)(zmq_msg_t*);
  void* (*msg_data)(zmq_msg_t*);
  size_t (*msg_size)(const zmq_msg_t*);
  int (*msg_more)(const zmq_msg_t*);
  int (*poll)(zmq_pollitem_t*, int, long);
  int (*errno_fn)();
  const char* (*strerror)(int);
};

// The library, loaded once (thread-safe); Unavailable, saying what to install, when it is
// not there. MC_ZMQ_LIBRARY names another file (tests, odd installs).
Result<const ZmqLib*> LoadZmq();

}  // namespace mooncake::store::kv_events
