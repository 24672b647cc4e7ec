// Internal to the extension: what store_py.cc (the bindings, the bytes API, BufferHandle),
// store_py_setup.cc (setup, close, ReplicateConfig's checks) and store_py_batch.cc (registered
// memory, upserts, ranged reads, get and put sessions, replica clear) share: PyStore, the object behind
// MooncakeDistributedStore, and PyReplicateConfig, behind ReplicateConfig. Conventions are
// those of store_py.cc's header.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "mooncake/store/dummy_client.h"
#include "store/client/client_http.h"
#include "store/client/client_metrics.h"
#include "mooncake/store/store_client.h"
#include "mooncake/store/error_code.h"

namespace py = pybind11;

namespace mooncake {
namespace pyapi {
namespace store_py {

using store::ErrorCode;
using store::ReplicateConfig;
using store::Span;
using store::StoreClient;
using store::ToInt;

constexpr int kNotReady = -1;  // upstream: "Client is not initialized"
constexpr uint64_t kDefaultSize = 16ull << 20;

// upstream 0.3.13's SoftPinAction. PRESERVE keeps an existing object's pin (upsert); for a new
// object it means no pin, as DISABLE.
enum class SoftPinAction : int { PRESERVE = 0, ENABLE = 1, DISABLE = 2 };

// upstream's ObjectDataType: a label of what an object holds (vLLM's embedding cache sets it).
enum class ObjectDataType : int {
  UNKNOWN = 0, KVCACHE = 1, TENSOR = 2, WEIGHT = 3, SAMPLE = 4, ACTIVATION = 5, GRADIENT = 6,
  OPTIMIZER_STATE = 7, METADATA = 8, GENERAL = 9
};

// Python-facing ReplicateConfig: upstream's fields (both the 0.3.13 and the older spelling of
// the soft pin).
struct PyReplicateConfig {
  size_t replica_num = 1;
  bool with_soft_pin = false;                            // older upstream
  SoftPinAction soft_pin_action = SoftPinAction::PRESERVE;  // upstream 0.3.13
  std::optional<uint64_t> soft_pin_ttl_ms;               // None: the master's default
  bool with_hard_pin = false;
  std::string preferred_segment;
  std::vector<std::string> preferred_segments;
  bool prefer_alloc_in_same_node = false;
  // upstream's newer fields. data_type is a label (accepted, not stored); group_ids route
  // metadata to shards upstream, and this master has one, so they have no effect beyond the
  // length check; NoF and DFS replicas do not exist here: anything but the default is refused.
  size_t nof_replica_num = 0;
  size_t dfs_replica_num = 0;
  std::vector<std::string> preferred_nof_segments;
  ObjectDataType data_type = ObjectDataType::UNKNOWN;
  std::optional<std::vector<std::string>> group_ids;

  // 0, or INVALID_PARAMS after a log line naming the field. `keys`: how many keys the call
  // puts (group_ids, when set, has one entry per key).
  int Check(const char* method, size_t keys) const;

  ReplicateConfig ToCpp() const;
  std::string Str() const;
};

// A contiguous view of a Python buffer (bytes, bytearray, memoryview, numpy array, ...).
struct PyBufferView {
  explicit PyBufferView(const py::handle& obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
      throw py::error_already_set();
    }
  }
  ~PyBufferView() { PyBuffer_Release(&view); }
  PyBufferView(const PyBufferView&) = delete;
  PyBufferView& operator=(const PyBufferView&) = delete;
  Span span() const { return {view.buf, static_cast<size_t>(view.len)}; }
  Py_buffer view{};
};

inline int PutCode(int code) {
  // Upstream: putting a key that exists succeeds and keeps the stored value.
  return code == ToInt(ErrorCode::OBJECT_ALREADY_EXISTS) ? 0 : code;
}

// One call of the Python API, for the client's per-interface metrics (upstream's
// mooncake_transfer_{read,write}_operation_*{op_name}, client_metrics.h): timed from its
// construction; Done records it with the bytes moved. As upstream, a call of one key is
// recorded when it succeeded, a batch always. Nothing when the client has no metrics.
class OpTimer {
 public:
  OpTimer(const StoreClient* c, store::OpKind kind, const char* op)
      : metrics_(c != nullptr ? c->metrics() : nullptr), kind_(kind), op_(op) {}
  void Done(bool succeeded, bool batch, uint64_t bytes) {
    if (metrics_ == nullptr || (!batch && !succeeded)) return;
    metrics_->ObserveOp(kind_, op_, bytes,
                        std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now() - start_)
                            .count());
  }

