// The pybind11 module mooncake.engine: names, arguments and defaults as upstream Mooncake's
// (arguments upstream declares without py::arg are positional-only here). Every method that
// can block runs with the GIL released. The contracts are in docstrings.h.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dirent.h>
#include <glog/logging.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string>

#include "docstrings.h"
#include "platform/device.h"
#include "py_engine.h"

namespace py = pybind11;
using mooncake::pyapi::EngineHolder;
using mooncake::pyapi::Opcode;
using mooncake::pyapi::PyTransferEngine;
using mooncake::pyapi::TransferNotify;
namespace doc = mooncake::pyapi::doc;

namespace {

using mooncake::Status;
using Release = py::call_guard<py::gil_scoped_release>;
using Addrs = std::vector<uintptr_t>;
using Lengths = std::vector<size_t>;

std::string LocalTopology() {
  std::set<int> nodes;
  if (DIR* d = ::opendir("/sys/devices/system/node")) {
    while (dirent* e = ::readdir(d)) {
      int n = 0;
      if (std::sscanf(e->d_name, "node%d", &n) == 1) nodes.insert(n);
    }
    ::closedir(d);
  }
  if (nodes.empty()) nodes.insert(0);
  std::string out = "{";
  for (int n : nodes) {
    out += (out.size() > 1 ? "," : "") + std::string("\"cpu:") + std::to_string(n) + "\":[[],[]]";
  }
  return out + "}";
}

// memcpy, or a device copy where either end is device memory (a torch CUDA or torch_npu
// tensor's data_ptr()).
Status CopyBytes(void* dst, const void* src, size_t length) {
  auto& dev = mooncake::platform::Devices();
  if (dev.Available().ok() && (dev.DeviceOf(dst) >= 0 || dev.DeviceOf(src) >= 0)) {
    return dev.Copy(dst, src, length);
  }
  std::memcpy(dst, src, length);
  return Status::OK();
}

int WriteBytes(PyTransferEngine&, uintptr_t dest, const py::bytes& src, size_t length) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(src.ptr(), &data, &size) != 0) throw py::error_already_set();
  if (dest == 0 || length > static_cast<size_t>(size)) {
    LOG(WARNING) << "write_bytes_to_buffer: " << (dest == 0 ? "null destination address"
                                                           : "length is larger than src")
                 << " (length " << length << ", src " << size << " bytes)";
    return -1;
  }
  py::gil_scoped_release release;  // src stays alive: the caller holds it
  Status s = CopyBytes(reinterpret_cast<void*>(dest), data, length);
  if (!s.ok()) {
    LOG(WARNING) << "write_bytes_to_buffer: " << s.ToString();
    return -1;
  }
  return 0;
}

py::bytes ReadBytes(PyTransferEngine&, uintptr_t source, size_t length) {
  if (source == 0 && length > 0) {
    LOG(WARNING) << "read_bytes_from_buffer: null source address";
    return py::bytes();
  }
  PyObject* obj = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(length));
  if (obj == nullptr) throw py::error_already_set();
  {
    py::gil_scoped_release release;
    Status s = length > 0 ? CopyBytes(PyBytes_AS_STRING(obj), reinterpret_cast<void*>(source),
                                      length)
                          : Status::OK();
    if (!s.ok()) LOG(WARNING) << "read_bytes_from_buffer: " << s.ToString();
  }
  return py::reinterpret_steal<py::bytes>(obj);
}

