// mooncake.store: MooncakeDistributedStore's setup (setup, the dict form, setup_dummy), close,
// health and the client it hands to the other methods, and ReplicateConfig's checks. The
// bindings and the bytes API: store_py.cc; the batch methods: store_py_batch.cc.
#include "store_py.h"

#include <pybind11/stl.h>

#include <glog/logging.h>

#include <cctype>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "mooncake/transfer_engine.h"
#include "py_engine.h"

namespace mooncake {
namespace pyapi {
namespace store_py {

namespace {

// "16MB", "1gb", "64 MiB", "512k", "4096" -> bytes (binary units, as upstream). nullopt if bad.
std::optional<uint64_t> ParseSize(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t digits = i;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == i) return std::nullopt;
  uint64_t value = 0;
  try {
    value = std::stoull(text.substr(i, digits - i));
  } catch (...) {
    return std::nullopt;
  }
  std::string unit;
  for (size_t j = digits; j < text.size(); ++j) {
    if (!std::isspace(static_cast<unsigned char>(text[j]))) {
      unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[j])));
    }
  }
  int shift = 0;
  if (unit.empty() || unit == "b") shift = 0;
  else if (unit == "k" || unit == "kb" || unit == "kib") shift = 10;
  else if (unit == "m" || unit == "mb" || unit == "mib") shift = 20;
  else if (unit == "g" || unit == "gb" || unit == "gib") shift = 30;
  else if (unit == "t" || unit == "tb" || unit == "tib") shift = 40;
  else return std::nullopt;
  if (shift > 0 && value > (UINT64_MAX >> shift)) return std::nullopt;
  return value << shift;
}

// "1", "true", "True", "yes", "on" (and Python's True through str()) -> true.
std::optional<bool> ParseBool(const py::object& v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  if (py::isinstance<py::int_>(v)) return v.cast<long long>() != 0;
  if (!py::isinstance<py::str>(v)) return std::nullopt;
  // upstream's TryParseBool: case and surrounding spaces ignored; "enable" / "disable" too.
  std::string t = v.cast<std::string>();
  const auto b = t.find_first_not_of(" \t"), e = t.find_last_not_of(" \t");
  t = b == std::string::npos ? "" : t.substr(b, e - b + 1);
  for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (t == "1" || t == "true" || t == "yes" || t == "on" || t == "enable") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off" || t == "disable" || t.empty()) {
    return false;
  }
  return std::nullopt;
}

}  // namespace

int PyReplicateConfig::Check(const char* method, size_t keys) const {
  auto refuse = [&](const std::string& why) {
    LOG(WARNING) << method << ": ReplicateConfig." << why;
    return ToInt(ErrorCode::INVALID_PARAMS);
  };
  if (soft_pin_ttl_ms && soft_pin_action != SoftPinAction::ENABLE && !with_soft_pin) {
    return refuse("soft_pin_ttl_ms=" + std::to_string(*soft_pin_ttl_ms) +
                  " needs soft_pin_action=SoftPinAction.ENABLE (as upstream)");
  }
  if (nof_replica_num != 0) {
    return refuse("nof_replica_num=" + std::to_string(nof_replica_num) +
                  ": NoF (NVMe-oF) replicas are not provided by this build; leave it 0");
  }
  if (dfs_replica_num != 0) {
    return refuse("dfs_replica_num=" + std::to_string(dfs_replica_num) +
                  ": DFS replicas are not provided by this build; leave it 0");
  }
  if (!preferred_nof_segments.empty()) {
    return refuse("preferred_nof_segments: NoF segments are not provided by this build; "
                  "leave it empty");
  }
  if (group_ids && group_ids->size() != keys) {
    return refuse("group_ids has " + std::to_string(group_ids->size()) +
                  " entries for " + std::to_string(keys) + " keys (one per key)");
  }
  return 0;
}

ReplicateConfig PyReplicateConfig::ToCpp() const {
  ReplicateConfig c;
  c.replica_num = replica_num;
  c.with_soft_pin = with_soft_pin || soft_pin_action == SoftPinAction::ENABLE;
  c.soft_pin_ttl_ms = soft_pin_ttl_ms.value_or(0);
  c.with_hard_pin = with_hard_pin;
  if (!preferred_segment.empty()) c.preferred_segments.push_back(preferred_segment);
  for (const auto& s : preferred_segments) c.preferred_segments.push_back(s);
  c.prefer_alloc_in_same_node = prefer_alloc_in_same_node;
  c.keep_soft_pin = soft_pin_action == SoftPinAction::PRESERVE && !with_soft_pin;
  return c;
}

