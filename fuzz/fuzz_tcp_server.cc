// Fuzzes the TCP data target (src/transport/tcp/tcp_server.cc) end to end: a real TcpServer,
// a MemoryRegistry holding one 64 KiB remote-accessible buffer between guard pages (plus one
// buffer registered without remote access), and a loopback TCP client that sends the input
// as the byte stream of one connection, reads what comes back until the target closes, and
// closes. Then the reply bytes and the memory are checked against the protocol
// (tcp_model.h): the target must never touch memory outside the registered buffer, never
// write where the peer did not ask, and answer exactly as docs/wire_protocol.md §3 says.
//
// Input format: see BuildTcpStream in tcp_model.h (mode byte: raw stream or structured
// requests addressed relative to the buffer).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include <glog/logging.h>

#include "engine/memory_registry.h"
#include "fuzz_common.h"
#include "mooncake/options.h"
#include "tcp_model.h"
#include "transport/tcp/tcp_server.h"

using namespace mooncake;

namespace {

fuzz::Arena g_arena;
MemoryRegistry* g_registry = nullptr;
int g_listen_fd = -1;
sockaddr_in g_addr{};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;  // the target logs every refused request
  FLAGS_logtostderr = true;
  g_arena.Map();
  g_registry = new MemoryRegistry();
  if (!g_registry->Add(g_arena.remote_addr(), fuzz::Arena::kRemoteSize, "cpu:0", true).ok() ||
      !g_registry->Add(g_arena.local_addr(), fuzz::Arena::kLocalSize, "cpu:0", false).ok()) {
    fuzz::Fail("registering the arena failed");
  }
  g_listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  g_addr.sin_family = AF_INET;
  g_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(g_addr);
  if (g_listen_fd < 0 || ::bind(g_listen_fd, reinterpret_cast<sockaddr*>(&g_addr), len) != 0 ||
      ::listen(g_listen_fd, 16) != 0 ||
      ::getsockname(g_listen_fd, reinterpret_cast<sockaddr*>(&g_addr), &len) != 0) {
    fuzz::Fail("loopback listener: %s", std::strerror(errno));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string stream = fuzz::BuildTcpStream(data, size, g_arena);
  g_arena.Reset();
  fuzz::TcpExpectation expect = fuzz::ModelTcp(stream, g_arena);

  EngineOptions options;
  options.slice_timeout_ms = fuzz::kSliceTimeoutMs;
  std::string got;
  {
    // One server per input: its threads are joined before the checks, so whatever it did is
    // attributed to this input.
    tcp::TcpServer server(options, g_registry);
    int lfd = ::fcntl(g_listen_fd, F_DUPFD_CLOEXEC, 0);
    if (lfd < 0 || !server.Start(UniqueFd(lfd)).ok()) fuzz::Fail("TcpServer::Start");
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    fuzz::ApplyClientBuffers(fd, data, size);  // before connect: sizes the TCP window
    if (fd < 0 || !fuzz::Connect(fd, &g_addr, sizeof(g_addr))) {
      fuzz::Fail("connect: %s", std::strerror(errno));
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (!fuzz::Exchange(fd, stream, &got, 5000)) {
      fuzz::Fail("TcpServer did not close the connection within 5 s of the client's EOF "
                 "(%zu bytes sent, %zu received)", stream.size(), got.size());
    }
    fuzz::CloseAbortive(fd);
    server.Stop();
  }
  if (fuzz::Trace()) {
    std::fprintf(stderr, "stream %zu bytes, %d requests applied, reply %zu bytes (expected "
                 "%zu..%zu)\n", stream.size(), expect.requests, got.size(), expect.min_len,
                 expect.full.size());
  }
  fuzz::CheckTcp(expect, got, g_arena, "TcpServer", /*over_tcp=*/true);
  return 0;
}
