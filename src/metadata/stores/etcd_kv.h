// EtcdKv: the parts of etcd v3's KV, Lease and Maintenance APIs that the Store's master HA
// (src/store/ha) and its clients need, through etcd's JSON gateway ("/v3/..." on the client
// port, etcd 3.4 and later) with libcurl. Keys and values are bytes (base64 on the wire).
//
// Contract:
//   - Endpoints are tried in turn: a transport failure (refused, reset, timeout) or a gateway
//     "Unavailable" moves on to the next; the last one that answered is tried first next
//     time. When all fail the status is Unavailable and names each ("etcd 10.0.0.1:2379:
//     connect: Connection refused; etcd 10.0.0.2:2379: timed out: Operation timed out after
//     1000 milliseconds ...").
//   - A write whose reply was lost (a timeout after the request went out) is sent again to
//     the next member and may then run twice; a Txn's compares then see the first run's
//     effect (a create-if-absent answers "failed" with the caller's own value in its range).
//   - Every call is bounded: connect by Options::connect_timeout_ms, the whole exchange by
//     Options::request_timeout_ms (or the call's timeout_ms when > 0), per endpoint tried; so
//     a call takes at most endpoints x that. A member that is SIGSTOPped (accepts, never
//     answers) costs one timeout, then the next member answers.
//   - etcd's errors map to Status: InvalidArgument (bad request; also OutOfRange, code 11:
//     a compacted or future revision), NotFound ("lease not found", code 5), AlreadyExists,
//     FailedPrecondition, ResourceExhausted ("request is too large", which etcd sends as
//     code 3, and "database space exceeded"), PermissionDenied, DeadlineExceeded, else
//     Unavailable; the message carries etcd's, after "etcd h:p: ".
//   - A reply etcd sends but this client cannot read (not JSON, bad base64) is DataLoss.
// Thread-safe: concurrent calls use separate connections (one curl handle per call in flight,
// pooled), so a slow call does not hold up another.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/net.h"
#include "mooncake/status.h"

namespace mooncake {

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct EtcdRange {
  std::vector<EtcdKeyValue> kvs;
  bool more = false;      // more keys in the range than `limit`
  int64_t count = 0;      // keys in the range (all of them, not only those returned)
  int64_t revision = 0;   // the store's revision when the range was read
};

// One comparison of a transaction ("If" part): the key's field `target` compared with
// `number` (create / mod revision, version, lease) or `value`.
struct EtcdCompare {
  enum class Target { kCreateRevision, kModRevision, kVersion, kValue, kLease };
  enum class Op { kEqual, kNotEqual, kGreater, kLess };
  std::string key;
  Target target = Target::kCreateRevision;
  Op op = Op::kEqual;
  int64_t number = 0;
  std::string value;
};

// One operation of a transaction ("Then" / "Else" parts).
struct EtcdOp {
  enum class Type { kPut, kDeleteRange, kRange };
  Type type = Type::kPut;
  std::string key;
  std::string value;      // kPut
  int64_t lease = 0;      // kPut: attach to this lease (0: none)
  std::string range_end;  // kDeleteRange / kRange: "" for the key alone
  int64_t limit = 0;      // kRange: at most this many keys (0: all)

  static EtcdOp Put(std::string key, std::string value, int64_t lease = 0);
  static EtcdOp Delete(std::string key, std::string range_end = "");
  static EtcdOp Get(std::string key, std::string range_end = "", int64_t limit = 0);
};

struct EtcdTxnResult {
  bool succeeded = false;  // the compares held: the "Then" ops ran (else the "Else" ops)
  int64_t revision = 0;    // the store's revision after the transaction
  // Per op that ran, in order: its range (kRange); for kDeleteRange `count` = keys deleted;
  // for kPut an empty range. `revision` of each: the store's revision after that op.
  std::vector<EtcdRange> responses;
};

class EtcdKv {
 public:
  struct Options {
    int connect_timeout_ms = 1000;
    int request_timeout_ms = 2000;
    size_t max_response_bytes = 64u << 20;
  };

  // Does not contact etcd. InvalidArgument when `endpoints` is empty.
  static Result<std::unique_ptr<EtcdKv>> Create(std::vector<HostPort> endpoints,
                                                const Options& options);
  ~EtcdKv();
  EtcdKv(const EtcdKv&) = delete;
  EtcdKv& operator=(const EtcdKv&) = delete;

  // Keys in [key, range_end) ("" range_end: the key alone; PrefixEnd(p): every key under p),
  // at most `limit` (0: all), in key order; `keys_only` leaves values empty.
  Result<EtcdRange> Range(const std::string& key, const std::string& range_end = "",
                          int64_t limit = 0, bool keys_only = false, int timeout_ms = 0);
  // The revision after the put.
  Result<int64_t> Put(const std::string& key, const std::string& value, int64_t lease = 0,
                      int timeout_ms = 0);
  // Keys deleted.
  Result<int64_t> Delete(const std::string& key, const std::string& range_end = "",
                         int timeout_ms = 0);
  Result<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& compares,
                            const std::vector<EtcdOp>& success,
                            const std::vector<EtcdOp>& failure = {}, int timeout_ms = 0);

  // A lease of `ttl_s` seconds: its id (etcd picks it). InvalidArgument when ttl_s <= 0.
  Result<int64_t> LeaseGrant(int64_t ttl_s, int timeout_ms = 0);
  // One keep-alive: the TTL the lease has again, in seconds; NotFound when the lease is gone
  // (expired or revoked).
  Result<int64_t> LeaseKeepAlive(int64_t lease, int timeout_ms = 0);
  // Revokes the lease (its keys are deleted at once). A lease already gone is OK.
  Status LeaseRevoke(int64_t lease, int timeout_ms = 0);

  // Compacts the key history up to `revision` (older revisions can no longer be read; etcd
  // frees their space for reuse), waiting until that is done (etcd's "physical"). A revision
  // already compacted is OK; a future one is InvalidArgument.
  Status Compact(int64_t revision, int timeout_ms = 0);
  // The answering member's database size in bytes (maintenance status: dbSize, and
  // dbSizeInUse), the store's revision, and that member's "host:port".
  struct MemberStatus {
    int64_t db_size = 0;
    int64_t db_size_in_use = 0;
    int64_t revision = 0;
    std::string endpoint;
  };
  Result<MemberStatus> GetStatus(int timeout_ms = 0);

  // "etcd h1:2379,h2:2379" for messages.
  std::string Describe() const;

 private:
  struct Impl;
  explicit EtcdKv(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The end of the range of every key that starts with `prefix` (etcd's prefix range: the
// prefix with its last byte below 0xff incremented, trailing 0xff bytes dropped; "\0" when
// every byte is 0xff).
std::string EtcdPrefixEnd(const std::string& prefix);

// Endpoints from upstream's connection-string forms: "h1:2379;h2:2379", "h1:2379,h2:2379",
// with or without "http://", IPv6 as "[::1]:2379"; a host without a port gets 2379. An empty
// list, an empty item or a bad port is InvalidArgument naming it. "https://" is refused
// (not supported: say so).
Result<std::vector<HostPort>> ParseEtcdEndpoints(const std::string& connstring);

}  // namespace mooncake
