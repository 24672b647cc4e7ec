// The operation log's keys and values in etcd (README.md here: "Keys"): a batch is stored
// under mooncake-store/<cluster>/oplog/<batch id, 20 digits> as the CRC32 (zlib's, little
// endian) of the serialized oplog.Batch followed by those bytes.
#pragma once

#include <cstdint>
#include <string>

#include "mooncake/status.h"
#include "oplog.pb.h"

namespace mooncake {
namespace store {
namespace ha {

// etcd's default request limit is 1.5 MiB: a batch stays well under it.
constexpr size_t kMaxBatchBytes = 512 << 10;

std::string ClusterPrefix(const std::string& cluster_id);  // "mooncake-store/<id>/"
std::string OplogPrefix(const std::string& cluster_id);    // "...<id>/oplog/"
std::string OplogKey(const std::string& cluster_id, uint64_t batch_id);
// The batch id of an oplog key of this cluster; InvalidArgument naming the key otherwise.
Result<uint64_t> ParseOplogKey(const std::string& cluster_id, const std::string& key);

// A message as stored: its CRC32 (little endian) and its bytes.
std::string EncodeWithCrc(const google::protobuf::MessageLite& m);
// DataLoss naming `what` when the CRC or the parse fails.
Status DecodeWithCrc(const std::string& value, const std::string& what,
                     google::protobuf::MessageLite* m);

std::string EncodeBatch(const oplog::Batch& batch);
// The batch in `value`, checked: the CRC, the parse, its id == `batch_id` (never 0: ids start
// at 1), a first sequence number, at least one entry. DataLoss naming the key's batch id when any fails.
Result<oplog::Batch> DecodeBatch(const std::string& value, uint64_t batch_id);

}  // namespace ha
}  // namespace store
}  // namespace mooncake
