// Optional shared-secret authentication of connections (beyond upstream; off by default).
//
// When a secret is set (EngineOptions::auth_secret, MC_AUTH_SECRET), every connection —
// handshake, TCP data, same-host — starts with a mutual exchange (docs/wire_protocol.md §5):
//   server -> client  "MCAUTHv2" + Ns (32 random bytes)
//   client -> server  "MCAUTHv2" + Nc (32 random bytes) + u16 LE n + segment name (n bytes)
//                     + HMAC-SHA256(secret, "MCAUTHv2 client" 0 purpose 0 n name Ns Nc)
//   server -> client  u8 verdict (0 ok; 1 wrong secret; 2 not this segment; 3 malformed)
//                     and, when 0, HMAC-SHA256(secret, "MCAUTHv2 server" 0 purpose 0 n name Ns Nc)
// `purpose` is "handshake", "tcp-data" or "shm"; the segment name is the one the client means
// to reach, which the server checks is its own. Each side proves it knows the secret over
// both nonces, so neither a replayed nor a relayed exchange passes: a man in the middle who
// forwards the challenge gets an answer bound to *its* segment name, which the real server
// refuses, and cannot forge the server's proof. No frame is parsed before the exchange ends.
// Not encryption and no per-frame integrity (see the threat model in docs/wire_protocol.md).
// Peers without a secret (upstream engines) and MCAUTHv1 peers get a one-line error.
//
// What reaches an engine *through* a metadata store (etcd, redis, http) or any other party
// is authenticated too (docs/wire_protocol.md §5.4): with a secret every engine signs its
// segment descriptor and its rpc_meta entry (SignEntry, an HMAC under a key derived from the
// secret), and a fetcher refuses an entry that is unsigned, altered, or signed for another
// name. Each engine start draws a random instance id that the signed entries carry; a client
// that dials a data or handshake port learnt from a signed entry authenticates to
// AuthName(segment, instance), which only that very engine start accepts, so a stale signed
// entry replayed by a relay reaches nothing either.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "mooncake/status.h"

namespace mooncake {

class Authenticator {
 public:
  static constexpr size_t kNonce = 32;
  static constexpr size_t kMac = 32;
  static constexpr size_t kMaxName = 1024;  // longest segment name in a client hello
  enum Verdict : uint8_t { kOk = 0, kWrongSecret = 1, kNotThisSegment = 2, kMalformed = 3 };

  explicit Authenticator(std::string secret) : secret_(std::move(secret)) {}
  bool enabled() const { return !secret_.empty(); }

  // Server side, right after accept: the whole exchange within `timeout_ms`. `own_names`
  // are the segment names this server answers to. PermissionDenied when the client is
  // refused (it is told why in one byte). No-op when disabled.
  Status Challenge(int fd, const char* purpose, const std::vector<std::string>& own_names,
                   int timeout_ms) const;
  // Client side, right after connect: `segment` is the segment name it means to reach.
  // PermissionDenied when the server refuses us or does not prove it knows the secret.
  // No-op when disabled.
  Status Answer(int fd, const char* purpose, const std::string& segment, int timeout_ms) const;

  // The MAC of one direction ("client" / "server"), exposed for tests and the fuzzer.
  std::string Mac(std::string_view direction, std::string_view purpose, std::string_view name,
                  const unsigned char* server_nonce, const unsigned char* client_nonce) const;

  // Signed entries (§5.4). Lowercase hex of HMAC-SHA256(K, "MCSIGv1" 0 kind 0 scope 0 body),
  // K = HMAC-SHA256(secret, "MCAUTH entry signing key v1"). `kind` is "segment" or
  // "rpc_meta", `scope` the metadata cluster id. Empty when disabled.
  std::string SignEntry(std::string_view kind, std::string_view scope, std::string_view body) const;
  // Constant-time check of `sig_hex` against SignEntry; false for any other length.
  bool VerifyEntry(std::string_view kind, std::string_view scope, std::string_view body,
                   std::string_view sig_hex) const;
  // Proof of the secret on a write to the http metadata server (docs/wire_protocol.md §5.5):
  // lowercase hex of HMAC-SHA256(K, "MCSTOREv1" 0 method 0 key 0 hex(SHA-256(body)) 0 time
  // 0 nonce), K = HMAC-SHA256(secret, "MCAUTH store request key v1") (a key of its own: no
  // request proof is ever an entry signature or an MCAUTHv2 MAC). `time` is the decimal Unix
  // time in seconds, `nonce` random hex. Empty when disabled.
  std::string SignStoreRequest(std::string_view method, std::string_view key,
                               std::string_view body, std::string_view time,
                               std::string_view nonce) const;
  // Constant-time check of `sig_hex` against SignStoreRequest; false when disabled.
  bool VerifyStoreRequest(std::string_view method, std::string_view key, std::string_view body,
                          std::string_view time, std::string_view nonce,
                          std::string_view sig_hex) const;
  // Lowercase hex of SHA-256(data).
  static std::string Sha256Hex(std::string_view data);
  static constexpr size_t kInstanceBytes = 16;
  // 32 random hex digits: this engine start's instance id.
  static Result<std::string> NewInstanceId();
  // The name a client authenticates with to reach `segment` as published by engine start
  // `instance` ("" when the entry carries none: the segment name alone).
  static std::string AuthName(const std::string& segment, const std::string& instance);
  // The names a server accepts: its segment name, and with `instance` AuthName of both.
  static std::vector<std::string> OwnNames(const std::string& segment, const std::string& instance);
  // MC_UCX_ALLOW_UNAUTHENTICATED=1: UCX runs even with a secret set (UCX itself authenticates
  // nothing; README, "UCX / RDMA"). Read on every call.
  static bool UcxUnauthenticatedAllowed();

  // A client hello (after its 8-byte magic) parsed from bytes, for tests and the fuzzer.
  struct Hello {
    std::string client_nonce;  // kNonce bytes
    std::string name;
    std::string mac;  // kMac bytes
  };
  // DataLoss for a truncated hello or a name longer than kMaxName.
  static Result<Hello> ParseHello(std::string_view bytes);
  // Checks a parsed hello against the server nonce and own names: the verdict to send.
  Verdict Check(const Hello& hello, const char* purpose, const unsigned char* server_nonce,
                const std::vector<std::string>& own_names) const;

 private:
  const std::string secret_;
};

}  // namespace mooncake
