// mooncake_master's KV event flags (upstream's names and defaults, then ours), read into the
// publisher's options (src/store/kv_events/kv_event_publisher.h).
#include <glog/logging.h>

#include "store/master/master_flags.h"

DEFINE_bool(enable_kv_events, false,
            "Publish stored / removed object events on a ZeroMQ PUB socket for cache-aware "
            "routers (needs --kv_events_bind_endpoint and --kv_events_backend_id; libzmq5)");
DEFINE_string(kv_events_bind_endpoint, "", "ZeroMQ endpoint the events are published on, e.g. "
              "tcp://0.0.0.0:5557");
DEFINE_string(kv_events_backend_id, "", "backend_id of every event: names this pool");
DEFINE_bool(kv_events_emit_object_key, true,
            "Put the object's key in each event (without it, events of keys that are not a "
            "64-bit number are left out)");
DEFINE_bool(kv_events_emit_legacy_compat, true,
            "Also emit the legacy fields: type (BlockStored / BlockRemoved), block_hashes, "
            "parent_block_hash");
DEFINE_uint64(kv_events_queue_capacity, 65536,
              "Events queued before the oldest is dropped (its sequence number is skipped); "
              "0: unbounded");
// Upstream's deprecated per-block fields: accepted, never emitted (the indexer's
// registration supplies them).
DEFINE_string(kv_events_model_name, "", "Deprecated: not emitted");
DEFINE_string(kv_events_tenant_id, "", "Deprecated: not emitted");
DEFINE_string(kv_events_additional_salt, "", "Deprecated: not emitted");
DEFINE_string(kv_events_lora_name, "", "Deprecated: not emitted");
DEFINE_uint32(kv_events_block_size, 0, "Deprecated: not emitted");
DEFINE_uint32(kv_events_dp_rank, 0, "Deprecated: not emitted");
// Ours: replay and snapshots (src/store/kv_events/README.md).
DEFINE_string(kv_events_replay_endpoint, "",
              "ZeroMQ ROUTER endpoint that answers replay requests (the batches since a "
              "sequence number) and snapshot requests (every object now), e.g. "
              "tcp://0.0.0.0:5558; \"\": none (not an upstream flag)");
DEFINE_uint64(kv_events_replay_batches, 4096,
              "Batches kept for replay (at most 64 MiB of them; not an upstream flag)");
DEFINE_uint64(kv_events_snapshot_interval_ms, 5000,
              "Least time between two snapshots; requests sooner are told when to retry "
              "(not an upstream flag)");

namespace mooncake {
namespace store {

Status KvEventSettingsFromFlags(bool* enabled, kv_events::PublisherOptions* out) {
  *enabled = FLAGS_enable_kv_events;
  for (const char* name : {"kv_events_model_name", "kv_events_tenant_id",
                           "kv_events_additional_salt", "kv_events_lora_name",
                           "kv_events_block_size", "kv_events_dp_rank"}) {
    gflags::CommandLineFlagInfo info;
    if (gflags::GetCommandLineFlagInfo(name, &info) && !info.is_default) {
      LOG(WARNING) << "--" << name << " is deprecated and not emitted (as upstream)";
    }
  }
  if (FLAGS_kv_events_replay_batches > (1u << 20)) {
    return Status::InvalidArgument("--kv_events_replay_batches=" +
                                   std::to_string(FLAGS_kv_events_replay_batches) +
                                   " is over 1048576 (batches are also capped at 64 MiB)");
  }
  if (FLAGS_kv_events_snapshot_interval_ms > 3600 * 1000) {
    return Status::InvalidArgument("--kv_events_snapshot_interval_ms is over an hour");
  }
  out->bind_endpoint = FLAGS_kv_events_bind_endpoint;
  out->replay_endpoint = FLAGS_kv_events_replay_endpoint;
  out->codec.backend_id = FLAGS_kv_events_backend_id;
  out->codec.emit_object_key = FLAGS_kv_events_emit_object_key;
  out->codec.legacy_compat = FLAGS_kv_events_emit_legacy_compat;
  out->queue_capacity = FLAGS_kv_events_queue_capacity;
  out->replay_batches = FLAGS_kv_events_replay_batches;
  out->snapshot_interval = std::chrono::milliseconds(FLAGS_kv_events_snapshot_interval_ms);
  return Status::OK();
}

}  // namespace store
}  // namespace mooncake
