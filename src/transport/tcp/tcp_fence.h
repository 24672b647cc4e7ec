// Connection fencing (our extension of the TCP data protocol; docs/wire_protocol.md §3.6).
//
// The problem: a WRITE that ended TIMEOUT or FAILED at the initiator may still be applied by
// the target afterwards (its bytes sit in a stalled network path or a stopped target's
// socket buffer), and then overwrite a later write to the same range. The fix: once an
// initiator gives up on a connection, no later request of it to that peer is applied before
// the target has stopped applying anything from the abandoned connection.
//
// How: the initiator keeps, per peer, a session (random 64-bit id) whose connections get
// increasing ids. Each connection starts with a HELLO (session, its id, and a fence), and
// whenever one of the session's connections is abandoned, every other stream of the peer puts
// a FENCE frame in front of its next requests. A fence says "every connection of this session
// with an id up to `floor`, other than the `live` ones, is dead". The target applies it in
// stream order: it marks those connections fenced, shuts their sockets down, waits until none
// of them is inside a write to memory, and only then reads the next frame of the connection
// that carried the fence. A fenced connection never applies another byte, and a connection
// whose HELLO comes after a fence that names it is refused.
//
// Only between two engines of this project: the target advertises it in its descriptor
// ("mc_tcp_fence": 1); the initiator sends HELLO/FENCE frames only to peers that do.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/thread_annotations.h"
#include "mooncake/status.h"
#include "transport/tcp/tcp_wire.h"

namespace mooncake::tcp {

// HELLO / FENCE control frames: a 24-byte header (size = body length, addr = kControlMagic,
// opcode kOpHello or kOpFence, | kV2Flag on v2 connections) and this body, little-endian:
// u64 session, u64 connection id (0 in a FENCE), u64 floor, u32 live count, u32 zero,
// u64 live ids[count].
constexpr uint8_t kOpHello = 0x10;
constexpr uint8_t kOpFence = 0x11;
constexpr uint64_t kControlMagic = 0x3156454E43464D4Dull;  // "MMFCNEV1" little-endian
constexpr size_t kMaxFenceLive = 64;
constexpr size_t kControlFixedSize = 32;
constexpr size_t kMaxControlBody = kControlFixedSize + kMaxFenceLive * 8;

struct ControlFrame {
  uint8_t op = kOpFence;
  uint64_t session = 0;
  uint64_t conn_id = 0;
  uint64_t floor = 0;
  std::vector<uint64_t> live;
};

// Header and body, ready to send.
std::string EncodeControl(const ControlFrame& frame, bool v2);
// The control opcode (kOpHello / kOpFence) of a header, or 0 if it is not a control header.
uint8_t ControlOpcode(const uint8_t header[kHeaderSize]);
// Parses a body of `len` bytes (len from the header, already bounded by kMaxControlBody).
Result<ControlFrame> DecodeControlBody(uint8_t op, const uint8_t* body, size_t len);

// Initiator side: one per peer, shared by the peer's streams, kept for the life of the
// transport (a peer whose descriptor changed keeps its session, so its old connections are
// still fenced).
class PeerFence {
 public:
  PeerFence();
  uint64_t session() const { return session_; }
  // A connection was established: its id, now counted live.
  uint64_t Connected() MC_EXCLUDES(mu_);
  // A connection went away (failed, timed out, closed): no longer live; bumps the epoch.
  void Abandoned(uint64_t conn_id) MC_EXCLUDES(mu_);
  // How many connections were abandoned so far (cheap; streams compare it before sending).
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  // The current fence: floor = the last id handed out, live = the connections alive now.
  ControlFrame Snapshot(uint8_t op, uint64_t* epoch) MC_EXCLUDES(mu_);

 private:
  const uint64_t session_;
  std::atomic<uint64_t> epoch_{0};
  Mutex mu_;
  uint64_t last_id_ MC_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> live_ MC_GUARDED_BY(mu_);
};

// Target side: the connections that said HELLO, by session, and the latest fence of each.
class FenceTable {
 public:
  // One connection. The serving thread holds apply_mu while it writes into memory and checks
  // `fenced` under it first.
  struct Conn {
    int fd = -1;
    uint64_t session = 0;
    uint64_t id = 0;
    // Taken after FenceTable::mu_ is released (Fence), never inside it.
    Mutex apply_mu;
    bool fenced MC_GUARDED_BY(apply_mu) = false;
  };

  // Sessions remembered at most (those with no connection left are forgotten first).
  static constexpr size_t kMaxSessions = 4096;

  // Registers a connection after its HELLO. FailedPrecondition if a fence already named it,
  // ResourceExhausted if the table is full of sessions with live connections.
  Status Register(const std::shared_ptr<Conn>& conn) MC_EXCLUDES(mu_);
  void Unregister(const Conn& conn) MC_EXCLUDES(mu_);
  // Applies a fence of `session` and returns once no fenced connection can apply another
  // byte. `self` (the connection carrying it) is never fenced by it.
  void Fence(const ControlFrame& fence, const Conn* self) MC_EXCLUDES(mu_);

  // Connections fenced so far, and sessions remembered now (tests).
  uint64_t fenced_count() const { return fenced_count_.load(); }
  size_t session_count() MC_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return sessions_.size();
  }

 private:
  struct Session {
    std::map<uint64_t, std::shared_ptr<Conn>> conns;
    uint64_t floor = 0;  // of the fence with the highest floor seen
    std::vector<uint64_t> live;
    uint64_t last_used = 0;
  };
  static bool IsFencedBy(uint64_t id, uint64_t floor, const std::vector<uint64_t>& live);
  void MakeRoomLocked() MC_REQUIRES(mu_);

  Mutex mu_;
  std::unordered_map<uint64_t, Session> sessions_ MC_GUARDED_BY(mu_);
  uint64_t clock_ MC_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> fenced_count_{0};
};

}  // namespace mooncake::tcp
