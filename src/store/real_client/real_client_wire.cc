#include "store/real_client/real_client_wire.h"

#include <nlohmann/json.hpp>

namespace mooncake {
namespace store {

std::string EncodeConfig(const RealClientConfig& c) {
  nlohmann::json j = {{"master_server_address", c.master_server_address},
                      {"metadata_server", c.metadata_server},
                      {"protocol", c.protocol},
                      {"device_names", c.device_names},
                      {"host", c.host},
                      {"segment_name", c.segment_name}};
  // Optional (newer real clients): absent when empty, so the line is what older ones send.
  if (!c.store_cluster_id.empty()) j["store_cluster_id"] = c.store_cluster_id;
  if (c.tenant_id != "default") j["tenant_id"] = c.tenant_id;
  // JSON carries UTF-8 only: a byte that is not (a flag's value can be anything) becomes
  // U+FFFD, where the strict default would throw out of the real client's constructor.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Result<RealClientConfig> DecodeConfig(const std::string& line) {
  if (line.size() > kMaxConfigBytes) return Status::DataLoss("real client config over 4 KiB");
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::DataLoss("real client config is not a JSON object");
  RealClientConfig c;
  const std::pair<const char*, std::string*> fields[] = {
      {"master_server_address", &c.master_server_address},
      {"metadata_server", &c.metadata_server},
      {"protocol", &c.protocol},
      {"device_names", &c.device_names},
      {"host", &c.host},
      {"segment_name", &c.segment_name}};
  for (const auto& [name, out] : fields) {
    auto it = j.find(name);
    if (it == j.end() || !it->is_string()) {
      return Status::DataLoss(std::string("real client config lacks the string '") + name + "'");
    }
    *out = it->get<std::string>();
  }
  if (auto it = j.find("store_cluster_id"); it != j.end()) {
    if (!it->is_string()) return Status::DataLoss("real client config: store_cluster_id is not a string");
    c.store_cluster_id = it->get<std::string>();
  }
  if (auto it = j.find("tenant_id"); it != j.end()) {
    if (!it->is_string()) return Status::DataLoss("real client config: tenant_id is not a string");
    c.tenant_id = it->get<std::string>();
  }
  if (c.master_server_address.empty() || c.metadata_server.empty() || c.host.empty()) {
    return Status::DataLoss("real client config has an empty master, metadata server or host");
  }
  return c;
}

}  // namespace store
}  // namespace mooncake
