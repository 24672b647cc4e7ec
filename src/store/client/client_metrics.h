// ClientMetrics: what a Store client exposes about itself, under upstream's names, so that
// upstream's dashboards and scrapes read ours (upstream mooncake-store/include/client_metric.h):
//   mooncake_transfer_{read,write}_bytes                 counters: bytes the client moved
//   mooncake_transfer_{put,get,batch_put,batch_get}_latency   histograms (us): whole calls
//   mooncake_client_rpc_count / _latency {rpc_name}      the master calls (latency: answered ones)
//   mooncake_transfer_{read,write}_operation_{count,bytes,latency} {op_name}  the Python API
//   mooncake_ssd_{read,write,total}_{bytes,ops}_total, mooncake_ssd_{read,write,total}_latency_us
//                                                        the disk tier: per bucket written, per
//                                                        batch of records read (always listed,
//                                                        as upstream; upstream's quantile
//                                                        summaries *_latency_summary_us are not)
// Every series carries client_mode ("real" or "dummy"), and cluster_id when MC_STORE_CLUSTER_ID
// is set. Latency buckets are upstream's (us): 50 .. 20,000,000 (kBucketsUs), the SSD ones
// 50 .. 30,000,000 (kSsdBucketsUs). Summary() is upstream's human-readable report
// (/metrics/summary, the periodic log); its SSD latency lines give bucket bounds ("p50<200us")
// where upstream's give a summary's quantiles ("p50=153.0us").
//
// Environment (upstream's): MC_STORE_CLIENT_METRIC (default on; 0/false/no/off/disable turn the
// metrics off: the client has none, and its HTTP server answers 503), MC_STORE_CLIENT_METRIC_INTERVAL
// (seconds between summaries in the log; 0, the default: never), MC_STORE_CLIENT_METRIC_BANDWIDTH
// (default on: the throughput lines of the summary).
//
// Thread-safe and lock-free on the recording side (atomics); the names a series is recorded
// under are fixed lists (no allocation per call).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace mooncake {
namespace store {

class LatencyHistogram {
 public:
  static constexpr std::array<uint64_t, 27> kBucketsUs = {
      50,    75,    125,    150,    200,    250,    300,     400,     500,
      750,   1000,  1500,   2000,   3000,   5000,   7000,    15000,   20000,
      50000, 100000, 200000, 500000, 1000000, 2000000, 5000000, 10000000, 20000000};
  // Upstream's kSsdLatencyBucket (client_metric.h): NVMe to network file systems.
  static constexpr std::array<uint64_t, 18> kSsdBucketsUs = {
      50,     100,    200,     500,     1000,    2000,    5000,     10000,    20000,
      50000,  100000, 200000,  500000,  1000000, 2000000, 5000000,  10000000, 30000000};

  // `bounds` (ascending, at most kBucketsUs.size() of them) must outlive it.
  template <size_t N>
  explicit LatencyHistogram(const std::array<uint64_t, N>& bounds)
      : bounds_(bounds.data()), n_(N) {
    static_assert(N <= kBucketsUs.size(), "too many buckets");
  }
  LatencyHistogram() : LatencyHistogram(kBucketsUs) {}

  void Observe(uint64_t us);
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  // Prometheus lines: name_bucket{labels,le=...} (cumulative), name_sum, name_count.
  void Write(const std::string& name, const std::string& labels, std::string* out) const;
  // Upstream's summary form: "count=N, p95<Xμs, max<Yμs" (bucket bounds), or "No data".
  std::string Brief() const;
  // The same without the count: ", p95<Xμs, max<Yμs", or "" when empty (one snapshot).
  std::string Tail() const;
  // Upstream's SSD latency line, from the buckets: "count=N, p50<Xus, p90<Yus, p99<Zus,
  // avg=W.Wus", or "No data".
  std::string Quantiles() const;

 private:
  using Counts = std::array<uint64_t, kBucketsUs.size() + 1>;
  // The buckets' counts now into *b; returns their total.
  uint64_t Snapshot(Counts* b) const;
  // The bucket index holding the observation of rank `rank` (1-based) of the snapshot `b`.
  size_t BucketOfRank(const Counts& b, uint64_t rank) const;
  std::string Bound(size_t i, const char* unit) const;  // "<X" or ">last" with `unit`

  const uint64_t* const bounds_;
  const size_t n_;
  std::array<std::atomic<uint64_t>, kBucketsUs.size() + 1> buckets_{};  // [n_]: +Inf
  std::atomic<uint64_t> sum_{0};
  std::atomic<uint64_t> count_{0};
};

enum class OpKind { kRead, kWrite };

class ClientMetrics {
 public:
  struct Options {
    bool enabled = true;
    uint64_t report_interval_s = 0;
    bool bandwidth = true;
    std::string cluster_id;
  };
  // From the environment; a value that does not parse is logged and the default kept.
  static Options OptionsFromEnv();
  // Null when options.enabled is false.
  static std::unique_ptr<ClientMetrics> Create(const Options& options, std::string client_mode);
  ~ClientMetrics();  // stops the reporter

  void AddRead(uint64_t bytes) { read_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  void AddWrite(uint64_t bytes) { write_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  LatencyHistogram put_latency, get_latency, batch_put_latency, batch_get_latency;

  // The master's calls, by upstream's rpc_name (RpcIndex; -1: not one of ours, ignored).
  static int RpcIndex(const char* rpc_name);
  void CountRpc(int index);
  void ObserveRpc(int index, uint64_t us);

  // One call of the Python API (op_name: upstream's interface names, e.g. "get_into").
  void ObserveOp(OpKind kind, const char* op_name, uint64_t bytes, uint64_t us);
  // One disk tier call (DiskStore::IoObserver): a bucket written, or a batch of records read.
  void ObserveSsd(OpKind kind, uint64_t keys, uint64_t bytes, uint64_t us);

  std::string Prometheus() const;  // text format 0.0.4
  std::string Summary() const;
  const std::string& client_mode() const { return client_mode_; }

 private:
  ClientMetrics(const Options& options, std::string client_mode);
  struct Op {
    std::atomic<uint64_t> count{0}, bytes{0};
    LatencyHistogram latency;
  };
  static constexpr size_t kRpcs = 31;
  static constexpr size_t kOps = 21;
  static const char* const kRpcNames[kRpcs];
  static const char* const kOpNames[kOps];
  std::string Labels(const char* extra_name = nullptr, const char* extra_value = nullptr) const;
  std::string Throughput() const;  // the average since start, per direction
  void Report();                   // the reporter thread

  const Options options_;
  const std::string client_mode_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::atomic<uint64_t> read_bytes_{0}, write_bytes_{0};
  std::array<std::atomic<uint64_t>, kRpcs> rpc_count_{};
  std::array<LatencyHistogram, kRpcs> rpc_latency_;
  std::array<Op, kOps> read_ops_, write_ops_;
  struct SsdOp {
    std::atomic<uint64_t> count{0}, bytes{0};  // count: keys
    LatencyHistogram latency{LatencyHistogram::kSsdBucketsUs};
  };
  SsdOp ssd_read_, ssd_write_, ssd_total_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread reporter_;
};

}  // namespace store
}  // namespace mooncake
