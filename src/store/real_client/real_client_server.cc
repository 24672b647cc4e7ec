#include "store/real_client/real_client_server.h"

#include <sys/socket.h>

#include <cerrno>

namespace mooncake {
namespace store {

bool RealClientServer::OnRead(PollServer::Conn& c, Clock::time_point /*now*/) {
  if (c.pinned) {  // a dummy's bytes after the hello are dropped
    c.in.clear();
    return true;
  }
  const size_t nl = c.in.find('\n');
  bool ok;
  if (nl == std::string::npos) {
    ok = c.in.size() <= kMaxHelloBytes;
  } else if (c.in.compare(0, nl + 1, kDummyHello) != 0) {
    ok = false;
  } else {
    // The config line fits a fresh socket's send buffer; a short send means the connection
    // is unusable.
    ssize_t w = ::send(c.fd, config_line_.data(), config_line_.size(),
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    ok = w == static_cast<ssize_t>(config_line_.size());
    if (ok) {
      c.pinned = true;
      c.deadline = Clock::time_point::max();
      c.in.clear();
      c.in.shrink_to_fit();
      ++dummies_;
    }
  }
  if (!ok) ++bad_hellos_;
  return ok;
}

void RealClientServer::OnTurn(Clock::time_point now) {
  if (next_beat_ == Clock::time_point{}) next_beat_ = now + kHeartbeatInterval;
  beat_ = now >= next_beat_;
  if (beat_) next_beat_ = now + kHeartbeatInterval;
}

bool RealClientServer::OnVisit(PollServer::Conn& c, Clock::time_point /*now*/) {
  if (!c.pinned || !beat_) return true;
  ssize_t w = ::send(c.fd, "\n", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  return !(w < 0 && errno != EAGAIN && errno != EINTR);
}

}  // namespace store
}  // namespace mooncake
