// MooncakeDistributedStore's run-time segments, upstream's calls and return shapes:
// mount_segment(path, size, offset=0, protocol="tcp", location="") and
// allocate_and_mount_segment(size, protocol="tcp", location="") return a dict {"ret": 0 or a
// negative code, "segment_ids": [id]} (the latter with "allocated_size": size rounded up to
// 16 MiB); unmount_segment / unmount_and_free_segment(segment_ids, grace_period_seconds=0)
// return 0 or the first failure (each id is tried). `protocol` is accepted as upstream's (it
// only chooses a registration size limit there; this engine has none). StoreClient's
// MountFileSegment / AllocateSegment / UnmountSegment do the work.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <glog/logging.h>

#include <string>
#include <vector>

#include "store_py.h"

namespace mooncake {
namespace pyapi {
namespace store_py {
namespace {

py::dict Mounted(int ret, const std::string& id) {
  py::dict d;
  d["ret"] = ret;
  py::list ids;
  if (ret == 0) ids.append(id);
  d["segment_ids"] = ids;
  return d;
}

int UnmountAll(PyStore& s, const char* method, const std::vector<std::string>& ids,
               int64_t grace_s, bool allocated) {
  auto c = s.Get(method);
  if (!c) return kNotReady;
  if (grace_s < 0) {
    LOG(WARNING) << method << ": grace_period_seconds " << grace_s << " is negative";
    return ToInt(ErrorCode::INVALID_PARAMS);
  }
  py::gil_scoped_release release;
  int first = 0;
  for (const auto& id : ids) {
    const int rc = c->UnmountSegment(id, allocated, grace_s);
    if (rc != 0 && first == 0) first = rc;
  }
  return first;
}

}  // namespace

void BindSegments(py::class_<PyStore>& c) {
  c.def(
      "mount_segment",
      [](PyStore& s, const std::string& path, uint64_t size, uint64_t offset,
         const std::string& protocol, const std::string& location) {
        (void)protocol;
        std::string id;
        int rc = kNotReady;
        if (auto cl = s.Get("mount_segment")) {
          py::gil_scoped_release release;
          rc = cl->MountFileSegment(path, offset, size, location, &id);
        }
        return Mounted(rc, id);
      },
      py::arg("path"), py::arg("size"), py::arg("offset") = 0, py::arg("protocol") = "tcp",
      py::arg("location") = "",
      "Maps size bytes of the file at path (a /dev/shm object, hugetlbfs or regular file) from "
      "offset (page-aligned, inside the file) and lends them to the pool: {'ret': 0 or a "
      "negative code, 'segment_ids': [id]}.");
  c.def(
      "allocate_and_mount_segment",
      [](PyStore& s, uint64_t size, const std::string& protocol, const std::string& location) {
        (void)protocol;
        std::string id;
        uint64_t allocated = 0;
        int rc = kNotReady;
        if (auto cl = s.Get("allocate_and_mount_segment")) {
          py::gil_scoped_release release;
          rc = cl->AllocateSegment(size, location, &id, &allocated);
        }
        py::dict d = Mounted(rc, id);
        d["allocated_size"] = allocated;
        return d;
      },
      py::arg("size"), py::arg("protocol") = "tcp", py::arg("location") = "",
      "Allocates size bytes (rounded up to 16 MiB) and lends them to the pool: {'ret', "
      "'segment_ids', 'allocated_size'}.");
  c.def(
      "unmount_segment",
      [](PyStore& s, const std::vector<std::string>& ids, int64_t grace_s) {
        return UnmountAll(s, "unmount_segment", ids, grace_s, false);
      },
      py::arg("segment_ids"), py::arg("grace_period_seconds") = 0,
      "Unmounts segments of mount_segment (after grace_period_seconds when > 0): their objects "
      "leave the pool, the file is unmapped. 0 or the first failure.");
  c.def(
      "unmount_and_free_segment",
      [](PyStore& s, const std::vector<std::string>& ids, int64_t grace_s) {
        return UnmountAll(s, "unmount_and_free_segment", ids, grace_s, true);
      },
      py::arg("segment_ids"), py::arg("grace_period_seconds") = 0,
      "Unmounts and frees segments of allocate_and_mount_segment. 0 or the first failure.");
}

}  // namespace store_py
}  // namespace pyapi
}  // namespace mooncake
