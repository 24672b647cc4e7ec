// MooncakeDistributedStore's replica tasks and replica descriptors, upstream's calls and shapes.
// get_replica_desc(key) returns a list of ReplicaDescriptor (empty when the key is missing,
// logged), batch_get_replica_desc(keys) a dict of key -> list (missing keys left out); a
// ReplicaDescriptor has status (ReplicaStatus), is_memory_replica() / is_disk_replica() /
// is_local_disk_replica() and get_memory_descriptor().buffer_descriptor (Descriptor: size,
// buffer_address, transport_endpoint); every replica here is a memory replica until the disk
// tier exists. Replica tasks:
// create_copy_task(key, targets) and create_move_task(key, source, target) return
// (task_id, 0) or ((0, 0), code); query_task(task_id) returns (QueryTaskResponse, 0) or
// (None, code). A task id is upstream's (u64, u64) tuple; TaskType (REPLICA_COPY,
// REPLICA_MOVE) and TaskStatus (PENDING, PROCESSING, FAILED, SUCCESS) have upstream's values
// (and, as upstream's, their members at module level too). QueryTaskResponse.assigned_client
// is the executor's client id as upstream's (u64, u64) tuple. StoreClient's CreateCopyTask /
// CreateMoveTask / QueryTask do the work (src/store/master/master_tasks.cc says how a task
// runs).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <glog/logging.h>

#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "store_py.h"

