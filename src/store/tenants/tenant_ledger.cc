#include "store/tenants/tenant_ledger.h"

#include <algorithm>

namespace mooncake {
namespace store {

void TenantLedger::SetPolicies(const TenantPolicies& policies) {
  for (auto& [id, a] : accounts_) a.requested = 0;
  for (const auto& [id, bytes] : policies) {
    accounts_[id].requested = std::min(bytes, kMaxQuotaBytes);
  }
  for (auto it = accounts_.begin(); it != accounts_.end();) DropIfUnused(it++);
  stale_ = true;
}

TenantPolicies TenantLedger::Policies() const {
  TenantPolicies out;
  for (const auto& [id, a] : accounts_) {
    if (a.requested > 0) out.emplace(id, a.requested);
  }
  return out;
}

ErrorCode TenantLedger::Upsert(const std::string& tenant, uint64_t requested_bytes) {
  if (requested_bytes == 0 || requested_bytes > kMaxQuotaBytes) return ErrorCode::INVALID_PARAMS;
  accounts_[tenant].requested = requested_bytes;
  stale_ = true;
  return ErrorCode::OK;
}

ErrorCode TenantLedger::RemoveIfEmpty(const std::string& tenant, TenantSnapshot* last) {
  auto it = Find(tenant);
  if (it == accounts_.end() || it->second.requested == 0) return ErrorCode::OBJECT_NOT_FOUND;
  if (it->second.charged > 0) return ErrorCode::TENANT_NOT_EMPTY;
  if (last != nullptr) *last = SnapshotOf(it->first, it->second);
  it->second.requested = 0;
  DropIfUnused(it);
  stale_ = true;
  return ErrorCode::OK;
}

bool TenantLedger::Registered(std::string_view tenant) const {
  auto it = Find(tenant);
  return it != accounts_.end() && it->second.requested > 0;
}

ErrorCode TenantLedger::Admit(std::string_view tenant, uint64_t bytes, uint64_t capacity,
                              uint64_t* deficit) {
  if (deficit != nullptr) *deficit = 0;
  auto it = Find(tenant);
  if (it == accounts_.end() || it->second.requested == 0) return ErrorCode::TENANT_NOT_REGISTERED;
  Recompute(capacity);
  const Account& a = it->second;
  if (a.charged <= a.effective && bytes <= a.effective - a.charged) return ErrorCode::OK;
  if (deficit != nullptr) *deficit = a.charged + bytes - a.effective;  // > 0 here
  return ErrorCode::TENANT_QUOTA_EXCEEDED;
}

void TenantLedger::Charge(std::string_view tenant, uint64_t bytes) {
  if (bytes == 0) return;
  auto it = Find(tenant);
  if (it == accounts_.end()) it = accounts_.emplace(std::string(tenant), Account{}).first;
  it->second.charged += bytes;
}

void TenantLedger::Release(std::string_view tenant, uint64_t bytes) {
  if (bytes == 0) return;
  auto it = Find(tenant);
  if (it == accounts_.end()) return;
  it->second.charged -= std::min(it->second.charged, bytes);
  DropIfUnused(it);
}

void TenantLedger::ClearCharges() {
  for (auto& [id, a] : accounts_) a.charged = 0;
  for (auto it = accounts_.begin(); it != accounts_.end();) DropIfUnused(it++);
}

uint64_t TenantLedger::Charged(std::string_view tenant) const {
  auto it = Find(tenant);
  return it == accounts_.end() ? 0 : it->second.charged;
}

std::optional<TenantSnapshot> TenantLedger::Snapshot(std::string_view tenant, uint64_t capacity) {
  Recompute(capacity);
  auto it = Find(tenant);
  if (it == accounts_.end()) return std::nullopt;
  return SnapshotOf(it->first, it->second);
}

std::vector<TenantSnapshot> TenantLedger::Snapshots(uint64_t capacity) {
  Recompute(capacity);
  std::vector<TenantSnapshot> out;
  out.reserve(accounts_.size());
  for (const auto& [id, a] : accounts_) out.push_back(SnapshotOf(id, a));
  return out;
}

void TenantLedger::Recompute(uint64_t capacity) {
  if (!stale_ && capacity == capacity_) return;
  capacity_ = capacity;
  stale_ = false;
  unsigned __int128 sum = 0;
  for (const auto& [id, a] : accounts_) sum += a.requested;
  if (sum <= capacity) {
    for (auto& [id, a] : accounts_) a.effective = a.requested;
    return;
  }
  // Shares of the capacity in proportion to the requests; the bytes the rounding down left
  // go one each to the largest remainders (ties: the smaller tenant id).
  struct Share {
    Account* account;
    const std::string* id;
    unsigned __int128 remainder;
  };
  std::vector<Share> shares;
  uint64_t given = 0;
  for (auto& [id, a] : accounts_) {
    if (a.requested == 0) {
      a.effective = 0;
      continue;
    }
    const unsigned __int128 product = static_cast<unsigned __int128>(capacity) * a.requested;
    a.effective = static_cast<uint64_t>(product / sum);
    given += a.effective;
    shares.push_back({&a, &id, product % sum});
  }
  std::sort(shares.begin(), shares.end(), [](const Share& l, const Share& r) {
    return l.remainder != r.remainder ? l.remainder > r.remainder : *l.id < *r.id;
  });
  uint64_t left = capacity - given;
  for (Share& s : shares) {
    if (left == 0) break;
    ++s.account->effective;
    --left;
  }
}

void TenantLedger::DropIfUnused(Accounts::iterator it) {
  if (it->second.requested != 0 || it->second.charged != 0) return;
  if (it == last_) last_ = accounts_.end();
  accounts_.erase(it);
}

TenantLedger::Accounts::iterator TenantLedger::Find(std::string_view tenant) const {
  if (last_ != accounts_.end() && last_->first == tenant) return last_;
  auto it = accounts_.find(tenant);
  if (it != accounts_.end()) last_ = it;
  return it;
}

TenantSnapshot TenantLedger::SnapshotOf(const std::string& id, const Account& a) const {
  TenantSnapshot s;
  s.tenant_id = id;
  s.requested_quota_bytes = a.requested;
  s.has_explicit_policy = a.requested > 0;
  s.effective_quota_bytes = a.requested > 0 ? a.effective : 0;
  s.charged_bytes = a.charged;
  s.admission_closed = a.requested == 0;
  s.over_quota = a.charged > s.effective_quota_bytes;
  return s;
}

}  // namespace store
}  // namespace mooncake
