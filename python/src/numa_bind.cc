// mooncake.store.bind_to_numa_node(node): upstream's module function. Binds the calling
// thread to the CPUs of NUMA node `node` (sched_setaffinity) and makes that node its preferred
// one for new memory (set_mempolicy MPOL_PREFERRED), read from /sys, without libnuma. As
// upstream, it returns nothing and only logs a warning when it cannot bind (no NUMA in /sys,
// a node that does not exist, a call the kernel refuses): the thread then runs as before.
// get_alloc_func_addr() / get_free_func_addr(): upstream's module functions, the addresses of
// `void* alloc(size_t)` / `void free(void*)` for a pluggable allocator. Upstream's allocate
// SPDK hugepage memory in its NoF build and return NULL (free: nothing) in any other; NoF is
// not built here, so these are the latter.
#include <pybind11/pybind11.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <glog/logging.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace mooncake {
namespace pyapi {

namespace py = pybind11;

namespace {

constexpr int kMpolPreferred = 1;  // MPOL_PREFERRED (linux/mempolicy.h)

// "0-3,8,10-11" -> the CPU numbers; false when it does not read as a list.
bool ParseCpuList(const std::string& text, std::vector<int>* cpus) {
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (part.empty() || part == "\n") continue;
    const size_t dash = part.find('-');
    try {
      const int lo = std::stoi(part.substr(0, dash));
      const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
      if (lo < 0 || hi < lo || hi >= CPU_SETSIZE) return false;
      for (int c = lo; c <= hi; ++c) cpus->push_back(c);
    } catch (const std::exception&) {
      return false;
    }
  }
  return true;
}

void BindToNumaNode(int node) {
  if (node < 0) {
    LOG(WARNING) << "bind_to_numa_node(" << node << "): not a NUMA node; binding skipped";
    return;
  }
  std::ifstream list("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
  if (!list) {
    LOG(WARNING) << "bind_to_numa_node(" << node << "): no such NUMA node on this host ("
                 << "/sys/devices/system/node lists the nodes); binding skipped";
    return;
  }
  std::string text((std::istreambuf_iterator<char>(list)), std::istreambuf_iterator<char>());
  std::vector<int> cpus;
  if (!ParseCpuList(text, &cpus) || cpus.empty()) {
    LOG(WARNING) << "bind_to_numa_node(" << node << "): node has no CPUs ('" << text
                 << "'); binding skipped";
    return;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    PLOG(WARNING) << "bind_to_numa_node(" << node << "): sched_setaffinity";
    return;
  }
  if (node < 64) {
    unsigned long mask = 1UL << node;
    if (syscall(SYS_set_mempolicy, kMpolPreferred, &mask, sizeof(mask) * 8 + 1) != 0) {
      PLOG(WARNING) << "bind_to_numa_node(" << node
                    << "): set_mempolicy (the CPUs are bound, memory is not)";
    }
  }
}

extern "C" void* McNoFHugepageAlloc(size_t) { return nullptr; }  // no NoF (SPDK) here
extern "C" void McNoFHugepageFree(void*) {}

}  // namespace

void BindNuma(py::module_& m) {
  m.def("get_alloc_func_addr", [] { return reinterpret_cast<uintptr_t>(&McNoFHugepageAlloc); },
        "Address of upstream's hugepage alloc function `void* (size_t)`: returns NULL here (as "
        "upstream's builds without NoF).");
  m.def("get_free_func_addr", [] { return reinterpret_cast<uintptr_t>(&McNoFHugepageFree); },
        "Address of the matching free function `void (void*)` (does nothing here).");
  m.def("bind_to_numa_node", &BindToNumaNode, py::arg("node"),
        "Binds the calling thread to the CPUs of NUMA node `node` and prefers that node for its "
        "new memory. Returns None; a node that does not exist (or no NUMA) logs a warning and "
        "changes nothing.");
}

}  // namespace pyapi
}  // namespace mooncake
