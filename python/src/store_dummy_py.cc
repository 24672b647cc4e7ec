// The standalone-storage pieces of mooncake.store beside MooncakeDistributedStore.setup_dummy
// (store_py.cc): MooncakeHostMemAllocator, the host memory allocator SGLang's standalone path
// allocates its host KV buffers with before it register_buffer()s them on a dummy client.
#include <glog/logging.h>
#include <pybind11/pybind11.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

namespace py = pybind11;

namespace mooncake {
namespace pyapi {

namespace {

// Page-aligned shared anonymous mappings. A dummy client's engine registers such memory with
// register_buffer, and the real client's engine then copies straight between it and its
// segment (process_vm_readv / writev: one copy), so any host memory would do; this one is
// page aligned and never moved or shared with a forked child by accident of malloc.
class HostMemAllocator {
 public:
  ~HostMemAllocator() = default;  // mappings outlive the allocator: tensors may still use them

  uintptr_t Alloc(size_t size) {
    if (size == 0) {
      LOG(WARNING) << "MooncakeHostMemAllocator.alloc: zero size";
      return 0;
    }
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    if (size > SIZE_MAX - page) {
      LOG(WARNING) << "MooncakeHostMemAllocator.alloc: " << size << " bytes is too large";
      return 0;
    }
    const size_t len = (size + page - 1) / page * page;
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      LOG(WARNING) << "MooncakeHostMemAllocator.alloc(" << size << "): " << std::strerror(errno);
      return 0;
    }
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[reinterpret_cast<uintptr_t>(p)] = len;
    return reinterpret_cast<uintptr_t>(p);
  }

  int Free(uintptr_t ptr) {
    size_t len = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sizes_.find(ptr);
      if (it == sizes_.end()) {
        LOG(WARNING) << "MooncakeHostMemAllocator.free: " << ptr << " is not from alloc";
        return -1;
      }
      len = it->second;
      sizes_.erase(it);
    }
    return ::munmap(reinterpret_cast<void*>(ptr), len) == 0 ? 0 : -1;
  }

 private:
  std::mutex mu_;
  std::map<uintptr_t, size_t> sizes_;
};

}  // namespace

void BindStoreDummy(py::module_& m) {
  py::class_<HostMemAllocator>(m, "MooncakeHostMemAllocator",
                               "Host memory for buffers a dummy client registers "
                               "(register_buffer) and moves with put_from / get_into.")
      .def(py::init<>())
      .def("alloc", &HostMemAllocator::Alloc, py::arg("size"),
           py::call_guard<py::gil_scoped_release>(),
           "Address of `size` fresh zeroed bytes (page aligned), or 0 on failure.")
      .def("free", &HostMemAllocator::Free, py::arg("ptr"),
           py::call_guard<py::gil_scoped_release>(),
           "Unmaps memory from alloc: 0, or -1 for an address alloc did not return.");
}

}  // namespace pyapi
}  // namespace mooncake
