#include "common/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

#include "common/net.h"

namespace mooncake {
namespace {
constexpr char kMagic[8] = {'M', 'C', 'A', 'U', 'T', 'H', 'v', '1'};
constexpr size_t kNonce = 32;
constexpr size_t kMac = 32;
}  // namespace

std::string Authenticator::Mac(const char* purpose, const unsigned char* nonce) const {
  std::string msg(purpose);
  msg.append(reinterpret_cast<const char*>(nonce), kNonce);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

Status Authenticator::Challenge(int fd, const char* purpose, int timeout_ms) const {
  if (!enabled()) return Status::OK();
  unsigned char challenge[sizeof(kMagic) + kNonce];
  std::memcpy(challenge, kMagic, sizeof(kMagic));
  if (RAND_bytes(challenge + sizeof(kMagic), kNonce) != 1) {
    return Status::Internal("no random bytes for an authentication challenge");
  }
  MC_RETURN_IF_ERROR(WriteFull(fd, challenge, sizeof(challenge), timeout_ms));
  unsigned char answer[kMac];
  Status s = ReadFull(fd, answer, kMac, timeout_ms);
  if (!s.ok()) return Status::PermissionDenied(std::string(purpose) + ": no answer to the "
                                               "authentication challenge (" + s.message() + ")");
  std::string want = Mac(purpose, challenge + sizeof(kMagic));
  if (CRYPTO_memcmp(want.data(), answer, kMac) != 0) {
    return Status::PermissionDenied(std::string(purpose) +
                                    ": wrong shared secret (MC_AUTH_SECRET)");
  }
  return Status::OK();
}

Status Authenticator::Answer(int fd, const char* purpose, int timeout_ms) const {
  if (!enabled()) return Status::OK();
  unsigned char challenge[sizeof(kMagic) + kNonce];
  Status s = ReadFull(fd, challenge, sizeof(challenge), timeout_ms);
  if (!s.ok() || std::memcmp(challenge, kMagic, sizeof(kMagic)) != 0) {
    return Status::PermissionDenied(std::string(purpose) +
                                    ": the peer sent no authentication challenge; it has no "
                                    "shared secret set (or is not this engine)");
  }
  std::string mac = Mac(purpose, challenge + sizeof(kMagic));
  return WriteFull(fd, mac.data(), mac.size(), timeout_ms);
}

}  // namespace mooncake
