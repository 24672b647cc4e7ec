// A stand-in libascendcl.so for tests: the aclrt* calls the Ascend backend
// (src/platform/ascend_backend.cc) makes, over host memory, so that the backend's own code
// runs on machines without an NPU (ctest device_fake_acl.*, LD_LIBRARY_PATH pointing here).
// It enforces the ACL rules the backend must follow, as CANN documents them: aclInit first;
// a current device (aclrtSetDevice) for allocations, streams and events; calls on a stream or
// event with its device current; the copy kind matching the memories; memory imported by
// aclrtIpcMemImportByKey copied device to device only; keys of 65 bytes. It is not CANN: its
// prototypes are this project's, so it proves the backend consistent with them, not with ACL.
// "Device memory" is a memfd mapping (the CPU could touch it; the simulated backend is the
// one that catches stray CPU accesses). Streams run their copies at once.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace {

constexpr int kOk = 0;
constexpr int kInvalidParam = 100000;    // ACL_ERROR_INVALID_PARAM
constexpr int kUninitialized = 100001;   // ACL_ERROR_UNINITIALIZE
constexpr int kRepeatInit = 100002;      // ACL_ERROR_REPEAT_INITIALIZE
constexpr int kNoContext = 107002;       // ACL_ERROR_RT_CONTEXT_NULL
constexpr int kNotSupported = 207000;    // ACL_ERROR_RT_FEATURE_NOT_SUPPORT
constexpr int kDriverInternal = 507899;  // ACL_ERROR_RT_DRV_INTERNAL_ERROR

struct Alloc {
  uint64_t length;
  int device;  // -1: pinned host memory
  int fd;
  bool imported;
  std::string key;
};
struct FakeStream {
  int device;
};
struct FakeEvent {
  int device;
};

std::mutex mu;
std::map<uint64_t, Alloc> allocs;  // base -> allocation
bool initialized = false;
thread_local int current = -1;
thread_local const char* last_error = "";

int Devices() {
  const char* e = std::getenv("FAKE_ACL_DEVICES");
  return e && *e ? std::atoi(e) : 2;
}

int Fail(int code, const char* why) {
  last_error = why;
  return code;
}

// REQUIRES: mu held.
const Alloc* Find(const void* p, uint64_t* base) {
  auto a = reinterpret_cast<uint64_t>(p);
  auto it = allocs.upper_bound(a);
  if (it == allocs.begin()) return nullptr;
  --it;
  if (a >= it->first + it->second.length) return nullptr;
  *base = it->first;
  return &it->second;
}

// -1 host (pinned or not), else the device; *imported when memory came from a peer's key.
int Where(const void* p, bool* imported) {
  std::lock_guard lock(mu);
  uint64_t base = 0;
  const Alloc* a = Find(p, &base);
  *imported = a && a->imported;
  return a ? a->device : -1;
}

int CheckCopy(void* dst, size_t dest_max, const void* src, size_t count, int kind) {
  if (count > dest_max) return Fail(kInvalidParam, "count > destMax");
  bool di = false, si = false;
  int d = Where(dst, &di), s = Where(src, &si);
  int want = d >= 0 && s >= 0 ? 3 : d >= 0 ? 1 : s >= 0 ? 2 : 0;
  if (kind != want) return Fail(kInvalidParam, "copy kind does not match the memories");
  if ((di || si) && want != 3) {
    return Fail(kNotSupported, "imported IPC memory copies device to device only");
  }
  std::lock_guard lock(mu);  // one copy engine (and TSan sees the device's ordering)
  std::memmove(dst, src, count);
  return kOk;
}

}  // namespace

