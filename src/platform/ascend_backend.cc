// The Ascend backend: the ACL runtime (libascendcl.so, from the CANN toolkit) loaded with
// dlopen at first use. The few prototypes and constants it needs are declared here, their
// signatures and values taken from CANN's ACL runtime documentation (aclrtMemcpyKind,
// aclrtPtrAttributes, aclrtIpcMem*), so building needs no CANN header and linking no CANN
// library. NOT YET RUN ON AN NPU: every call below is written from the documentation; the
// engine's Ascend paths are tested on the simulated backend (MC_DEVICE_SIM=npu) only.
//
// ACL's rules this follows:
//   - aclInit once per process (ACL_ERROR_REPEAT_INITIALIZE when torch_npu did it: fine).
//   - A thread reaches a device through its current context (aclrtSetDevice); calls on a
//     stream or event run with that stream's device current, restoring the caller's.
//   - Copies name their direction (memory imported from another process refuses
//     ACL_MEMCPY_DEFAULT and any copy with host memory: IpcCopiesWithHost() is false).
//   - IPC: the owner exports a key per allocation (aclrtIpcMemGetExportKey, 65 bytes with the
//     NUL, process whitelist disabled), the peer imports it (aclrtIpcMemImportByKey) and
//     closes it by key (aclrtIpcMemClose).
#include <dlfcn.h>
#include <glog/logging.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "platform/device_backends.h"

namespace mooncake::platform {
namespace {

using aclError = int;
using aclrtStream = void*;
using aclrtEvent = void*;
constexpr aclError kAclSuccess = 0;
constexpr aclError kAclRepeatInitialize = 100002;  // ACL_ERROR_REPEAT_INITIALIZE
// aclrtMemcpyKind
constexpr int kHostToDevice = 1;
constexpr int kDeviceToHost = 2;
constexpr int kDeviceToDevice = 3;
constexpr int kMallocHugeFirst = 0;           // ACL_MEM_MALLOC_HUGE_FIRST
constexpr uint32_t kLocationDevice = 1;       // ACL_MEM_LOCATION_TYPE_DEVICE
constexpr size_t kIpcKeyLength = 65;          // the documented key buffer, NUL included
constexpr uint64_t kExportNoPidCheck = 0x1;   // ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION
constexpr uint64_t kImportPeerAccess = 0x1;   // ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS
static_assert(kIpcKeyLength - 1 == kIpcHandleSize, "an ACL key fills an IpcHandle");

struct MemLocation {  // aclrtMemLocation
  uint32_t id;
  uint32_t type;  // aclrtMemLocationType
};
struct PtrAttributes {  // aclrtPtrAttributes, with room for later fields
  MemLocation location;
  uint32_t page_size;
  uint32_t rsv[4];
  uint32_t spare[16];
};

struct Api {
  aclError (*Init)(const char*);
  aclError (*GetDeviceCount)(uint32_t*);
  aclError (*SetDevice)(int32_t);
  aclError (*GetDevice)(int32_t*);
  aclError (*Malloc)(void**, size_t, int);
  aclError (*Free)(void*);
  aclError (*MallocHost)(void**, size_t);
  aclError (*FreeHost)(void*);
  aclError (*Memcpy)(void*, size_t, const void*, size_t, int);
  aclError (*MemcpyAsync)(void*, size_t, const void*, size_t, int, aclrtStream);
  aclError (*CreateStream)(aclrtStream*);
  aclError (*DestroyStream)(aclrtStream);
  aclError (*SynchronizeStream)(aclrtStream);
  aclError (*CreateEvent)(aclrtEvent*);
  aclError (*DestroyEvent)(aclrtEvent);
  aclError (*RecordEvent)(aclrtEvent, aclrtStream);
  aclError (*SynchronizeEvent)(aclrtEvent);
  aclError (*PointerGetAttributes)(const void*, PtrAttributes*);
  // Optional (same-host IPC; without them NPU memory reaches same-host peers over TCP).
  aclError (*MemGetAddressRange)(void*, void**, size_t*);
  aclError (*IpcMemGetExportKey)(void*, size_t, char*, size_t, uint64_t);
  aclError (*IpcMemImportByKey)(void**, const char*, uint64_t);
  aclError (*IpcMemClose)(const char*);
  const char* (*GetRecentErrMsg)();
};

// Our stream and event handles: ACL's, with the device they belong to.
struct Stream {
  aclrtStream s;
  int device;
};
struct Event {
  aclrtEvent e;  // null until first recorded
  int device;    // of e; -1 until then
};

class AscendBackend final : public DeviceBackend {
 public:
  const char* name() const override { return "ascend"; }
  const char* location_prefix() const override { return "npu"; }
  bool IpcCopiesWithHost() const override { return false; }

