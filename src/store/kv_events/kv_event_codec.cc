#include "store/kv_events/kv_event_codec.h"

#include <msgpack.hpp>

namespace mooncake::store::kv_events {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackStringOrNil(Packer& p, const std::string& s) {
  if (s.empty()) {
    p.pack_nil();
  } else {
    p.pack(s);
  }
}

size_t MapSize(bool stored, const CodecOptions& o) {
  size_t n = 13;  // event_id ... seq_hashes, group_id (as upstream)
  if (o.legacy_compat) n += 2;             // type, block_hashes
  if (o.emit_object_key) n += 1;           // object_key
  if (stored) n += o.legacy_compat ? 4 : 3;  // base_block_idx, parent_hash, token_ids
                                             // (+ parent_block_hash)
  else n += 1;                             // base_block_idx
  return n;
}

void PackEvent(Packer& p, const Event& e, std::optional<uint64_t> hash, uint64_t id,
               int64_t ts, const CodecOptions& o) {
  p.pack_map(static_cast<uint32_t>(MapSize(e.stored, o)));
  p.pack("event_id");
  p.pack(id);
  p.pack("timestamp");
  p.pack(ts);
  p.pack("event_type");
  p.pack(e.stored ? "stored" : "removed");
  if (o.legacy_compat) {
    p.pack("type");
    p.pack(e.stored ? "BlockStored" : "BlockRemoved");
  }
  for (const char* unknown : {"model_name", "block_size", "additional_salt", "lora_name"}) {
    p.pack(unknown);
    p.pack_nil();
  }
  p.pack("tenant_id");
  p.pack(e.tenant_id);
  p.pack("backend_id");
  p.pack(o.backend_id);
  p.pack("group_id");
  PackStringOrNil(p, e.group_id);
  p.pack("medium");
  PackStringOrNil(p, e.medium);
  p.pack("dp_rank");
  p.pack_nil();
  if (o.emit_object_key) {
    p.pack("object_key");
    p.pack(e.key);
  }
  p.pack("seq_hashes");
  p.pack_array(hash ? 1 : 0);
  if (hash) p.pack(*hash);
  if (o.legacy_compat) {
    p.pack("block_hashes");
    p.pack_array(hash ? 1 : 0);
    if (hash) p.pack(static_cast<int64_t>(*hash));
  }
  p.pack("base_block_idx");
  if (!e.stored) {
    p.pack_nil();
    return;
  }
  p.pack(static_cast<uint32_t>(0));
  p.pack("parent_hash");
  p.pack_nil();
  p.pack("token_ids");
  p.pack_nil();
  if (o.legacy_compat) {
    p.pack("parent_block_hash");
    p.pack_nil();
  }
}

}  // namespace

std::optional<uint64_t> ParseSeqHash(std::string_view key) {
  int base = 10;
  if (key.size() > 2 && key[0] == '0' && (key[1] == 'x' || key[1] == 'X')) {
    base = 16;
    key.remove_prefix(2);
  }
  if (key.empty() || key.size() > (base == 16 ? 16u : 20u)) return std::nullopt;
  uint64_t value = 0;
  for (char c : key) {
    unsigned digit;
    if (c >= '0' && c <= '9') {
      digit = static_cast<unsigned>(c - '0');
    } else if (base == 16 && c >= 'a' && c <= 'f') {
      digit = static_cast<unsigned>(c - 'a' + 10);
    } else if (base == 16 && c >= 'A' && c <= 'F') {
      digit = static_cast<unsigned>(c - 'A' + 10);
    } else {
      return std::nullopt;
    }
    if (value > (UINT64_MAX - digit) / static_cast<unsigned>(base)) return std::nullopt;
    value = value * static_cast<unsigned>(base) + digit;
  }
  return value;
}

size_t EncodeBatch(const std::vector<Event>& events, const CodecOptions& options,
                   int64_t timestamp_ms, uint64_t* next_event_id, uint64_t* unparsed,
                   std::string* out) {
  out->clear();
  std::vector<std::pair<const Event*, std::optional<uint64_t>>> kept;
  kept.reserve(events.size());
  for (const Event& e : events) {
    std::optional<uint64_t> hash = ParseSeqHash(e.key);
    if (!hash) {
      ++*unparsed;
      if (!options.emit_object_key || e.key.empty()) continue;
    }
    kept.emplace_back(&e, hash);
  }
  if (kept.empty()) return 0;
  msgpack::sbuffer buf;
  Packer p(&buf);
  p.pack_array(3);
  p.pack(timestamp_ms);
  p.pack_array(static_cast<uint32_t>(kept.size()));
  for (const auto& [event, hash] : kept) {
    PackEvent(p, *event, hash, (*next_event_id)++, timestamp_ms, options);
  }
  p.pack(static_cast<uint32_t>(0));  // the batch's dp_rank: a pool has none
  out->assign(buf.data(), buf.size());
  return kept.size();
}

}  // namespace mooncake::store::kv_events