std::string PyReplicateConfig::Str() const {
  std::string segs;
  for (const auto& s : preferred_segments) segs += (segs.empty() ? "" : ", ") + s;
  static const char* kActions[] = {"PRESERVE", "ENABLE", "DISABLE"};
  return "ReplicateConfig: { replica_num: " + std::to_string(replica_num) +
         ", with_soft_pin: " + std::to_string(with_soft_pin) +
         ", soft_pin_action: " + kActions[static_cast<int>(soft_pin_action)] +
         ", soft_pin_ttl_ms: " +
         (soft_pin_ttl_ms ? std::to_string(*soft_pin_ttl_ms) : std::string("default")) +
         ", with_hard_pin: " + std::to_string(with_hard_pin) + ", preferred_segment: " +
         preferred_segment + ", preferred_segments: [" + segs +
         "], prefer_alloc_in_same_node: " + std::to_string(prefer_alloc_in_same_node) +
         ", nof_replica_num: " + std::to_string(nof_replica_num) +
         ", dfs_replica_num: " + std::to_string(dfs_replica_num) +
         ", data_type: " + std::to_string(static_cast<int>(data_type)) + " }";
}

int SetupExtras::Check() const {
  if (enable_client_http_server && (client_http_port <= 0 || client_http_port > 65535)) {
    LOG(WARNING) << "setup: client_http_port " << client_http_port << " is not a port (1..65535)";
    return ToInt(ErrorCode::INVALID_PARAMS);
  }
  return 0;
}

int PyStore::Setup(const std::string& local_hostname, const std::string& metadata_server,
                   uint64_t global_segment_size, uint64_t local_buffer_size,
                   const std::string& protocol, const std::string& rdma_devices,
                   const std::string& master_server_addr, const py::object& engine,
                   const SetupExtras& extras) {
  if (int rc = extras.Check(); rc != 0) return rc;
  store::StoreClientOptions o;
  o.local_hostname = local_hostname;
  o.metadata_server = metadata_server;
  o.global_segment_size = global_segment_size;
  o.local_buffer_size = local_buffer_size;
  o.protocol = protocol.empty() ? "tcp" : protocol;
  o.master_server_addr = master_server_addr;
  o.tenant_id = extras.tenant_id.empty() ? "default" : extras.tenant_id;  // setup checks it
  // The disk tier: the directories from ssd_offload_path, else MOONCAKE_OFFLOAD_FILE_STORAGE_PATH.
  o.enable_offload = extras.enable_ssd_offload;
  o.offload_path = extras.ssd_offload_path;
  (void)rdma_devices;  // no RDMA transport in this build; the engine picks tcp / shm
  std::shared_ptr<EngineHolder> holder;
  if (!engine.is_none()) {
    // Either the Python TransferEngine or what its get_engine() returns (SGLang's HiCache
    // passes the latter, as upstream's binding expects a shared C++ engine).
    if (py::isinstance<EngineHolder>(engine)) {
      holder = engine.cast<std::shared_ptr<EngineHolder>>();
    } else if (py::isinstance<PyTransferEngine>(engine)) {
      holder = engine.cast<PyTransferEngine*>()->GetEngine();
    } else {
      LOG(WARNING) << "setup: engine must be a mooncake.engine.TransferEngine or what its "
                      "get_engine() returns, not "
                   << py::str(py::type::of(engine)).cast<std::string>();
      return ToInt(ErrorCode::INVALID_PARAMS);
    }
    if (!holder || !holder->engine) {
      LOG(WARNING) << "setup: the engine passed in is not initialized (call initialize first)";
      return ToInt(ErrorCode::INVALID_PARAMS);
    }
    // Keeps the engine (and its managed buffers) alive as long as the store uses it.
    o.engine = std::shared_ptr<TransferEngine>(holder, holder->engine.get());
  }
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(mu_);
  if (client_) {
    LOG(WARNING) << "setup: this store is already set up (close() it first)";
    return kNotReady;
  }
  int code = 0;
  std::string message;
  auto client = StoreClient::Create(std::move(o), &code, &message);
  if (!client) return code != 0 ? code : ToInt(ErrorCode::INTERNAL_ERROR);
  client_ = std::shared_ptr<StoreClient>(std::move(client));
  if (extras.enable_client_http_server) {
    auto server = store::StartClientHttp(extras.client_http_port, [this] { return Get(); });
    if (server.ok()) {
      http_ = std::move(server).value();
      LOG(INFO) << "client HTTP server on port " << extras.client_http_port
                << ": /metrics, /metrics/summary, /health";
    } else {
      LOG(WARNING) << "Failed to start client HTTP server on port " << extras.client_http_port
                   << " (" << server.status().message()
                   << "); continuing without HTTP endpoints";
    }
  }
  return 0;
}

