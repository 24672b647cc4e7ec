// MooncakeDistributedStore's replica tasks, upstream's calls and shapes:
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

#include <cstdio>
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
