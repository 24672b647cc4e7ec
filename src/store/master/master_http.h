// The master's HTTP endpoints (served on --metrics_port by MetricsServer): the read-only ones
// of upstream's master, in upstream's formats. None changes state: /query_key and
// /batch_query_keys grant no lease (upstream's do) and count as no access.
//
//   GET /metrics            Prometheus text (MasterService::MetricsText); with HA also
//                           upstream's ha_oplog_{applied,last}_sequence_id,
//                           ha_oplog_standby_lag, ha_oplog_pending_entries,
//                           ha_batch_record_durable_{batches,entries}_total and ours,
//                           master_ha_{fenced_writes_total,promotions_total,
//                           checkpoint_sequence_id,role,service_ready}
//   GET /metrics/summary    one line: role, state, service_ready, master={storage, keys,
//                           clients, segments}; with HA ", ha={...}" and the leader
//   GET /health             {"status":"ok","role":R,"ha_state":S,"service_ready":B} and, when
//                           a leader is known, "leader_address":"ip:port","view_version":N
//   GET /leader             {"present":false} or {"present":true,"leader_address":..,
//                           "view_version":N}
//   GET /role, /ha_status   the role (leader | standby) and the state as text
//   GET /kv_events/status   {"enabled":B,"published_batches":N,"published_events":N,
//                           "dropped_events":N,"skipped_unparsed_keys":N} (upstream's), and
//                           with events on also next_sequence, replay_requests, snapshots
// The HA fields come from the HaView function given to the constructor (ha/ha_view.h);
// without one, the fixed non-HA view: leader, serving, ready, no leader address (so /leader
// is {"present":false}, as upstream's master without HA).
// Service plane: on a master whose view is not service_ready, the endpoints below that read
// the tables (/get_all_keys, /get_all_segments, /query_segment, /query_key,
// /batch_query_keys) answer 503 {"success":false,"error_code":-1011,"error_message":
// "service plane is not active: this master is a standby; the leader is ADDR"} (a leader
// still warming up says so and adds Retry-After: 1), and /metrics/summary puts that message in
// place of its master={...} part; /metrics, /health, /leader, /role, /ha_status always answer.
//   GET /get_all_keys       keys of complete objects, one per line
//   GET /get_all_segments   names of the mounted segments, one per line (mount order)
//   GET /query_segment?segment=NAME
//                           "NAME\nUsed(bytes): U\nCapacity(bytes) : C\n" (summed over the
//                           segments mounted under NAME); 404 when none is
//   GET /query_key?key=K    {"success":true,"data":[{"size_","buffer_address_","protocol_",
//                           "transport_endpoint_"}...]} per complete replica; 404
//                           {"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}
//   GET /batch_query_keys?keys=K1,K2,...
//                           {"success":true,"data":{"K1":{"ok":true,"values":[...]},
//                           "K2":{"ok":false,"error":"OBJECT_NOT_FOUND"}}}
//   (the three above read the default tenant's keys, as upstream; &tenant_id=T another's)
//   GET /api/v1/tenant_quotas[?tenant_id=T]
//                           strict mode: {"success":true,"data":[snapshot...]} or one
//                           snapshot: {"tenant_id","requested_quota_bytes",
//                           "effective_quota_bytes","charged_bytes","admission_closed",
//                           "over_quota","has_explicit_policy"}; 404 for a tenant without;
//                           409 UNAVAILABLE_IN_CURRENT_MODE without strict mode
//   PUT /api/v1/tenant_quotas?tenant_id=T {"requested_quota_bytes":N}, DELETE ...?tenant_id=T
//                           (ServeWrite): the policy saved (SetTenantPolicySource) before it
//                           applies; 400 for a bad tenant or N, 404 / 409 TENANT_NOT_EMPTY
//                           for DELETE, 500 when the save fails (nothing changed)
// Query values are percent-decoded ('+' is a space); keys= is split at ',' after decoding,
// as upstream. "protocol_" is "tcp": the master does not know which transport a reader will
// use (the engine picks tcp or the same-host path per peer).
//
// Bounds: a listing holds at most kMaxListed entries and kMaxListedBytes bytes; a cut listing
// says so in the headers X-Mooncake-Truncated: true and X-Mooncake-Total-Count: <all>.
// The endpoints that walk a table under the master's lock (all but /metrics, /health, /leader,
// /role, /ha_status, /query_key) take at most a fifth of the time: after one that took d >= 1 ms,
// such requests are answered 503 (Retry-After: 1) for 4 d, so that a client polling big
// listings cannot starve the RPCs.
// A bad query (no key, a key over kMaxKeyBytes, over kMaxBatchItems keys, bad percent-
// encoding) is 400 with a message; other paths 404 with the list of endpoints.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "common/thread_annotations.h"
#include "store/ha/ha_view.h"
#include "store/master/master_service.h"
#include "store/common/metrics_server.h"
#include "store/tenants/tenant_policy.h"