int PyStore::SetupDict(const py::dict& config) {
  auto str = [&](const char* k, const std::string& def) -> std::optional<std::string> {
    if (!config.contains(k)) return def;
    py::object v = config[k];
    if (!py::isinstance<py::str>(v)) return std::nullopt;
    return v.cast<std::string>();
  };
  auto size = [&](const char* k) -> std::optional<uint64_t> {
    if (!config.contains(k)) return kDefaultSize;
    py::object v = config[k];
    if (py::isinstance<py::int_>(v)) {
      long long n = v.cast<long long>();
      if (n < 0) return std::nullopt;
      return static_cast<uint64_t>(n);
    }
    if (py::isinstance<py::str>(v)) return ParseSize(v.cast<std::string>());
    return std::nullopt;
  };
  for (const char* required : {"local_hostname", "metadata_server"}) {
    if (!config.contains(required)) {
      LOG(WARNING) << "setup: the config has no '" << required << "'";
      return ToInt(ErrorCode::INVALID_PARAMS);
    }
  }
  auto host = str("local_hostname", "");
  auto meta = str("metadata_server", "");
  auto proto = str("protocol", "tcp");
  auto rdma = str("rdma_devices", "");
  auto master = str("master_server_addr", "127.0.0.1:50051");
  auto gseg = size("global_segment_size");
  auto lbuf = size("local_buffer_size");
  if (!host || !meta || !proto || !rdma || !master) {
    LOG(WARNING) << "setup: local_hostname, metadata_server, protocol, rdma_devices and "
                    "master_server_addr must be strings";
    return ToInt(ErrorCode::INVALID_PARAMS);
  }
  if (!gseg || !lbuf) {
    LOG(WARNING) << "setup: global_segment_size and local_buffer_size must be a byte count or a "
                    "size such as \"16MB\" or \"1GB\"";
    return ToInt(ErrorCode::INVALID_PARAMS);
  }
  py::object engine = config.contains("engine") ? py::object(config["engine"]) : py::none();
  SetupExtras extras;
  for (auto [key, field] : {std::pair<const char*, bool*>{"enable_ssd_offload",
                                                           &extras.enable_ssd_offload},
                            {"enable_client_http_server", &extras.enable_client_http_server}}) {
    if (!config.contains(key)) continue;
    auto b = ParseBool(config[key]);
    if (!b) {
      LOG(WARNING) << "setup: " << key << " must be a boolean (True/False, \"true\"/\"false\")";
      return ToInt(ErrorCode::INVALID_PARAMS);
    }
    *field = *b;
  }
  if (config.contains("tenant_id")) extras.tenant_id = py::str(config["tenant_id"]);
  if (extras.enable_client_http_server && config.contains("client_http_port")) {
    // An int, or a string of one (spaces around it allowed), as upstream's TryParseInteger.
    std::string v = py::str(config["client_http_port"]);
    const auto b = v.find_first_not_of(" \t"), e = v.find_last_not_of(" \t");
    v = b == std::string::npos ? "" : v.substr(b, e - b + 1);
    if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos) {
      LOG(WARNING) << "setup: client_http_port '" << v << "' is not a port number";
      return ToInt(ErrorCode::INVALID_PARAMS);
    }
    extras.client_http_port = std::stoi(v);
  }
  return Setup(*host, *meta, *gseg, *lbuf, *proto, *rdma, *master, engine, extras);
}

int PyStore::SetupDummy(uint64_t mem_pool_size, uint64_t local_buffer_size,
                        const std::string& address) {
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(mu_);
  if (client_) {
    LOG(WARNING) << "setup_dummy: this store is already set up (close() it first)";
    return kNotReady;
  }
  int code = 0;
  std::string message;
  auto d = store::DummyClient::Create(mem_pool_size, local_buffer_size, address, &code, &message);
  if (!d) return code != 0 ? code : ToInt(ErrorCode::INTERNAL_ERROR);
  dummy_ = std::shared_ptr<store::DummyClient>(std::move(d));
  client_ = dummy_->client();
  return 0;
}

uint64_t PyStore::AllocFromMemPool(size_t size) {
  std::shared_ptr<store::DummyClient> d;
  {
    std::lock_guard<std::mutex> lock(mu_);
    d = dummy_;
  }
  if (!d) {
    LOG(WARNING) << "alloc_from_mem_pool: not a dummy client (call setup_dummy)";
    return 0;
  }
  return reinterpret_cast<uint64_t>(d->AllocFromMemPool(size));
}

int PyStore::Close() {
  std::shared_ptr<StoreClient> c;
  std::shared_ptr<store::DummyClient> d;
  std::unique_ptr<store::MetricsServer> http;
  {
    std::lock_guard<std::mutex> lock(mu_);
    c.swap(client_);
    d.swap(dummy_);
    http.swap(http_);
  }
  http.reset();  // its handler takes mu_: stopped without it
  d.reset();  // stops watching the real client; the client closes with its last user
  if (!c) return 0;
  // Calls in flight hold their own reference; the last one to finish closes the client.
  if (c.use_count() == 1) return c->Close();
  return 0;
}

int PyStore::HealthCheck() {
  auto c = Get();
  if (!c) return 1;
  return c->HealthCheck() == 0 ? 0 : 2;
}

std::string PyStore::GetHostname() {
  std::lock_guard<std::mutex> lock(mu_);  // a dummy keeps its name while its real client is gone
  return client_ ? client_->segment_name() : "";
}

std::shared_ptr<StoreClient> PyStore::Get(const char* method) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!client_ && method) LOG(WARNING) << method << ": Client is not initialized (call setup)";
  if (dummy_ && !dummy_->alive()) {
    if (method) {
      LOG(WARNING) << method << ": the real client at " << dummy_->real_client_address()
                   << " is gone";
    }
    return nullptr;
  }
  return client_;
}
}  // namespace store_py
}  // namespace pyapi
}  // namespace mooncake
