// KV events on the wire (upstream's Mooncake master publisher, RFC #1527; the Dynamo KV router
// and Mooncake's conductor read it): one ZeroMQ message per batch of at most kMaxBatchEvents
// events, three frames: an empty topic, the batch's sequence number (8 bytes, big-endian),
// and a msgpack payload [timestamp_ms, [event map, ...], 0].
//
// Each event is a map with upstream's keys: event_id, timestamp, event_type ("stored" |
// "removed"), model_name / block_size / additional_salt / lora_name / dp_rank (nil: the pool
// does not know them), tenant_id, backend_id, group_id (nil when none), medium ("cpu"),
// seq_hashes ([u64] when the key is a decimal or 0x-hex 64-bit number, else []), object_key
// (with emit_object_key), base_block_idx (0 stored / nil removed); stored events add
// parent_hash and token_ids (nil). With legacy compat: type ("BlockStored" | "BlockRemoved"),
// block_hashes (seq_hashes as int64) and, on stored events, parent_block_hash (nil).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mooncake::store::kv_events {

constexpr size_t kMaxBatchEvents = 64;

struct Event {
  bool stored = true;  // false: removed
  std::string key;
  std::string medium = "cpu";
  std::string tenant_id = "default";
  std::string group_id;  // "" : nil
};

struct CodecOptions {
  std::string backend_id;
  bool emit_object_key = true;
  bool legacy_compat = true;
};

// The key as a 64-bit block hash: all decimal digits, or "0x" / "0X" and hex digits, with a
// value below 2^64. Anything else (signs, spaces, empty, overflow) is nullopt.
std::optional<uint64_t> ParseSeqHash(std::string_view key);

// The msgpack payload of one batch. Events whose key does not parse are counted in
// *unparsed; without emit_object_key they are also left out (nothing would identify them).
// Event ids are taken from *next_event_id. Returns how many events the payload holds (0: no
// payload worth sending; *out is then empty).
size_t EncodeBatch(const std::vector<Event>& events, const CodecOptions& options,
                   int64_t timestamp_ms, uint64_t* next_event_id, uint64_t* unparsed,
                   std::string* out);

}  // namespace mooncake::store::kv_events
