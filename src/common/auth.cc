#include "common/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "common/net.h"

namespace mooncake {
namespace {

constexpr char kMagic[8] = {'M', 'C', 'A', 'U', 'T', 'H', 'v', '2'};
constexpr char kMagicV1[8] = {'M', 'C', 'A', 'U', 'T', 'H', 'v', '1'};
constexpr size_t kNonce = Authenticator::kNonce;
constexpr size_t kMac = Authenticator::kMac;

// Milliseconds left of a deadline (at least 1, so that a late call still polls once).
class Deadline {
 public:
  explicit Deadline(int timeout_ms)
      : end_(std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms)),
        infinite_(timeout_ms < 0) {}
  int left() const {
    if (infinite_) return -1;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  end_ - std::chrono::steady_clock::now())
                  .count();
    return ms < 1 ? 1 : static_cast<int>(ms);
  }

 private:
  std::chrono::steady_clock::time_point end_;
  bool infinite_;
};

const char* VerdictText(uint8_t v) {
  switch (v) {
    case Authenticator::kWrongSecret: return "it has a different shared secret (MC_AUTH_SECRET)";
    case Authenticator::kNotThisSegment:
      return "it is not the segment we asked for (a relay, a stale segment name or a "
             "descriptor of an earlier start of that engine, or another name of that engine: "
             "open a segment by the name its engine reports)";
    case Authenticator::kMalformed: return "it could not parse our MCAUTHv2 answer";
  }
  return "unknown verdict";
}

std::string Hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  return out;
}

}  // namespace

std::string Authenticator::SignEntry(std::string_view kind, std::string_view scope,
                                     std::string_view body) const {
  if (!enabled()) return "";
  // A key of its own, so that no signature is ever a valid MCAUTHv2 MAC or the reverse.
  static constexpr char kKeyLabel[] = "MCAUTH entry signing key v1";
  unsigned char key[EVP_MAX_MD_SIZE];
  unsigned int key_len = 0;
  HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
       reinterpret_cast<const unsigned char*>(kKeyLabel), sizeof(kKeyLabel) - 1, key, &key_len);
  std::string msg = "MCSIGv1";
  msg.push_back('\0');
  msg.append(kind);
  msg.push_back('\0');
  msg.append(scope);
  msg.push_back('\0');
  msg.append(body);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key, static_cast<int>(key_len),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len);
  return Hex(out, len);
}

bool Authenticator::VerifyEntry(std::string_view kind, std::string_view scope,
                                std::string_view body, std::string_view sig_hex) const {
  if (!enabled()) return false;
  std::string want = SignEntry(kind, scope, body);
  return sig_hex.size() == want.size() &&
         CRYPTO_memcmp(want.data(), sig_hex.data(), want.size()) == 0;
}

std::string Authenticator::SignStoreRequest(std::string_view method, std::string_view key,
                                            std::string_view body, std::string_view time,
                                            std::string_view nonce) const {
  if (!enabled()) return "";
  static constexpr char kKeyLabel[] = "MCAUTH store request key v1";
  unsigned char k[EVP_MAX_MD_SIZE];
  unsigned int k_len = 0;
  HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
       reinterpret_cast<const unsigned char*>(kKeyLabel), sizeof(kKeyLabel) - 1, k, &k_len);
  const std::string body_hash = Sha256Hex(body);
  std::string msg = "MCSTOREv1";
  for (std::string_view part : {method, key, std::string_view(body_hash), time, nonce}) {
    msg.push_back('\0');
    msg.append(part);
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), k, static_cast<int>(k_len),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len);
  return Hex(out, len);
}

bool Authenticator::VerifyStoreRequest(std::string_view method, std::string_view key,
                                       std::string_view body, std::string_view time,
                                       std::string_view nonce, std::string_view sig_hex) const {
  if (!enabled()) return false;
  std::string want = SignStoreRequest(method, key, body, time, nonce);
  return sig_hex.size() == want.size() &&
         CRYPTO_memcmp(want.data(), sig_hex.data(), want.size()) == 0;
}

std::string Authenticator::Sha256Hex(std::string_view data) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), d);
  return Hex(d, sizeof(d));
}

Result<std::string> Authenticator::NewInstanceId() {
  unsigned char b[kInstanceBytes];
  if (RAND_bytes(b, sizeof(b)) != 1) return Status::Internal("no random bytes for an instance id");
  return Hex(b, sizeof(b));
}

std::string Authenticator::AuthName(const std::string& segment, const std::string& instance) {
  if (instance.empty()) return segment;
  return segment + " (instance " + instance + ")";
}

