// The CUDA backend: the CUDA runtime loaded with dlopen at first use. The few prototypes and
// constants it needs are declared here (values from CUDA's driver_types.h, stable since CUDA
// 11), so building needs no CUDA header and linking no CUDA library.
#include <dlfcn.h>
#include <glog/logging.h>

#include <cstring>
#include <mutex>
#include <string>

#include "platform/device_backends.h"

namespace mooncake::platform {
namespace {

using cudaError_t = int;
using cudaStream_t = void*;
using cudaEvent_t = void*;
constexpr cudaError_t kSuccess = 0;
constexpr cudaError_t kNotReady = 600;
constexpr int kMemoryTypeDevice = 2;
constexpr int kMemcpyDefault = 4;
constexpr unsigned kStreamNonBlocking = 0x01;
constexpr unsigned kEventDisableTiming = 0x02;
constexpr unsigned kIpcMemLazyEnablePeerAccess = 0x01;

struct PointerAttributes {  // cudaPointerAttributes, with room for later fields
  int type;
  int device;
  void* device_pointer;
  void* host_pointer;
  long reserved[16];
};
struct CudaIpcMemHandle {  // cudaIpcMemHandle_t, passed by value to cudaIpcOpenMemHandle
  char reserved[kIpcHandleSize];
};

struct Api {
  cudaError_t (*GetDeviceCount)(int*);
  cudaError_t (*PointerGetAttributes)(PointerAttributes*, const void*);
  cudaError_t (*Malloc)(void**, size_t);
  cudaError_t (*Free)(void*);
  cudaError_t (*MallocHost)(void**, size_t);
  cudaError_t (*FreeHost)(void*);
  cudaError_t (*SetDevice)(int);
  cudaError_t (*GetDevice)(int*);
  cudaError_t (*Memcpy)(void*, const void*, size_t, int);
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, int, cudaStream_t);
  cudaError_t (*StreamCreateWithFlags)(cudaStream_t*, unsigned);
  cudaError_t (*StreamDestroy)(cudaStream_t);
  cudaError_t (*StreamSynchronize)(cudaStream_t);
  cudaError_t (*EventCreateWithFlags)(cudaEvent_t*, unsigned);
  cudaError_t (*EventDestroy)(cudaEvent_t);
  cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t);
  cudaError_t (*EventSynchronize)(cudaEvent_t);
  cudaError_t (*IpcGetMemHandle)(CudaIpcMemHandle*, void*);
  cudaError_t (*IpcOpenMemHandle)(void**, CudaIpcMemHandle, unsigned);
  cudaError_t (*IpcCloseMemHandle)(void*);
  const char* (*GetErrorString)(cudaError_t);
  // Driver API (libcuda.so.1): the base of the allocation holding an address.
  int (*MemGetAddressRange)(uint64_t*, size_t*, uint64_t);
};

class CudaBackend final : public DeviceBackend {
 public:
  const char* name() const override { return "cuda"; }

  Status Available() override {
    Load();
    return load_status_;
  }
  int DeviceCount() override { return Available().ok() ? device_count_ : 0; }

  int DeviceOf(const void* addr) override {
    if (!Available().ok() || addr == nullptr) return kHostMemory;
    PointerAttributes attr{};
    if (api_.PointerGetAttributes(&attr, addr) != kSuccess) return kHostMemory;
    return attr.type == kMemoryTypeDevice ? attr.device : kHostMemory;
  }

