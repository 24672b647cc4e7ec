#include "store/client/registrations.h"

#include <algorithm>

namespace mooncake {
namespace store {

void Registrations::Add(const void* p, size_t n) {
  MutexLock lock(&mu_);
  registered_[reinterpret_cast<uintptr_t>(p)] = n;
}

void Registrations::AddPool(void* p, size_t n) {
  MutexLock lock(&mu_);
  registered_[reinterpret_cast<uintptr_t>(p)] = n;
  pools_.push_back(p);
}

bool Registrations::AddInPool(const void* p, size_t n) {
  MutexLock lock(&mu_);
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (!InAPoolLocked(a, n)) return false;
  InPool& r = in_pool_[a];
  r.size = std::max(r.size, n);
  ++r.count;
  return true;
}

Registrations::Removed Registrations::Remove(const void* p) {
  MutexLock lock(&mu_);
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto n = in_pool_.find(a);
  if (n != in_pool_.end()) {
    if (--n->second.count == 0) in_pool_.erase(n);
    return Removed::kInPool;
  }
  if (std::find(pools_.begin(), pools_.end(), p) != pools_.end()) return Removed::kPool;
  return registered_.erase(a) == 0 ? Removed::kNotRegistered : Removed::kRemoved;
}

bool Registrations::Find(const void* p, size_t n, uint64_t* lo, uint64_t* len) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  MutexLock lock(&mu_);
  auto it = registered_.upper_bound(a);
  if (it == registered_.begin()) return false;
  --it;
  if (a < it->first || a + n > it->first + it->second) return false;
  *lo = it->first;
  *len = it->second;
  return true;
}

uint64_t Registrations::Room(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  MutexLock lock(&mu_);
  auto n = in_pool_.upper_bound(a);
  if (n != in_pool_.begin()) {
    --n;
    if (a >= n->first && a < n->first + n->second.size) return n->first + n->second.size - a;
  }
  auto it = registered_.upper_bound(a);
  if (it == registered_.begin()) return 0;
  --it;
  if (a < it->first || a >= it->first + it->second) return 0;
  return it->first + it->second - a;
}

std::vector<void*> Registrations::Clear() {
  MutexLock lock(&mu_);
  registered_.clear();
  in_pool_.clear();
  std::vector<void*> pools;
  pools.swap(pools_);
  return pools;
}

bool Registrations::InAPoolLocked(uintptr_t a, size_t n) {
  for (void* p : pools_) {
    auto it = registered_.find(reinterpret_cast<uintptr_t>(p));
    if (it != registered_.end() && a >= it->first && n <= it->second &&
        a - it->first <= it->second - n) {
      return true;
    }
  }
  return false;
}

}  // namespace store
}  // namespace mooncake
