// RedisStore: plain GET/SET/DEL through hiredis, as upstream's redis plugin does.
//
// Contract:
//   - One connection, made at creation: connect (bounded by connect_timeout_ms), then AUTH
//     when a password is set ("AUTH <user> <password>" with a username, for redis 6 ACLs),
//     SELECT when redis_db_index != 0, then PING. A refused AUTH, or a server that wants one,
//     is PermissionDenied ("redis 127.0.0.1:6379: AUTH failed: WRONGPASS ..."); an unreachable
//     server is Unavailable ("redis 127.0.0.1:6379: connect: Connection refused").
//   - Each command is bounded by request_timeout_ms. A broken connection (EOF, reset) is
//     remade and the command retried once (GET/SET/DEL are idempotent); after a timeout
//     (Unavailable, "timed out") the connection is dropped and remade on the next call,
//     without a retry, to keep the bound.
//   - Values and keys are binary-safe.
// Thread-safe: commands are serialized on the connection.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/net.h"
#include "metadata/metadata_store.h"

struct redisContext;

namespace mooncake {

class RedisStore final : public MetadataStore {
 public:
  static Result<std::unique_ptr<MetadataStore>> Create(const HostPort& address,
                                                       const StoreOptions& options);
  ~RedisStore() override;

  Result<std::string> Get(const std::string& key) override;
  Status Put(const std::string& key, const std::string& value) override;
  Status Remove(const std::string& key) override;
  std::string Describe() const override;

 private:
  struct Reply;  // a redisReply's type and text, copied out

  RedisStore(const HostPort& address, const StoreOptions& options);
  // With mu_ held: (re)connects, authenticates and selects the database.
  Status ConnectLocked();
  void DisconnectLocked();
  // With mu_ held: one command on the current connection, no retry.
  Result<Reply> RunLocked(const std::vector<std::string>& args);
  // Connects if needed, runs the command, and retries once on a broken connection.
  Result<Reply> Command(const std::vector<std::string>& args);

  const HostPort address_;
  const StoreOptions options_;
  const std::string where_;  // "redis 127.0.0.1:6379"
  std::mutex mu_;
  redisContext* ctx_ = nullptr;
  bool broken_ = false;  // the last RunLocked() found the connection broken (EOF, reset)
};

}  // namespace mooncake