std::vector<std::string> Authenticator::OwnNames(const std::string& segment,
                                                 const std::string& instance) {
  std::vector<std::string> names{segment};
  if (!instance.empty()) names.push_back(AuthName(segment, instance));
  return names;
}

bool Authenticator::UcxUnauthenticatedAllowed() {
  const char* v = std::getenv("MC_UCX_ALLOW_UNAUTHENTICATED");
  return v != nullptr && std::string_view(v) == "1";
}

std::string Authenticator::Mac(std::string_view direction, std::string_view purpose,
                               std::string_view name, const unsigned char* server_nonce,
                               const unsigned char* client_nonce) const {
  // Every variable-length field is delimited, so no two inputs share an encoding.
  std::string msg = "MCAUTHv2 ";
  msg.append(direction);
  msg.push_back('\0');
  msg.append(purpose);
  msg.push_back('\0');
  uint16_t n = static_cast<uint16_t>(name.size());
  msg.push_back(static_cast<char>(n & 0xff));
  msg.push_back(static_cast<char>(n >> 8));
  msg.append(name);
  msg.append(reinterpret_cast<const char*>(server_nonce), kNonce);
  msg.append(reinterpret_cast<const char*>(client_nonce), kNonce);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

Result<Authenticator::Hello> Authenticator::ParseHello(std::string_view b) {
  if (b.size() < kNonce + 2) return Status::DataLoss("authentication hello truncated");
  Hello h;
  h.client_nonce.assign(b.data(), kNonce);
  size_t n = static_cast<uint8_t>(b[kNonce]) | (static_cast<size_t>(static_cast<uint8_t>(b[kNonce + 1])) << 8);
  if (n > kMaxName) {
    return Status::DataLoss("authentication hello names a segment of " + std::to_string(n) +
                            " bytes (limit " + std::to_string(kMaxName) + ")");
  }
  if (b.size() != kNonce + 2 + n + kMac) {
    return Status::DataLoss("authentication hello of " + std::to_string(b.size()) +
                            " bytes; its name length says " +
                            std::to_string(kNonce + 2 + n + kMac));
  }
  h.name.assign(b.data() + kNonce + 2, n);
  h.mac.assign(b.data() + kNonce + 2 + n, kMac);
  return h;
}

Authenticator::Verdict Authenticator::Check(const Hello& h, const char* purpose,
                                            const unsigned char* server_nonce,
                                            const std::vector<std::string>& own_names) const {
  if (h.client_nonce.size() != kNonce || h.mac.size() != kMac) return kMalformed;
  std::string want =
      Mac("client", purpose, h.name, server_nonce,
          reinterpret_cast<const unsigned char*>(h.client_nonce.data()));
  if (CRYPTO_memcmp(want.data(), h.mac.data(), kMac) != 0) return kWrongSecret;
  // A client that echoes our own nonce back is replaying us to ourselves.
  if (std::memcmp(h.client_nonce.data(), server_nonce, kNonce) == 0) return kMalformed;
  if (std::find(own_names.begin(), own_names.end(), h.name) == own_names.end()) {
    return kNotThisSegment;
  }
  return kOk;
}

Status Authenticator::Challenge(int fd, const char* purpose,
                                const std::vector<std::string>& own_names, int timeout_ms) const {
  if (!enabled()) return Status::OK();
  Deadline deadline(timeout_ms);
  const std::string what = std::string(purpose) + ": ";
  unsigned char challenge[sizeof(kMagic) + kNonce];
  std::memcpy(challenge, kMagic, sizeof(kMagic));
  unsigned char* ns = challenge + sizeof(kMagic);
  if (RAND_bytes(ns, kNonce) != 1) {
    return Status::Internal("no random bytes for an authentication challenge");
  }
  MC_RETURN_IF_ERROR(WriteFull(fd, challenge, sizeof(challenge), deadline.left()));
  auto refuse = [&](uint8_t verdict, const std::string& why) {
    (void)WriteFull(fd, &verdict, 1, 100);  // best effort: the client learns why
    return Status::PermissionDenied(what + why);
  };
  // The magic alone first: an MCAUTHv1 client sends only 32 bytes and waits.
  char head[sizeof(kMagic) + kNonce + 2];
  Status s = ReadFull(fd, head, sizeof(kMagic), deadline.left());
  if (s.ok() && std::memcmp(head, kMagic, sizeof(kMagic)) != 0) {
    return refuse(kMalformed, "the peer did not answer with MCAUTHv2 (an older MCAUTHv1 "
                              "engine, one without MC_AUTH_SECRET, or not this engine)");
  }
  if (s.ok()) s = ReadFull(fd, head + sizeof(kMagic), kNonce + 2, deadline.left());
  if (!s.ok()) {
    return Status::PermissionDenied(what + "no answer to the authentication challenge (" +
                                    s.message() + ")");
  }
  size_t n = static_cast<uint8_t>(head[sizeof(head) - 2]) |
             (static_cast<size_t>(static_cast<uint8_t>(head[sizeof(head) - 1])) << 8);
  if (n > kMaxName) {
    return refuse(kMalformed, "authentication answer names a segment of " + std::to_string(n) +
                                  " bytes (limit " + std::to_string(kMaxName) + ")");
  }
  std::string body(head + sizeof(kMagic), kNonce + 2);
  body.resize(kNonce + 2 + n + kMac);
  s = ReadFull(fd, body.data() + kNonce + 2, n + kMac, deadline.left());
  if (!s.ok()) return Status::PermissionDenied(what + "authentication answer cut short (" + s.message() + ")");
  auto hello = ParseHello(body);
  if (!hello.ok()) return refuse(kMalformed, hello.status().message());
  Verdict v = Check(*hello, purpose, ns, own_names);
  if (v == kWrongSecret) return refuse(v, "wrong shared secret (MC_AUTH_SECRET)");
  if (v == kNotThisSegment) {
    return refuse(v, "the peer meant to reach segment '" + hello->name.substr(0, 200) +
                         "', which is not this engine (" +
                         (own_names.empty() ? std::string("no name") : own_names.front()) +
                         "): a relay, or a stale segment name");
  }
  if (v != kOk) return refuse(v, "malformed authentication answer");
  std::string reply(1, static_cast<char>(kOk));
  reply += Mac("server", purpose, hello->name, ns,
               reinterpret_cast<const unsigned char*>(hello->client_nonce.data()));
  return WriteFull(fd, reply.data(), reply.size(), deadline.left());
}

Status Authenticator::Answer(int fd, const char* purpose, const std::string& segment,
                             int timeout_ms) const {
  if (!enabled()) return Status::OK();
  Deadline deadline(timeout_ms);
  const std::string what = std::string(purpose) + " to segment '" + segment + "': ";
  if (segment.size() > kMaxName) {
    return Status::InvalidArgument(what + "segment name longer than " + std::to_string(kMaxName) +
                                   " bytes cannot be authenticated");
  }
  unsigned char challenge[sizeof(kMagic) + kNonce];
  Status s = ReadFull(fd, challenge, sizeof(challenge), deadline.left());
  if (s.ok() && std::memcmp(challenge, kMagicV1, sizeof(kMagicV1)) == 0) {
    return Status::PermissionDenied(what + "the peer speaks the older MCAUTHv1 authentication, "
                                           "which a relay can defeat; upgrade it to this version");
  }
  if (!s.ok() || std::memcmp(challenge, kMagic, sizeof(kMagic)) != 0) {
    return Status::PermissionDenied(what + "the peer sent no authentication challenge; it has no "
                                           "shared secret set (or is not this engine)");
  }
  const unsigned char* ns = challenge + sizeof(kMagic);
  unsigned char nc[kNonce];
  if (RAND_bytes(nc, kNonce) != 1) return Status::Internal("no random bytes for authentication");
  std::string hello(kMagic, sizeof(kMagic));
  hello.append(reinterpret_cast<const char*>(nc), kNonce);
  hello.push_back(static_cast<char>(segment.size() & 0xff));
  hello.push_back(static_cast<char>(segment.size() >> 8));
  hello += segment;
  hello += Mac("client", purpose, segment, ns, nc);
  MC_RETURN_IF_ERROR(WriteFull(fd, hello.data(), hello.size(), deadline.left()).WithContext(what));
  uint8_t verdict = 0xff;
  s = ReadFull(fd, &verdict, 1, deadline.left());
  if (!s.ok()) {
    return Status::PermissionDenied(what + "the peer closed the connection during "
                                           "authentication (" + s.message() + ")");
  }
  if (verdict != kOk) return Status::PermissionDenied(what + "refused by the peer: " + VerdictText(verdict));
  unsigned char mac[kMac];
  s = ReadFull(fd, mac, kMac, deadline.left());
  std::string want = Mac("server", purpose, segment, ns, nc);
  if (!s.ok() || CRYPTO_memcmp(want.data(), mac, kMac) != 0) {
    return Status::PermissionDenied(what + "the peer did not prove that it knows the shared "
                                           "secret (a relay or an impostor)");
  }
  return Status::OK();
}

}  // namespace mooncake