  Status Available() override {
    std::call_once(once_, [this] { load_status_ = LoadOnce(); });
    return load_status_;
  }
  int DeviceCount() override { return Available().ok() ? device_count_ : 0; }

  int DeviceOf(const void* addr) override {
    if (!Available().ok() || addr == nullptr) return kHostMemory;
    {
      MutexLock lock(&mu_);
      auto it = imported_.upper_bound(reinterpret_cast<uint64_t>(addr));
      if (it != imported_.begin()) {
        --it;
        if (reinterpret_cast<uint64_t>(addr) < it->first + it->second.size) {
          return it->second.device;
        }
      }
    }
    DeviceGuard guard(this, -1);
    PtrAttributes attr{};
    if (api_.PointerGetAttributes(addr, &attr) != kAclSuccess) return kHostMemory;
    return attr.location.type == kLocationDevice ? static_cast<int>(attr.location.id)
                                                 : kHostMemory;
  }

  Result<void*> Malloc(int device, size_t length) override {
    MC_RETURN_IF_ERROR(CheckDevice(device));
    DeviceGuard guard(this, device);
    void* p = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.Malloc(&p, length, kMallocHugeFirst),
                             "aclrtMalloc(" + std::to_string(length) + ") on npu:" +
                                 std::to_string(device)));
    return p;
  }
  Status Free(void* p) override {
    MC_RETURN_IF_ERROR(Available());
    DeviceGuard guard(this, -1);
    return Check(api_.Free(p), "aclrtFree");
  }
  Result<void*> MallocHost(size_t length) override {
    MC_RETURN_IF_ERROR(Available());
    DeviceGuard guard(this, -1);
    void* p = nullptr;
    MC_RETURN_IF_ERROR(
        Check(api_.MallocHost(&p, length), "aclrtMallocHost(" + std::to_string(length) + ")"));
    return p;
  }
  Status FreeHost(void* p) override {
    MC_RETURN_IF_ERROR(Available());
    DeviceGuard guard(this, -1);
    return Check(api_.FreeHost(p), "aclrtFreeHost");
  }
  Status SetDevice(int device) override {
    MC_RETURN_IF_ERROR(CheckDevice(device));
    return Check(api_.SetDevice(device), "aclrtSetDevice(" + std::to_string(device) + ")");
  }
  int CurrentDevice() override {
    int32_t d = 0;
    if (!Available().ok() || api_.GetDevice(&d) != kAclSuccess) return 0;
    return d;
  }

  Status Copy(void* dst, const void* src, size_t length) override {
    MC_RETURN_IF_ERROR(Available());
    int d = DeviceOf(dst), s = DeviceOf(src);
    if (d < 0 && s < 0) {
      std::memcpy(dst, src, length);
      return Status::OK();
    }
    DeviceGuard guard(this, d >= 0 ? d : s);
    return Check(api_.Memcpy(dst, length, src, length, KindOf(d, s)), "aclrtMemcpy");
  }

