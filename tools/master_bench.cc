// master_bench: how the Store master scales with the number of objects it holds.
//
// Builds a MasterService in this process (no RPC; the real clock), mounts fake segments (the
// master only places objects in them, it never touches their memory), fills it with
// --objects objects through PutStart + PutEnd batches of --batch keys, as a client would, and
// at each checkpoint measures, with the table at that size:
//   exist      single-key ExistKey of a random stored key (after an untimed pass of as many)
//   get        single-key GetReplicaList of a random stored key (grants a lease)
//   put_batch  PutStart + PutEnd of --batch new keys (one "op" = the whole batch)
//   remove     single-key Remove of a key the put_batch step added (so the size stays)
// as p50 / p99 latency and calls/s, and the process's resident memory growth per object
// since the segments were mounted. Prints a table and, with --json, one JSON line.
//
//   master_bench --objects=10000000 --checkpoints=10000,100000,1000000,10000000 --json
//
// Keys look like a KV-cache connector's (model, rank, a 40-hex-digit chunk hash); sizes are
// uniform in [--min_size, --max_size]. Heartbeats (Ping) and Tick run once a second, as the
// client library and the master's housekeeping thread would.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "mooncake/store/error_code.h"
#include "store/master/master_service.h"

DEFINE_uint64(objects, 10000000, "objects to fill the master with");
DEFINE_string(checkpoints, "10000,100000,1000000,10000000",
              "object counts at which to measure (those above --objects are skipped; "
              "--objects itself is always one)");
DEFINE_uint64(min_size, 4096, "smallest object, bytes");
DEFINE_uint64(max_size, 65536, "largest object, bytes");
DEFINE_int32(batch, 128, "keys per PutStart / PutEnd batch (fill and put_batch)");
DEFINE_int32(segments, 4, "fake segments mounted (one client each)");
DEFINE_uint64(segment_size, 4ull << 40, "bytes of address range per segment");
DEFINE_int32(samples, 20000, "calls measured per single-key op at each checkpoint");
DEFINE_int32(batch_samples, 200, "put_batch batches measured at each checkpoint");
DEFINE_string(key_prefix, "Qwen2.5-7B-Instruct@tp0@", "key prefix (then a 40-hex-digit hash)");
DEFINE_bool(json, false, "print one JSON line with every figure");
DEFINE_string(tenant, "",
              "strict multi-tenant mode: every request is this tenant's (keys scoped, puts "
              "admitted against its quota, charges kept); \"\": the default mode");
DEFINE_bool(evicting, false,
            "the pool (--segments x --segment_size) may be smaller than the objects: the master "
            "evicts (the fill's worst batch shows the cost), and exist / get may miss");

