// The parts of etcd_kv.h that need no etcd (endpoint parsing, prefix ranges, op builders):
// built in every configuration, USE_ETCD or not.
#include <algorithm>
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "metadata/stores/etcd_kv.h"

namespace mooncake {
namespace {

constexpr uint16_t kEtcdDefaultPort = 2379;

bool StartsWithNoCase(const std::string& s, const std::string& prefix) {
  if (s.size() < prefix.size()) return false;
  return std::equal(prefix.begin(), prefix.end(), s.begin(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) ==
           std::tolower(static_cast<unsigned char>(b));
  });
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

}  // namespace

EtcdOp EtcdOp::Put(std::string key, std::string value, int64_t lease) {
  EtcdOp op;
  op.type = Type::kPut;
  op.key = std::move(key);
  op.value = std::move(value);
  op.lease = lease;
  return op;
}

EtcdOp EtcdOp::Delete(std::string key, std::string range_end) {
  EtcdOp op;
  op.type = Type::kDeleteRange;
  op.key = std::move(key);
  op.range_end = std::move(range_end);
  return op;
}

EtcdOp EtcdOp::Get(std::string key, std::string range_end, int64_t limit) {
  EtcdOp op;
  op.type = Type::kRange;
  op.key = std::move(key);
  op.range_end = std::move(range_end);
  op.limit = limit;
  return op;
}

std::string EtcdPrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  // Every byte is 0xff (or the prefix is empty): every key from `prefix` on.
  return std::string(1, '\0');
}

Result<std::vector<HostPort>> ParseEtcdEndpoints(const std::string& connstring) {
  const std::string where = "etcd endpoints '" + connstring + "'";
  if (Trim(connstring).empty()) return Status::InvalidArgument(where + ": no endpoint given");
  std::vector<HostPort> endpoints;
  size_t start = 0;
  while (start <= connstring.size()) {
    size_t end = connstring.find_first_of(",;", start);
    if (end == std::string::npos) end = connstring.size();
    std::string item = Trim(connstring.substr(start, end - start));
    const std::string label = "item " + std::to_string(endpoints.size() + 1);
    if (StartsWithNoCase(item, "https://")) {
      return Status::InvalidArgument(where + ": '" + item +
                                     "': https (TLS to etcd) is not supported; use http://");
    }
    if (StartsWithNoCase(item, "http://")) {
      item = item.substr(7);
    } else if (item.find("://") != std::string::npos) {
      return Status::InvalidArgument(where + ": '" + item + "': expected host:port or http://");
    }
    while (!item.empty() && item.back() == '/') item.pop_back();
    if (item.empty()) return Status::InvalidArgument(where + ": " + label + " is empty");
    auto hp = ParseHostPort(item);
    if (!hp.ok()) return hp.status().WithContext(where);
    if (!hp->has_port) {
      hp->port = kEtcdDefaultPort;
      hp->has_port = true;
    }
    endpoints.push_back(std::move(hp).value());
    start = end + 1;
  }
  return endpoints;
}

}  // namespace mooncake
