// Tenants: who a client says it is (upstream's tenant_id: per client, not per request, and not
// authentication), and how a tenant's keys are kept apart from another's in the master.
//
// Validity (upstream's rules, plus a length bound and UTF-8): 1..kMaxTenantIdBytes bytes of
// UTF-8 (the policy is YAML and the real client's wire JSON: other bytes would come back as
// another id), not starting with '_', no control character (below 0x20) and no DEL (0x7f).
//
// Scoped keys: in strict mode (--enable_multi_tenants) the master stores tenant T's key K as
//   K            when T is "default" and K holds no NUL byte,
//   T '\0' K     otherwise,
// so the same K in two tenants is two objects, every scoped key names exactly one (T, K), and
// the default tenant's objects are those a master without strict mode stored (a cluster that
// turns strict mode on keeps its objects, as the default tenant's — but for keys holding a
// NUL byte, which a master without strict mode accepts: "B\0x" stored then is tenant B's key
// x afterwards; their tenant need not be a valid id, and the metrics escape it). A tenant id holds no NUL,
// so no key of one tenant can be spelled as another's: K = "B\0x" from tenant A is stored as
// "A\0B\0x" (and from the default tenant as "default\0B\0x").
// Without strict mode every tenant is the default one and keys are stored as sent.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

#include "store/common/limits.h"

namespace mooncake {
namespace store {

constexpr size_t kMaxTenantIdBytes = 128;
// Tenants a policy may name (the admin API refuses a new one past it): bounds the policy the
// master saves and loads, and the metrics' series.
constexpr size_t kMaxTenants = 4096;
constexpr std::string_view kDefaultTenant = "default";

// "" when `t` is a valid tenant id, else why not.
inline std::string TenantIdProblem(std::string_view t) {
  if (t.empty()) return "empty tenant_id";
  if (t.size() > kMaxTenantIdBytes) {
    return "tenant_id of " + std::to_string(t.size()) + " bytes is longer than the limit of " +
           std::to_string(kMaxTenantIdBytes);
  }
  if (t.front() == '_') return "tenant_id '" + std::string(t) + "' starts with '_' (reserved)";
  for (unsigned char c : t) {
    if (c < 0x20 || c == 0x7f) return "tenant_id holds a control character (byte " +
                                      std::to_string(static_cast<int>(c)) + ")";
  }
  for (size_t i = 0; i < t.size();) {  // well-formed UTF-8: no overlong forms, no surrogates
    const unsigned char c = static_cast<unsigned char>(t[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = n != 0 && i + n <= t.size() && !(n == 2 && c < 0xc2) && !(n == 4 && c > 0xf4);
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(t[i + k]) >> 6) == 0x2;
    if (ok && n == 3) {
      const unsigned char c1 = static_cast<unsigned char>(t[i + 1]);
      ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0);
    }
    if (ok && n == 4) {
      const unsigned char c1 = static_cast<unsigned char>(t[i + 1]);
      ok = !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 >= 0x90);
    }
    if (!ok) return "tenant_id is not UTF-8 (byte " + std::to_string(i) + ")";
    i += n;
  }
  return "";
}

// The stored key of tenant `t`'s key `k` (strict mode).
inline std::string ScopedKey(std::string_view t, std::string_view k) {
  if (t == kDefaultTenant && std::memchr(k.data(), '\0', k.size()) == nullptr) {
    return std::string(k);
  }
  std::string s;
  s.reserve(t.size() + 1 + k.size());
  s.append(t).push_back('\0');
  s.append(k);
  return s;
}

// The tenant of a stored key, and the key as its tenant sent it.
inline std::string_view TenantOf(std::string_view scoped) {
  const size_t nul = scoped.find('\0');
  return nul == std::string_view::npos ? kDefaultTenant : scoped.substr(0, nul);
}
inline std::string_view LocalKey(std::string_view scoped) {
  const size_t nul = scoped.find('\0');
  return nul == std::string_view::npos ? scoped : scoped.substr(nul + 1);
}

// KeyProblem (limits.h) of a stored key in strict mode: the tenant's key is checked, the
// tenant prefix comes on top of kMaxKeyBytes.
inline std::string ScopedKeyProblem(const std::string& scoped) {
  if (scoped.size() > kMaxKeyBytes + 1 + kMaxTenantIdBytes) return KeyProblem(scoped);
  const std::string_view local = LocalKey(scoped);
  if (local.size() == scoped.size()) return KeyProblem(scoped);
  if (local.empty()) return "empty key";
  if (local.size() > kMaxKeyBytes) return KeyProblem(std::string(local));
  return "";
}

}  // namespace store
}  // namespace mooncake
