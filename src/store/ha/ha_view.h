// HaView: what a master says about its place in an HA cluster (the HTTP endpoints /health,
// /leader, /role, /ha_status and the ha_* metrics render it; master_http.h). A master run
// without --enable_ha reports enabled = false and the fixed "leader / serving" view.
#pragma once

#include <cstdint>
#include <string>

namespace mooncake {
namespace store {

struct HaView {
  bool enabled = false;
  // "leader" (ha_state leader_warmup or serving) or "standby" (every other state), as upstream.
  std::string role = "leader";
  // Upstream's states: starting, standby, candidate, recovering, catching_up, leader_warmup,
  // serving; and "failed" (a promotion that could not read the whole log, or etcd refused us).
  std::string ha_state = "serving";
  bool service_ready = true;  // only the serving leader answers Store calls
  std::string leader_address;  // "ip:port" of the leader this master knows of; "" if none
  int64_t view_version = 0;    // the etcd create revision of master_view (0: none known)
  // The operation log (--enable_oplog): the last sequence number this master applied (a
  // standby) or appended (the leader), the last one durable in etcd, entries appended and
  // not yet durable (the leader), and the sequence the latest checkpoint covers.
  uint64_t applied_seq = 0;
  uint64_t durable_seq = 0;
  uint64_t pending_entries = 0;
  uint64_t checkpoint_seq = 0;
  uint64_t durable_batches = 0;  // batches this master wrote to etcd (counter)
  uint64_t durable_entries = 0;  // entries in them (counter)
  uint64_t fenced_writes = 0;    // batches refused because another master leads (counter)
  uint64_t promotions = 0;       // times this master became the leader (counter)
};

}  // namespace store
}  // namespace mooncake
