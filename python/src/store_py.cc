// mooncake.store: upstream Mooncake's Python `MooncakeDistributedStore` over this project's
// StoreClient (include/mooncake/store/store_client.h). Bound as the submodule
// mooncake.engine._store, so that one copy of the engine serves both modules and a
// TransferEngine can be shared (`setup(..., engine=te)`); python/mooncake/store.py re-exports
// it and adds the tensor helpers.
//
// Conventions (upstream's, see docs/store_upstream.md): integer results are 0 (or a count or a
// size) on success and a negative ErrorCode on failure; get() returns b"" and get_buffer()
// None for a missing key; putting an existing key returns 0 and keeps the stored value. Every
// call that can block releases the GIL; close() waits for calls in flight.
//
// This file: the bindings (BindStore) and the bytes API; store_py_setup.cc setup, close and
// ReplicateConfig's checks; store_py_batch.cc the rest of MooncakeDistributedStore's
// methods; store_py.h what they share.
#include "store_py.h"

#include <pybind11/stl.h>

#include <glog/logging.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mooncake/transfer_engine.h"
#include "py_engine.h"

namespace mooncake {
namespace pyapi {
namespace store_py {

namespace {

// What get_buffer returns: the object's bytes in memory it owns (buffer protocol, ptr(),
// size()); valid after the store is closed.
struct BufferHandle {
  std::unique_ptr<char[]> data;
  size_t length = 0;
};

// Reads each key into fresh memory (bytes or a BufferHandle) with one master round trip.
template <class Make>
std::vector<int64_t> FetchMany(PyStore& s, const char* method,
                               const std::vector<std::string>& keys, Make make) {
  auto c = s.Get(method);
  if (!c) return std::vector<int64_t>(keys.size(), kNotReady);
  // Upstream's get and get_batch read through its get_buffer and batch_get_buffer.
  const std::string m = method;
  const bool batch = m == "get_batch" || m == "batch_get_buffer";
  OpTimer op(c.get(), store::OpKind::kRead, batch ? "batch_get_buffer" : "get_buffer");
  py::gil_scoped_release release;
  auto rc = c->BatchGetWith(keys, make);
  op.Done(!rc.empty() && rc[0] >= 0, batch, BytesRead(rc));
  return rc;
}

// Each key's object as bytes (b"" for a missing key or a failed read). Called with the GIL.
std::vector<py::object> GetBytes(PyStore& s, const char* method,
                                 const std::vector<std::string>& keys) {
  std::vector<py::object> out(keys.size(), py::bytes());
  auto rc = FetchMany(s, method, keys, [&](size_t i, uint64_t size) -> std::vector<Span> {
    py::gil_scoped_acquire acquire;
    PyObject* b = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size));
    if (b == nullptr) {
      PyErr_Clear();
      return {};  // the key reports INVALID_PARAMS
    }
    out[i] = py::reinterpret_steal<py::object>(b);
    return {{PyBytes_AS_STRING(b), size}};
  });
  for (size_t i = 0; i < keys.size(); ++i) {
    if (rc[i] < 0) out[i] = py::bytes();
  }
  return out;
}

// Each key's object in a BufferHandle (None for a missing key or a failed read).
std::vector<py::object> GetBuffers(PyStore& s, const char* method,
                                   const std::vector<std::string>& keys) {
  std::vector<std::shared_ptr<BufferHandle>> hs(keys.size());
  auto rc = FetchMany(s, method, keys, [&](size_t i, uint64_t size) -> std::vector<Span> {
    hs[i] = std::make_shared<BufferHandle>();
    hs[i]->data.reset(new (std::nothrow) char[size]);
    hs[i]->length = size;
    if (!hs[i]->data) return {};
    return {{hs[i]->data.get(), size}};
  });
  std::vector<py::object> out;
  for (size_t i = 0; i < keys.size(); ++i) {
    out.push_back(rc[i] < 0 ? py::object(py::none()) : py::cast(hs[i]));
  }
  return out;
}

}  // namespace

uint64_t BytesPut(const std::vector<std::vector<Span>>& parts, const std::vector<int>& codes) {
  uint64_t n = 0;
  for (size_t i = 0; i < parts.size() && i < codes.size(); ++i) {
    if (codes[i] != 0) continue;
    for (const Span& p : parts[i]) n += p.size;
  }
  return n;
}

uint64_t BytesRead(const std::vector<int64_t>& results) {
  uint64_t n = 0;
  for (int64_t r : results) n += r > 0 ? r : 0;
  return n;
}

std::vector<int> PutFromMany(PyStore& s, const char* method, const std::vector<std::string>& keys,
                             const std::vector<std::vector<Span>>& parts,
                             const PyReplicateConfig& config, bool upsert) {
  if (int rc = config.Check(method, keys.size()); rc != 0) return std::vector<int>(keys.size(), rc);
  auto c = s.Get(method);
  // upstream: an upsert on a store not set up answers INVALID_PARAMS
  if (!c) return std::vector<int>(keys.size(), upsert ? ToInt(ErrorCode::INVALID_PARAMS) : kNotReady);
  const bool batch = std::string(method).find("batch") != std::string::npos;
  OpTimer op(c.get(), store::OpKind::kWrite, method);
  std::vector<int> codes;
  if (!batch && keys.size() == 1 && parts.size() == 1) {  // upstream's Put / Upsert
    codes = {upsert ? c->Upsert(keys[0], parts[0], config.ToCpp())
                    : c->Put(keys[0], parts[0], config.ToCpp())};
  } else {
    codes = upsert ? c->BatchUpsert(keys, parts, config.ToCpp())
                   : c->BatchPut(keys, parts, config.ToCpp());
  }
  if (!upsert) {
    for (int& code : codes) code = PutCode(code);
  }
  op.Done(!codes.empty() && codes[0] == 0, batch, BytesPut(parts, codes));
  return codes;
}


}  // namespace store_py

