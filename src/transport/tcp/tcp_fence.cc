#include "transport/tcp/tcp_fence.h"

#include <endian.h>
#include <openssl/rand.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <random>

namespace mooncake::tcp {
namespace {

void PutU64(std::string* out, uint64_t v) {
  v = htole64(v);
  out->append(reinterpret_cast<const char*>(&v), 8);
}

uint64_t GetU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return le64toh(v);
}

uint64_t RandomSession() {
  uint64_t v = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&v), sizeof(v)) != 1) {
    std::random_device rd;
    v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  return v == 0 ? 1 : v;
}

}  // namespace

std::string EncodeControl(const ControlFrame& f, bool v2) {
  size_t n = std::min(f.live.size(), kMaxFenceLive);
  uint8_t header[kHeaderSize] = {};
  uint64_t size = htole64(kControlFixedSize + n * 8), magic = htole64(kControlMagic);
  std::memcpy(header, &size, 8);
  std::memcpy(header + 8, &magic, 8);
  header[16] = static_cast<uint8_t>(f.op | (v2 ? kV2Flag : 0));
  std::string out(reinterpret_cast<const char*>(header), kHeaderSize);
  PutU64(&out, f.session);
  PutU64(&out, f.conn_id);
  PutU64(&out, f.floor);
  PutU64(&out, n);  // u32 count, then u32 zero (little-endian)
  for (size_t i = 0; i < n; ++i) PutU64(&out, f.live[i]);
  return out;
}

uint8_t ControlOpcode(const uint8_t header[kHeaderSize]) {
  uint8_t op = header[16] & static_cast<uint8_t>(~kV2Flag);
  if (op != kOpHello && op != kOpFence) return 0;
  return GetU64(header + 8) == kControlMagic ? op : 0;
}

Result<ControlFrame> DecodeControlBody(uint8_t op, const uint8_t* body, size_t len) {
  if (len < kControlFixedSize || len > kMaxControlBody || (len - kControlFixedSize) % 8 != 0) {
    return Status::DataLoss("fence frame of " + std::to_string(len) + " bytes (want 32 + 8n, n <= " +
                            std::to_string(kMaxFenceLive) + ")");
  }
  ControlFrame f;
  f.op = op;
  f.session = GetU64(body);
  f.conn_id = GetU64(body + 8);
  f.floor = GetU64(body + 16);
  uint64_t counts = GetU64(body + 24);
  size_t n = static_cast<uint32_t>(counts);
  if ((counts >> 32) != 0 || n != (len - kControlFixedSize) / 8) {
    return Status::DataLoss("fence frame: live count " + std::to_string(n) +
                            " does not match its length " + std::to_string(len));
  }
  if (f.session == 0 || (op == kOpHello && f.conn_id == 0)) {
    return Status::DataLoss("fence frame: zero session or connection id");
  }
  f.live.reserve(n);
  for (size_t i = 0; i < n; ++i) f.live.push_back(GetU64(body + kControlFixedSize + i * 8));
  return f;
}

PeerFence::PeerFence() : session_(RandomSession()) {}

uint64_t PeerFence::Connected() {
  MutexLock lock(&mu_);
  uint64_t id = ++last_id_;
  live_.push_back(id);
  return id;
}

void PeerFence::Abandoned(uint64_t conn_id) {
  {
    MutexLock lock(&mu_);
    auto it = std::find(live_.begin(), live_.end(), conn_id);
    if (it != live_.end()) live_.erase(it);
  }
  epoch_.fetch_add(1, std::memory_order_acq_rel);
}

ControlFrame PeerFence::Snapshot(uint8_t op, uint64_t* epoch) {
  ControlFrame f;
  f.op = op;
  f.session = session_;
  MutexLock lock(&mu_);
  *epoch = epoch_.load(std::memory_order_acquire);
  f.floor = last_id_;
  f.live = live_;
  if (f.live.size() > kMaxFenceLive) {
    // More live connections than a frame names (more than 64 streams to one peer, which
    // the lane limit of 16 rules out): fence nothing rather than a live connection.
    f.floor = 0;
    f.live.clear();
  }
  return f;
}

bool FenceTable::IsFencedBy(uint64_t id, uint64_t floor, const std::vector<uint64_t>& live) {
  return id <= floor && std::find(live.begin(), live.end(), id) == live.end();
}

void FenceTable::MakeRoomLocked() {
  while (sessions_.size() >= kMaxSessions) {
    auto victim = sessions_.end();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      if (!it->second.conns.empty()) continue;
      if (victim == sessions_.end() || it->second.last_used < victim->second.last_used) victim = it;
    }
    if (victim == sessions_.end()) return;
    sessions_.erase(victim);
  }
}

Status FenceTable::Register(const std::shared_ptr<Conn>& conn) {
  MutexLock lock(&mu_);
  auto it = sessions_.find(conn->session);
  if (it == sessions_.end()) {
    MakeRoomLocked();
    if (sessions_.size() >= kMaxSessions) {
      return Status::ResourceExhausted("fence table full: " + std::to_string(kMaxSessions) +
                                       " initiator sessions with open connections");
    }
    it = sessions_.emplace(conn->session, Session{}).first;
  }
  Session& s = it->second;
  s.last_used = ++clock_;
  if (IsFencedBy(conn->id, s.floor, s.live)) {
    return Status::FailedPrecondition("connection " + std::to_string(conn->id) +
                                      " was fenced before it said hello; refusing it");
  }
  if (!s.conns.emplace(conn->id, conn).second) {
    return Status::AlreadyExists("connection id " + std::to_string(conn->id) +
                                 " already in use in its session");
  }
  return Status::OK();
}

void FenceTable::Unregister(const Conn& conn) {
  MutexLock lock(&mu_);
  auto it = sessions_.find(conn.session);
  if (it == sessions_.end()) return;
  auto c = it->second.conns.find(conn.id);
  if (c != it->second.conns.end() && c->second.get() == &conn) it->second.conns.erase(c);
}

void FenceTable::Fence(const ControlFrame& fence, const Conn* self) {
  std::vector<std::shared_ptr<Conn>> victims;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(fence.session);
    if (it == sessions_.end()) {
      MakeRoomLocked();
      if (sessions_.size() >= kMaxSessions) return;
      it = sessions_.emplace(fence.session, Session{}).first;
    }
    Session& s = it->second;
    s.last_used = ++clock_;
    for (auto& [id, c] : s.conns) {
      if (c.get() != self && IsFencedBy(id, fence.floor, fence.live)) {
        ::shutdown(c->fd, SHUT_RDWR);  // wakes it if it is blocked in a receive
        victims.push_back(c);
      }
    }
    // Remember the newest fence for connections whose HELLO has not arrived yet. An older
    // fence arriving late on another connection still fences what it names (nothing live:
    // ids it calls dead were dead when it was made).
    if (fence.floor >= s.floor) {
      s.floor = fence.floor;
      s.live = fence.live;
    }
  }
  for (auto& c : victims) {
    MutexLock apply(&c->apply_mu);  // waits for a write in progress
    if (!c->fenced) fenced_count_.fetch_add(1);
    c->fenced = true;
  }
}

}  // namespace mooncake::tcp
