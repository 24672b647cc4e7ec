// store_bench: put/get throughput through the Mooncake Store (master + clients), for
// bench/run.py and by hand.
//
//   mooncake_master --rpc_port=50051 &
//   store_bench --role=holder --segment_size=1073741824 &        # contributes the pool
//   store_bench --role=bench --op=put --block_size=1048576 --batch_size=16 --duration=3
//
// The bench client contributes no memory (global segment 0), so every object lands in the
// holder's segment and moves through the transfer engine (same host: the shm transport);
// its buffer is registered (zero copy, as put_from / get_into). Put batches use fresh keys
// (the working set is cleared with remove_all, untimed, before the pool fills); get batches
// read a working set written first. Prints upstream-style "Test completed" and, with --json,
// one JSON line: op, block, batch, gbps, ops_per_s, batch_p50_us, batch_p99_us.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mooncake/store/store_client.h"

DEFINE_string(role, "bench", "holder (contributes the pool and waits) | bench");
DEFINE_string(master, "127.0.0.1:50051", "mooncake_master address");
DEFINE_string(local_hostname, "127.0.0.1", "this client's host");
DEFINE_string(metadata_server, "P2PHANDSHAKE", "as the engine's");
DEFINE_uint64(segment_size, 1ull << 30, "holder: bytes contributed to the pool");
DEFINE_string(op, "put",
              "bench: put | get | exist (batch_is_exist of the working set's keys: the master's "
              "round trip for a batch, no data moved)");
DEFINE_uint64(block_size, 1 << 20, "bench: bytes per object");
DEFINE_int32(batch_size, 16, "bench: objects per batch call");
DEFINE_double(duration, 3, "bench: seconds of the timed loop");
DEFINE_uint64(working_set, 256ull << 20, "bench: bytes of objects kept in the pool");
DEFINE_uint32(key_bytes, 0,
              "bench: pad each key to at least this many bytes (serving systems name blocks by "
              "hashes: 64 or more); 0: short keys (bench-R-I)");
DEFINE_bool(json, false, "bench: print one JSON result line");
DEFINE_int32(fills, 0,
             "bench, put: time N fills of --working_set each (the pool emptied between them, "
             "untimed) instead of --duration: fill 1 into a fresh holder's segment is the first "
             "fill, the next ones are warm; one line (and JSON line) per fill");

