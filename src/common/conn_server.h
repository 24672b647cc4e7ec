// ConnServer: the accept loop of a thread-per-connection server, shared by the TCP data server
// and the same-host (shm) server. It accepts on a listening socket, serves each connection on
// its own thread, reaps finished ones, and on Stop shuts every connection down and joins every
// thread, so no serve function outlives the server.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/net.h"
#include "mooncake/status.h"

namespace mooncake {

class ConnServer {
 public:
  // serve(fd) runs on the connection's own thread and returns when it is done with it; the
  // server then shuts the socket down (the peer sees it closed) and closes it once reaped.
  // on_accept(fd), if set, runs on the accept thread before the serve thread starts.
  using ServeFn = std::function<void(int fd)>;
  using AcceptFn = std::function<void(int fd)>;

  ConnServer(std::string name, size_t max_connections, ServeFn serve, AcceptFn on_accept = {});
  ~ConnServer();  // Stop()
  ConnServer(const ConnServer&) = delete;
  ConnServer& operator=(const ConnServer&) = delete;

  // Takes a listening socket and starts accepting.
  Status Start(UniqueFd listen_fd);
  // Closes the listener and every connection; joins all threads. Idempotent.
  void Stop();

  // Connections accepted so far, and those whose serve function has not returned (tests).
  uint64_t accepted() const { return accepted_.load(); }
  size_t active() const;

 private:
  struct Conn {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  void AcceptLoop();
  void ReapFinishedLocked();

  const std::string name_;
  const size_t max_connections_;
  const ServeFn serve_;
  const AcceptFn on_accept_;
  UniqueFd listen_fd_;
  int wake_fd_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> accepted_{0};
  std::thread acceptor_;
  mutable std::mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_;  // GUARDED_BY(mu_)
};

}  // namespace mooncake
