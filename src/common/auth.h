// Optional shared-secret authentication of connections (beyond upstream; off by default).
//
// When a secret is set (EngineOptions::auth_secret, MC_AUTH_SECRET), every accepted
// connection — handshake, TCP data, same-host — starts with a challenge from the server:
//   "MCAUTHv1" (8 bytes) + 32 random bytes (nonce)
// and the client must answer with HMAC-SHA256(secret, purpose || nonce) (32 bytes), purpose
// being "handshake", "tcp-data" or "shm". The server verifies it before reading anything
// else, so a peer without the secret never gets a request parsed, let alone memory touched.
// Peers without a secret (upstream engines) cannot talk to an engine that has one.
#pragma once

#include <string>

#include "mooncake/status.h"

namespace mooncake {

class Authenticator {
 public:
  explicit Authenticator(std::string secret) : secret_(std::move(secret)) {}
  bool enabled() const { return !secret_.empty(); }

  // Server side, right after accept. PermissionDenied when the answer is missing or wrong.
  // No-op when disabled.
  Status Challenge(int fd, const char* purpose, int timeout_ms) const;
  // Client side, right after connect. No-op when disabled.
  Status Answer(int fd, const char* purpose, int timeout_ms) const;

 private:
  std::string Mac(const char* purpose, const unsigned char* nonce) const;
  const std::string secret_;
};

}  // namespace mooncake
