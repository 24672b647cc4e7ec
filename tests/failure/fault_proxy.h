// Fault injection between an initiator and a target, in the test process.
//
// FaultProxy: a TCP proxy (127.0.0.1, ephemeral port) in front of one target address. Every
// accepted connection gets its own connection to the target and two forwarding threads, one
// per direction, so neither direction can block the other. Faults:
//   CutAfter(dir, n)  one-shot: once n more bytes have gone in `dir` (all connections
//                     together), the connection carrying byte n is cut right after it, in the
//                     middle of whatever frame it is in; both of its sockets are reset (RST)
//   CutAll()          resets every open connection now
//   SetDelay(ms)      every chunk waits ms before it is forwarded
//   SetRate(B/s)      forwards at most B bytes per second per direction and connection
//   SetStalled(true)  forwards nothing (connections stay open, new ones are accepted) until
//                     SetStalled(false)
//   SetRefuse(true)   new connections are reset at once
//   FreezeExisting()  the connections open now forward nothing (they keep what they hold,
//                     including a FIN from either side) until ThawAll(); new connections
//                     flow normally: one connection's bytes are delayed behind later ones
//
// HandshakeProxy: the P2P handshake (docs/wire_protocol.md §1) in front of a target's RPC
// port. The initiator opens the proxy's name ("127.0.0.1:<port>") instead of the target's;
// every frame is forwarded, and in a Metadata reply the descriptor's tcp_data_port becomes
// `data_port` (a FaultProxy's port), tcp_data_host becomes 127.0.0.1 and the same-host field
// mc_shm_path is cleared, so that the data path goes through the FaultProxy. Requires peers
// without MC_AUTH_SECRET (it parses frames).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace mc_failure {

class FaultProxy {
 public:
  enum Direction { kToTarget = 0, kToInitiator = 1 };

  FaultProxy(std::string target_host, uint16_t target_port);
  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  bool Start();  // false if it cannot listen
  void Stop();   // resets every connection and joins every thread
  uint16_t port() const { return port_; }

  void CutAfter(Direction dir, uint64_t bytes);
  void CutAll();
  void SetDelay(int ms) { delay_ms_.store(ms); }
  void SetRate(uint64_t bytes_per_second) { rate_.store(bytes_per_second); }
  void SetStalled(bool stalled) { stalled_.store(stalled); }
  void SetRefuse(bool refuse) { refuse_.store(refuse); }
  void FreezeExisting();
  void ThawAll();

  uint64_t connections() const { return connections_.load(); }  // accepted so far
  uint64_t cuts() const { return cuts_.load(); }                // cuts done so far
  uint64_t bytes(Direction d) const { return bytes_[d].load(); }
  bool cut_pending() const;
  // When the last cut happened (steady clock; epoch if none yet).
  std::chrono::steady_clock::time_point last_cut() const;

 private:
  struct Conn {
    int a = -1;  // initiator side
    int b = -1;  // target side
    std::atomic<bool> dead{false};
    std::atomic<bool> frozen{false};
    std::atomic<int> running{0};
    std::thread up, down;
  };
  void AcceptLoop();
  void Pump(Conn* c, Direction dir);
  void Abort(Conn* c);  // RST both sockets; wakes both pumps
  void ReapLocked(bool all);

  const std::string host_;
  const uint16_t target_port_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;

  std::atomic<int> delay_ms_{0};
  std::atomic<uint64_t> rate_{0};
  std::atomic<bool> stalled_{false};
  std::atomic<bool> refuse_{false};
  std::atomic<uint64_t> connections_{0};
  std::atomic<uint64_t> cuts_{0};
  std::atomic<uint64_t> bytes_[2] = {{0}, {0}};

  mutable std::mutex mu_;
  int64_t cut_left_[2] = {-1, -1};  // GUARDED_BY(mu_); -1: not armed
  std::chrono::steady_clock::time_point last_cut_{};  // GUARDED_BY(mu_)
  std::list<std::unique_ptr<Conn>> conns_;  // GUARDED_BY(mu_)
};

class HandshakeProxy {
 public:
  HandshakeProxy(std::string target_host, uint16_t target_rpc_port, uint16_t data_port);
  ~HandshakeProxy();
  HandshakeProxy(const HandshakeProxy&) = delete;
  HandshakeProxy& operator=(const HandshakeProxy&) = delete;

  bool Start();
  void Stop();
  uint16_t port() const { return port_; }
  std::string name() const { return "127.0.0.1:" + std::to_string(port_); }
  uint64_t metadata_replies() const { return rewrites_.load(); }

 private:
  void AcceptLoop();
  void Serve(int fd);

  const std::string host_;
  const uint16_t target_port_;
  const uint16_t data_port_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> rewrites_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::list<std::thread> workers_;  // GUARDED_BY(mu_)
};

// The descriptor JSON with tcp_data_port = port, tcp_data_host = "127.0.0.1" and
// mc_shm_path = "" (exposed for the proxy's own test).
std::string RewriteDescriptor(const std::string& json, uint16_t port);

// Fetches a peer's descriptor with one Metadata handshake to host:rpc_port and returns its
// tcp_data_port, or -1.
int FetchTcpDataPort(const std::string& host, uint16_t rpc_port);
// The same, returning the descriptor's JSON ("" when the handshake failed).
std::string FetchDescriptor(const std::string& host, uint16_t rpc_port);

}  // namespace mc_failure