namespace mooncake {
namespace pyapi {
namespace store_py {
namespace {

enum class PyTaskType : uint32_t { REPLICA_COPY = 0, REPLICA_MOVE = 1 };
enum class PyTaskStatus : uint32_t { PENDING = 0, PROCESSING = 1, FAILED = 2, SUCCESS = 3 };

using PyTaskId = std::pair<uint64_t, uint64_t>;

enum class PyReplicaStatus : uint32_t {
  UNDEFINED = 0, INITIALIZED = 1, PROCESSING = 2, COMPLETE = 3, REMOVED = 4, FAILED = 5
};

struct PyBufferDescriptor {  // upstream's AllocatedBuffer::Descriptor ("Descriptor")
  uint64_t size = 0;
  uint64_t buffer_address = 0;
  std::string transport_endpoint;
};
struct PyMemoryDescriptor {
  PyBufferDescriptor buffer_descriptor;
};
struct PyDiskDescriptor {
  std::string file_path;
  uint64_t object_size = 0;
};
struct PyReplicaDescriptor {
  PyReplicaStatus status = PyReplicaStatus::COMPLETE;
  PyMemoryDescriptor memory;
  bool local_disk = false;  // a copy on its owner's local disk (upstream's LOCAL_DISK)
  PyDiskDescriptor disk;
};

std::vector<PyReplicaDescriptor> Descriptors(const StoreClient::KeyReplicas& k) {
  std::vector<PyReplicaDescriptor> out;
  for (const auto& r : k.replicas) {
    PyReplicaDescriptor d;
    if (r.disk) {
      d.local_disk = true;
      d.disk = {"", r.size};  // its file is its owner's business: no path
      d.memory.buffer_descriptor = {r.size, 0, r.segment_name};  // the owner's endpoint
    } else {
      d.memory.buffer_descriptor = {r.size, r.addr, r.segment_name};
    }
    out.push_back(std::move(d));
  }
  return out;
}

struct PyQueryTaskResponse {
  PyTaskId id{0, 0};
  PyTaskType type = PyTaskType::REPLICA_COPY;
  PyTaskStatus status = PyTaskStatus::PENDING;
  int64_t created_at_ms_epoch = 0;
  int64_t last_updated_at_ms_epoch = 0;
  PyTaskId assigned_client{0, 0};
  std::string message;
};

// A client id of 32 hex digits (ours: RandomClientId) as upstream's (u64, u64).
PyTaskId ClientUuid(const std::string& id) {
  if (id.size() != 32) return {0, 0};
  uint64_t parts[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    const char ch = id[i];
    int v = (ch >= '0' && ch <= '9') ? ch - '0'
            : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10
            : (ch >= 'A' && ch <= 'F') ? ch - 'A' + 10 : -1;
    if (v < 0) return {0, 0};
    parts[i / 16] = parts[i / 16] << 4 | static_cast<uint64_t>(v);
  }
  return {parts[0], parts[1]};
}

py::tuple Created(int rc, const StoreClient::TaskId& id) {
  return py::make_tuple(rc == 0 ? PyTaskId{id.hi, id.lo} : PyTaskId{0, 0}, rc);
}

}  // namespace

void BindTasks(py::module_& m, py::class_<PyStore>& c) {
  py::enum_<PyTaskType>(m, "TaskType")
      .value("REPLICA_COPY", PyTaskType::REPLICA_COPY)
      .value("REPLICA_MOVE", PyTaskType::REPLICA_MOVE)
      .export_values();
  py::enum_<PyTaskStatus>(m, "TaskStatus")
      .value("PENDING", PyTaskStatus::PENDING)
      .value("PROCESSING", PyTaskStatus::PROCESSING)
      .value("SUCCESS", PyTaskStatus::SUCCESS)
      .value("FAILED", PyTaskStatus::FAILED)
      .export_values();
  py::class_<PyQueryTaskResponse>(m, "QueryTaskResponse")
      .def_readonly("id", &PyQueryTaskResponse::id)
      .def_readonly("type", &PyQueryTaskResponse::type)
      .def_readonly("status", &PyQueryTaskResponse::status)
      .def_readonly("created_at_ms_epoch", &PyQueryTaskResponse::created_at_ms_epoch)
      .def_readonly("last_updated_at_ms_epoch", &PyQueryTaskResponse::last_updated_at_ms_epoch)
      .def_readonly("assigned_client", &PyQueryTaskResponse::assigned_client)
      .def_readonly("message", &PyQueryTaskResponse::message)
      .def("__repr__", [](const PyQueryTaskResponse& r) {
        return "QueryTaskResponse(id=(" + std::to_string(r.id.first) + ", " +
               std::to_string(r.id.second) + "), type=" +
               std::to_string(static_cast<uint32_t>(r.type)) +
               ", status=" + std::to_string(static_cast<uint32_t>(r.status)) +
               ", created_at_ms_epoch=" + std::to_string(r.created_at_ms_epoch) +
               ", last_updated_at_ms_epoch=" + std::to_string(r.last_updated_at_ms_epoch) +
               ", message='" + r.message + "')";
      });

  py::enum_<PyReplicaStatus>(m, "ReplicaStatus")
      .value("UNDEFINED", PyReplicaStatus::UNDEFINED)
      .value("INITIALIZED", PyReplicaStatus::INITIALIZED)
      .value("PROCESSING", PyReplicaStatus::PROCESSING)
      .value("COMPLETE", PyReplicaStatus::COMPLETE)
      .value("REMOVED", PyReplicaStatus::REMOVED)
      .value("FAILED", PyReplicaStatus::FAILED)
      .export_values();
  py::class_<PyBufferDescriptor>(m, "Descriptor")
      .def(py::init<>())
      .def_readwrite("size", &PyBufferDescriptor::size)
      .def_readwrite("buffer_address", &PyBufferDescriptor::buffer_address)
      .def_readwrite("transport_endpoint", &PyBufferDescriptor::transport_endpoint)
      .def("__repr__", [](const PyBufferDescriptor& d) {
        return "<Descriptor size=" + std::to_string(d.size) +
               " buffer_address=" + std::to_string(d.buffer_address) +
               " transport_endpoint=" + d.transport_endpoint + ">";
      });
  py::class_<PyMemoryDescriptor>(m, "MemoryDescriptor")
      .def_readwrite("buffer_descriptor", &PyMemoryDescriptor::buffer_descriptor);
  py::class_<PyDiskDescriptor>(m, "DiskDescriptor")
      .def_readwrite("file_path", &PyDiskDescriptor::file_path)
      .def_readwrite("object_size", &PyDiskDescriptor::object_size);
  py::class_<PyReplicaDescriptor>(m, "ReplicaDescriptor")
      .def_readonly("status", &PyReplicaDescriptor::status)
      .def("is_memory_replica", [](const PyReplicaDescriptor& d) { return !d.local_disk; })
      // upstream's legacy DISK replicas (--root_fs_dir): not built; local-disk ones are.
      .def("is_disk_replica", [](const PyReplicaDescriptor&) { return false; })
      .def("is_local_disk_replica", [](const PyReplicaDescriptor& d) { return d.local_disk; })
      .def("get_memory_descriptor",
           [](const PyReplicaDescriptor& d) -> const PyMemoryDescriptor& { return d.memory; },
           py::return_value_policy::reference_internal)
      .def("get_disk_descriptor", [](const PyReplicaDescriptor& d) -> PyDiskDescriptor {
        if (!d.local_disk) throw std::runtime_error("not a disk replica");
        return d.disk;
      });

  c.def(
      "get_offload_rpc_read_count",
      [](PyStore& s) -> int64_t {
        auto cl = s.Get();
        return cl ? static_cast<int64_t>(cl->offload_rpc_reads()) : 0;
      },
      "Objects this client read from a disk replica (the disk tier).");
  c.def(
      "unmount_local_disk_segment",
      [](PyStore& s, uint64_t grace_period_seconds) -> int {
        auto cl = s.Get("unmount_local_disk_segment");
        if (!cl) return ToInt(ErrorCode::INVALID_PARAMS);
        py::gil_scoped_release release;
        return cl->UnmountDisk(static_cast<int64_t>(grace_period_seconds));
      },
      py::arg("grace_period_seconds") = 0,
      "Stops writing to this client's disk; after grace_period_seconds readers are no longer "
      "sent to it. 0, or a negative code.");
  c.def(
      "get_replica_desc",
      [](PyStore& s, const std::string& key) {
        std::vector<StoreClient::KeyReplicas> got;
        if (auto cl = s.Get("get_replica_desc")) {
          py::gil_scoped_release release;
          got = cl->BatchQueryReplicas({key});
        }
        if (got.empty()) return std::vector<PyReplicaDescriptor>();
        if (got[0].code != 0) {
          LOG(ERROR) << "get_replica_desc: key " << key << ": " << store::ErrorCodeName(got[0].code);
        }
        return Descriptors(got[0]);
      },
      py::arg("key"),
      "The key's complete replicas (ReplicaDescriptor), [] when it is missing. Grants a read "
      "lease, as upstream's.");
  c.def(
      "batch_get_replica_desc",
      [](PyStore& s, const std::vector<std::string>& keys) {
        std::vector<StoreClient::KeyReplicas> got;
        if (auto cl = s.Get("batch_get_replica_desc")) {
          py::gil_scoped_release release;
          got = cl->BatchQueryReplicas(keys);
        }
        std::map<std::string, std::vector<PyReplicaDescriptor>> out;
        for (size_t i = 0; i < got.size(); ++i) {
          if (got[i].code == 0) {
            out[keys[i]] = Descriptors(got[i]);
          } else {
            LOG(ERROR) << "batch_get_replica_desc: key " << keys[i] << ": "
                       << store::ErrorCodeName(got[i].code);
          }
        }
        return out;
      },
      py::arg("keys"), "{key: [ReplicaDescriptor]} of the keys found.");
  c.def(
      "create_copy_task",
      [](PyStore& s, const std::string& key, const std::vector<std::string>& targets) {
        StoreClient::TaskId id;
        int rc = kNotReady;
        if (auto cl = s.Get("create_copy_task")) {
          py::gil_scoped_release release;
          rc = cl->CreateCopyTask(key, targets, &id);
        }
        return Created(rc, id);
      },
      py::arg("key"), py::arg("targets"),
      "Copies the object's replica to each target segment (by the engine of the client owning "
      "the source): (task_id, 0) or ((0, 0), code). The new replicas are readable once "
      "query_task says SUCCESS.");
  c.def(
      "create_move_task",
      [](PyStore& s, const std::string& key, const std::string& source, const std::string& target) {
        StoreClient::TaskId id;
        int rc = kNotReady;
        if (auto cl = s.Get("create_move_task")) {
          py::gil_scoped_release release;
          rc = cl->CreateMoveTask(key, source, target, &id);
        }
        return Created(rc, id);
      },
      py::arg("key"), py::arg("source"), py::arg("target"),
      "Moves the object's replica on segment source to segment target (the source is dropped "
      "when the copy is complete): (task_id, 0) or ((0, 0), code).");
  c.def(
      "query_task",
      [](PyStore& s, const PyTaskId& task_id) -> py::tuple {
        StoreClient::TaskInfo info;
        int rc = kNotReady;
        if (auto cl = s.Get("query_task")) {
          py::gil_scoped_release release;
          rc = cl->QueryTask({task_id.first, task_id.second}, &info);
        }
        if (rc != 0) return py::make_tuple(py::none(), rc);
        PyQueryTaskResponse r;
        r.id = {info.id.hi, info.id.lo};
        r.type = static_cast<PyTaskType>(info.type);
        r.status = static_cast<PyTaskStatus>(info.status);
        r.created_at_ms_epoch = info.created_at_ms;
        r.last_updated_at_ms_epoch = info.last_updated_at_ms;
        r.assigned_client = ClientUuid(info.assigned_client);
        r.message = info.message;
        return py::make_tuple(py::cast(r), 0);
      },
      py::arg("task_id"),
      "(QueryTaskResponse, 0), or (None, code): TASK_NOT_FOUND (-1400) for an unknown id.");
}

}  // namespace store_py
}  // namespace pyapi
}  // namespace mooncake
