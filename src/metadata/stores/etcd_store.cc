#include "metadata/stores/etcd_store.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace mooncake {
namespace {

constexpr int kRevokeTimeoutMs = 1000;

bool IsLeaseNotFound(const Status& s) {
  return s.IsNotFound() && s.message().find("lease not found") != std::string::npos;
}

}  // namespace

Result<std::unique_ptr<MetadataStore>> EtcdStore::Create(std::vector<HostPort> endpoints,
                                                         const StoreOptions& options) {
  EtcdKv::Options kv_options;
  kv_options.connect_timeout_ms = options.connect_timeout_ms;
  kv_options.request_timeout_ms = options.request_timeout_ms;
  MC_ASSIGN_OR_RETURN(std::unique_ptr<EtcdKv> kv, EtcdKv::Create(endpoints, kv_options));
  std::unique_ptr<EtcdStore> store(new EtcdStore(std::move(endpoints), options, std::move(kv)));
  if (options.lease_ttl_s > 0) {
    std::lock_guard<std::mutex> lock(store->mu_);
    MC_RETURN_IF_ERROR(store->RenewLeaseLocked());
    store->keepalive_thread_ = std::thread([s = store.get()] { s->KeepAliveLoop(); });
  } else {
    auto r = store->kv_->Range("mooncake/", "", /*limit=*/1, /*keys_only=*/true);
    if (!r.ok()) return r.status();
  }
  return std::unique_ptr<MetadataStore>(std::move(store));
}

EtcdStore::EtcdStore(std::vector<HostPort> endpoints, const StoreOptions& options,
                     std::unique_ptr<EtcdKv> kv)
    : endpoints_(std::move(endpoints)), options_(options), kv_(std::move(kv)) {}

EtcdStore::~EtcdStore() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (keepalive_thread_.joinable()) keepalive_thread_.join();
  int64_t id = lease_id_.load();
  if (id != 0) {
    Status s = kv_->LeaseRevoke(id, kRevokeTimeoutMs);
    if (!s.ok()) {
      LOG(WARNING) << Describe() << ": revoking lease " << id << " failed (" << s.ToString()
                   << "); its keys expire in " << options_.lease_ttl_s << " s";
    }
  }
}

std::string EtcdStore::Describe() const {
  std::string s = "etcd://";
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    if (i) s += ",";
    s += endpoints_[i].ToString();
  }
  return s;
}

Result<std::string> EtcdStore::Get(const std::string& key) {
  MC_ASSIGN_OR_RETURN(EtcdRange range, kv_->Range(key));
  if (range.kvs.empty()) return Status::NotFound(Describe() + ": no key '" + key + "'");
  return std::move(range.kvs[0].value);
}

Status EtcdStore::Put(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = kv_->Put(key, value, lease_id_.load()).status();
  if (IsLeaseNotFound(s)) {
    // The lease expired (we were cut off longer than the TTL): take a new one, which also
    // writes our earlier keys again, then retry this one.
    LOG(WARNING) << Describe() << ": lease " << lease_id_.load() << " is gone; granting a new one";
    MC_RETURN_IF_ERROR(RenewLeaseLocked());
    s = kv_->Put(key, value, lease_id_.load()).status();
  }
  if (s.ok() && options_.lease_ttl_s > 0) leased_[key] = value;
  return s;
}

Status EtcdStore::Remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  MC_RETURN_IF_ERROR(kv_->Delete(key).status());
  leased_.erase(key);
  return Status::OK();
}

Status EtcdStore::RenewLeaseLocked() {
  MC_ASSIGN_OR_RETURN(int64_t id, kv_->LeaseGrant(options_.lease_ttl_s));
  lease_id_.store(id);
  for (const auto& [key, value] : leased_) {
    Status s = kv_->Put(key, value, id).status();
    if (!s.ok()) return s.WithContext("re-publishing '" + key + "' under a new lease");
  }
  return Status::OK();
}

void EtcdStore::KeepAliveLoop() {
  const auto interval =
      std::chrono::milliseconds(std::max(200, options_.lease_ttl_s * 1000 / 3));
  bool failing = false;
  std::unique_lock<std::mutex> stop_lock(stop_mu_);
  while (!stop_cv_.wait_for(stop_lock, interval, [this] { return stop_; })) {
    stop_lock.unlock();
    const int64_t id = lease_id_.load();
    auto r = kv_->LeaseKeepAlive(id);
    if (r.status().IsNotFound()) {
      // The lease expired while we could not reach the store: renew it unless a Put did.
      std::lock_guard<std::mutex> lock(mu_);
      if (lease_id_.load() == id) {
        LOG(WARNING) << Describe() << ": lease " << id << " expired; granting a new one";
        Status s = RenewLeaseLocked();
        failing = !s.ok();
        if (!s.ok()) LOG(WARNING) << Describe() << ": " << s.ToString();
      }
    } else if (!r.ok()) {
      if (!failing) {
        LOG(WARNING) << Describe() << ": lease keep-alive failed: " << r.status().ToString();
      }
      failing = true;
    } else {
      if (failing) LOG(INFO) << Describe() << ": lease keep-alive works again";
      failing = false;
    }
    stop_lock.lock();
  }
}

}  // namespace mooncake
