// transfer_engine_bench: target and initiator of a transfer benchmark, with upstream
// Mooncake's flags and result line, plus --verify (every byte checked) and --json.
//
// Target:    transfer_engine_bench --mode=target
// Initiator: transfer_engine_bench --mode=initiator --segment_id=127.0.0.1:<port> --verify
// Exit status: 0 only when every request completed (and, with --verify, every byte matched).
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <map>
#include <thread>
#include <vector>

#include "mooncake/transfer_engine.h"
#include "platform/device.h"

DEFINE_string(mode, "initiator", "target | initiator");
DEFINE_string(local_server_name, "127.0.0.1", "this engine's host[:port]");
DEFINE_string(metadata_server, "P2PHANDSHAKE",
              "P2PHANDSHAKE, or a store: etcd://h:p, redis://h:p, http://h:p/metadata");
DEFINE_string(segment_id, "", "initiator: the target's segment name, <host>:<port> from its log");
DEFINE_string(operation, "read", "read | write");
DEFINE_string(protocol, "auto", "transport: auto (the best both ends share), shm or tcp");
DEFINE_uint64(block_size, 65536, "bytes per request");
DEFINE_int32(batch_size, 128, "requests per batch");
DEFINE_uint64(block_iteration, 0,
              "if > 0: one batch per block size block_size << i, i < block_iteration, every "
              "other block (the Ascend perf tool's mode) instead of the timed loop");
DEFINE_int32(threads, 2, "initiator worker threads");
DEFINE_double(duration, 10, "seconds of the timed loop (0: skip it)");
DEFINE_uint64(buffer_size, 1ull << 30, "bytes of registered memory on each side");
DEFINE_int32(gpu_id, -1, "GPU whose memory holds the buffers, on either side (-1: host memory)");
DEFINE_int32(device_logicid, -1, "alias of --gpu_id (the Ascend perf tool's name)");
DEFINE_string(report_unit, "GB", "GB GiB Gb MB MiB Mb KB KiB Kb");
DEFINE_int32(report_precision, 2, "decimals in the result line");
DEFINE_bool(verify, false, "initiator: write the whole buffer, read it back, compare every byte");
DEFINE_bool(json, false, "initiator: also print one JSON result line");
DEFINE_int32(timeout_ms, 60000, "initiator: longest wait for one batch");
DEFINE_bool(shared_buffer, false,
            "initiator: allocate the local buffer with AllocateSharedMemory (memfd): a same-host "
            "target then copies with memcpy instead of process_vm_readv/writev");

