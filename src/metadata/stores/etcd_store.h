// EtcdStore: the MetadataStore over etcd v3, spoken through EtcdKv (etcd_kv.h: the JSON
// gateway, etcd 3.4 and later).
//
// Contract:
//   - Endpoints are tried in turn: a transport failure (or a gateway "Unavailable") moves on to
//     the next; the last one that answered is tried first next time. When all fail the status
//     is Unavailable and names each ("etcd 127.0.0.1:2379: connect: Connection refused").
//   - With lease_ttl_s > 0, Put() attaches the key to one lease of that TTL, granted at
//     creation and kept alive by a background thread every TTL/3. If the lease is lost anyway
//     (the store was unreachable for longer than the TTL), a new one is granted and every key
//     this object put (and did not remove) is written again under it. The destructor stops the
//     thread and revokes the lease, so the keys vanish at once; after a crash they expire after
//     the TTL. With lease_ttl_s <= 0 keys are written without a lease.
//   - Every call is bounded by StoreOptions timeouts (per endpoint tried).
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "metadata/metadata_store.h"
#include "metadata/stores/etcd_kv.h"

namespace mooncake {

class EtcdStore final : public MetadataStore {
 public:
  // Unavailable when no endpoint answers (the lease grant, or a read without a lease, is the
  // probe). `endpoints` must not be empty.
  static Result<std::unique_ptr<MetadataStore>> Create(std::vector<HostPort> endpoints,
                                                       const StoreOptions& options);
  ~EtcdStore() override;

  Result<std::string> Get(const std::string& key) override;
  Status Put(const std::string& key, const std::string& value) override;
  Status Remove(const std::string& key) override;
  std::string Describe() const override;

 private:
  EtcdStore(std::vector<HostPort> endpoints, const StoreOptions& options,
            std::unique_ptr<EtcdKv> kv);

  // With mu_ held: grants a new lease and writes every key in leased_ again under it.
  Status RenewLeaseLocked();
  void KeepAliveLoop();

  const std::vector<HostPort> endpoints_;
  const StoreOptions options_;
  // Thread-safe; each call in flight has its own connection, so the keep-alive thread never
  // waits behind a Get/Put/Remove.
  const std::unique_ptr<EtcdKv> kv_;

  std::mutex mu_;  // serializes writes and lease renewal
  std::atomic<int64_t> lease_id_{0};
  std::map<std::string, std::string> leased_;  // keys put under the lease, by this object

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread keepalive_thread_;
};

}  // namespace mooncake
