// Lower-level variant of fuzz_tcp_server: drives the per-connection request loop of the TCP
// target (the Session class inside src/transport/tcp/tcp_server.cc, compiled into this file)
// directly on a unix socketpair, without the listener, the accept thread and a TCP
// handshake per input. Same input format, same memory layout and the same protocol checks
// (tcp_model.h); about twice the executions per second of fuzz_tcp_server.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <thread>

#include <glog/logging.h>

// The code under test, with its file-local Session class visible to this file.
#include "transport/tcp/tcp_server.cc"  // NOLINT(bugprone-suspicious-include)

#include "engine/memory_registry.h"
#include "fuzz_common.h"
#include "tcp_model.h"

using namespace mooncake;

namespace {

fuzz::Arena g_arena;
MemoryRegistry* g_registry = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;
  FLAGS_logtostderr = true;
  g_arena.Map();
  g_registry = new MemoryRegistry();
  if (!g_registry->Add(g_arena.remote_addr(), fuzz::Arena::kRemoteSize, "cpu:0", true).ok() ||
      !g_registry->Add(g_arena.local_addr(), fuzz::Arena::kLocalSize, "cpu:0", false).ok()) {
    fuzz::Fail("registering the arena failed");
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string stream = fuzz::BuildTcpStream(data, size, g_arena);
  g_arena.Reset();
  fuzz::TcpExpectation expect = fuzz::ModelTcp(stream, g_arena);

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) fuzz::Fail("socketpair");
  {
    // On a unix socket only the sender's buffer counts: the "receive buffer" choice sizes the
    // target's send buffer instead.
    int snd, rcv;
    fuzz::TcpClientBuffers(data, size, &snd, &rcv);
    if (snd) ::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &snd, sizeof(snd));
    if (rcv) ::setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &rcv, sizeof(rcv));
  }
  std::thread target([fd = sv[1]] {
    tcp::FenceTable fences;  // one per input: HELLO/FENCE frames of this input only
    tcp::Session(fd, g_registry, &fences, fuzz::kSliceTimeoutMs).Run();
    ::shutdown(fd, SHUT_RDWR);  // as TcpServer::ServeConnection does
  });
  ::fcntl(sv[0], F_SETFL, ::fcntl(sv[0], F_GETFL) | O_NONBLOCK);
  std::string got;
  bool closed = fuzz::Exchange(sv[0], stream, &got, 5000);
  if (!closed) {
    fuzz::Fail("Session did not end within 5 s of the client's EOF (%zu bytes sent, %zu "
               "received)", stream.size(), got.size());
  }
  ::close(sv[0]);
  target.join();
  ::close(sv[1]);
  if (fuzz::Trace()) {
    std::fprintf(stderr, "stream %zu bytes, %d requests applied, reply %zu bytes (expected "
                 "%zu..%zu)\n", stream.size(), expect.requests, got.size(), expect.min_len,
                 expect.full.size());
  }
  fuzz::CheckTcp(expect, got, g_arena, "TcpServer Session", /*over_tcp=*/false);
  return 0;
}
