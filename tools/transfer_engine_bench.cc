// transfer_engine_bench: target and initiator of a transfer benchmark, with upstream
// Mooncake's flags and result line, plus --verify (every byte checked) and --json.
//
// Target:    transfer_engine_bench --mode=target
// Initiator: transfer_engine_bench --mode=initiator --segment_id=127.0.0.1:<port> --verify
// Exit status: 0 only when every request completed (and, with --verify, every byte matched).
//
// Built a second time as transfer_engine_ascend_direct_perf (MC_ASCEND_DIRECT_PERF, the seed's
// target name): the same tool with upstream's Ascend perf tool's defaults (block iterations,
// --operation=write, NPU memory on --device_logicid 0) but --local_server_name 127.0.0.1.
//
// The seeds' flow: the initiator starts the moment the target logs "listening on". The target
// registers its memory before Init, so the first descriptor a peer fetches already lists it;
// against a target that registers later (upstream's), the initiator waits for its buffers
// (at most --timeout_ms) and says so in one line.
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
#include <functional>
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
DEFINE_string(protocol, "auto",
              "transport: auto (the best both ends share), shm, tcp or ucx (UCX over the lanes "
              "UCX_TLS allows; both ends must have UCX)");
DEFINE_uint64(block_size, 65536, "bytes per request");
DEFINE_int32(batch_size, 128, "requests per batch");
DEFINE_uint64(block_iteration, 0,
              "if > 0: one batch per block size block_size << i, i < block_iteration, every "
              "other block (the Ascend perf tool's mode) instead of the timed loop");
DEFINE_int32(threads, 2, "initiator worker threads");
DEFINE_double(duration, 10, "seconds of the timed loop (0: skip it)");
DEFINE_uint64(buffer_size, 1ull << 30, "bytes of registered memory on each side");
DEFINE_int32(gpu_id, -1, "GPU whose memory holds the buffers, on either side (-1: host memory)");
DEFINE_int32(device_logicid, -1,
             "Ascend NPU whose memory holds the buffers (location npu:N; -1: host memory). "
             "Needs the Ascend runtime, libascendcl.so");
DEFINE_string(report_unit, "GB", "GB GiB Gb MB MiB Mb KB KiB Kb");
DEFINE_int32(report_precision, 2, "decimals in the result line");
DEFINE_bool(verify, false, "initiator: write the whole buffer, read it back, compare every byte");
DEFINE_bool(json, false, "initiator: also print one JSON result line");
DEFINE_int32(timeout_ms, 60000, "initiator: longest wait for one batch");
DEFINE_int32(target_register_delay_ms, -1,
             "target: -1 registers its memory before Init (before it logs \"listening on\"); "
             ">= 0 registers it this long after Init, as upstream's perf tool does (for tests "
             "of the initiator's wait)");
DEFINE_bool(shared_buffer, false,
            "allocate the buffers with AllocateSharedMemory (memfd). Initiator: a same-host "
            "target then copies with memcpy instead of process_vm_readv/writev. Target: it lends "
            "them, and a same-host initiator copies itself, with memcpy on its own threads");