  Result<StreamHandle> CreateStream() override {
    MC_RETURN_IF_ERROR(Available());
    auto* st = new Stream{nullptr, CurrentDevice()};
    DeviceGuard guard(this, st->device);
    Status s = Check(api_.CreateStream(&st->s), "aclrtCreateStream");
    if (!s.ok()) {
      delete st;
      return s;
    }
    return static_cast<StreamHandle>(st);
  }
  void DestroyStream(StreamHandle h) override {
    auto* st = static_cast<Stream*>(h);
    if (st == nullptr) return;
    if (Available().ok()) {
      DeviceGuard guard(this, st->device);
      (void)api_.DestroyStream(st->s);
    }
    delete st;
  }
  Status CopyAsync(void* dst, const void* src, size_t length, StreamHandle h) override {
    auto* st = static_cast<Stream*>(h);
    int d = DeviceOf(dst), s = DeviceOf(src);
    if (d < 0 && s < 0) {
      return Status::InvalidArgument("aclrtMemcpyAsync: ACL has no asynchronous host copy");
    }
    DeviceGuard guard(this, st->device);
    return Check(api_.MemcpyAsync(dst, length, src, length, KindOf(d, s), st->s),
                 "aclrtMemcpyAsync");
  }
  Status StreamSynchronize(StreamHandle h) override {
    auto* st = static_cast<Stream*>(h);
    DeviceGuard guard(this, st->device);
    return Check(api_.SynchronizeStream(st->s), "aclrtSynchronizeStream");
  }
  // Events are created on the device of the stream they are first recorded on (callers may
  // create them with another device current; ACL records an event on its own device only).
  Result<EventHandle> CreateEvent() override {
    MC_RETURN_IF_ERROR(Available());
    return static_cast<EventHandle>(new Event{nullptr, -1});
  }
  void DestroyEvent(EventHandle h) override {
    auto* ev = static_cast<Event*>(h);
    if (ev == nullptr) return;
    if (ev->e != nullptr && Available().ok()) {
      DeviceGuard guard(this, ev->device);
      (void)api_.DestroyEvent(ev->e);
    }
    delete ev;
  }
  Status RecordEvent(EventHandle eh, StreamHandle sh) override {
    auto* ev = static_cast<Event*>(eh);
    auto* st = static_cast<Stream*>(sh);
    DeviceGuard guard(this, st->device);
    if (ev->e != nullptr && ev->device != st->device) {
      (void)api_.DestroyEvent(ev->e);  // of another device; not waited on any more
      ev->e = nullptr;
    }
    if (ev->e == nullptr) {
      MC_RETURN_IF_ERROR(Check(api_.CreateEvent(&ev->e), "aclrtCreateEvent"));
      ev->device = st->device;
    }
    return Check(api_.RecordEvent(ev->e, st->s), "aclrtRecordEvent");
  }
  Status EventSynchronize(EventHandle eh) override {
    auto* ev = static_cast<Event*>(eh);
    if (ev->e == nullptr) return Status::OK();  // never recorded: nothing to wait for
    DeviceGuard guard(this, ev->device);
    return Check(api_.SynchronizeEvent(ev->e), "aclrtSynchronizeEvent");
  }

  Result<IpcExport> IpcExportRange(void* addr) override {
    MC_RETURN_IF_ERROR(Available());
    if (api_.IpcMemGetExportKey == nullptr || api_.MemGetAddressRange == nullptr) {
      return Status::Unimplemented(lib_name_ +
                                   " lacks aclrtIpcMemGetExportKey or aclrtMemGetAddressRange "
                                   "(older CANN): same-host NPU peers use TCP");
    }
    int device = DeviceOf(addr);
    if (device == kHostMemory) {
      return Status::InvalidArgument("IPC export: address is not NPU memory");
    }
    DeviceGuard guard(this, device);
    void* base = nullptr;
    size_t size = 0;
    MC_RETURN_IF_ERROR(
        Check(api_.MemGetAddressRange(addr, &base, &size), "aclrtMemGetAddressRange"));
    IpcExport out;
    out.offset = reinterpret_cast<uint64_t>(addr) - reinterpret_cast<uint64_t>(base);
    MutexLock lock(&mu_);
    auto it = exported_.find(reinterpret_cast<uint64_t>(base));
    if (it == exported_.end()) {
      // One key per allocation: ACL exports an allocation once.
      char key[kIpcKeyLength] = {};
      MC_RETURN_IF_ERROR(Check(
          api_.IpcMemGetExportKey(base, size, key, kIpcKeyLength, kExportNoPidCheck),
          "aclrtIpcMemGetExportKey (needs a CANN whose export takes "
          "ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION)"));
      key[kIpcKeyLength - 1] = '\0';
      it = exported_.emplace(reinterpret_cast<uint64_t>(base), std::string(key)).first;
    }
    std::memcpy(out.handle.bytes, it->second.data(), it->second.size());
    return out;
  }

