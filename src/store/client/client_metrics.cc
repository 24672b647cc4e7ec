#include "store/client/client_metrics.h"

#include <glog/logging.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "store/common/metrics_text.h"

namespace mooncake {
namespace store {

namespace {

std::string Trimmed(const char* v) {
  std::string s(v);
  auto not_space = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// upstream's TryParseBool: 1/true/yes/on/enable, 0/false/no/off/disable (case and spaces ignored).
bool EnvBool(const char* name, bool fallback) {
  const char* v = getenv(name);
  if (v == nullptr) return fallback;
  const std::string s = Trimmed(v);
  if (s == "1" || s == "true" || s == "yes" || s == "on" || s == "enable") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off" || s == "disable") return false;
  LOG(WARNING) << name << "=" << v << " is not a boolean (1/true/yes/on/enable or "
               << "0/false/no/off/disable): " << (fallback ? "on" : "off") << " kept";
  return fallback;
}

uint64_t EnvSeconds(const char* name) {
  const char* v = getenv(name);
  if (v == nullptr) return 0;
  std::string s = Trimmed(v);
  if (!s.empty() && s[0] == '+') s.erase(0, 1);
  constexpr uint64_t kYear = 366ull * 24 * 3600;
  if (s.empty() || s.size() > 12 || !std::all_of(s.begin(), s.end(), ::isdigit) ||
      std::stoull(s) > kYear) {
    LOG(WARNING) << name << "=" << v << " is not a whole number of seconds up to a year: 0 "
                 << "(no report) kept";
    return 0;
  }
  return std::stoull(s);
}

void Header(const char* name, const char* help, const char* type, std::string* out) {
  *out += "# HELP ";
  *out += name;
  *out += ' ';
  *out += help;
  *out += "\n# TYPE ";
  *out += name;
  *out += ' ';
  *out += type;
  *out += '\n';
}

void Sample(const std::string& name, const std::string& labels, uint64_t v, std::string* out) {
  *out += name;
  *out += labels;
  *out += ' ';
  *out += std::to_string(v);
  *out += '\n';
}

// labels "{a="b"}" plus one more pair.
std::string With(const std::string& labels, const char* name, const std::string& value) {
  std::string pair = std::string(name) + "=\"" + value + "\"";
  if (labels.empty()) return "{" + pair + "}";
  return labels.substr(0, labels.size() - 1) + "," + pair + "}";
}

}  // namespace

// ---- LatencyHistogram ----

void LatencyHistogram::Observe(uint64_t us) {
  const uint64_t* at = std::lower_bound(bounds_, bounds_ + n_, us);
  buckets_[at - bounds_].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(us, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

void LatencyHistogram::Write(const std::string& name, const std::string& labels,
                             std::string* out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= n_; ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    const std::string le = i < n_ ? std::to_string(bounds_[i]) : "+Inf";
    Sample(name + "_bucket", With(labels, "le", le), cumulative, out);
  }
  Sample(name + "_sum", labels, sum_.load(std::memory_order_relaxed), out);
  // The count is the buckets' total, so that the exposition is consistent however the
  // observations interleave with this read.
  Sample(name + "_count", labels, cumulative, out);
}

std::string LatencyHistogram::Brief() const {
  const std::string tail = Tail();
  if (tail.empty()) return "No data";
  Counts b{};
  const uint64_t n = Snapshot(&b);
  // n may have grown past the snapshot Tail() read; the count is the later one.
  return "count=" + std::to_string(n) + tail;
}

std::string LatencyHistogram::Bound(size_t i, const char* unit) const {
  return i < n_ ? "<" + std::to_string(bounds_[i]) + unit
                : ">" + std::to_string(bounds_[n_ - 1]) + unit;
}

uint64_t LatencyHistogram::Snapshot(Counts* b) const {
  uint64_t n = 0;
  for (size_t i = 0; i <= n_; ++i) n += ((*b)[i] = buckets_[i].load(std::memory_order_relaxed));
  return n;
}

size_t LatencyHistogram::BucketOfRank(const Counts& b, uint64_t rank) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= n_; ++i) {
    cumulative += b[i];
    if (cumulative >= rank) return i;
  }
  return n_;
}

std::string LatencyHistogram::Tail() const {
  Counts b{};
  const uint64_t n = Snapshot(&b);
  if (n == 0) return "";
  size_t max = 0;
  for (size_t i = 0; i <= n_; ++i) {
    if (b[i] > 0) max = i;
  }
  // p95: the first bucket holding n * 95 / 100 observations (upstream's rule).
  const size_t p95 = BucketOfRank(b, std::max<uint64_t>(1, n * 95 / 100));
  return ", p95" + Bound(p95, "μs") + ", max" + Bound(max, "μs");
}

std::string LatencyHistogram::Quantiles() const {
  Counts b{};
  const uint64_t n = Snapshot(&b);
  if (n == 0) return "No data";
  std::string out = "count=" + std::to_string(n);
  for (const auto& [name, q] : {std::pair<const char*, uint64_t>{"p50", 50}, {"p90", 90},
                                {"p99", 99}}) {
    // Nearest rank: the observation ceil(q% of n).
    out += std::string(", ") + name + Bound(BucketOfRank(b, (n * q + 99) / 100), "us");
  }
  char avg[48];
  snprintf(avg, sizeof(avg), ", avg=%.1fus",
           static_cast<double>(sum_.load(std::memory_order_relaxed)) / static_cast<double>(n));
  return out + avg;
}

// ---- ClientMetrics ----

// Upstream's rpc_name values for this client's master calls (rpc_wire.h's methods; a call of
// one key and of several are upstream's single and Batch forms).
const char* const ClientMetrics::kRpcNames[kRpcs] = {
    "Ping",          "MountSegment",     "ReMountSegment", "UnmountSegment",
    "PutStart",      "BatchPutStart",    "UpsertStart",    "BatchUpsertStart",
    "PutEnd",        "BatchPutEnd",      "PutRevoke",      "BatchPutRevoke",
    "GetReplicaList", "BatchGetReplicaList", "ExistKey",    "BatchExistKey",
    "Remove",        "BatchRemove",      "RemoveByRegex",  "RemoveAll",
    "BatchReplicaClear", "GetStats",  "CreateCopyTask", "CreateMoveTask",
    "QueryTask",     "FetchTasks",       "MarkTaskToComplete",
    "MountLocalDiskSegment", "OffloadObjectHeartbeat", "NotifyOffloadSuccess",
    "BatchEvictDiskReplica"};

// Upstream's op_name values (its RealClient's interfaces).
const char* const ClientMetrics::kOpNames[kOps] = {
    "put",          "put_batch",        "put_parts",       "put_from",
    "batch_put_from", "put_from_with_metadata", "batch_put_from_multi_buffers",
    "upsert",       "upsert_from",      "batch_upsert_from", "upsert_parts",
    "upsert_batch", "batch_upsert_from_multi_buffers",
    "get_buffer",   "batch_get_buffer", "get_into",        "batch_get_into",
    "get_into_ranges", "batch_get_into_multi_buffers", "batch_get_into_multi_buffer_ranges",
    "batch_put_from_multi_buffer_ranges"};

ClientMetrics::Options ClientMetrics::OptionsFromEnv() {
  Options o;
  o.enabled = EnvBool("MC_STORE_CLIENT_METRIC", true);
  o.report_interval_s = EnvSeconds("MC_STORE_CLIENT_METRIC_INTERVAL");
  o.bandwidth = EnvBool("MC_STORE_CLIENT_METRIC_BANDWIDTH", true);
  if (const char* c = getenv("MC_STORE_CLUSTER_ID")) o.cluster_id = c;
  return o;
}

std::unique_ptr<ClientMetrics> ClientMetrics::Create(const Options& options,
                                                     std::string client_mode) {
  if (!options.enabled) {
    LOG(INFO) << "client metrics disabled (MC_STORE_CLIENT_METRIC)";
    return nullptr;
  }
  return std::unique_ptr<ClientMetrics>(new ClientMetrics(options, std::move(client_mode)));
}

ClientMetrics::ClientMetrics(const Options& options, std::string client_mode)
    : options_(options), client_mode_(std::move(client_mode)) {
  if (options_.report_interval_s > 0) {
    LOG(INFO) << "client metrics: a summary every " << options_.report_interval_s
              << " s in the log (MC_STORE_CLIENT_METRIC_INTERVAL)";
    reporter_ = std::thread([this] { Report(); });
  }
}

ClientMetrics::~ClientMetrics() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (reporter_.joinable()) reporter_.join();
}

int ClientMetrics::RpcIndex(const char* rpc_name) {
  for (size_t i = 0; i < kRpcs; ++i) {
    if (std::strcmp(kRpcNames[i], rpc_name) == 0) return static_cast<int>(i);
  }
  return -1;
}

void ClientMetrics::CountRpc(int index) {
  if (index >= 0) rpc_count_[index].fetch_add(1, std::memory_order_relaxed);
}

void ClientMetrics::ObserveRpc(int index, uint64_t us) {
  if (index >= 0) rpc_latency_[index].Observe(us);
}

void ClientMetrics::ObserveOp(OpKind kind, const char* op_name, uint64_t bytes, uint64_t us) {
  for (size_t i = 0; i < kOps; ++i) {
    if (std::strcmp(kOpNames[i], op_name) != 0) continue;
    Op& op = (kind == OpKind::kRead ? read_ops_ : write_ops_)[i];
    op.count.fetch_add(1, std::memory_order_relaxed);
    op.bytes.fetch_add(bytes, std::memory_order_relaxed);
    op.latency.Observe(us);
    return;
  }
  DLOG(WARNING) << "client metrics: unknown op_name " << op_name;
}

void ClientMetrics::ObserveSsd(OpKind kind, uint64_t keys, uint64_t bytes, uint64_t us) {
  for (SsdOp* op : {kind == OpKind::kRead ? &ssd_read_ : &ssd_write_, &ssd_total_}) {
    op->count.fetch_add(keys, std::memory_order_relaxed);
    op->bytes.fetch_add(bytes, std::memory_order_relaxed);
    op->latency.Observe(us);
  }
}

std::string ClientMetrics::Labels(const char* extra_name, const char* extra_value) const {
  // Upstream orders static labels by name, then the dynamic one.
  std::string l = "{client_mode=\"" + PromLabelValue(client_mode_) + "\"";
  if (!options_.cluster_id.empty()) {
    l += ",cluster_id=\"" + PromLabelValue(options_.cluster_id) + "\"";
  }
  if (extra_name != nullptr) l += std::string(",") + extra_name + "=\"" + extra_value + "\"";
  return l + "}";
}

std::string ClientMetrics::Prometheus() const {
  std::string out;
  const std::string labels = Labels();
  Header("mooncake_transfer_read_bytes", "Total bytes read", "counter", &out);
  Sample("mooncake_transfer_read_bytes", labels, read_bytes_.load(), &out);
  Header("mooncake_transfer_write_bytes", "Total bytes written", "counter", &out);
  Sample("mooncake_transfer_write_bytes", labels, write_bytes_.load(), &out);
  struct H {
    const char* name;
    const char* help;
    const LatencyHistogram* h;
  };
  for (const H& h : {H{"mooncake_transfer_batch_put_latency", "Batch Put transfer latency (us)",
                       &batch_put_latency},
                     H{"mooncake_transfer_batch_get_latency", "Batch Get transfer latency (us)",
                       &batch_get_latency},
                     H{"mooncake_transfer_get_latency", "Get transfer latency (us)", &get_latency},
                     H{"mooncake_transfer_put_latency", "Put transfer latency (us)",
                       &put_latency}}) {
    Header(h.name, h.help, "histogram", &out);
    h.h->Write(h.name, labels, &out);
  }
  // Labelled families: only the label values seen (as upstream).
  std::string counts, latencies;
  for (size_t i = 0; i < kRpcs; ++i) {
    const uint64_t n = rpc_count_[i].load(std::memory_order_relaxed);
    if (n == 0) continue;
    const std::string l = Labels("rpc_name", kRpcNames[i]);
    Sample("mooncake_client_rpc_count", l, n, &counts);
    if (rpc_latency_[i].count() > 0) {
      rpc_latency_[i].Write("mooncake_client_rpc_latency", l, &latencies);
    }
  }
  if (!counts.empty()) {
    Header("mooncake_client_rpc_count", "Total number of RPC calls made by the client",
           "counter", &out);
    out += counts;
  }
  if (!latencies.empty()) {
    Header("mooncake_client_rpc_latency", "Latency of RPC calls made by the client (in us)",
           "histogram", &out);
    out += latencies;
  }
  for (OpKind kind : {OpKind::kRead, OpKind::kWrite}) {
    const bool read = kind == OpKind::kRead;
    const auto& ops = read ? read_ops_ : write_ops_;
    const std::string base = read ? "mooncake_transfer_read_operation"
                                  : "mooncake_transfer_write_operation";
    std::string c, b, lat;
    for (size_t i = 0; i < kOps; ++i) {
      const uint64_t n = ops[i].count.load(std::memory_order_relaxed);
      if (n == 0) continue;
      const std::string l = Labels("op_name", kOpNames[i]);
      Sample(base + "_count", l, n, &c);
      Sample(base + "_bytes", l, ops[i].bytes.load(std::memory_order_relaxed), &b);
      ops[i].latency.Write(base + "_latency", l, &lat);
    }
    if (c.empty()) continue;
    const std::string dir = read ? "read" : "write";
    Header((base + "_count").c_str(), ("Total " + dir + " operations by interface type").c_str(),
           "counter", &out);
    out += c;
    Header((base + "_bytes").c_str(), ("Total " + dir + " bytes by interface type").c_str(),
           "counter", &out);
    out += b;
    Header((base + "_latency").c_str(),
           (std::string(read ? "Read" : "Write") + " operation latency by interface type (us)")
               .c_str(),
           "histogram", &out);
    out += lat;
  }
  struct Ssd {
    const char* name;
    const char* what;
    const SsdOp* op;
  };
  for (const Ssd& d : {Ssd{"read", "read from", &ssd_read_}, Ssd{"write", "written to", &ssd_write_},
                       Ssd{"total", "read from and written to", &ssd_total_}}) {
    const std::string base = std::string("mooncake_ssd_") + d.name;
    Header((base + "_bytes_total").c_str(), (std::string("Bytes ") + d.what + " SSD").c_str(),
           "counter", &out);
    Sample(base + "_bytes_total", labels, d.op->bytes.load(std::memory_order_relaxed), &out);
    Header((base + "_ops_total").c_str(),
           (std::string("Objects (keys) ") + d.what + " SSD").c_str(), "counter", &out);
    Sample(base + "_ops_total", labels, d.op->count.load(std::memory_order_relaxed), &out);
    Header((base + "_latency_us").c_str(),
           "SSD latency per batch (us): a bucket written, a batch of records read", "histogram",
           &out);
    d.op->latency.Write(base + "_latency_us", labels, &out);
  }
  return out;
}

std::string ClientMetrics::Throughput() const {
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (s <= 0) return "";
  return "Average Read Throughput: " + ByteRateString(read_bytes_.load() / s) +
         "\nAverage Write Throughput: " + ByteRateString(write_bytes_.load() / s) + "\n";
}

std::string ClientMetrics::Summary() const {
  std::string out = "Client Metrics Summary\n=== Transfer Metrics Summary ===\n";
  out += "Total Read: " + ByteSizeString(read_bytes_.load()) + "\n";
  out += "Total Write: " + ByteSizeString(write_bytes_.load()) + "\n";
  if (options_.bandwidth) out += Throughput();
  out += "\n=== Latency Summary (microseconds) ===\n";
  out += "Get: " + get_latency.Brief() + "\n";
  out += "Put: " + put_latency.Brief() + "\n";
  out += "Batch Get: " + batch_get_latency.Brief() + "\n";
  out += "Batch Put: " + batch_put_latency.Brief() + "\n";
  out += "\n=== RPC Metrics Summary ===\n";
  bool any = false;
  for (size_t i = 0; i < kRpcs; ++i) {
    const uint64_t n = rpc_count_[i].load(std::memory_order_relaxed);
    if (n == 0) continue;
    any = true;
    // The count is the calls sent; the latency's (answered calls only) is left out.
    out += std::string(kRpcNames[i]) + ": count=" + std::to_string(n) + rpc_latency_[i].Tail() +
           "\n";
  }
  if (!any) out += "No RPC calls recorded\n";
  out += "\n=== Interface Operation Metrics Summary ===\n";
  for (OpKind kind : {OpKind::kRead, OpKind::kWrite}) {
    const auto& ops = kind == OpKind::kRead ? read_ops_ : write_ops_;
    out += kind == OpKind::kRead ? "Read Interfaces:\n" : "Write Interfaces:\n";
    bool seen = false;
    for (size_t i = 0; i < kOps; ++i) {
      const uint64_t n = ops[i].count.load(std::memory_order_relaxed);
      if (n == 0) continue;
      seen = true;
      out += std::string(kOpNames[i]) + ": count=" + std::to_string(n) +
             ", bytes=" + ByteSizeString(ops[i].bytes.load(std::memory_order_relaxed)) +
             ops[i].latency.Tail() + "\n";
    }
    if (!seen) out += "No data\n";
  }
  // Upstream's SSD sections: bytes and keys (with their average rates), then latencies.
  out += "\n=== SSD Metrics Summary ===\n";
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  for (const auto& [name, op] : {std::pair<const char*, const SsdOp*>{"SSD Read", &ssd_read_},
                                 {"SSD Write", &ssd_write_}, {"SSD Total", &ssd_total_}}) {
    const uint64_t bytes = op->bytes.load(std::memory_order_relaxed);
    const uint64_t keys = op->count.load(std::memory_order_relaxed);
    out += std::string(name) + ": " + ByteSizeString(bytes) + ", ops=" + std::to_string(keys);
    if (s > 0 && bytes > 0) {
      char iops[48];
      snprintf(iops, sizeof(iops), ", IOPS=%.1f", static_cast<double>(keys) / s);
      out += ", throughput=" + ByteRateString(bytes / s) + iops;
    }
    out += "\n";
  }
  out += "\n=== SSD Latency Summary (microseconds) ===\n";
  out += "Read: " + ssd_read_.latency.Quantiles() + "\n";
  out += "Write: " + ssd_write_.latency.Quantiles() + "\n";
  out += "Total: " + ssd_total_.latency.Quantiles() + "\n";
  return out;
}

void ClientMetrics::Report() {
  uint64_t last_read = 0, last_write = 0;
  auto last = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::seconds(options_.report_interval_s),
                       [this] { return stop_; })) {
    std::string text;
    try {
      text = "Client Metrics Report:\n" + Summary();
    } catch (const std::exception& e) {  // never end the process for a report
      LOG(WARNING) << "client metrics report failed: " << e.what();
      continue;
    }
    if (options_.bandwidth) {
      const auto now = std::chrono::steady_clock::now();
      const double s = std::chrono::duration<double>(now - last).count();
      const uint64_t r = read_bytes_.load(), w = write_bytes_.load();
      char span[32];
      snprintf(span, sizeof(span), "%.2f", s);
      text += "\n=== Interval Throughput Summary ===\nRead Throughput: " +
              ByteRateString((r - last_read) / s) + " (" + ByteSizeString(r - last_read) + " over " +
              span + "s)\nWrite Throughput: " + ByteRateString((w - last_write) / s) + " (" +
              ByteSizeString(w - last_write) + " over " + span + "s)";
      last_read = r;
      last_write = w;
      last = now;
    }
    LOG(INFO) << text;
  }
}

}  // namespace store
}  // namespace mooncake