namespace mooncake {
namespace store {

constexpr size_t kMaxListed = 100000;
constexpr size_t kMaxListedBytes = 16 << 20;

class MasterHttp {
 public:
  using Clock = std::chrono::steady_clock;
  using NowFn = std::function<Clock::time_point()>;

  // This master's place in an HA cluster, read on each request (so it must be cheap and
  // thread-safe); null: the non-HA view.
  using HaViewFn = std::function<HaView()>;

  // `master` must outlive this.
  explicit MasterHttp(MasterService* master, NowFn now = &Clock::now)
      : MasterHttp(master, nullptr, std::move(now)) {}
  MasterHttp(MasterService* master, HaViewFn ha_view, NowFn now = &Clock::now)
      : master_([master] {  // not owned: an aliasing pointer that deletes nothing
          return std::shared_ptr<MasterService>(std::shared_ptr<MasterService>(), master);
        }),
        ha_view_(std::move(ha_view)),
        now_(std::move(now)) {}
  // An HA master replaces its MasterService when it steps down: each request asks for the
  // current one (kept alive for the request).
  using MasterFn = std::function<std::shared_ptr<MasterService>()>;
  MasterHttp(MasterFn master, HaViewFn ha_view, NowFn now = &Clock::now)
      : master_(std::move(master)), ha_view_(std::move(ha_view)), now_(std::move(now)) {}

  // The reply to GET `target` (path and query as sent). Thread-safe.
  HttpReply Serve(const std::string& target);
  // The reply to a PUT / POST / DELETE (MetricsServer's write handler). Thread-safe.
  HttpReply ServeWrite(const std::string& method, const std::string& target,
                       const std::string& body);
  // Where PUT / DELETE /api/v1/tenant_quotas save the policy before it takes effect (null:
  // nowhere, the change lasts as long as this master). Set before serving; not owned.
  void SetTenantPolicySource(TenantPolicySource* source) { policies_ = source; }
  // GET /kv_events/status's body (the publisher's StatusJson); unset: {"enabled":false,...}.
  void SetKvEventsStatus(std::function<std::string()> status) {
    MutexLock lock(&mu_);
    kv_events_status_ = std::move(status);
  }

  // Table walks may run while the time they owe ends at most kWalkBurst from now (each walk
  // owes 5x its length: see Serve).
  static constexpr std::chrono::milliseconds kWalkBurst{100};

 private:
  const MasterFn master_;
  const HaViewFn ha_view_;
  const NowFn now_;
  Mutex mu_;
  Clock::time_point heavy_after_ MC_GUARDED_BY(mu_){};  // walks' debt is paid off then
  std::function<std::string()> kv_events_status_ MC_GUARDED_BY(mu_);
  TenantPolicySource* policies_ = nullptr;
  Mutex admin_mu_;  // one tenant policy change at a time
};

}  // namespace store
}  // namespace mooncake