  Result<void*> IpcOpen(const IpcHandle& handle, int device) override {
    MC_RETURN_IF_ERROR(Available());
    if (api_.IpcMemImportByKey == nullptr || api_.IpcMemClose == nullptr) {
      return Status::Unimplemented(lib_name_ + " lacks aclrtIpcMemImportByKey");
    }
    std::string key(reinterpret_cast<const char*>(handle.bytes),
                    strnlen(reinterpret_cast<const char*>(handle.bytes), kIpcHandleSize));
    if (key.empty()) return Status::InvalidArgument("IPC open: empty ACL key");
    DeviceGuard guard(this, device < 0 ? 0 : device);
    void* p = nullptr;
    aclError err = api_.IpcMemImportByKey(&p, key.c_str(), kImportPeerAccess);
    if (err != kAclSuccess) err = api_.IpcMemImportByKey(&p, key.c_str(), 0);  // flag reserved
    MC_RETURN_IF_ERROR(Check(err, "aclrtIpcMemImportByKey"));
    size_t size = 0;
    void* base = p;
    if (api_.MemGetAddressRange != nullptr) (void)api_.MemGetAddressRange(p, &base, &size);
    MutexLock lock(&mu_);
    imported_[reinterpret_cast<uint64_t>(p)] = Imported{key, device, size};
    return p;
  }

  Status IpcClose(void* base) override {
    MC_RETURN_IF_ERROR(Available());
    Imported im;
    {
      MutexLock lock(&mu_);
      auto it = imported_.find(reinterpret_cast<uint64_t>(base));
      if (it == imported_.end()) {
        return Status::InvalidArgument("IPC close: not an address IpcOpen returned");
      }
      im = it->second;
      imported_.erase(it);
    }
    DeviceGuard guard(this, im.device < 0 ? 0 : im.device);
    return Check(api_.IpcMemClose(im.key.c_str()), "aclrtIpcMemClose");
  }

 private:
  struct Imported {
    std::string key;
    int device = 0;
    size_t size = 0;  // 0 when aclrtMemGetAddressRange is absent
  };

  // Makes `device` current for the scope (-1: any device, the caller's if it has one, else
  // 0), restoring the caller's current device after.
  class DeviceGuard {
   public:
    DeviceGuard(AscendBackend* b, int device) : b_(b) {
      if (!b_->Available().ok()) return;
      bool has = b_->api_.GetDevice(&saved_) == kAclSuccess;
      int want = device >= 0 ? device : (has ? saved_ : 0);
      if (has && want == saved_) return;
      if (b_->api_.SetDevice(want) == kAclSuccess) restore_ = has;
    }
    ~DeviceGuard() {
      if (restore_) (void)b_->api_.SetDevice(saved_);
    }

   private:
    AscendBackend* b_;
    int32_t saved_ = 0;
    bool restore_ = false;
  };

  static int KindOf(int dst_device, int src_device) {
    if (dst_device >= 0 && src_device >= 0) return kDeviceToDevice;
    return dst_device >= 0 ? kHostToDevice : kDeviceToHost;
  }

  Status CheckDevice(int device) {
    MC_RETURN_IF_ERROR(Available());
    if (device < 0 || device >= device_count_) {
      return Status::InvalidArgument("NPU " + std::to_string(device) + " does not exist (" +
                                     std::to_string(device_count_) + " on this host)");
    }
    return Status::OK();
  }

  Status Check(aclError err, const std::string& what) {
    if (err == kAclSuccess) return Status::OK();
    const char* text = api_.GetRecentErrMsg ? api_.GetRecentErrMsg() : nullptr;
    return Status::Internal(what + " failed: aclError " + std::to_string(err) +
                            (text && *text ? std::string(" (") + text + ")" : ""));
  }

  template <typename F>
  bool Sym(void* lib, const char* symbol, F* out) {
    *out = reinterpret_cast<F>(::dlsym(lib, symbol));
    return *out != nullptr;
  }