void BindStoreDummy(py::module_& m);  // store_dummy_py.cc
void BindNuma(py::module_& m);        // numa_bind.cc

void BindStore(py::module_& m) {
  using namespace store_py;  // NOLINT(build/namespaces)
  BindStoreDummy(m);
  BindNuma(m);
  m.doc() = "Mooncake Store (upstream-compatible MooncakeDistributedStore); use mooncake.store.";

  py::enum_<SoftPinAction>(m, "SoftPinAction")
      .value("PRESERVE", SoftPinAction::PRESERVE)
      .value("ENABLE", SoftPinAction::ENABLE)
      .value("DISABLE", SoftPinAction::DISABLE);

  py::enum_<ObjectDataType>(m, "ObjectDataType")
      .value("UNKNOWN", ObjectDataType::UNKNOWN)
      .value("KVCACHE", ObjectDataType::KVCACHE)
      .value("TENSOR", ObjectDataType::TENSOR)
      .value("WEIGHT", ObjectDataType::WEIGHT)
      .value("SAMPLE", ObjectDataType::SAMPLE)
      .value("ACTIVATION", ObjectDataType::ACTIVATION)
      .value("GRADIENT", ObjectDataType::GRADIENT)
      .value("OPTIMIZER_STATE", ObjectDataType::OPTIMIZER_STATE)
      .value("METADATA", ObjectDataType::METADATA)
      .value("GENERAL", ObjectDataType::GENERAL)
      .export_values();

  py::class_<PyReplicateConfig>(m, "ReplicateConfig")
      .def(py::init<>())
      .def_readwrite("replica_num", &PyReplicateConfig::replica_num)
      .def_readwrite("with_soft_pin", &PyReplicateConfig::with_soft_pin)
      .def_readwrite("soft_pin_action", &PyReplicateConfig::soft_pin_action)
      .def_readwrite("soft_pin_ttl_ms", &PyReplicateConfig::soft_pin_ttl_ms)
      .def_readwrite("with_hard_pin", &PyReplicateConfig::with_hard_pin)
      .def_readwrite("preferred_segment", &PyReplicateConfig::preferred_segment)
      .def_readwrite("preferred_segments", &PyReplicateConfig::preferred_segments)
      .def_readwrite("prefer_alloc_in_same_node", &PyReplicateConfig::prefer_alloc_in_same_node)
      .def_readwrite("nof_replica_num", &PyReplicateConfig::nof_replica_num)
      .def_readwrite("dfs_replica_num", &PyReplicateConfig::dfs_replica_num)
      .def_readwrite("preferred_nof_segments", &PyReplicateConfig::preferred_nof_segments)
      .def_readwrite("data_type", &PyReplicateConfig::data_type)
      .def_readwrite("group_ids", &PyReplicateConfig::group_ids)
      .def("__str__", &PyReplicateConfig::Str);

  py::class_<BufferHandle, std::shared_ptr<BufferHandle>>(m, "BufferHandle", py::buffer_protocol())
      .def("ptr", [](const BufferHandle& b) { return reinterpret_cast<uintptr_t>(b.data.get()); })
      .def("size", [](const BufferHandle& b) { return b.length; })
      .def("__len__", [](const BufferHandle& b) { return b.length; })
      .def_buffer([](BufferHandle& b) {
        return py::buffer_info(b.data.get(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.length)}, {1}, /*readonly=*/true);
      });

  const PyReplicateConfig kDefault;
  py::class_<PyStore> c(m, "MooncakeDistributedStore");
  c.def(py::init<>());
  c.def(
      "setup",
      [](PyStore& s, const std::string& local_hostname, const std::string& metadata_server,
         uint64_t global_segment_size, uint64_t local_buffer_size, const std::string& protocol,
         const std::string& rdma_devices, const std::string& master_server_addr,
         const py::object& engine, bool enable_ssd_offload, const std::string& ssd_offload_path,
         const std::string& tenant_id, bool enable_client_http_server, int client_http_port) {
        SetupExtras extras{enable_ssd_offload, ssd_offload_path, tenant_id,
                           enable_client_http_server, client_http_port};
        return s.Setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
                       protocol, rdma_devices, master_server_addr, engine, extras);
      },
      py::arg("local_hostname"), py::arg("metadata_server"),
      py::arg("global_segment_size") = kDefaultSize, py::arg("local_buffer_size") = kDefaultSize,
      py::arg("protocol") = "tcp", py::arg("rdma_devices") = "",
      py::arg("master_server_addr") = "127.0.0.1:50051", py::arg("engine") = py::none(),
      py::arg("enable_ssd_offload") = false, py::arg("ssd_offload_path") = "",
      py::arg("tenant_id") = "default", py::arg("enable_client_http_server") = false,
      py::arg("client_http_port") = 9300,
      "Connects to the master, starts (or shares) a transfer engine and mounts a segment of "
      "global_segment_size bytes. engine: a mooncake.engine.TransferEngine or its get_engine(). "
      "local_buffer_size may be 0 (then only registered memory can be put or got). "
      "tenant_id: this client's tenant (a master in strict multi-tenant mode keeps its keys "
      "apart and charges its quota). enable_client_http_server: serve /metrics, "
      "/metrics/summary and /health on client_http_port. enable_ssd_offload is an upstream "
      "feature this build lacks: refused (-600) with a log line. 0 or a negative error code.");
  c.def("setup", &PyStore::SetupDict, py::arg("config"),
        "setup from a dict: local_hostname and metadata_server required; sizes may be ints or "
        "strings such as \"16MB\".");
  c.def("setup_dummy", &PyStore::SetupDummy, py::arg("mem_pool_size"),
        py::arg("local_buffer_size"), py::arg("server_address"),
        "Joins the real client (mooncake_client) at server_address (its --port): a client with "
        "no segment of its own and a memory pool of mem_pool_size bytes (alloc_from_mem_pool). "
        "0 or a negative error code (-900 when no real client answers). While the real client "
        "is gone, every call fails (-1, b\"\" or None).");
  c.def("alloc_from_mem_pool", &PyStore::AllocFromMemPool, py::arg("size"), Release(),
        "Address of size bytes of the dummy client's memory pool (puts from and gets into it "
        "are not staged), or 0 when it does not fit or this is not a dummy client.");
  c.def("close", &PyStore::Close, Release());
  c.def("health_check", &PyStore::HealthCheck, Release(),
        "0 healthy, 1 not set up or closed, 2 master unreachable.");
  c.def("get_hostname", &PyStore::GetHostname);

  // ---- bytes API ----
  c.def(
      "put",
      [](PyStore& s, const std::string& key, const py::buffer& value,
         const PyReplicateConfig& config) {
        PyBufferView v(value);
        if (int rc = config.Check("put", 1); rc != 0) return rc;
        auto cl = s.Get("put");
        if (!cl) return kNotReady;
        py::gil_scoped_release release;
        OpTimer op(cl.get(), store::OpKind::kWrite, "put");
        const int rc = PutCode(cl->Put(key, {v.span()}, config.ToCpp()));
        op.Done(rc == 0, false, v.span().size);
        return rc;
      },
      py::arg("key"), py::arg("value"), py::arg("config") = kDefault);
  c.def(
      "put_parts",
      [](PyStore& s, const std::string& key, const py::args& parts,
         const PyReplicateConfig& config) {
        std::vector<std::unique_ptr<PyBufferView>> views;
        std::vector<Span> spans;
        for (const auto& p : parts) {
          views.push_back(std::make_unique<PyBufferView>(p));
          spans.push_back(views.back()->span());
        }
        if (int rc = config.Check("put_parts", 1); rc != 0) return rc;
        auto cl = s.Get("put_parts");
        if (!cl) return kNotReady;
        py::gil_scoped_release release;
        OpTimer op(cl.get(), store::OpKind::kWrite, "put_parts");
        const int rc = PutCode(cl->Put(key, spans, config.ToCpp()));
        op.Done(rc == 0, false, BytesPut({spans}, {rc}));
        return rc;
      },
      py::arg("key"), py::arg("config") = kDefault);
  c.def(
      "put_batch",
      [](PyStore& s, const std::vector<std::string>& keys, const std::vector<py::buffer>& values,
         const PyReplicateConfig& config) {
        if (keys.size() != values.size()) {
          LOG(WARNING) << "put_batch: " << keys.size() << " keys but " << values.size()
                       << " values";
          return ToInt(ErrorCode::INVALID_PARAMS);
        }
        std::vector<std::unique_ptr<PyBufferView>> views;
        std::vector<std::vector<Span>> spans;
        for (const auto& v : values) {
          views.push_back(std::make_unique<PyBufferView>(v));
          spans.push_back({views.back()->span()});
        }
        std::vector<int> codes;
        {
          py::gil_scoped_release release;
          codes = PutFromMany(s, "put_batch", keys, spans, config);
        }
        for (int code : codes) {
          if (code != 0) return code;
        }
        return 0;
      },
      py::arg("keys"), py::arg("values"), py::arg("config") = kDefault);
  c.def(
      "get",
      [](PyStore& s, const std::string& key) { return GetBytes(s, "get", {key})[0]; },
      py::arg("key"));
  c.def(
      "get_batch",
      [](PyStore& s, const std::vector<std::string>& keys) {
        return GetBytes(s, "get_batch", keys);
      },
      py::arg("keys"));
  c.def(
      "get_buffer",
      [](PyStore& s, const std::string& key) { return GetBuffers(s, "get_buffer", {key})[0]; },
      py::arg("key"));
  c.def(
      "batch_get_buffer",
      [](PyStore& s, const std::vector<std::string>& keys) {
        return GetBuffers(s, "batch_get_buffer", keys);
      },
      py::arg("keys"));
  c.def(
      "is_exist",
      [](PyStore& s, const std::string& key) {
        auto cl = s.Get("is_exist");
        return cl ? cl->BatchIsExist({key})[0] : kNotReady;
      },
      Release(), py::arg("key"));
  c.def(
      "batch_is_exist",
      [](PyStore& s, const std::vector<std::string>& keys) {
        auto cl = s.Get("batch_is_exist");
        return cl ? cl->BatchIsExist(keys) : std::vector<int>(keys.size(), kNotReady);
      },
      Release(), py::arg("keys"));
  c.def(
      "get_size",
      [](PyStore& s, const std::string& key) {
        auto cl = s.Get("get_size");
        return cl ? cl->GetSize(key) : int64_t{kNotReady};
      },
      Release(), py::arg("key"));
  c.def(
      "remove",
      [](PyStore& s, const std::string& key, bool force) {
        auto cl = s.Get("remove");
        return cl ? cl->Remove(key, force) : kNotReady;
      },
      Release(), py::arg("key"), py::arg("force") = false);
  c.def(
      "batch_remove",
      [](PyStore& s, const std::vector<std::string>& keys, bool force) {
        auto cl = s.Get("batch_remove");
        return cl ? cl->BatchRemove(keys, force) : std::vector<int>(keys.size(), kNotReady);
      },
      Release(), py::arg("keys"), py::arg("force") = false);
  c.def(
      "remove_by_regex",
      [](PyStore& s, const std::string& regex, bool force) {
        auto cl = s.Get("remove_by_regex");
        return cl ? cl->RemoveByRegex(regex, force) : int64_t{kNotReady};
      },
      Release(), py::arg("regex_pattern"), py::arg("force") = false);
  c.def(
      "remove_all",
      [](PyStore& s, bool force) {
        auto cl = s.Get("remove_all");
        return cl ? cl->RemoveAll(force) : int64_t{kNotReady};
      },
      Release(), py::arg("force") = false);

  store_py::BindBatchApi(c, kDefault);
  store_py::BindSegments(c);
  store_py::BindTasks(m, c);
}

}  // namespace pyapi
}  // namespace mooncake
