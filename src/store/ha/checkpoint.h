// Checkpoints of the replicated metadata (README.md here: "Keys"), so that the log can be
// compacted and a standby started late reads the state, not the whole history:
//   checkpoint/<seq, 20 digits>/<chunk, 6 digits>  oplog.CheckpointChunk (CRC32 in front),
//                                                  at most kMaxBatchBytes each
//   checkpoint/manifest                            JSON {"seq", "chunks", "entries",
//                                                  "last_batch", "view_version", "unix_ms"}
// The leader writes one once the log has grown by --oplog_checkpoint_entries since the last
// (every write fenced on its view version, the manifest last), then deletes the batches it
// covers and the older checkpoint's chunks, and compacts etcd's history up to there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "metadata/stores/etcd_kv.h"
#include "store/master/master_service.h"

namespace mooncake {
namespace store {
namespace ha {

struct CheckpointManifest {
  uint64_t seq = 0;  // the state after log entry `seq`
  uint64_t chunks = 0;
  uint64_t entries = 0;
  uint64_t last_batch = 0;  // the last oplog batch it covers whole (deleted after it)
  int64_t view_version = 0;
  int64_t unix_ms = 0;
};

std::string CheckpointPrefix(const std::string& cluster_id);  // ".../checkpoint/"
std::string ManifestKey(const std::string& cluster_id);
std::string ChunkKey(const std::string& cluster_id, uint64_t seq, uint64_t chunk);

std::string EncodeManifest(const CheckpointManifest& m);
// InvalidArgument (DataLoss) when `json` is not a manifest.
Result<CheckpointManifest> DecodeManifest(const std::string& json);

// `master`'s state as checkpoint chunks (encoded values) and the log position it is at:
// exported under the master's lock, with `last_appended` read inside it (no change can be
// logged meanwhile). *seq is 0 when the state is empty and no position could be fixed.
std::vector<std::string> ExportCheckpoint(const MasterService& master,
                                          const std::function<uint64_t()>& last_appended,
                                          uint64_t* seq, uint64_t* entries);

// Writes the chunks and then the manifest, each transaction fenced on master_view's create
// revision == view_version. FailedPrecondition when fenced; Unavailable when etcd fails.
Status WriteCheckpoint(EtcdKv* kv, const std::string& cluster_id, int64_t view_version,
                       const CheckpointManifest& manifest, const std::vector<std::string>& chunks,
                       int timeout_ms);

// Deletes, fenced, the oplog batches up to `last_batch` and every checkpoint chunk older than
// `seq`; then compacts etcd's history up to that revision. The revision, or an error.
Result<int64_t> CompactLog(EtcdKv* kv, const std::string& cluster_id, int64_t view_version,
                           uint64_t last_batch, uint64_t seq, int timeout_ms);

// Loads the latest checkpoint into a fresh standby `master`: the manifest, or NotFound when
// there is none; DataLoss when a chunk is missing or bad (a newer checkpoint replaced it
// while it was read: try again).
Result<CheckpointManifest> LoadCheckpoint(EtcdKv* kv, const std::string& cluster_id,
                                          MasterService* master, int timeout_ms);

}  // namespace ha
}  // namespace store
}  // namespace mooncake