void DefineTransfers(py::class_<PyTransferEngine>& c) {
  auto sync_one = [](Opcode op, const char* name) {
    return [op, name](PyTransferEngine& self, const std::string& target, uintptr_t buffer,
                      uintptr_t peer, size_t length, const std::string&) {
      return self.TransferSync(name, target, buffer, peer, length, op, nullptr);
    };
  };
  auto sync_batch = [](Opcode op, const char* name) {
    return [op, name](PyTransferEngine& self, const std::string& target, const Addrs& buffers,
                      const Addrs& peers, const Lengths& lengths, const std::string&) {
      return self.BatchTransferSync(name, target, {buffers, peers, lengths}, op, nullptr);
    };
  };
  auto async_batch = [](Opcode op, const char* name) {
    return [op, name](PyTransferEngine& self, const std::string& target, const Addrs& buffers,
                      const Addrs& peers, const Lengths& lengths, const std::string&) {
      return self.BatchTransferAsync(name, target, {buffers, peers, lengths}, op);
    };
  };
  c.def("transfer_sync_write", sync_one(Opcode::kWrite, "transfer_sync_write"), Release(),
        doc::kTransferSyncWrite, py::arg("target_hostname"), py::arg("buffer"),
        py::arg("peer_buffer_address"), py::arg("length"), py::arg("transport_hint") = "");
  c.def("transfer_sync_read", sync_one(Opcode::kRead, "transfer_sync_read"), Release(),
        doc::kTransferSyncRead, py::arg("target_hostname"), py::arg("buffer"),
        py::arg("peer_buffer_address"), py::arg("length"), py::arg("transport_hint") = "");
  c.def("batch_transfer_sync_write", sync_batch(Opcode::kWrite, "batch_transfer_sync_write"),
        Release(), doc::kBatchSyncWrite, py::arg("target_hostname"), py::arg("buffers"),
        py::arg("peer_buffer_addresses"), py::arg("lengths"), py::arg("transport_hint") = "");
  c.def("batch_transfer_sync_read", sync_batch(Opcode::kRead, "batch_transfer_sync_read"),
        Release(), doc::kBatchSyncRead, py::arg("target_hostname"), py::arg("buffers"),
        py::arg("peer_buffer_addresses"), py::arg("lengths"), py::arg("transport_hint") = "");
  c.def("batch_transfer_async_write", async_batch(Opcode::kWrite, "batch_transfer_async_write"),
        Release(), doc::kBatchAsyncWrite, py::arg("target_hostname"), py::arg("buffers"),
        py::arg("peer_buffer_addresses"), py::arg("lengths"), py::arg("transport_hint") = "");
  c.def("batch_transfer_async_read", async_batch(Opcode::kRead, "batch_transfer_async_read"),
        Release(), doc::kBatchAsyncRead, py::arg("target_hostname"), py::arg("buffers"),
        py::arg("peer_buffer_addresses"), py::arg("lengths"), py::arg("transport_hint") = "");
  c.def(
      "transfer_sync",
      [](PyTransferEngine& self, const std::string& target, uintptr_t buffer, uintptr_t peer,
         size_t length, Opcode op, const TransferNotify* notify, const std::string&) {
        return self.TransferSync("transfer_sync", target, buffer, peer, length, op, notify);
      },
      Release(), doc::kTransferSync, py::arg("target_hostname"), py::arg("buffer"),
      py::arg("peer_buffer_address"), py::arg("length"), py::arg("opcode"),
      py::arg("notify") = nullptr, py::arg("transport_hint") = "");
  c.def(
      "batch_transfer_sync",
      [](PyTransferEngine& self, const std::string& target, const Addrs& buffers,
         const Addrs& peers, const Lengths& lengths, Opcode op, const TransferNotify* notify,
         const std::string&) {
        return self.BatchTransferSync("batch_transfer_sync", target, {buffers, peers, lengths},
                                      op, notify);
      },
      Release(), doc::kBatchSync, py::arg("target_hostname"), py::arg("buffers"),
      py::arg("peer_buffer_addresses"), py::arg("lengths"), py::arg("opcode"),
      py::arg("notify") = nullptr, py::arg("transport_hint") = "");
  c.def(
      "batch_transfer_async",
      [](PyTransferEngine& self, const std::string& target, const Addrs& buffers,
         const Addrs& peers, const Lengths& lengths, Opcode op, const std::string&) {
        return self.BatchTransferAsync("batch_transfer_async", target, {buffers, peers, lengths},
                                       op);
      },
      Release(), doc::kBatchAsync, py::arg("target_hostname"), py::arg("buffers"),
      py::arg("peer_buffer_addresses"), py::arg("lengths"), py::arg("opcode"),
      py::arg("transport_hint") = "");
  c.def("get_batch_transfer_status", &PyTransferEngine::GetBatchTransferStatus, Release(),
        doc::kGetBatchStatus, py::arg("batch_ids"), py::pos_only());
  c.def(
      "transfer_submit_write",
      [](PyTransferEngine& self, const std::string& target, uintptr_t buffer, uintptr_t peer,
         size_t length, const std::string&) {
        std::vector<uintptr_t> b{buffer}, p{peer};
        std::vector<size_t> l{length};
        return self.BatchTransferAsync("transfer_submit_write", target, {b, p, l},
                                       Opcode::kWrite);
      },
      Release(), doc::kSubmitWrite, py::arg("target_hostname"), py::arg("buffer"),
      py::arg("peer_buffer_address"), py::arg("length"), py::arg("transport_hint") = "");
  c.def("transfer_check_status", &PyTransferEngine::TransferCheckStatus, Release(),
        doc::kCheckStatus, py::arg("batch_id"), py::pos_only());
}

void DefineMemory(py::class_<PyTransferEngine>& c) {
  c.def("allocate_managed_buffer", &PyTransferEngine::AllocateManagedBuffer, Release(),
        doc::kAllocateManaged, py::arg("length"), py::pos_only());
  c.def("free_managed_buffer", &PyTransferEngine::FreeManagedBuffer, Release(),
        doc::kFreeManaged, py::arg("buffer_addr"), py::arg("length"), py::pos_only());
  c.def("register_memory", &PyTransferEngine::RegisterMemory, Release(), doc::kRegister,
        py::arg("buffer_addr"), py::arg("capacity"), py::arg("location") = "*");
  c.def("unregister_memory", &PyTransferEngine::UnregisterMemory, Release(), doc::kUnregister,
        py::arg("buffer_addr"), py::pos_only());
  c.def("batch_register_memory", &PyTransferEngine::BatchRegisterMemory, Release(),
        doc::kBatchRegister, py::arg("buffer_addresses"), py::arg("capacities"),
        py::arg("location") = "*");
  c.def("batch_unregister_memory", &PyTransferEngine::BatchUnregisterMemory, Release(),
        doc::kBatchUnregister, py::arg("buffer_addresses"), py::pos_only());
  c.def("write_bytes_to_buffer", &WriteBytes, doc::kWriteBytes, py::arg("dest_address"),
        py::arg("src"), py::arg("length"), py::pos_only());
  c.def("read_bytes_from_buffer", &ReadBytes, doc::kReadBytes, py::arg("source_address"),
        py::arg("length"), py::pos_only());
}

}  // namespace

