// The hostile tests' relay of an authentication exchange (relay_test.cc, store_relay_test.cc):
// a man in the middle passing MCAUTH bytes between a victim and a server unchanged.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "common/net.h"

namespace mooncake {

// Forwards the authentication exchange from `server` to `client` (server speaks first),
// whichever version the server speaks. False when either side stops it.
inline bool RelayAuth(int client, int server) {
  char challenge[40];
  if (!ReadFull(server, challenge, 40, 3000).ok()) return false;
  if (!WriteFull(client, challenge, 40, 3000).ok()) return false;
  if (std::memcmp(challenge, "MCAUTHv1", 8) == 0) {
    char mac[32];
    return ReadFull(client, mac, 32, 3000).ok() && WriteFull(server, mac, 32, 3000).ok();
  }
  char head[42];
  if (!ReadFull(client, head, 42, 3000).ok()) return false;
  size_t n = static_cast<uint8_t>(head[40]) | (static_cast<size_t>(static_cast<uint8_t>(head[41])) << 8);
  std::string rest(n + 32, '\0');
  if (!ReadFull(client, rest.data(), rest.size(), 3000).ok()) return false;
  if (!WriteFull(server, head, 42, 3000).ok() ||
      !WriteFull(server, rest.data(), rest.size(), 3000).ok()) {
    return false;
  }
  char verdict = 1;
  if (!ReadFull(server, &verdict, 1, 3000).ok()) return false;
  (void)WriteFull(client, &verdict, 1, 3000);
  if (verdict != 0) return false;
  char mac[32];
  return ReadFull(server, mac, 32, 3000).ok() && WriteFull(client, mac, 32, 3000).ok();
}

}  // namespace mooncake