  Status LoadOnce() {
    static const char* const kNames[] = {
        "libascendcl.so", "/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so",
        "/usr/local/Ascend/latest/lib64/libascendcl.so"};
    void* lib = nullptr;
    std::string tried;
    for (const char* n : kNames) {
      lib = ::dlopen(n, RTLD_NOW | RTLD_LOCAL);
      if (lib) {
        lib_name_ = n;
        break;
      }
      tried += tried.empty() ? n : std::string(", ") + n;
    }
    if (lib == nullptr) {
      return Status::FailedPrecondition(
          "Ascend runtime not found (tried " + tried +
          "): NPU memory cannot be used on this host. Install the CANN toolkit and run "
          "`source /usr/local/Ascend/ascend-toolkit/set_env.sh` (your install's set_env.sh) "
          "before starting, so that libascendcl.so is on LD_LIBRARY_PATH");
    }
    bool ok = Sym(lib, "aclInit", &api_.Init) &&
              Sym(lib, "aclrtGetDeviceCount", &api_.GetDeviceCount) &&
              Sym(lib, "aclrtSetDevice", &api_.SetDevice) &&
              Sym(lib, "aclrtGetDevice", &api_.GetDevice) && Sym(lib, "aclrtMalloc", &api_.Malloc) &&
              Sym(lib, "aclrtFree", &api_.Free) && Sym(lib, "aclrtMallocHost", &api_.MallocHost) &&
              Sym(lib, "aclrtFreeHost", &api_.FreeHost) && Sym(lib, "aclrtMemcpy", &api_.Memcpy) &&
              Sym(lib, "aclrtMemcpyAsync", &api_.MemcpyAsync) &&
              Sym(lib, "aclrtCreateStream", &api_.CreateStream) &&
              Sym(lib, "aclrtDestroyStream", &api_.DestroyStream) &&
              Sym(lib, "aclrtSynchronizeStream", &api_.SynchronizeStream) &&
              Sym(lib, "aclrtCreateEvent", &api_.CreateEvent) &&
              Sym(lib, "aclrtDestroyEvent", &api_.DestroyEvent) &&
              Sym(lib, "aclrtRecordEvent", &api_.RecordEvent) &&
              Sym(lib, "aclrtSynchronizeEvent", &api_.SynchronizeEvent) &&
              Sym(lib, "aclrtPointerGetAttributes", &api_.PointerGetAttributes);
    if (!ok) {
      return Status::FailedPrecondition(lib_name_ + " lacks a symbol this engine needs (" +
                                        ::dlerror() +
                                        "): install a CANN toolkit with "
                                        "aclrtPointerGetAttributes (CANN 8.x)");
    }
    Sym(lib, "aclrtMemGetAddressRange", &api_.MemGetAddressRange);
    Sym(lib, "aclrtIpcMemGetExportKey", &api_.IpcMemGetExportKey);
    Sym(lib, "aclrtIpcMemImportByKey", &api_.IpcMemImportByKey);
    Sym(lib, "aclrtIpcMemClose", &api_.IpcMemClose);
    Sym(lib, "aclGetRecentErrMsg", &api_.GetRecentErrMsg);
    aclError err = api_.Init(nullptr);
    if (err != kAclSuccess && err != kAclRepeatInitialize) {
      return Status::FailedPrecondition(lib_name_ + " loaded but aclInit failed (aclError " +
                                        std::to_string(err) +
                                        "): NPU memory cannot be used on this host");
    }
    uint32_t n = 0;
    err = api_.GetDeviceCount(&n);
    if (err != kAclSuccess || n == 0) {
      return Status::FailedPrecondition(
          lib_name_ + " loaded but no NPU is usable (" +
          (err != kAclSuccess ? "aclrtGetDeviceCount: aclError " + std::to_string(err)
                              : std::string("no device")) +
          "; check npu-smi info and the driver): NPU memory cannot be used on this host");
    }
    device_count_ = static_cast<int>(n);
    LOG(INFO) << "Ascend: " << lib_name_ << ", " << n << " NPU(s)";
    return Status::OK();
  }

  std::once_flag once_;
  Status load_status_;
  std::string lib_name_;
  int device_count_ = 0;
  Api api_{};
  Mutex mu_;
  std::map<uint64_t, std::string> exported_ MC_GUARDED_BY(mu_);  // allocation base -> key
  std::map<uint64_t, Imported> imported_ MC_GUARDED_BY(mu_);     // mapped base -> its key
};

}  // namespace

std::unique_ptr<DeviceBackend> MakeAscendBackend() { return std::make_unique<AscendBackend>(); }

}  // namespace mooncake::platform