namespace {

using mooncake::store::ErrorCode;
using mooncake::store::MasterConfig;
using mooncake::store::MasterService;
using mooncake::store::ToInt;
namespace rpc = mooncake::store::rpc;
using Clock = std::chrono::steady_clock;

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string Key(uint64_t i) {
  char hash[41];
  std::snprintf(hash, sizeof(hash), "%016llx%016llx%08llx",
                static_cast<unsigned long long>(Mix(i)), static_cast<unsigned long long>(Mix(~i)),
                static_cast<unsigned long long>(Mix(i * 3 + 1) & 0xffffffffull));
  return FLAGS_key_prefix + hash;
}

uint64_t SizeOf(uint64_t i) {
  const uint64_t span = FLAGS_max_size - FLAGS_min_size + 1;
  return FLAGS_min_size + Mix(i ^ 0x5bd1e995ull) % span;
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

uint64_t RssBytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t pages = 0, rss = 0;
  f >> pages >> rss;
  return rss * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

struct Stat {
  double p50_us = 0, p99_us = 0, ops_per_s = 0;
  double cpu_us = 0;  // mean thread CPU time per op: what a shared machine's noise spares
};

Stat Summarize(std::vector<double>* lat_s, double wall_s) {
  Stat s;
  if (lat_s->empty()) return s;
  std::sort(lat_s->begin(), lat_s->end());
  s.p50_us = (*lat_s)[lat_s->size() / 2] * 1e6;
  s.p99_us = (*lat_s)[std::min(lat_s->size() - 1, lat_s->size() * 99 / 100)] * 1e6;
  s.ops_per_s = static_cast<double>(lat_s->size()) / wall_s;
  return s;
}

class Bench {
 public:
  static MasterConfig Config() {
    MasterConfig c;
    c.enable_multi_tenants = !FLAGS_tenant.empty();
    return c;
  }

  Bench() : master_(Config()) {
    if (!FLAGS_tenant.empty()) master_.SetTenantPolicies({{FLAGS_tenant, uint64_t{1} << 62}});
    for (int s = 0; s < FLAGS_segments; ++s) {
      rpc::MountSegmentRequest req;
      req.set_client_id(ClientId(s));
      req.set_segment_name("127.0.0.1:" + std::to_string(12300 + s));
      req.set_base((1ull << 46) + static_cast<uint64_t>(s) * FLAGS_segment_size);
      req.set_size(FLAGS_segment_size);
      auto resp = master_.MountSegment(req);
      CHECK_EQ(resp.code(), ToInt(ErrorCode::OK)) << resp.message();
    }
    last_tick_ = Clock::now();
  }

  // A client id as the client library makes them: 32 hex digits.
  static std::string ClientId(int s) {
    char buf[33];
    std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(Mix(s)),
                  static_cast<unsigned long long>(Mix(s + 1000)));
    return buf;
  }

  // With --tenant: the request as the RPC layer hands it to the master (keys scoped; done
  // before the timed calls, so the figures leave out that one string per key).
  template <class R>
  void Scope(R* r) {
    if (FLAGS_tenant.empty()) return;
    r->set_tenant_id(FLAGS_tenant);
    CHECK_EQ(master_.ScopeRequest(r), "");
  }

  // PutStart + PutEnd of keys [first, first + n) by client `c`.
  void PutBatch(uint64_t first, int n, int c) {
    rpc::PutStartRequest start;
    start.set_client_id(ClientId(c));
    rpc::KeysRequest end;
    end.set_client_id(ClientId(c));
    for (int i = 0; i < n; ++i) {
      auto* item = start.add_items();
      item->set_key(Key(first + i));
      item->set_size(SizeOf(first + i));
      end.add_keys(item->key());
    }
    Scope(&start);
    Scope(&end);
    PutRequests(start, end);
  }

  void PutRequests(const rpc::PutStartRequest& start, const rpc::KeysRequest& end) {
    auto s = master_.PutStart(start);
    for (const auto& r : s.results()) CHECK_EQ(r.code(), ToInt(ErrorCode::OK)) << r.message();
    auto e = master_.PutEnd(end);
    for (int32_t code : e.codes()) CHECK_EQ(code, ToInt(ErrorCode::OK));
  }

  // Heartbeats and housekeeping once a second, as the clients and the master would.
  void Housekeep() {
    const auto now = Clock::now();
    if (now - last_tick_ < std::chrono::seconds(1)) return;
    last_tick_ = now;
    for (int s = 0; s < FLAGS_segments; ++s) {
      rpc::PingRequest req;
      req.set_client_id(ClientId(s));
      master_.Ping(req);
    }
    master_.Tick();
  }

  // Fills up to `target` objects; returns the objects per second of the fill and sets
  // *worst_ms to the slowest PutStart + PutEnd batch of it in this thread's CPU time (a table
  // rehash shows there; time the thread waited for a core, on a shared machine, does not).
  double FillTo(uint64_t target, double* worst_ms) {
    const auto t0 = Clock::now();
    const uint64_t from = filled_;
    double worst = 0;
    while (filled_ < target) {
      const int n = static_cast<int>(std::min<uint64_t>(FLAGS_batch, target - filled_));
      const double a = ThreadCpuSeconds();
      PutBatch(filled_, n, static_cast<int>((filled_ / FLAGS_batch) % FLAGS_segments));
      worst = std::max(worst, ThreadCpuSeconds() - a);
      filled_ += n;
      Housekeep();
    }
    *worst_ms = worst * 1e3;
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    return s > 0 ? static_cast<double>(filled_ - from) / s : 0;
  }

  template <class Req, class Fn>
  Stat Time(std::vector<Req>& reqs, Fn&& call) {
    std::vector<double> lat;
    lat.reserve(reqs.size());
    const auto t0 = Clock::now();
    const double cpu0 = ThreadCpuSeconds();
    for (auto& r : reqs) {
      const auto a = Clock::now();
      call(r);
      lat.push_back(std::chrono::duration<double>(Clock::now() - a).count());
    }
    const double cpu = ThreadCpuSeconds() - cpu0;
    Stat s = Summarize(&lat, std::chrono::duration<double>(Clock::now() - t0).count());
    s.cpu_us = reqs.empty() ? 0 : cpu * 1e6 / static_cast<double>(reqs.size());
    return s;
  }

  std::vector<rpc::KeysRequest> RandomKeyRequests(std::mt19937_64& rng, int n) {
    std::vector<rpc::KeysRequest> reqs(n);
    for (auto& r : reqs) {
      r.set_client_id(ClientId(0));
      r.add_keys(Key(rng() % filled_));
      Scope(&r);
    }
    return reqs;
  }

  struct Row {
    uint64_t objects;
    double fill_per_s;
    double fill_worst_ms;
    double rss_per_object;
    Stat exist, get, put_batch, remove;
  };

  Row Measure(double fill_per_s, double fill_worst_ms, uint64_t rss0) {
    Row row{filled_, fill_per_s, fill_worst_ms, 0, {}, {}, {}, {}};
    row.rss_per_object = static_cast<double>(RssBytes() - rss0) / static_cast<double>(filled_);
    std::mt19937_64 rng(filled_);
    // A pass of lookups not timed: right after the fill the first random lookups into a
    // table of gigabytes also fill the caches with its page tables (at 10 M objects the
    // first pass measured 1.33 us p50, the next 0.77 us), which a master serving traffic
    // has warm.
    auto warm = RandomKeyRequests(rng, FLAGS_samples);
    for (const auto& r : warm) (void)master_.ExistKey(r);
    auto exist = RandomKeyRequests(rng, FLAGS_samples);
    row.exist = Time(exist, [&](const rpc::KeysRequest& r) {
      auto resp = master_.ExistKey(r);
      if (!FLAGS_evicting) CHECK_EQ(resp.results(0).code(), ToInt(ErrorCode::OK));
    });
    auto get = RandomKeyRequests(rng, FLAGS_samples);
    row.get = Time(get, [&](const rpc::KeysRequest& r) {
      auto resp = master_.GetReplicaList(r);
      if (!FLAGS_evicting) CHECK_EQ(resp.results(0).code(), ToInt(ErrorCode::OK));
    });
    // New keys beyond every key filled so far (and beyond the next checkpoint's fill).
    const uint64_t base = (1ull << 40) + filled_ * 2;
    struct PutReq {
      rpc::PutStartRequest start;
      rpc::KeysRequest end;
    };
    std::vector<PutReq> puts(FLAGS_batch_samples);
    std::vector<rpc::KeysRequest> removes;
    for (int b = 0; b < FLAGS_batch_samples; ++b) {
      puts[b].start.set_client_id(ClientId(b % FLAGS_segments));
      puts[b].end.set_client_id(ClientId(b % FLAGS_segments));
      for (int i = 0; i < FLAGS_batch; ++i) {
        const uint64_t k = base + static_cast<uint64_t>(b) * FLAGS_batch + i;
        auto* item = puts[b].start.add_items();
        item->set_key(Key(k));
        item->set_size(SizeOf(k));
        puts[b].end.add_keys(item->key());
        if (removes.size() < static_cast<size_t>(FLAGS_samples)) {
          removes.emplace_back();
          removes.back().set_client_id(ClientId(b % FLAGS_segments));
          removes.back().add_keys(item->key());
          Scope(&removes.back());
        }
      }
      Scope(&puts[b].start);
      Scope(&puts[b].end);
    }
    row.put_batch = Time(puts, [&](const PutReq& p) { PutRequests(p.start, p.end); });
    std::shuffle(removes.begin(), removes.end(), rng);
    row.remove = Time(removes, [&](const rpc::KeysRequest& r) {
      auto resp = master_.Remove(r);
      if (!FLAGS_evicting) CHECK_EQ(resp.codes(0), ToInt(ErrorCode::OK));
    });
    // What put_batch added beyond the removed keys goes too, so the next fill starts at the
    // checkpoint's size.
    rpc::KeysRequest rest;
    rest.set_client_id(ClientId(0));
    const uint64_t added = static_cast<uint64_t>(FLAGS_batch_samples) * FLAGS_batch;
    for (uint64_t k = removes.size(); k < added; ++k) {
      rest.add_keys(Key(base + k));
      if (rest.keys_size() == 4096 || k + 1 == added) {
        Scope(&rest);
        master_.Remove(rest);
        rest.clear_keys();
      }
    }
    return row;
  }

  uint64_t filled() const { return filled_; }
  MasterService& master() { return master_; }

 private:
  MasterService master_;
  uint64_t filled_ = 0;
  Clock::time_point last_tick_;
};

std::string StatJson(const Stat& s) {
  std::ostringstream o;
  o << "{\"p50_us\":" << s.p50_us << ",\"p99_us\":" << s.p99_us << ",\"ops_per_s\":"
    << s.ops_per_s << ",\"cpu_us\":" << s.cpu_us << "}";
  return o.str();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("master_bench --objects=N [--checkpoints=a,b,...] [--json]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_minloglevel = 1;  // no INFO lines per mount
  if (FLAGS_min_size == 0 || FLAGS_max_size < FLAGS_min_size || FLAGS_batch <= 0 ||
      FLAGS_batch > 4096 || FLAGS_segments <= 0 || FLAGS_samples <= 0 ||
      FLAGS_batch_samples <= 0) {
    std::fprintf(stderr, "master_bench: bad sizes, batch, segments or samples\n");
    return 2;
  }
  std::vector<uint64_t> points;
  std::stringstream ss(FLAGS_checkpoints);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty() && std::stoull(item) < FLAGS_objects) points.push_back(std::stoull(item));
  }
  points.push_back(FLAGS_objects);
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());

  const uint64_t rss_before = RssBytes();
  Bench bench;
  const uint64_t rss0 = RssBytes();
  const size_t key_bytes = Key(0).size();
  std::printf("master_bench: %d segments x %llu GiB, objects %llu..%llu B, keys %zu B, "
              "batch %d, %d samples per op\n",
              FLAGS_segments, static_cast<unsigned long long>(FLAGS_segment_size >> 30),
              static_cast<unsigned long long>(FLAGS_min_size),
              static_cast<unsigned long long>(FLAGS_max_size), key_bytes, FLAGS_batch,
              FLAGS_samples);
  // Per op: p50 and p99 wall time and the mean thread CPU time (us); a put is a batch.
  std::printf("%10s %8s %8s %8s | %-20s | %-20s | %-23s | %-20s\n", "objects", "fill/s",
              "worstcpu", "B/object", "exist p50/p99/cpu", "get p50/p99/cpu",
              "put batch p50/p99/cpu", "remove p50/p99/cpu");
  std::vector<Bench::Row> rows;
  for (uint64_t p : points) {
    double worst_ms = 0;
    const double fill = bench.FillTo(p, &worst_ms);
    rows.push_back(bench.Measure(fill, worst_ms, rss0));
    const auto& r = rows.back();
    std::printf("%10llu %8.0f %8.1f %8.0f | %6.2f %6.2f %6.2f | %6.2f %6.2f %6.2f | %7.1f %7.1f "
                "%7.1f | %6.2f %6.2f %6.2f\n",
                static_cast<unsigned long long>(r.objects), r.fill_per_s, r.fill_worst_ms,
                r.rss_per_object, r.exist.p50_us, r.exist.p99_us, r.exist.cpu_us, r.get.p50_us,
                r.get.p99_us, r.get.cpu_us, r.put_batch.p50_us, r.put_batch.p99_us,
                r.put_batch.cpu_us, r.remove.p50_us, r.remove.p99_us, r.remove.cpu_us);
    std::fflush(stdout);
  }
  auto stats = bench.master().GetStats();
  if (!FLAGS_evicting) CHECK_EQ(stats.keys(), FLAGS_objects);
  std::printf("objects stored at the end: %llu, evicted: %llu\n",
              static_cast<unsigned long long>(stats.keys()),
              static_cast<unsigned long long>(stats.evicted_objects()));
  if (FLAGS_json) {
    std::ostringstream o;
    o << "{\"bench\":\"master_bench\",\"key_bytes\":" << key_bytes
      << ",\"min_size\":" << FLAGS_min_size << ",\"max_size\":" << FLAGS_max_size
      << ",\"batch\":" << FLAGS_batch << ",\"segments\":" << FLAGS_segments
      << ",\"rss_before_mount\":" << rss_before << ",\"rss_after_mount\":" << rss0
      << ",\"rows\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      o << (i ? "," : "") << "{\"objects\":" << r.objects << ",\"fill_per_s\":" << r.fill_per_s
        << ",\"fill_worst_batch_cpu_ms\":" << r.fill_worst_ms
        << ",\"rss_bytes_per_object\":" << r.rss_per_object << ",\"exist\":"
        << StatJson(r.exist) << ",\"get\":" << StatJson(r.get)
        << ",\"put_batch\":" << StatJson(r.put_batch) << ",\"remove\":" << StatJson(r.remove)
        << "}";
    }
    o << "]}";
    std::printf("%s\n", o.str().c_str());
  }
  std::fflush(stdout);
  std::_Exit(0);  // tearing down 10 million objects takes seconds and measures nothing
}