extern "C" {

int aclInit(const char*) {
  std::lock_guard lock(mu);
  if (initialized) return kRepeatInit;
  initialized = true;
  return kOk;
}
int aclrtGetDeviceCount(uint32_t* n) {
  if (!initialized) return Fail(kUninitialized, "aclInit first");
  *n = static_cast<uint32_t>(Devices());
  return kOk;
}
int aclrtSetDevice(int32_t d) {
  if (!initialized) return Fail(kUninitialized, "aclInit first");
  if (d < 0 || d >= Devices()) return Fail(kInvalidParam, "no such device");
  current = d;
  return kOk;
}
int aclrtGetDevice(int32_t* d) {
  if (current < 0) return Fail(kNoContext, "no current device");
  *d = current;
  return kOk;
}
int aclrtMalloc(void** p, size_t size, int) {
  if (current < 0) return Fail(kNoContext, "aclrtMalloc without a current device");
  if (size == 0) return Fail(kInvalidParam, "size 0");
  int fd = ::memfd_create("fake-acl", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) return Fail(kInvalidParam, "memfd");
  void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return Fail(kInvalidParam, "mmap");
  std::lock_guard lock(mu);
  allocs[reinterpret_cast<uint64_t>(m)] = Alloc{size, current, fd, false, ""};
  *p = m;
  return kOk;
}
int aclrtFree(void* p) {
  std::lock_guard lock(mu);
  auto it = allocs.find(reinterpret_cast<uint64_t>(p));
  if (it == allocs.end() || it->second.device < 0 || it->second.imported) {
    return Fail(kInvalidParam, "aclrtFree of memory aclrtMalloc did not return");
  }
  ::munmap(p, it->second.length);
  ::close(it->second.fd);
  allocs.erase(it);
  return kOk;
}
int aclrtMallocHost(void** p, size_t size) {
  void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return Fail(kInvalidParam, "mmap");
  std::lock_guard lock(mu);
  allocs[reinterpret_cast<uint64_t>(m)] = Alloc{size, -1, -1, false, ""};
  *p = m;
  return kOk;
}
int aclrtFreeHost(void* p) {
  std::lock_guard lock(mu);
  auto it = allocs.find(reinterpret_cast<uint64_t>(p));
  if (it == allocs.end() || it->second.device >= 0) {
    return Fail(kInvalidParam, "aclrtFreeHost of memory aclrtMallocHost did not return");
  }
  ::munmap(p, it->second.length);
  allocs.erase(it);
  return kOk;
}
int aclrtMemcpy(void* dst, size_t dest_max, const void* src, size_t count, int kind) {
  if (current < 0) return Fail(kNoContext, "aclrtMemcpy without a current device");
  return CheckCopy(dst, dest_max, src, count, kind);
}
int aclrtMemcpyAsync(void* dst, size_t dest_max, const void* src, size_t count, int kind,
                     void* stream) {
  auto* s = static_cast<FakeStream*>(stream);
  if (s == nullptr || s->device != current) {
    return Fail(kNoContext, "stream used without its device current");
  }
  return CheckCopy(dst, dest_max, src, count, kind);
}
int aclrtCreateStream(void** stream) {
  if (current < 0) return Fail(kNoContext, "aclrtCreateStream without a current device");
  *stream = new FakeStream{current};
  return kOk;
}
int aclrtDestroyStream(void* stream) {
  delete static_cast<FakeStream*>(stream);
  return kOk;
}
int aclrtSynchronizeStream(void* stream) {
  auto* s = static_cast<FakeStream*>(stream);
  return s && s->device == current ? kOk : Fail(kNoContext, "stream without its device");
}
int aclrtCreateEvent(void** event) {
  if (current < 0) return Fail(kNoContext, "aclrtCreateEvent without a current device");
  *event = new FakeEvent{current};
  return kOk;
}
int aclrtDestroyEvent(void* event) {
  delete static_cast<FakeEvent*>(event);
  return kOk;
}
int aclrtRecordEvent(void* event, void* stream) {
  auto* e = static_cast<FakeEvent*>(event);
  auto* s = static_cast<FakeStream*>(stream);
  if (!e || !s || e->device != s->device || s->device != current) {
    return Fail(kInvalidParam, "event, stream and current device differ");
  }
  return kOk;
}
int aclrtSynchronizeEvent(void* event) {
  auto* e = static_cast<FakeEvent*>(event);
  return e && e->device == current ? kOk : Fail(kNoContext, "event without its device");
}

struct PtrAttributes {
  uint32_t id;
  uint32_t type;
  uint32_t page_size;
  uint32_t rsv[4];
};
int aclrtPointerGetAttributes(const void* p, PtrAttributes* attr) {
  std::lock_guard lock(mu);
  uint64_t base = 0;
  const Alloc* a = Find(p, &base);
  std::memset(attr, 0, sizeof(*attr));
  attr->type = a == nullptr ? 2 : a->device < 0 ? 0 : 1;  // UNREGISTERED / HOST / DEVICE
  attr->id = a && a->device >= 0 ? static_cast<uint32_t>(a->device) : 0;
  attr->page_size = 4096;
  return kOk;
}
int aclrtMemGetAddressRange(void* p, void** pbase, size_t* psize) {
  std::lock_guard lock(mu);
  uint64_t base = 0;
  const Alloc* a = Find(p, &base);
  if (a == nullptr) return Fail(kInvalidParam, "not ACL memory");
  *pbase = reinterpret_cast<void*>(base);
  *psize = a->length;
  return kOk;
}
int aclrtIpcMemGetExportKey(void* p, size_t size, char* key, size_t len, uint64_t flags) {
  if (len != 65) return Fail(kInvalidParam, "key length must be 65");
  std::lock_guard lock(mu);
  auto it = allocs.find(reinterpret_cast<uint64_t>(p));
  if (it == allocs.end() || it->second.device < 0 || it->second.imported ||
      it->second.length != size) {
    return Fail(kInvalidParam, "export: not a whole device allocation");
  }
  std::snprintf(key, len, "fakeacl-%d-%d-%llu-%d-%d", static_cast<int>(::getpid()),
                it->second.fd, static_cast<unsigned long long>(size), it->second.device,
                flags == 1 ? 0 : 1);
  return kOk;
}
int aclrtIpcMemImportByKey(void** p, const char* key, uint64_t) {
  if (current < 0) return Fail(kNoContext, "import without a current device");
  int pid = 0, fd = 0, device = 0, pid_check = 0;
  unsigned long long size = 0;
  if (std::sscanf(key, "fakeacl-%d-%d-%llu-%d-%d", &pid, &fd, &size, &device, &pid_check) != 5) {
    return Fail(kInvalidParam, "not a key");
  }
  if (pid_check) return Fail(kDriverInternal, "pid not in the key's whitelist");
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  int mfd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (mfd < 0) return Fail(kInvalidParam, "key's memory is gone");
  void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  if (m == MAP_FAILED) return Fail(kInvalidParam, "mmap");
  std::lock_guard lock(mu);
  allocs[reinterpret_cast<uint64_t>(m)] = Alloc{size, device, mfd, true, key};
  *p = m;
  return kOk;
}
int aclrtIpcMemClose(const char* key) {
  std::lock_guard lock(mu);
  for (auto it = allocs.begin(); it != allocs.end(); ++it) {
    if (it->second.imported && it->second.key == key) {
      ::munmap(reinterpret_cast<void*>(it->first), it->second.length);
      ::close(it->second.fd);
      allocs.erase(it);
      return kOk;
    }
  }
  return kOk;  // the exporter's own close
}
const char* aclGetRecentErrMsg() { return last_error; }

}  // extern "C"
