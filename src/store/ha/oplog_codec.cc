#include "store/ha/oplog_codec.h"

#include <zlib.h>

#include <cstdio>

namespace mooncake {
namespace store {
namespace ha {

namespace {
uint32_t Crc(const char* p, size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  while (n > 0) {  // zlib takes uInt lengths
    const uInt part = n > (1u << 30) ? (1u << 30) : static_cast<uInt>(n);
    c = crc32(c, reinterpret_cast<const Bytef*>(p), part);
    p += part;
    n -= part;
  }
  return static_cast<uint32_t>(c);
}
}  // namespace

std::string ClusterPrefix(const std::string& cluster_id) {
  return "mooncake-store/" + cluster_id + "/";
}
std::string OplogPrefix(const std::string& cluster_id) {
  return ClusterPrefix(cluster_id) + "oplog/";
}
std::string OplogKey(const std::string& cluster_id, uint64_t batch_id) {
  char digits[32];
  std::snprintf(digits, sizeof(digits), "%020llu", static_cast<unsigned long long>(batch_id));
  return OplogPrefix(cluster_id) + digits;
}

Result<uint64_t> ParseOplogKey(const std::string& cluster_id, const std::string& key) {
  const std::string prefix = OplogPrefix(cluster_id);
  const bool shaped = key.size() == prefix.size() + 20 && key.compare(0, prefix.size(), prefix) == 0;
  uint64_t id = 0;
  for (size_t i = prefix.size(); shaped && i < key.size(); ++i) {
    if (key[i] < '0' || key[i] > '9') return Status::InvalidArgument("oplog key '" + key.substr(0, 200) + "' is not <prefix><20 digits>");
    id = id * 10 + static_cast<uint64_t>(key[i] - '0');
  }
  if (!shaped || id == 0) {
    return Status::InvalidArgument("oplog key '" + key.substr(0, 200) + "' is not " + prefix +
                                   "<20 digits, not all 0>");
  }
  return id;
}

std::string EncodeWithCrc(const google::protobuf::MessageLite& m) {
  std::string body;
  m.SerializeToString(&body);
  const uint32_t crc = Crc(body.data(), body.size());
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((crc >> (8 * i)) & 0xff);
  out += body;
  return out;
}

Status DecodeWithCrc(const std::string& value, const std::string& what,
                     google::protobuf::MessageLite* m) {
  if (value.size() < 4) {
    return Status::DataLoss(what + " is " + std::to_string(value.size()) + " bytes: no CRC");
  }
  uint32_t crc = 0;
  for (int i = 3; i >= 0; --i) crc = (crc << 8) | static_cast<uint8_t>(value[i]);
  if (Crc(value.data() + 4, value.size() - 4) != crc) {
    return Status::DataLoss(what + " fails its CRC32 (" + std::to_string(value.size()) + " bytes)");
  }
  if (!m->ParseFromArray(value.data() + 4, static_cast<int>(value.size() - 4))) {
    return Status::DataLoss(what + " passes its CRC but does not parse");
  }
  return Status::OK();
}

std::string EncodeBatch(const oplog::Batch& batch) { return EncodeWithCrc(batch); }

Result<oplog::Batch> DecodeBatch(const std::string& value, uint64_t batch_id) {
  const std::string what = "oplog batch " + std::to_string(batch_id);
  oplog::Batch b;
  if (Status s = DecodeWithCrc(value, what, &b); !s.ok()) return s;
  if (batch_id == 0 || b.batch_id() != batch_id || b.entries_size() == 0 || b.first_seq() == 0) {
    return Status::DataLoss(what + " holds batch " + std::to_string(b.batch_id()) + " with " +
                            std::to_string(b.entries_size()) + " entries from sequence " +
                            std::to_string(b.first_seq()));
  }
  return b;
}

}  // namespace ha
}  // namespace store
}  // namespace mooncake