namespace {

using mooncake::store::ReplicateConfig;
using mooncake::store::Span;
using mooncake::store::StoreClient;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

std::unique_ptr<StoreClient> Connect(uint64_t segment_size, uint64_t buffer_size) {
  mooncake::store::StoreClientOptions o;
  o.local_hostname = FLAGS_local_hostname;
  o.metadata_server = FLAGS_metadata_server;
  o.global_segment_size = segment_size;
  o.local_buffer_size = buffer_size;
  o.master_server_addr = FLAGS_master;
  int code = 0;
  std::string message;
  auto c = StoreClient::Create(o, &code, &message);
  if (!c) {
    std::fprintf(stderr, "store_bench: setup failed (%d): %s\n", code, message.c_str());
    std::exit(1);
  }
  return c;
}

int Holder() {
  auto c = Connect(FLAGS_segment_size, 4 << 20);
  std::printf("holder ready: segment %s, %llu bytes\n", c->segment_name().c_str(),
              static_cast<unsigned long long>(FLAGS_segment_size));
  std::fflush(stdout);
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return c->Close() == 0 ? 0 : 1;
}

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

int Bench() {
  const size_t block = FLAGS_block_size;
  const size_t batch = static_cast<size_t>(std::max(1, FLAGS_batch_size));
  if (block == 0) {
    std::fprintf(stderr, "store_bench: --block_size must be > 0\n");
    return 1;
  }
  const size_t set_batches = std::max<size_t>(1, FLAGS_working_set / (block * batch));
  auto c = Connect(0, 16 << 20);
  std::vector<char> buf(block * batch);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(i * 131 + 7);
  if (c->RegisterBuffer(buf.data(), buf.size()) != 0) return 1;
  std::vector<std::vector<Span>> parts(batch);
  for (size_t i = 0; i < batch; ++i) parts[i] = {{buf.data() + i * block, block}};
  auto keys_of = [&](size_t round) {
    std::vector<std::string> keys;
    for (size_t i = 0; i < batch; ++i) {
      std::string k = "bench-" + std::to_string(round) + "-" + std::to_string(i);
      if (k.size() < FLAGS_key_bytes) k.insert(0, FLAGS_key_bytes - k.size(), 'k');
      keys.push_back(std::move(k));
    }
    return keys;
  };
  (void)c->RemoveAll(true);
  const bool put = FLAGS_op == "put";
  if (!put) {
    for (size_t r = 0; r < set_batches; ++r) {
      for (int code : c->BatchPut(keys_of(r), parts, ReplicateConfig{})) {
        if (code != 0) {
          std::fprintf(stderr, "store_bench: put of the working set failed: %d\n", code);
          return 1;
        }
      }
    }
  }
  // One timed pass: --duration seconds (the pool emptied, untimed, every working set), or
  // with `fill`, exactly one working set of puts into an emptied pool.
  auto measure = [&](int fill) -> bool {
    std::vector<double> lat;
    size_t done = 0, round = 0;
    const double cpu0 = CpuSeconds();
    const auto start = Clock::now();
    const auto end = start + std::chrono::duration<double>(FLAGS_duration);
    Clock::duration excluded{0};
    while (fill > 0 ? round < set_batches : Clock::now() < end) {
      const auto keys = keys_of(put ? round : round % set_batches);
      const auto t0 = Clock::now();
      bool ok = true;
      if (put) {
        for (int code : c->BatchPut(keys, parts, ReplicateConfig{})) ok = ok && code == 0;
      } else if (FLAGS_op == "exist") {
        for (int e : c->BatchIsExist(keys)) ok = ok && e == 1;
      } else {
        for (int64_t n : c->BatchGet(keys, parts)) ok = ok && n == static_cast<int64_t>(block);
      }
      const auto t1 = Clock::now();
      if (!ok) {
        std::fprintf(stderr, "store_bench: a %s batch failed\n", FLAGS_op.c_str());
        return false;
      }
      lat.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      done += batch;
      ++round;
      if (fill == 0 && put && round % set_batches == 0) {  // keep the pool from filling: not timed
        (void)c->RemoveAll(true);
        excluded += Clock::now() - t1;
      }
    }
    const double secs = std::chrono::duration<double>(Clock::now() - start - excluded).count();
    // This process's CPU per batch (all threads, user + system; the pool refills excluded
    // from the time but not from this): what a batch costs here regardless of the load.
    const double cpu_us = (CpuSeconds() - cpu0) * 1e6 / static_cast<double>(std::max<size_t>(1, round));
    std::sort(lat.begin(), lat.end());
    const double p50 = lat[lat.size() / 2];
    const double p99 = lat[std::min(lat.size() - 1, static_cast<size_t>(lat.size() * 0.99))];
    const double gbps = static_cast<double>(done * block) / secs / 1e9;
    const double ops = static_cast<double>(done) / secs;
    std::printf("Test completed: duration %.2f, batch count %zu, throughput %.2f GB/s\n", secs,
                lat.size(), gbps);
    std::printf("%s%s: %.0f ops/s, batch latency p50 %.1f us, p99 %.1f us, client CPU %.1f us/batch\n",
                FLAGS_op.c_str(), fill > 0 ? (" fill " + std::to_string(fill)).c_str() : "", ops,
                p50, p99, cpu_us);
    if (FLAGS_json) {
      std::printf("{\"op\":\"%s\",\"block\":%zu,\"batch\":%zu,\"gbps\":%.4f,\"ops_per_s\":%.1f,"
                  "\"batch_p50_us\":%.1f,\"batch_p99_us\":%.1f,\"client_cpu_us_per_batch\":%.1f,"
                  "\"fill\":%d}\n",
                  FLAGS_op.c_str(), block, batch, gbps, ops, p50, p99, cpu_us, fill);
    }
    std::fflush(stdout);
    return true;
  };
  if (put && FLAGS_fills > 0) {
    for (int f = 1; f <= FLAGS_fills; ++f) {
      if (!measure(f)) return 1;
      (void)c->RemoveAll(true);
    }
  } else if (!measure(0)) {
    return 1;
  }
  (void)c->RemoveAll(true);
  (void)c->UnregisterBuffer(buf.data());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("store_bench --role=holder|bench [--op=put|get] ...");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  if (FLAGS_role == "holder") return Holder();
  if (FLAGS_role == "bench") {
    if (FLAGS_op != "put" && FLAGS_op != "get" && FLAGS_op != "exist") {
      std::fprintf(stderr, "store_bench: --op must be put, get or exist\n");
      return 1;
    }
    return Bench();
  }
  std::fprintf(stderr, "store_bench: --role must be holder or bench\n");
  return 1;
}