namespace {

using mooncake::BatchID;
using mooncake::SegmentID;
using mooncake::Status;
using mooncake::TransferEngine;
using mooncake::TransferRequest;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

[[noreturn]] void Die(const std::string& msg) {
  LOG(ERROR) << msg;
  std::fprintf(stderr, "ERROR: %s\n", msg.c_str());
  std::exit(1);
}

double UnitBytes(const std::string& unit) {
  static const std::map<std::string, double> kUnits = {
      {"GB", 1e9},  {"GiB", 1073741824.0}, {"Gb", 1e9 / 8}, {"MB", 1e6},    {"MiB", 1048576.0},
      {"Mb", 1e6 / 8}, {"KB", 1e3},         {"KiB", 1024.0}, {"Kb", 1000.0 / 8}};
  auto it = kUnits.find(unit);
  if (it != kUnits.end()) return it->second;
  LOG(WARNING) << "invalid --report_unit " << unit << "; using GB";
  FLAGS_report_unit = "GB";
  return 1e9;
}

// The GPU holding the buffers (--gpu_id, or its alias --device_logicid), or -1.
int GpuId() { return FLAGS_gpu_id >= 0 ? FLAGS_gpu_id : FLAGS_device_logicid; }
std::string Location() { return GpuId() >= 0 ? "cuda:" + std::to_string(GpuId()) : "cpu:0"; }

uint8_t* AllocBuffer(size_t size) {
  if (GpuId() >= 0) {
    auto p = mooncake::platform::Devices().Malloc(GpuId(), size);
    if (!p.ok()) Die("cannot allocate " + std::to_string(size) + " bytes of GPU memory: " +
                     p.status().ToString());
    return static_cast<uint8_t*>(*p);
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Die("cannot allocate " + std::to_string(size) + " bytes");
  std::memset(p, 0, size);  // fault the pages in before timing
  return static_cast<uint8_t*>(p);
}

void FreeBuffer(uint8_t* p, size_t size) {
  if (GpuId() >= 0) {
    (void)mooncake::platform::Devices().Free(p);
  } else {
    ::munmap(p, size);
  }
}

// Copies between a buffer from AllocBuffer and host memory.
void CopyBuffer(void* dst, const void* src, size_t n) {
  if (GpuId() < 0) {
    std::memcpy(dst, src, n);
    return;
  }
  Status s = mooncake::platform::Devices().Copy(dst, src, n);
  if (!s.ok()) Die("copy to/from GPU memory: " + s.ToString());
}

void Check(const Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}

// Submits one batch and waits for it; dies with the first failure's message.
void RunBatch(TransferEngine& engine, const std::vector<TransferRequest>& reqs) {
  auto id = engine.AllocateBatchID(reqs.size());
  Check(id.status(), "allocate batch");
  Check(engine.SubmitTransfer(*id, reqs), "submit");
  auto st = engine.WaitBatch(*id, std::chrono::milliseconds(FLAGS_timeout_ms));
  Check(st.status(), "wait");
  if (st->s != mooncake::COMPLETED) {
    std::string why = "batch ended " + std::string(mooncake::TransferStatusName(st->s));
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto err = engine.GetTransferError(*id, i);
      if (err.ok() && !err->empty()) {
        why += ": request " + std::to_string(i) + ": " + *err;
        break;
      }
    }
    if (st->s == mooncake::WAITING) why = "batch did not finish within --timeout_ms";
    Die(why);
  }
  Check(engine.FreeBatchID(*id), "free batch");
}

// Moves [0, len) between local and remote in block_size requests, batch_size per batch.
double MoveAll(TransferEngine& engine, TransferRequest::OpCode op, uint8_t* local,
               SegmentID seg, uint64_t remote, size_t len) {
  auto start = Clock::now();
  std::vector<TransferRequest> reqs;
  for (size_t off = 0; off < len;) {
    reqs.clear();
    for (int i = 0; i < FLAGS_batch_size && off < len; ++i) {
      size_t n = std::min<size_t>(FLAGS_block_size, len - off);
      reqs.push_back({op, local + off, seg, remote + off, n});
      off += n;
    }
    RunBatch(engine, reqs);
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int RunTarget(TransferEngine& engine) {
  uint8_t* buf = AllocBuffer(FLAGS_buffer_size);
  Check(engine.RegisterLocalMemory(buf, FLAGS_buffer_size, Location()), "register");
  std::printf("Target segment name: %s (buffer 0x%lx, %lu bytes, %s)\n",
              engine.GetLocalSegmentName().c_str(), reinterpret_cast<unsigned long>(buf),
              static_cast<unsigned long>(FLAGS_buffer_size), Location().c_str());
  std::fflush(stdout);
  while (!g_stop.load()) ::usleep(100000);
  LOG(INFO) << "target stopping";
  Check(engine.UnregisterLocalMemory(buf), "unregister");
  FreeBuffer(buf, FLAGS_buffer_size);
  return 0;
}

void Percentiles(std::vector<double>& v, double* p50, double* p99) {
  if (v.empty()) {
    *p50 = *p99 = 0;
    return;
  }
  std::sort(v.begin(), v.end());
  *p50 = v[v.size() / 2];
  *p99 = v[std::min(v.size() - 1, static_cast<size_t>(v.size() * 0.99))];
}

int RunBlockIterations(TransferEngine& engine, SegmentID seg, uint64_t remote_base,
                       uint64_t remote_len, TransferRequest::OpCode op) {
  for (uint64_t i = 0; i < FLAGS_block_iteration; ++i) {
    uint64_t bs = FLAGS_block_size << i;
    uint64_t need = bs * 2 * FLAGS_batch_size;
    if (need > remote_len) Die("block iteration " + std::to_string(i) + " needs " +
                               std::to_string(need) + " bytes; raise --buffer_size");
    uint8_t* local = AllocBuffer(need);
    Check(engine.RegisterLocalMemory(local, need, Location()), "register");
    std::vector<TransferRequest> reqs;
    for (int j = 0; j < FLAGS_batch_size; ++j) {
      reqs.push_back({op, local + bs * 2 * j, seg, remote_base + bs * 2 * j, bs});
    }
    auto start = Clock::now();
    RunBatch(engine, reqs);
    double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    double rate = FLAGS_batch_size * bs * 1e6 / us / UnitBytes(FLAGS_report_unit);
    LOG(INFO) << "Test completed: duration " << static_cast<long>(us) << "us, block size "
              << bs / 1024 << "KB, total size " << FLAGS_batch_size * bs / 1024
              << "KB , throughput " << std::fixed << std::setprecision(FLAGS_report_precision)
              << rate << " " << FLAGS_report_unit << "/s";
    Check(engine.UnregisterLocalMemory(local), "unregister");
    FreeBuffer(local, need);
  }
  return 0;
}

int RunInitiator(TransferEngine& engine) {
  if (FLAGS_segment_id.empty()) Die("--segment_id is required: the target logs it");
  auto op = FLAGS_operation == "write" ? TransferRequest::WRITE : TransferRequest::READ;
  if (FLAGS_operation != "read" && FLAGS_operation != "write") {
    Die("--operation must be read or write");
  }
  uint64_t need = FLAGS_block_size * FLAGS_batch_size * FLAGS_threads;
  if (FLAGS_block_iteration == 0 && FLAGS_buffer_size < need) {
    LOG(WARNING) << "Invalid flag: buffer size is smaller than require_size, adjust to " << need;
    FLAGS_buffer_size = need;
  }
  auto seg = engine.OpenSegment(FLAGS_segment_id);
  Check(seg.status(), "open segment " + FLAGS_segment_id);
  auto info = engine.GetSegmentInfo(*seg);
  Check(info.status(), "segment info");
  if (info->buffers.empty()) Die("segment " + FLAGS_segment_id + " has no registered memory");
  uint64_t remote = info->buffers[0].addr, remote_len = info->buffers[0].length;
  if (FLAGS_block_iteration > 0) return RunBlockIterations(engine, *seg, remote, remote_len, op);
  if (remote_len < FLAGS_buffer_size) {
    Die("target buffer is " + std::to_string(remote_len) + " bytes; --buffer_size asks " +
        std::to_string(FLAGS_buffer_size));
  }
  uint8_t* local = nullptr;
  if (FLAGS_shared_buffer && GpuId() >= 0) Die("--shared_buffer is host memory; drop --gpu_id");
  if (FLAGS_shared_buffer) {
    auto shared = engine.AllocateSharedMemory(FLAGS_buffer_size);
    Check(shared.status(), "allocate shared memory");
    local = static_cast<uint8_t*>(*shared);
    std::memset(local, 0, FLAGS_buffer_size);
  } else {
    local = AllocBuffer(FLAGS_buffer_size);
    Check(engine.RegisterLocalMemory(local, FLAGS_buffer_size, Location()), "register");
  }
  double unit = UnitBytes(FLAGS_report_unit);

  if (FLAGS_verify) {
    uint8_t* back = AllocBuffer(FLAGS_buffer_size);
    Check(engine.RegisterLocalMemory(back, FLAGS_buffer_size, Location()), "register");
    std::vector<uint8_t> pattern(FLAGS_buffer_size), got(FLAGS_buffer_size);
    uint64_t x = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(::getpid());
    for (size_t i = 0; i < FLAGS_buffer_size; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      pattern[i] = static_cast<uint8_t>(x);
    }
    CopyBuffer(local, pattern.data(), FLAGS_buffer_size);
    double tw = MoveAll(engine, TransferRequest::WRITE, local, *seg, remote, FLAGS_buffer_size);
    double tr = MoveAll(engine, TransferRequest::READ, back, *seg, remote, FLAGS_buffer_size);
    CopyBuffer(got.data(), back, FLAGS_buffer_size);
    size_t matched = 0;
    for (size_t i = 0; i < FLAGS_buffer_size; ++i) matched += pattern[i] == got[i];
    std::printf("verify: wrote %lu bytes in %.3f s (%.2f %s/s), read back in %.3f s (%.2f %s/s)\n",
                static_cast<unsigned long>(FLAGS_buffer_size), tw, FLAGS_buffer_size / tw / unit,
                FLAGS_report_unit.c_str(), tr, FLAGS_buffer_size / tr / unit,
                FLAGS_report_unit.c_str());
    std::printf("matched_bytes %lu\ntotal_bytes %lu\n", static_cast<unsigned long>(matched),
                static_cast<unsigned long>(FLAGS_buffer_size));
    std::fflush(stdout);
    if (matched != FLAGS_buffer_size) Die("verification failed: bytes differ");
    Check(engine.UnregisterLocalMemory(back), "unregister");
    FreeBuffer(back, FLAGS_buffer_size);
  }
  if (FLAGS_duration <= 0) return 0;

  std::atomic<bool> running{true};
  std::atomic<uint64_t> batches{0};
  std::vector<std::vector<double>> latencies(FLAGS_threads);
  std::vector<std::thread> workers;
  auto start = Clock::now();
  for (int tid = 0; tid < FLAGS_threads; ++tid) {
    workers.emplace_back([&, tid] {
      std::vector<TransferRequest> reqs(FLAGS_batch_size);
      for (int i = 0; i < FLAGS_batch_size; ++i) {
        uint64_t off = FLAGS_block_size * (static_cast<uint64_t>(i) * FLAGS_threads + tid);
        reqs[i] = {op, local + off, *seg, remote + off, FLAGS_block_size};
      }
      while (running.load(std::memory_order_relaxed) && !g_stop.load()) {
        auto t0 = Clock::now();
        RunBatch(engine, reqs);
        latencies[tid].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        batches.fetch_add(1, std::memory_order_relaxed);
      }
      LOG(INFO) << "Worker " << tid << " stopped!";
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(FLAGS_duration));
  running.store(false);
  for (auto& w : workers) w.join();
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  uint64_t n = batches.load();
  double bytes = static_cast<double>(n) * FLAGS_batch_size * FLAGS_block_size;
  std::vector<double> all;
  for (auto& v : latencies) all.insert(all.end(), v.begin(), v.end());
  double p50, p99;
  Percentiles(all, &p50, &p99);
  double ops = n * static_cast<double>(FLAGS_batch_size) / secs;
  LOG(INFO) << "Test completed: duration " << std::fixed << std::setprecision(2) << secs
            << ", batch count " << n << ", throughput " << std::setprecision(FLAGS_report_precision)
            << bytes / secs / unit << " " << FLAGS_report_unit << "/s";
  std::printf("Test completed: duration %.2f, batch count %lu, throughput %.*f %s/s\n", secs,
              static_cast<unsigned long>(n), FLAGS_report_precision, bytes / secs / unit,
              FLAGS_report_unit.c_str());
  std::printf("requests/s %.0f, batch latency p50 %.1f us, p99 %.1f us\n", ops, p50, p99);
  if (FLAGS_json) {
    std::printf(
        "{\"operation\":\"%s\",\"block_size\":%lu,\"batch_size\":%d,\"threads\":%d,"
        "\"duration_s\":%.3f,\"batches\":%lu,\"bytes\":%.0f,\"gbps\":%.4f,\"ops_per_s\":%.1f,"
        "\"batch_p50_us\":%.1f,\"batch_p99_us\":%.1f}\n",
        FLAGS_operation.c_str(), static_cast<unsigned long>(FLAGS_block_size), FLAGS_batch_size,
        FLAGS_threads, secs, static_cast<unsigned long>(n), bytes, bytes / secs / 1e9, ops, p50,
        p99);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("transfer_engine_bench --mode=target|initiator [flags]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  ::signal(SIGINT, OnSignal);
  ::signal(SIGTERM, OnSignal);
  ::signal(SIGPIPE, SIG_IGN);
  if (GpuId() >= 0) {
    Status gpu = mooncake::platform::Devices().Available();
    if (!gpu.ok()) Die("--gpu_id/--device_logicid " + std::to_string(GpuId()) + ": " + gpu.ToString());
  }
  if (FLAGS_block_size == 0 || FLAGS_batch_size <= 0 || FLAGS_threads <= 0) {
    Die("--block_size, --batch_size and --threads must be positive");
  }
  TransferEngine engine;
  std::string proto = FLAGS_protocol == "auto" ? "" : FLAGS_protocol;
  Check(engine.Init(FLAGS_metadata_server, FLAGS_local_server_name, proto), "init");
  if (FLAGS_mode == "target") return RunTarget(engine);
  if (FLAGS_mode == "initiator") return RunInitiator(engine);
  Die("--mode must be target or initiator");
}
