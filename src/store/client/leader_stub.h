// LeaderStub: the master of an HA cluster, followed through etcd (master_server_addr
// "etcd://h1:2379;h2:2379"). The leader holds "mooncake-store/<cluster>/master_view"
// (store/ha/master_view.h); this stub reads it with EtcdKv, keeps an RPC stub
// (MakeRpcMasterStub) to the leader it names, and a thread re-reads it every
// Options::poll_interval (200 ms: polling, not etcd's watch stream, which the JSON gateway
// serves as a long-lived chunked response; a poll costs one small range a client every
// 200 ms and needs no reconnect logic). It switches when the key's create_revision (the view
// version) grows, never to a lower one; a value rewritten under the same revision (a leader
// that published "warming" first) is taken too.
//
// A call that fails because its master is gone (Unavailable: refused, reset, lost;
// DeadlineExceeded) or answers kNotLeader is sent again when that cannot do harm: the
// method is MC_MASTER_METHODS' `resend` (Ping, GetReplicaList, ExistKey, GetStats), or the
// request provably never reached the master whole (MayHaveArrived false), or the master
// answered kNotLeader (rpc_wire.h: it made none of the changes asked for). It then waits for
// the view to change (read at once, then every Options::retry_interval, 100 ms), and sends it
// to the new leader; to the same one again every kSameLeaderRetry (500 ms) too when that one
// answered kNotLeader or refused the connection (a leader restarting or still warming up),
// not when it took the request and never answered. Any other such failure (a PutStart whose bytes all went out to a master
// that then vanished) is returned, saying the master may have acted on it.
//
// Bound: a call ends, answered or failed with a message naming the master, the key and etcd,
// by its start + max(Options::failover_timeout, the first attempt's own time). The first
// attempt is an ordinary call (at most rpc_timeout); the waiting and each resend (its RPC
// timeout cut to what is left) stop at start + failover_timeout. With the defaults (both
// 10 s) a call made during a failover ends within 10 s in all, also when etcd is down (each
// etcd read is bounded by what is left, split among the endpoints).
//
// Thread-safe. Locks: read_mu_ (one etcd read at a time: callers waiting on one failover
// share reads) before mu_ (the current leader); neither is held across an RPC.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "common/thread_annotations.h"
#include "metadata/stores/etcd_kv.h"
#include "store/client/master_stub.h"

namespace mooncake {
namespace store {

class LeaderStub final : public MasterStub {
 public:
  struct Options {
    std::vector<HostPort> etcd;  // endpoints (ParseEtcdEndpoints)
    std::string cluster_id = "mooncake_cluster";
    std::chrono::milliseconds rpc_timeout{10000};      // each call to the leader
    std::chrono::milliseconds failover_timeout{10000};  // the bound above; also Create's wait
    std::chrono::milliseconds poll_interval{200};       // the thread's re-reads
    std::chrono::milliseconds retry_interval{100};      // a waiting call's re-reads
  };
  static constexpr std::chrono::milliseconds kSameLeaderRetry{500};

  // Reads the view, waiting up to failover_timeout for a leader to be named (re-reading
  // every retry_interval), and starts the thread; does not call the master. Errors:
  // InvalidArgument (no endpoints, bad cluster id), Unavailable (no leader named in that
  // time, or etcd did not answer: the message names the key and the endpoints).
  static Result<std::unique_ptr<LeaderStub>> Create(Options options);
  ~LeaderStub() override;  // stops the thread; calls in flight must have finished

#define MC_X(Name, number, Req, Resp, resend) \
  Reply<rpc::Resp> Start##Name(const rpc::Req& request) override;
  MC_MASTER_METHODS(MC_X)
#undef MC_X

  // "10.0.0.1:50051 (leader of view 7 in etcd 10.0.0.5:2379)".
  std::string address() const override;
  // The view followed now: its version (create_revision) and the leader's address.
  int64_t view_version() const MC_EXCLUDES(mu_);
  std::string leader_address() const MC_EXCLUDES(mu_);
  const std::string& view_key() const { return key_; }

 private:
  struct Leader;
  template <class Req, class Resp>
  class Call;

  LeaderStub(Options options, std::unique_ptr<EtcdKv> etcd);
  std::shared_ptr<const Leader> Current() const MC_EXCLUDES(mu_);
  // Reads master_view (unless another caller's read began after `asked`: its result is
  // shared) and adopts a newer leader; the read's status (NotFound: no leader named).
  Status ReadView(std::chrono::steady_clock::time_point asked,
                  std::chrono::steady_clock::time_point deadline) MC_EXCLUDES(read_mu_, mu_);
  void Adopt(int64_t version, const std::string& address) MC_EXCLUDES(mu_);
  // The failover path of a failed call (see above): `send` sends the request to a stub and
  // waits for the reply (*arrived: MayHaveArrived).
  template <class Send>
  Status Failover(MasterMethod method, std::chrono::steady_clock::time_point start,
                  std::shared_ptr<const Leader> tried, Status failed, bool arrived, Send send);
  void Poll() MC_EXCLUDES(mu_);

  const Options opt_;
  const std::string key_;
  const std::unique_ptr<EtcdKv> etcd_;

  Mutex read_mu_ MC_ACQUIRED_BEFORE(mu_);
  std::chrono::steady_clock::time_point last_read_ MC_GUARDED_BY(read_mu_);
  Status last_read_status_ MC_GUARDED_BY(read_mu_);

  mutable Mutex mu_;
  CondVar changed_;  // a new leader adopted, poke_ or stopping_
  std::shared_ptr<const Leader> leader_ MC_GUARDED_BY(mu_);  // never null after Create
  bool poke_ MC_GUARDED_BY(mu_) = false;  // the poller should read at once
  bool stopping_ MC_GUARDED_BY(mu_) = false;
  std::thread poller_;
  std::atomic<int64_t> logged_view_{0};  // the last view a resend was logged for
};

// The master of master_server_addr: host:port (or [v6]:port) is the RPC stub to it, as
// before; "etcd://<endpoints>" (";" or "," between them) a LeaderStub of cluster
// `cluster_id`. Errors: InvalidArgument (another scheme: this build follows leaders through
// etcd only; bad endpoints or cluster id), Unavailable (no leader: LeaderStub::Create).
Result<std::unique_ptr<MasterStub>> MakeMasterStub(const std::string& master_server_addr,
                                                   const std::string& cluster_id,
                                                   std::chrono::milliseconds rpc_timeout,
                                                   std::chrono::milliseconds failover_timeout);

}  // namespace store
}  // namespace mooncake