  Result<void*> Malloc(int device, size_t length) override {
    DeviceGuard guard(this);
    MC_RETURN_IF_ERROR(SetDevice(device));
    void* p = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.Malloc(&p, length),
                             "cudaMalloc(" + std::to_string(length) + ") on device " +
                                 std::to_string(device)));
    return p;
  }
  Status Free(void* p) override {
    MC_RETURN_IF_ERROR(Available());
    return Check(api_.Free(p), "cudaFree");
  }
  Result<void*> MallocHost(size_t length) override {
    MC_RETURN_IF_ERROR(Available());
    void* p = nullptr;
    MC_RETURN_IF_ERROR(
        Check(api_.MallocHost(&p, length), "cudaMallocHost(" + std::to_string(length) + ")"));
    return p;
  }
  Status FreeHost(void* p) override {
    MC_RETURN_IF_ERROR(Available());
    return Check(api_.FreeHost(p), "cudaFreeHost");
  }
  Status SetDevice(int device) override {
    MC_RETURN_IF_ERROR(Available());
    if (device < 0 || device >= device_count_) {
      return Status::InvalidArgument("CUDA device " + std::to_string(device) + " does not exist (" +
                                     std::to_string(device_count_) + " on this host)");
    }
    return Check(api_.SetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  }
  int CurrentDevice() override {
    int d = 0;
    if (!Available().ok() || api_.GetDevice(&d) != kSuccess) return 0;
    return d;
  }
  Status Copy(void* dst, const void* src, size_t length) override {
    MC_RETURN_IF_ERROR(Available());
    return Check(api_.Memcpy(dst, src, length, kMemcpyDefault), "cudaMemcpy");
  }
  Result<StreamHandle> CreateStream() override {
    MC_RETURN_IF_ERROR(Available());
    cudaStream_t s = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.StreamCreateWithFlags(&s, kStreamNonBlocking),
                             "cudaStreamCreateWithFlags"));
    return s;
  }
  void DestroyStream(StreamHandle s) override {
    if (s && Available().ok()) (void)api_.StreamDestroy(s);
  }
  Status CopyAsync(void* dst, const void* src, size_t length, StreamHandle s) override {
    return Check(api_.MemcpyAsync(dst, src, length, kMemcpyDefault, s), "cudaMemcpyAsync");
  }
  Status StreamSynchronize(StreamHandle s) override {
    return Check(api_.StreamSynchronize(s), "cudaStreamSynchronize");
  }
  Result<EventHandle> CreateEvent() override {
    MC_RETURN_IF_ERROR(Available());
    cudaEvent_t e = nullptr;
    MC_RETURN_IF_ERROR(
        Check(api_.EventCreateWithFlags(&e, kEventDisableTiming), "cudaEventCreateWithFlags"));
    return e;
  }
  void DestroyEvent(EventHandle e) override {
    if (e && Available().ok()) (void)api_.EventDestroy(e);
  }
  Status RecordEvent(EventHandle e, StreamHandle s) override {
    return Check(api_.EventRecord(e, s), "cudaEventRecord");
  }
  Status EventSynchronize(EventHandle e) override {
    return Check(api_.EventSynchronize(e), "cudaEventSynchronize");
  }

  Result<IpcExport> IpcExportRange(void* addr) override {
    MC_RETURN_IF_ERROR(Available());
    int device = DeviceOf(addr);
    if (device == kHostMemory) {
      return Status::InvalidArgument("IPC export: address is not CUDA device memory");
    }
    DeviceGuard guard(this);
    MC_RETURN_IF_ERROR(SetDevice(device));
    IpcExport out;
    uint64_t base = reinterpret_cast<uint64_t>(addr);
    size_t size = 0;
    if (api_.MemGetAddressRange != nullptr &&
        api_.MemGetAddressRange(&base, &size, reinterpret_cast<uint64_t>(addr)) != 0) {
      return Status::Internal("cuMemGetAddressRange failed for a device address");
    }
    CudaIpcMemHandle h{};
    MC_RETURN_IF_ERROR(Check(api_.IpcGetMemHandle(&h, reinterpret_cast<void*>(base)),
                             "cudaIpcGetMemHandle"));
    std::memcpy(out.handle.bytes, h.reserved, kIpcHandleSize);
    out.offset = reinterpret_cast<uint64_t>(addr) - base;
    return out;
  }
  Result<void*> IpcOpen(const IpcHandle& handle, int device) override {
    DeviceGuard guard(this);
    MC_RETURN_IF_ERROR(SetDevice(device < 0 ? 0 : device));
    CudaIpcMemHandle h{};
    std::memcpy(h.reserved, handle.bytes, kIpcHandleSize);
    void* p = nullptr;
    MC_RETURN_IF_ERROR(Check(api_.IpcOpenMemHandle(&p, h, kIpcMemLazyEnablePeerAccess),
                             "cudaIpcOpenMemHandle"));
    return p;
  }
  Status IpcClose(void* base) override {
    MC_RETURN_IF_ERROR(Available());
    return Check(api_.IpcCloseMemHandle(base), "cudaIpcCloseMemHandle");
  }

 private:
  // Restores the calling thread's current device (the caller's framework, e.g. torch, keeps
  // its own idea of it).
  class DeviceGuard {
   public:
    explicit DeviceGuard(CudaBackend* b) : b_(b) {
      active_ = b_->Available().ok() && b_->api_.GetDevice(&saved_) == kSuccess;
    }
    ~DeviceGuard() {
      if (active_) b_->api_.SetDevice(saved_);
    }

   private:
    CudaBackend* b_;
    int saved_ = 0;
    bool active_ = false;
  };

  Status Check(cudaError_t err, const std::string& what) {
    if (err == kSuccess) return Status::OK();
    const char* text = api_.GetErrorString ? api_.GetErrorString(err) : "unknown error";
    std::string msg = what + ": " + (text ? text : "unknown error") + " (cudaError " +
                      std::to_string(err) + ")";
    if (err == kNotReady) return Status::Unavailable(msg);
    return Status::Internal(msg);
  }

  template <typename F>
  bool Sym(void* lib, const char* symbol, F* out) {
    *out = reinterpret_cast<F>(::dlsym(lib, symbol));
    return *out != nullptr;
  }

  void Load() {
    std::call_once(once_, [this] { load_status_ = LoadOnce(); });
  }

  Status LoadOnce() {
    // Sonames first: a runtime already loaded by the process (torch's) is matched by soname.
    static const char* const kNames[] = {
        "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so",
        "/usr/local/cuda/lib64/libcudart.so", "/usr/local/cuda/lib/libcudart.so"};
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
      return Status::FailedPrecondition("CUDA runtime not found (tried " + tried +
                                        "): GPU memory cannot be used on this host");
    }
    bool ok = Sym(lib, "cudaGetDeviceCount", &api_.GetDeviceCount) &&
              Sym(lib, "cudaPointerGetAttributes", &api_.PointerGetAttributes) &&
              Sym(lib, "cudaMalloc", &api_.Malloc) && Sym(lib, "cudaFree", &api_.Free) &&
              Sym(lib, "cudaMallocHost", &api_.MallocHost) &&
              Sym(lib, "cudaFreeHost", &api_.FreeHost) &&
              Sym(lib, "cudaSetDevice", &api_.SetDevice) &&
              Sym(lib, "cudaGetDevice", &api_.GetDevice) && Sym(lib, "cudaMemcpy", &api_.Memcpy) &&
              Sym(lib, "cudaMemcpyAsync", &api_.MemcpyAsync) &&
              Sym(lib, "cudaStreamCreateWithFlags", &api_.StreamCreateWithFlags) &&
              Sym(lib, "cudaStreamDestroy", &api_.StreamDestroy) &&
              Sym(lib, "cudaStreamSynchronize", &api_.StreamSynchronize) &&
              Sym(lib, "cudaEventCreateWithFlags", &api_.EventCreateWithFlags) &&
              Sym(lib, "cudaEventDestroy", &api_.EventDestroy) &&
              Sym(lib, "cudaEventRecord", &api_.EventRecord) &&
              Sym(lib, "cudaEventSynchronize", &api_.EventSynchronize) &&
              Sym(lib, "cudaIpcGetMemHandle", &api_.IpcGetMemHandle) &&
              Sym(lib, "cudaIpcOpenMemHandle", &api_.IpcOpenMemHandle) &&
              Sym(lib, "cudaIpcCloseMemHandle", &api_.IpcCloseMemHandle) &&
              Sym(lib, "cudaGetErrorString", &api_.GetErrorString);
    if (!ok) {
      return Status::FailedPrecondition(std::string("CUDA runtime ") + lib_name_ +
                                        " lacks a symbol this engine needs: " + ::dlerror());
    }
    if (void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
      Sym(driver, "cuMemGetAddressRange_v2", &api_.MemGetAddressRange);
    }
    int n = 0;
    cudaError_t err = api_.GetDeviceCount(&n);
    if (err != kSuccess || n <= 0) {
      std::string why = err != kSuccess ? api_.GetErrorString(err) : "no device";
      return Status::FailedPrecondition(std::string("CUDA runtime ") + lib_name_ +
                                        " loaded but no GPU is usable (" + why +
                                        "): GPU memory cannot be used on this host");
    }
    device_count_ = n;
    LOG(INFO) << "CUDA: " << lib_name_ << ", " << n << " device(s)";
    return Status::OK();
  }

  std::once_flag once_;
  Status load_status_;
  std::string lib_name_;
  int device_count_ = 0;
  Api api_{};
};

}  // namespace

std::unique_ptr<DeviceBackend> MakeCudaBackend() { return std::make_unique<CudaBackend>(); }

}  // namespace mooncake::platform
