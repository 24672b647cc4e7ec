#include "store/ha/checkpoint.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>

#include "store/ha/master_view.h"
#include "store/ha/oplog_codec.h"

namespace mooncake {
namespace store {
namespace ha {

namespace {
std::string Digits(uint64_t v, int width) {
  char b[32];
  std::snprintf(b, sizeof(b), "%0*llu", width, static_cast<unsigned long long>(v));
  return b;
}
EtcdCompare Fence(const std::string& cluster_id, int64_t view_version) {
  EtcdCompare c;
  c.key = MasterViewKey(cluster_id);
  c.target = EtcdCompare::Target::kCreateRevision;
  c.op = EtcdCompare::Op::kEqual;
  c.number = view_version;
  return c;
}
Status Fenced(const Result<EtcdTxnResult>& r, const std::string& what) {
  if (!r.ok()) return Status::Unavailable(what + ": " + r.status().message());
  if (!r->succeeded) {
    return Status::FailedPrecondition(what + ": master_view is no longer this master's");
  }
  return Status::OK();
}
}  // namespace

std::string CheckpointPrefix(const std::string& cluster_id) {
  return ClusterPrefix(cluster_id) + "checkpoint/";
}
std::string ManifestKey(const std::string& cluster_id) {
  return CheckpointPrefix(cluster_id) + "manifest";
}
std::string ChunkKey(const std::string& cluster_id, uint64_t seq, uint64_t chunk) {
  return CheckpointPrefix(cluster_id) + Digits(seq, 20) + "/" + Digits(chunk, 6);
}

std::string EncodeManifest(const CheckpointManifest& m) {
  nlohmann::json j;
  j["seq"] = m.seq;
  j["chunks"] = m.chunks;
  j["entries"] = m.entries;
  j["last_batch"] = m.last_batch;
  j["view_version"] = m.view_version;
  j["unix_ms"] = m.unix_ms;
  return j.dump();
}

Result<CheckpointManifest> DecodeManifest(const std::string& json) {
  auto j = nlohmann::json::parse(json, nullptr, false);
  CheckpointManifest m;
  if (j.is_discarded() || !j.is_object() || !j.contains("seq") || !j["seq"].is_number_unsigned() ||
      !j.contains("chunks") || !j["chunks"].is_number_unsigned()) {
    return Status::DataLoss("checkpoint manifest is not {\"seq\": n, \"chunks\": n, ...}: '" +
                            json.substr(0, 200) + "'");
  }
  m.seq = j["seq"].get<uint64_t>();
  m.chunks = j["chunks"].get<uint64_t>();
  if (j.contains("entries") && j["entries"].is_number_unsigned()) m.entries = j["entries"];
  if (j.contains("last_batch") && j["last_batch"].is_number_unsigned()) {
    m.last_batch = j["last_batch"];
  }
  if (j.contains("view_version") && j["view_version"].is_number()) m.view_version = j["view_version"];
  if (j.contains("unix_ms") && j["unix_ms"].is_number()) m.unix_ms = j["unix_ms"];
  if (m.chunks > 1000000) return Status::DataLoss("checkpoint manifest names too many chunks");
  return m;
}

std::vector<std::string> ExportCheckpoint(const MasterService& master,
                                          const std::function<uint64_t()>& last_appended,
                                          uint64_t* seq, uint64_t* entries) {
  std::vector<std::string> chunks;
  oplog::CheckpointChunk cur;
  size_t bytes = 0;
  bool fixed = false;
  *seq = 0;
  *entries = 0;
  const uint64_t before = last_appended();
  master.ExportState([&](oplog::Entry&& e) {
    if (!fixed) {  // under the master's lock: nothing is appended until the export ends
      *seq = last_appended();
      fixed = true;
    }
    const size_t n = e.ByteSizeLong();
    if (cur.entries_size() > 0 && bytes + n > kMaxBatchBytes) {
      chunks.push_back(EncodeWithCrc(cur));
      cur.Clear();
      bytes = 0;
    }
    *cur.add_entries() = std::move(e);
    bytes += n;
    ++*entries;
  });
  if (cur.entries_size() > 0) chunks.push_back(EncodeWithCrc(cur));
  if (!fixed && last_appended() == before) *seq = before;  // empty, and nothing changed
  return chunks;
}

Status WriteCheckpoint(EtcdKv* kv, const std::string& cluster_id, int64_t view_version,
                       const CheckpointManifest& manifest, const std::vector<std::string>& chunks,
                       int timeout_ms) {
  const EtcdCompare fence = Fence(cluster_id, view_version);
  for (size_t i = 0; i < chunks.size(); ++i) {
    auto r = kv->Txn({fence}, {EtcdOp::Put(ChunkKey(cluster_id, manifest.seq, i), chunks[i])}, {},
                     timeout_ms);
    if (Status s = Fenced(r, "checkpoint chunk " + std::to_string(i)); !s.ok()) return s;
  }
  auto r = kv->Txn({fence}, {EtcdOp::Put(ManifestKey(cluster_id), EncodeManifest(manifest))}, {},
                   timeout_ms);
  return Fenced(r, "checkpoint manifest");
}

Result<int64_t> CompactLog(EtcdKv* kv, const std::string& cluster_id, int64_t view_version,
                           uint64_t last_batch, uint64_t seq, int timeout_ms) {
  std::vector<EtcdOp> ops;
  if (last_batch > 0) {
    ops.push_back(EtcdOp::Delete(OplogKey(cluster_id, 1), OplogKey(cluster_id, last_batch + 1)));
  }
  // Older checkpoints' chunks: keys below checkpoint/<seq>/ ("manifest" sorts after digits).
  ops.push_back(EtcdOp::Delete(CheckpointPrefix(cluster_id) + "0",
                               CheckpointPrefix(cluster_id) + Digits(seq, 20) + "/"));
  auto r = kv->Txn({Fence(cluster_id, view_version)}, ops, {}, timeout_ms);
  if (Status s = Fenced(r, "compacting the oplog"); !s.ok()) return s;
  // History kept by etcd for these keys goes too (etcd's own auto-compaction may be off).
  if (Status s = kv->Compact(r->revision, timeout_ms); !s.ok()) {
    return Status::Unavailable("etcd compaction to revision " + std::to_string(r->revision) +
                               ": " + s.message());
  }
  return r->revision;
}

Result<CheckpointManifest> LoadCheckpoint(EtcdKv* kv, const std::string& cluster_id,
                                          MasterService* master, int timeout_ms) {
  auto r = kv->Range(ManifestKey(cluster_id), "", 0, false, timeout_ms);
  if (!r.ok()) return Status::Unavailable("reading the checkpoint manifest: " + r.status().message());
  if (r->kvs.empty()) return Status::NotFound("no checkpoint");
  auto m = DecodeManifest(r->kvs[0].value);
  if (!m.ok()) return m.status();
  uint64_t loaded = 0;
  for (uint64_t i = 0; i < m->chunks; ++i) {
    auto c = kv->Range(ChunkKey(cluster_id, m->seq, i), "", 0, false, timeout_ms);
    if (!c.ok()) return Status::Unavailable("reading a checkpoint chunk: " + c.status().message());
    const std::string what = "checkpoint " + std::to_string(m->seq) + " chunk " + std::to_string(i);
    if (c->kvs.empty()) return Status::DataLoss(what + " is missing");
    oplog::CheckpointChunk chunk;
    if (Status s = DecodeWithCrc(c->kvs[0].value, what, &chunk); !s.ok()) return s;
    for (const oplog::Entry& e : chunk.entries()) {
      if (Status s = master->Apply(e); !s.ok()) return Status::DataLoss(what + ": " + s.message());
      ++loaded;
    }
  }
  if (m->entries != 0 && loaded != m->entries) {
    return Status::DataLoss("checkpoint " + std::to_string(m->seq) + " holds " +
                            std::to_string(loaded) + " entries, its manifest says " +
                            std::to_string(m->entries));
  }
  master->MarkLoadedFromCheckpoint();
  return m;
}

}  // namespace ha
}  // namespace store
}  // namespace mooncake