namespace {

using mooncake::BatchID;
using mooncake::SegmentID;
using mooncake::Status;
using mooncake::TransferEngine;
using mooncake::TransferRequest;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_stop{false};

#ifdef MC_ASCEND_DIRECT_PERF
constexpr const char* kToolName = "transfer_engine_ascend_direct_perf";
#else
constexpr const char* kToolName = "transfer_engine_bench";
#endif

// Upstream's transfer_engine_ascend_direct_perf defaults, except --local_server_name (upstream
// points it at a lab address; here it stays 127.0.0.1). Applied before parsing, so --help
// shows them and the command line overrides them.
void ApplyToolDefaults() {
#ifdef MC_ASCEND_DIRECT_PERF
  for (auto [name, value] : {std::pair{"operation", "write"}, {"block_iteration", "10"},
                             {"batch_size", "32"}, {"block_size", "32768"},
                             {"device_logicid", "0"}}) {
    gflags::SetCommandLineOptionWithMode(name, value, gflags::SET_FLAGS_DEFAULT);
  }
#endif
}

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

// The device holding the buffers (a GPU by --gpu_id, an NPU by --device_logicid), or -1.
int DeviceId() { return FLAGS_gpu_id >= 0 ? FLAGS_gpu_id : FLAGS_device_logicid; }
std::string Location() {
  if (FLAGS_gpu_id >= 0) return "cuda:" + std::to_string(FLAGS_gpu_id);
  if (FLAGS_device_logicid >= 0) return "npu:" + std::to_string(FLAGS_device_logicid);
  return "cpu:0";
}

// OK when the memory the flags ask for can be had here; else what is missing.
Status DeviceReady() {
  if (FLAGS_gpu_id >= 0 && FLAGS_device_logicid >= 0) {
    return Status::InvalidArgument("--gpu_id (CUDA) and --device_logicid (Ascend): pick one");
  }
  if (FLAGS_gpu_id >= 0) {
    return mooncake::platform::Devices().Available().WithContext("--gpu_id " +
                                                                 std::to_string(FLAGS_gpu_id));
  }
  if (FLAGS_device_logicid < 0) return Status::OK();
  // NPU memory comes from the device seam's Ascend backend, which loads libascendcl.so.
  const std::string where = "--device_logicid " + std::to_string(FLAGS_device_logicid) + " (" +
                            Location() + ")";
  int device = mooncake::platform::kHostMemory;
  MC_RETURN_IF_ERROR(mooncake::platform::ResolveLocation(Location(), nullptr, &device)
                         .WithContext(where));
  mooncake::platform::DeviceBackend& d = mooncake::platform::Devices();
  const std::string backend = d.name();
  if (backend != "ascend" && backend != "sim") {
    return Status::FailedPrecondition(
        where + ": NPU memory needs the Ascend runtime (libascendcl.so), but this process uses "
        "the " + backend + " device runtime; install CANN and source "
        "/usr/local/Ascend/ascend-toolkit/set_env.sh, or pass --device_logicid=-1 for host memory");
  }
  return d.Available().WithContext(where);
}

uint8_t* AllocBuffer(size_t size) {
  if (DeviceId() >= 0) {
    auto p = mooncake::platform::Devices().Malloc(DeviceId(), size);
    if (!p.ok()) Die("cannot allocate " + std::to_string(size) + " bytes of " + Location() +
                     " memory: " + p.status().ToString());
    return static_cast<uint8_t*>(*p);
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Die("cannot allocate " + std::to_string(size) + " bytes");
  std::memset(p, 0, size);  // fault the pages in before timing
  return static_cast<uint8_t*>(p);
}

void FreeBuffer(uint8_t* p, size_t size) {
  if (DeviceId() >= 0) {
    (void)mooncake::platform::Devices().Free(p);
  } else {
    ::munmap(p, size);
  }
}

// Copies between a buffer from AllocBuffer and host memory.
void CopyBuffer(void* dst, const void* src, size_t n) {
  if (DeviceId() < 0) {
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
// say_submitted: log upstream's "submit transfer suc." once it is submitted.
void RunBatch(TransferEngine& engine, const std::vector<TransferRequest>& reqs,
              bool say_submitted = false) {
  auto id = engine.AllocateBatchID(reqs.size());
  Check(id.status(), "allocate batch");
  Check(engine.SubmitTransfer(*id, reqs), "submit");
  if (say_submitted) LOG(INFO) << "submit transfer suc.";
  auto st = engine.WaitBatch(*id, std::chrono::milliseconds(FLAGS_timeout_ms));
  Check(st.status(), "wait");
  if (st->s != mooncake::COMPLETED) {
    // Upstream's words (the seed's script greps for them), then ours.
    std::string why = "getTransferStatus FAILED: batch ended " +
                      std::string(mooncake::TransferStatusName(st->s));
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto err = engine.GetTransferError(*id, i);
      if (err.ok() && !err->empty()) {
        why += ": request " + std::to_string(i) + ": " + *err;
        break;
      }
    }
    if (st->s == mooncake::WAITING) {
      why = "Sync data transfer timeout: batch did not finish within --timeout_ms";
    }
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

// The target's buffers, registered before Init (see the file comment). With
// --block_iteration > 0, upstream's perf layout: a warm-up buffer of block_size, then one of
// batch_size * (block_size << i) * 2 bytes per iteration i; otherwise one of --buffer_size.
struct TargetBuffers {
  std::vector<std::pair<uint8_t*, size_t>> list;
};

uint64_t IterationBytes(uint64_t i) { return (FLAGS_block_size << i) * 2 * FLAGS_batch_size; }

TargetBuffers RegisterTargetBuffers(TransferEngine& engine) {
  std::vector<size_t> sizes;
  if (FLAGS_block_iteration > 0) {
    sizes.push_back(FLAGS_block_size);
    for (uint64_t i = 0; i < FLAGS_block_iteration; ++i) sizes.push_back(IterationBytes(i));
  } else {
    sizes.push_back(FLAGS_buffer_size);
  }
  if (FLAGS_shared_buffer && DeviceId() >= 0) Die("--shared_buffer is host memory; drop --gpu_id");
  TargetBuffers out;
  for (size_t n : sizes) {
    uint8_t* p = nullptr;
    if (FLAGS_shared_buffer) {
      auto shared = engine.AllocateSharedMemory(n);
      Check(shared.status(), "allocate shared memory");
      p = static_cast<uint8_t*>(*shared);
    } else {
      p = AllocBuffer(n);
      Check(engine.RegisterLocalMemory(p, n, Location()), "register " + Location() + " memory");
    }
    out.list.emplace_back(p, n);
  }
  return out;
}

int RunTarget(TransferEngine& engine, TargetBuffers buffers) {
  const auto& first = buffers.list.front();
  std::printf("Target segment name: %s (buffer 0x%lx, %lu bytes, %s; %zu buffer(s))\n",
              engine.GetLocalSegmentName().c_str(), reinterpret_cast<unsigned long>(first.first),
              static_cast<unsigned long>(first.second), Location().c_str(), buffers.list.size());
  std::fflush(stdout);
  while (!g_stop.load()) ::usleep(100000);
  LOG(INFO) << "target stopping";
  for (auto& [p, n] : buffers.list) {
    if (FLAGS_shared_buffer) {
      Check(engine.FreeSharedMemory(p), "free shared memory");
      continue;
    }
    Check(engine.UnregisterLocalMemory(p), "unregister");
    FreeBuffer(p, n);
  }
  return 0;
}

// Where the initiator writes in the target: a warm-up address and one per block iteration.
struct RemotePlan {
  uint64_t warm_up = 0;
  std::vector<uint64_t> iteration;
};

// Fits the block iterations into the target's buffers: upstream's perf layout (a warm-up
// buffer, then one per iteration), or everything at the start of its first buffer.
bool PlanBlockIterations(const mooncake::SegmentInfo& info, RemotePlan* plan) {
  const auto& b = info.buffers;
  const uint64_t n = FLAGS_block_iteration;
  bool layout = b.size() >= n + 1 && b[0].length >= FLAGS_block_size;
  for (uint64_t i = 0; layout && i < n; ++i) layout = b[i + 1].length >= IterationBytes(i);
  plan->iteration.clear();
  if (layout) {
    plan->warm_up = b[0].addr;
    for (uint64_t i = 0; i < n; ++i) plan->iteration.push_back(b[i + 1].addr);
    return true;
  }
  if (b.empty() || b[0].length < IterationBytes(n - 1)) return false;
  plan->warm_up = b[0].addr;
  plan->iteration.assign(n, b[0].addr);
  return true;
}

// The target's descriptor once `ready` accepts it. A target that registers its memory after
// it starts listening (upstream's perf tool does) is waited for, at most --timeout_ms.
mooncake::SegmentInfo WaitForTargetMemory(
    TransferEngine& engine, SegmentID seg,
    const std::function<bool(const mooncake::SegmentInfo&)>& ready) {
  auto deadline = Clock::now() + std::chrono::milliseconds(FLAGS_timeout_ms);
  bool said = false;
  for (;;) {
    auto info = engine.GetSegmentInfo(seg);
    Check(info.status(), "segment info of " + FLAGS_segment_id);
    if (ready(*info)) return *info;
    if (Clock::now() >= deadline) {
      std::string seen = std::to_string(info->buffers.size()) + " buffer(s)";
      if (!info->buffers.empty()) {
        seen += ", the first " + std::to_string(info->buffers[0].length) + " bytes";
      }
      Die("segment " + FLAGS_segment_id + " has no registered memory that fits (" + seen +
          ") after " + std::to_string(FLAGS_timeout_ms) + " ms (--timeout_ms)");
    }
    if (!said) {
      LOG(INFO) << "segment " << FLAGS_segment_id << " has not registered the memory this run "
                << "needs yet (" << info->buffers.size() << " buffer(s)); waiting for it, at most "
                << FLAGS_timeout_ms << " ms";
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    Check(engine.RefreshSegment(seg), "refresh segment " + FLAGS_segment_id);
  }
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

int RunBlockIterations(TransferEngine& engine, SegmentID seg, const RemotePlan& plan,
                       TransferRequest::OpCode op) {
  // Warm-up: one block, as upstream's tool does before it measures.
  uint8_t* warm = AllocBuffer(FLAGS_block_size);
  Check(engine.RegisterLocalMemory(warm, FLAGS_block_size, Location()), "register");
  RunBatch(engine, {{op, warm, seg, plan.warm_up, FLAGS_block_size}}, /*say_submitted=*/true);
  Check(engine.UnregisterLocalMemory(warm), "unregister");
  FreeBuffer(warm, FLAGS_block_size);
  for (uint64_t i = 0; i < FLAGS_block_iteration; ++i) {
    uint64_t bs = FLAGS_block_size << i;
    uint64_t need = IterationBytes(i);
    uint8_t* local = AllocBuffer(need);
    Check(engine.RegisterLocalMemory(local, need, Location()), "register");
    std::vector<TransferRequest> reqs;
    // Every other block, so that neither side's memory is contiguous (as upstream).
    for (int j = 0; j < FLAGS_batch_size; ++j) {
      reqs.push_back({op, local + bs * 2 * j, seg, plan.iteration[i] + bs * 2 * j, bs});
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

TransferRequest::OpCode ParseOperation() {
  if (FLAGS_operation != "read" && FLAGS_operation != "write") {
    Die("--operation must be read or write");
  }
  return FLAGS_operation == "write" ? TransferRequest::WRITE : TransferRequest::READ;
}

// The target's first buffer, once it has registered one; dies if it is under --buffer_size.
uint64_t WaitForRemoteBuffer(TransferEngine& engine, SegmentID seg) {
  auto info = WaitForTargetMemory(
      engine, seg, [](const mooncake::SegmentInfo& i) { return !i.buffers.empty(); });
  uint64_t remote = info.buffers[0].addr, remote_len = info.buffers[0].length;
  if (remote_len < FLAGS_buffer_size) {
    Die("target buffer is " + std::to_string(remote_len) + " bytes; --buffer_size asks " +
        std::to_string(FLAGS_buffer_size));
  }
  return remote;
}

// The initiator's registered buffer of --buffer_size (shared memory with --shared_buffer).
uint8_t* AllocLocalBuffer(TransferEngine& engine) {
  if (FLAGS_shared_buffer && DeviceId() >= 0) Die("--shared_buffer is host memory; drop --gpu_id");
  if (FLAGS_shared_buffer) {
    auto shared = engine.AllocateSharedMemory(FLAGS_buffer_size);
    Check(shared.status(), "allocate shared memory");
    auto* local = static_cast<uint8_t*>(*shared);
    std::memset(local, 0, FLAGS_buffer_size);
    return local;
  }
  uint8_t* local = AllocBuffer(FLAGS_buffer_size);
  Check(engine.RegisterLocalMemory(local, FLAGS_buffer_size, Location()), "register");
  return local;
}

// --verify: writes a pattern over the whole buffer, reads it back into a second buffer and
// compares every byte; dies on a mismatch.
void RunVerify(TransferEngine& engine, uint8_t* local, SegmentID seg, uint64_t remote,
               double unit) {
  uint8_t* back = AllocBuffer(FLAGS_buffer_size);
  Check(engine.RegisterLocalMemory(back, FLAGS_buffer_size, Location()), "register");
  std::vector<uint8_t> pattern(FLAGS_buffer_size), got(FLAGS_buffer_size);
  uint64_t x = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(::getpid());
  for (size_t i = 0; i < FLAGS_buffer_size; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    pattern[i] = static_cast<uint8_t>(x);
  }
  CopyBuffer(local, pattern.data(), FLAGS_buffer_size);
  double tw = MoveAll(engine, TransferRequest::WRITE, local, seg, remote, FLAGS_buffer_size);
  double tr = MoveAll(engine, TransferRequest::READ, back, seg, remote, FLAGS_buffer_size);
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

struct TimedRun {
  double secs = 0;
  uint64_t batches = 0;
  std::vector<double> latencies_us;  // one per batch, all threads
};

// --threads workers submitting their batches back to back for --duration seconds (or until
// a signal); thread t's requests cover every --threads-th block from block t.
TimedRun RunWorkers(TransferEngine& engine, TransferRequest::OpCode op, uint8_t* local,
                    SegmentID seg, uint64_t remote) {
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
        reqs[i] = {op, local + off, seg, remote + off, FLAGS_block_size};
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
  TimedRun run;
  run.secs = std::chrono::duration<double>(Clock::now() - start).count();
  run.batches = batches.load();
  for (auto& v : latencies) run.latencies_us.insert(run.latencies_us.end(), v.begin(), v.end());
  return run;
}

// Upstream's result line (logged and printed), ours, and with --json the JSON line.
void Report(TimedRun& run, double unit) {
  const double secs = run.secs;
  const uint64_t n = run.batches;
  double bytes = static_cast<double>(n) * FLAGS_batch_size * FLAGS_block_size;
  double p50, p99;
  Percentiles(run.latencies_us, &p50, &p99);
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
}

int RunInitiator(TransferEngine& engine) {
  if (FLAGS_segment_id.empty()) Die("--segment_id is required: the target logs it");
  const TransferRequest::OpCode op = ParseOperation();
  uint64_t need = FLAGS_block_size * FLAGS_batch_size * FLAGS_threads;
  if (FLAGS_block_iteration == 0 && FLAGS_buffer_size < need) {
    LOG(WARNING) << "Invalid flag: buffer size is smaller than require_size, adjust to " << need;
    FLAGS_buffer_size = need;
  }
  auto seg = engine.OpenSegment(FLAGS_segment_id);
  Check(seg.status(), "open segment " + FLAGS_segment_id);
  if (FLAGS_block_iteration > 0) {
    RemotePlan plan;
    WaitForTargetMemory(engine, *seg, [&](const mooncake::SegmentInfo& info) {
      return PlanBlockIterations(info, &plan);
    });
    return RunBlockIterations(engine, *seg, plan, op);
  }
  const uint64_t remote = WaitForRemoteBuffer(engine, *seg);
  uint8_t* local = AllocLocalBuffer(engine);
  const double unit = UnitBytes(FLAGS_report_unit);
  if (FLAGS_verify) RunVerify(engine, local, *seg, remote, unit);
  if (FLAGS_duration <= 0) return 0;
  TimedRun run = RunWorkers(engine, op, local, *seg, remote);
  Report(run, unit);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ApplyToolDefaults();
  gflags::SetUsageMessage(std::string(kToolName) + " --mode=target|initiator [flags]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  ::signal(SIGINT, OnSignal);
  ::signal(SIGTERM, OnSignal);
  ::signal(SIGPIPE, SIG_IGN);
  Check(DeviceReady(), "device memory");
  if (FLAGS_block_size == 0 || FLAGS_batch_size <= 0 || FLAGS_threads <= 0) {
    Die("--block_size, --batch_size and --threads must be positive");
  }
  if (FLAGS_mode != "target" && FLAGS_mode != "initiator") {
    Die("--mode must be target or initiator");
  }
  TransferEngine engine;
  // The target's memory is registered before Init: in the descriptor before "listening on".
  TargetBuffers target_buffers;
  const bool late = FLAGS_target_register_delay_ms >= 0;
  if (FLAGS_mode == "target" && !late) target_buffers = RegisterTargetBuffers(engine);
  std::string proto = FLAGS_protocol == "auto" ? "" : FLAGS_protocol;
  Check(engine.Init(FLAGS_metadata_server, FLAGS_local_server_name, proto), "init");
  if (FLAGS_mode == "target" && late) {
    std::this_thread::sleep_for(std::chrono::milliseconds(FLAGS_target_register_delay_ms));
    target_buffers = RegisterTargetBuffers(engine);
  }
  std::string transports;
  for (const auto& t : engine.GetTransports()) transports += (transports.empty() ? "" : ",") + t;
  LOG(INFO) << "Success to initialize mooncake-te engine: " << engine.GetLocalSegmentName()
            << ", transports " << transports << ", memory " << Location();
  if (FLAGS_mode == "target") return RunTarget(engine, std::move(target_buffers));
  return RunInitiator(engine);
}
