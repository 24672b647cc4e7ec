// HaMaster: one mooncake_master of an HA cluster on etcd (README.md here has the design).
//
// A control thread runs the election and, on a standby, the log's tail:
//   standby     applies the log (oplog/<id> batches, every --oplog_poll_interval_ms) to a
//               standby MasterService, and reads master_view every 200 ms; when no master
//               holds it, campaigns: a lease of --ha_lease_ttl_sec, then a transaction that
//               creates master_view (value "__mooncake_service_warming__:<lease>") only if
//               it does not exist;
//   recovering  won: the key's create revision is the view version (the fence of every log
//               write); reads the log to its end, then MasterService::Promote;
//   warmup      publishes its address in master_view (fenced on the view version), then
//   serving     answers Store calls. Every change goes to an OplogWriter; a reply waits in
//               the RPC server until the writer has its log position in etcd (hold_position
//               / RpcServer::ReleaseHeld), and a read waits for everything appended before
//               it (no client sees what a failover could take back). The lease is renewed
//               every min(1 s, TTL/3); the master serves only until (last renewal sent + TTL
//               - min(1 s, TTL/4)), so it has stopped before etcd can let another master win.
// Stepping down (lease lost or not renewed in time, the writer fenced or failing, Stop):
// stops serving at once, fails every held reply with kNotLeader, revokes the lease (another
// master may win at once), and starts again as a standby with a fresh state read from the
// log. Without --enable_oplog nothing is replicated: a new leader starts empty (upstream's
// behaviour without its oplog).
//
// Checkpoints (checkpoint.h): the leader writes one each --oplog_checkpoint_entries entries
// and deletes the log before it; a fresh standby loads the latest, then the log after it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "metadata/stores/etcd_kv.h"
#include "store/ha/ha_view.h"
#include "store/ha/oplog_writer.h"
#include "store/master/master_service.h"
#include "store/rpc/rpc_server.h"

namespace mooncake {
namespace store {
namespace ha {

class HaMaster {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    std::vector<HostPort> endpoints;
    std::string cluster_id = "mooncake_cluster";
    std::string advertise_address;  // this master's RPC "ip:port" for clients
    MasterConfig config;            // of the MasterService (standby set as needed)
    bool oplog = true;              // --enable_oplog
    uint32_t lease_ttl_sec = 5;
    uint32_t poll_interval_ms = 1000;
    uint32_t batch_max_entries = 1024;
    uint32_t retry_timeout_sec = 180;
    bool ack_before_durable = false;
    uint64_t checkpoint_entries = 100000;  // --oplog_checkpoint_entries
    int etcd_timeout_ms = 1000;  // each etcd call (the lease is renewed every second)
    // KV events of the objects this master changes while it leads (null: none); must
    // outlive this.
    ObjectEventSink* events = nullptr;
    // Called on the master about to serve, before it does (the tenant quota policy is loaded
    // here: it lives in etcd or a shared file, not in the log). Not OK: this master steps
    // down, saying why, and competes again.
    std::function<Status(MasterService*)> before_serving;
  };

  // Does not contact etcd.
  static Result<std::unique_ptr<HaMaster>> Create(Options options);
  ~HaMaster();  // Stop()

  // Starts the control thread; `server` (built with Handler() and HoldPosition()) must
  // outlive this or Stop().
  void Start(RpcServer* server);
  // Steps down if leading (revoking the lease) and ends the threads. Idempotent.
  void Stop();

  // The RPC handler: the serving leader's MasterService, or kNotLeader naming the leader.
  RpcStatus Serve(uint16_t method, const char* data, size_t n, std::string* out);
  // RpcServer::Options::hold_position.
  uint64_t HoldPosition(uint16_t method, RpcStatus status);
  // The current MasterService (a standby's, or the leader's): for the HTTP endpoints.
  std::shared_ptr<MasterService> master() const;
  HaView View() const;
  // Housekeeping (main calls it every 200 ms): the leader's MasterService::Tick.
  void Tick();

 private:
  enum class State { kStandby, kRecovering, kWarmup, kServing, kFailed, kStopped };
  explicit HaMaster(Options options, std::unique_ptr<EtcdKv> kv);
  void Run();
  // Standby: one read of the log from next_batch_id_ (at most `limit` batches) applied;
  // *more: batches are left. An error: the log and this state diverged, or etcd failed.
  Status TailOnce(int64_t limit, bool* more);
  void Campaign();
  // The leader: a checkpoint of the state, then the log it covers deleted (checkpoint.h).
  void Checkpoint();
  void Renew(Clock::time_point now);
  void StepDown(const std::string& why);
  void BecomeStandby();  // a fresh standby MasterService, the log from its start
  void SetState(State s);
  static const char* StateName(State s);

  const Options options_;
  const std::unique_ptr<EtcdKv> kv_;
  RpcServer* server_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  mutable std::mutex mu_;  // master_, writer_, state_, leader_address_ and the view's fields
  std::shared_ptr<MasterService> master_;
  std::shared_ptr<OplogWriter> writer_;
  State state_ = State::kStandby;
  std::string leader_address_;
  int64_t view_version_ = 0;
  uint64_t applied_seq_ = 0;     // standby: entries applied; leader: where its log began
  uint64_t next_batch_id_ = 0;   // 0: the first batch in etcd (after a checkpoint)
  bool need_checkpoint_ = true;  // a fresh standby loads the latest checkpoint first
  uint64_t checkpoint_seq_ = 0;  // the latest checkpoint's (loaded or written)
  uint64_t checkpoint_last_batch_ = 0;  // and the last batch it covers
  uint64_t checkpoints_ = 0;     // written by this master
  uint64_t promotions_ = 0;
  uint64_t fenced_total_ = 0;
  uint64_t batches_total_ = 0, entries_total_ = 0;  // of writers gone
  std::string failure_;  // why the last step-down / failure

  // Serving: calls are answered (read on every call without the lock).
  std::atomic<bool> serving_{false};
  // Grows at every promotion and step-down: a call that began in another term is not
  // acknowledged (HoldPosition holds it; FailHeld turns it into kNotLeader).
  std::atomic<uint64_t> term_{0};
  std::atomic<bool> writer_failed_{false};
  std::string writer_failure_;  // under mu_

  // The leader's lease and its deadline (control thread only).
  int64_t lease_ = 0;
  // Serving ends at (last renewal sent + TTL - min(1 s, TTL/4)), in steady-clock ticks: Serve() checks it
  // on every call, so a master stopped past it (SIGSTOP) answers nothing once resumed.
  std::atomic<int64_t> serve_until_ticks_{0};
  Clock::time_point next_renew_{};
};

}  // namespace ha
}  // namespace store
}  // namespace mooncake