 private:
  store::ClientMetrics* const metrics_;
  const store::OpKind kind_;
  const char* const op_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The bytes of the parts of the keys whose code is 0 / of the positive results.
uint64_t BytesPut(const std::vector<std::vector<Span>>& parts, const std::vector<int>& codes);
uint64_t BytesRead(const std::vector<int64_t>& results);

// setup()'s keyword arguments beyond the engine's. tenant_id goes to the client ("" is
// "default"; an invalid one fails setup with INVALID_PARAMS, saying why).
// enable_client_http_server starts the client's HTTP port (store/client/client_http.h) on
// client_http_port (1..65535, else INVALID_PARAMS); a port that cannot be bound is logged
// and setup succeeds without it, as upstream. enable_ssd_offload is an upstream feature this
// build does not have: True is refused (INVALID_PARAMS) with a line saying so, since ignoring
// it would change what the caller gets (no SSD tier).
struct SetupExtras {
  bool enable_ssd_offload = false;
  std::string ssd_offload_path;
  std::string tenant_id = "default";
  bool enable_client_http_server = false;
  int client_http_port = 9300;

  // 0, or INVALID_PARAMS after logging why.
  int Check() const;
};

// The object behind MooncakeDistributedStore: a StoreClient (or a dummy client's) once set up.
// Thread safety: every method may be called from any thread at once; the binding releases the
// GIL around the ones that block (Setup and SetupDict release it themselves).
class PyStore {
 public:
  // setup()'s positional form; 0 or a negative code (kNotReady when already set up).
  int Setup(const std::string& local_hostname, const std::string& metadata_server,
            uint64_t global_segment_size, uint64_t local_buffer_size, const std::string& protocol,
            const std::string& rdma_devices, const std::string& master_server_addr,
            const py::object& engine, const SetupExtras& extras = SetupExtras());
  // setup(config: dict): sizes may be ints or strings such as "16MB".
  int SetupDict(const py::dict& config);
  // A dummy client (dummy_client.h): the object API runs on its own StoreClient, refused
  // (kNotReady) while its real client is gone.
  int SetupDummy(uint64_t mem_pool_size, uint64_t local_buffer_size, const std::string& address);
  // An address in the dummy client's memory pool, or 0.
  uint64_t AllocFromMemPool(size_t size);
  // Detaches the client; the last call in flight closes it. 0 or a negative code.
  int Close();
  // 0 healthy, 1 not set up or closed, 2 master unreachable.
  int HealthCheck();
  std::string GetHostname();  // the segment name, "" before setup
  // The client for one call, or null (not set up, closed, or a dummy whose real client is
  // gone; logged when `method` names the call).
  std::shared_ptr<StoreClient> Get(const char* method = nullptr);

 private:
  std::mutex mu_;
  std::shared_ptr<StoreClient> client_;
  std::shared_ptr<store::DummyClient> dummy_;  // set by setup_dummy
  // The client HTTP port (setup's enable_client_http_server); its handler calls Get(), so it
  // is stopped without mu_ held, and goes first when the store is destroyed.
  std::unique_ptr<store::MetricsServer> http_;
};

using Release = py::call_guard<py::gil_scoped_release>;
using Ptrs = std::vector<uintptr_t>;
using Sizes = std::vector<size_t>;

// put / put_from / upsert of many keys at once: per key 0 or a negative code (an existing key
// is 0 for a put, replaced for an upsert). Called without the GIL.
std::vector<int> PutFromMany(PyStore& s, const char* method, const std::vector<std::string>& keys,
                             const std::vector<std::vector<Span>>& parts,
                             const PyReplicateConfig& config, bool upsert = false);

// Binds the registered-memory (zero-copy) calls, upserts, ranged reads, get / put sessions
// and batch_replica_clear on `c` (store_py_batch.cc); kDefault: config's default.
void BindBatchApi(py::class_<PyStore>& c, const PyReplicateConfig& kDefault);
void BindSegments(py::class_<PyStore>& c);  // store_py_segments.cc
void BindTasks(py::module_& m, py::class_<PyStore>& c);  // store_py_tasks.cc

}  // namespace store_py
}  // namespace pyapi
}  // namespace mooncake