namespace mooncake {
namespace pyapi {
void BindStore(py::module_& m);  // store_py.cc
}  // namespace pyapi
}  // namespace mooncake

PYBIND11_MODULE(engine, m) {
  mooncake::pyapi::ApplyLogLevelFromEnvironment();
  m.doc() = doc::kModule;
  m.attr("__version__") = MC_VERSION;
  for (const char* name : {"SUPPORT_EFA", "SUPPORT_HIP", "SUPPORT_MNNVL", "SUPPORT_MUSA",
                           "SUPPORT_INTRA_NVLINK"}) {
    m.attr(name) = false;
  }
  // Every build can register CUDA memory: the runtime is loaded when first needed (never at
  // import), and a host without one gets a clear error when it registers cuda:N memory.
  m.attr("SUPPORT_CUDA") = true;

  py::enum_<Opcode> opcode(m, "TransferOpcode", py::arithmetic(), doc::kOpcode);
  opcode.value("Read", Opcode::kRead).value("Write", Opcode::kWrite).export_values();

  py::class_<TransferNotify>(m, "TransferNotify", doc::kNotify)
      .def(py::init<>())
      .def(py::init<std::string, std::string>(), py::arg("name"), py::arg("msg"))
      .def_readwrite("name", &TransferNotify::name)
      .def_readwrite("msg", &TransferNotify::msg)
      .def("__repr__", [](const TransferNotify& n) {
        return "TransferNotify(name=" + py::repr(py::str(n.name)).cast<std::string>() +
               ", msg=" + py::repr(py::str(n.msg)).cast<std::string>() + ")";
      });

  py::class_<EngineHolder, std::shared_ptr<EngineHolder>>(m, "InnerTransferEngine", doc::kInner)
      .def("__repr__", [](const EngineHolder& h) {
        return "<InnerTransferEngine " + h.engine->GetLocalSegmentName() + ">";
      });

  py::class_<PyTransferEngine> c(m, "TransferEngine", doc::kClass);
  c.def(py::init<>(), doc::kInit);
  c.def("initialize", &PyTransferEngine::Initialize, Release(), doc::kInitialize,
        py::arg("local_hostname"), py::arg("metadata_server"), py::arg("protocol"),
        py::arg("device_name"), py::pos_only());
  c.def("initialize_ext", &PyTransferEngine::InitializeExt, Release(), doc::kInitializeExt,
        py::arg("local_hostname"), py::arg("metadata_server"), py::arg("protocol"),
        py::arg("device_name"), py::arg("metadata_type"), py::pos_only());
  c.def("get_rpc_port", &PyTransferEngine::GetRpcPort, doc::kGetRpcPort);
  DefineMemory(c);
  DefineTransfers(c);
  c.def(
      "get_local_topology",
      [](PyTransferEngine&, std::optional<std::string>) { return LocalTopology(); },
      doc::kTopology, py::arg("device_name") = py::none());
  c.def("get_first_buffer_address", &PyTransferEngine::GetFirstBufferAddress, Release(),
        doc::kFirstBuffer, py::arg("segment_name"), py::pos_only());
  c.def(
      "warmup_efa_segment", [](PyTransferEngine&, const std::string&) { return 0; },
      doc::kWarmupEfa, py::arg("segment_name"));
  c.def("get_notifies", &PyTransferEngine::GetNotifies, Release(), doc::kGetNotifies);
  c.def("send_probe", &PyTransferEngine::SendProbe, Release(), doc::kSendProbe,
        py::arg("peer_server_name"));
  c.def("get_engine", &PyTransferEngine::GetEngine, doc::kGetEngine);
  c.def(
      "get_engine_ptr",
      [](PyTransferEngine& self) {
        auto h = self.GetEngine();
        return h ? reinterpret_cast<uintptr_t>(h->engine.get()) : uintptr_t{0};
      },
      doc::kGetEnginePtr);
  c.def("_pending_batches", &PyTransferEngine::PendingBatches, doc::kPending);
  c.attr("TransferOpcode") = opcode;

  // The Store's classes, re-exported by mooncake.store (one module: a TransferEngine can be
  // shared with a store).
  py::module_ store = m.def_submodule("_store");
  mooncake::pyapi::BindStore(store);
}
