// gpu_baseline: the device copy limits the engine's GPU paths are measured against.
//
//   gpu_baseline d2d|h2d|d2h --block_size B --batch N --duration S --gpu_id G
// copies B-byte blocks (cudaMemcpyAsync on one stream through the platform backend, the
// same call the cuda_ipc transport makes; N copies between synchronizations) within a 1 GiB
// working set on device G (host side: pinned memory), and prints one JSON line:
// {"baseline":"cuda_d2d", "block_size":..., "gbps":...} (bytes copied per second, each byte
// counted once). Exits 2 with a message where no GPU is usable.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "platform/device.h"

using mooncake::Status;
namespace platform = mooncake::platform;

namespace {

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "gpu_baseline: %s\n", why.c_str());
  std::exit(2);
}

void Check(const Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Die("usage: gpu_baseline d2d|h2d|d2h [--block_size B] [--batch N] [--duration S]");
  std::string mode = argv[1];
  size_t block = 16 << 20, span = 1ull << 30;
  int batch = 16, gpu = 0;
  double duration = 2;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--block_size") block = std::strtoull(argv[i + 1], nullptr, 0);
    if (k == "--batch") batch = std::atoi(argv[i + 1]);
    if (k == "--duration") duration = std::atof(argv[i + 1]);
    if (k == "--gpu_id") gpu = std::atoi(argv[i + 1]);
  }
  if (mode != "d2d" && mode != "h2d" && mode != "d2h") Die("mode must be d2d, h2d or d2h");
  if (block == 0 || batch <= 0 || block > span / 2) Die("bad --block_size or --batch");
  platform::DeviceBackend& dev = platform::Devices();
  Check(dev.Available(), "GPU");
  Check(dev.SetDevice(gpu), "set device");
  auto alloc = [&](bool device) -> char* {
    auto p = device ? dev.Malloc(gpu, span) : dev.MallocHost(span);
    Check(p.status(), device ? "cudaMalloc" : "cudaMallocHost");
    return static_cast<char*>(*p);
  };
  char* src = alloc(mode != "h2d");
  char* dst = alloc(mode != "d2h");
  auto stream = dev.CreateStream();
  auto event = dev.CreateEvent();
  Check(stream.status(), "stream");
  Check(event.status(), "event");
  const size_t slots = span / block;
  size_t next = 0;
  auto round = [&] {
    for (int i = 0; i < batch; ++i, next = (next + 1) % slots) {
      Check(dev.CopyAsync(dst + next * block, src + next * block, block, *stream), "copy");
    }
    Check(dev.RecordEvent(*event, *stream), "record");
    Check(dev.EventSynchronize(*event), "synchronize");
  };
  for (int i = 0; i < 3; ++i) round();  // warm-up
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  double secs = 0;
  uint64_t bytes = 0;
  while (secs < duration) {
    round();
    bytes += static_cast<uint64_t>(batch) * block;
    secs = std::chrono::duration<double>(Clock::now() - start).count();
  }
  std::printf("{\"baseline\":\"cuda_%s\",\"block_size\":%zu,\"batch\":%d,\"gbps\":%.3f}\n",
              mode.c_str(), block, batch, bytes / secs / 1e9);
  return 0;
}
