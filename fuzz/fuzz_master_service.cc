// Fuzz target: the Store master's rules (MasterService, src/store/master_service.* and
// master_remove.cc) driven directly, without gRPC: the input is a sequence of RPCs built from
// fuzzed fields (few clients, segment names, keys and sizes so that they collide; now and
// then keys, names, batches, replica counts and regex patterns over the bounds) on a fake
// clock that the input advances.
//
// Oracles, beyond "no crash, no sanitizer report":
// - a range PutStart hands out never overlaps a range that GetReplicaList gave a reader whose
//   lease has not lapsed (same segment name): no reader can see another key's bytes, whatever
//   removals, evictions, unmounts, client expiries and remounts ran in between;
// - a range PutStart hands out never overlaps a range of a put or upsert in flight whose
//   writer has not yet called PutEnd / PutRevoke and that is not discarded yet (its writer
//   may still be writing there), whatever unmounts and expiries ran in between;
// - the ranges of one PutStart reply do not overlap, and lie inside a mounted segment;
// - allocated <= capacity after every call;
// - at the end, after removing everything (force), letting every lease and put lapse and one
//   tick: nothing is allocated and no key is left (no leaked or doubly freed space).
#include <fuzzer/FuzzedDataProvider.h>
#include <glog/logging.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "store/common/limits.h"
#include "store/master/master_service.h"

namespace {

using mooncake::store::MasterConfig;
using mooncake::store::MasterService;
namespace rpc = mooncake::store::rpc;
using Clock = MasterService::Clock;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "\n*** FUZZ ORACLE FAILURE: %s\n", what.c_str());
  std::abort();
}

struct Range {
  std::string segment;
  uint64_t addr, size;
  Clock::time_point until;  // the reader's lease
  std::string key;
  std::string reader;
};

bool Overlap(const Range& a, const std::string& seg, uint64_t addr, uint64_t size) {
  return a.segment == seg && addr < a.addr + a.size && a.addr < addr + size;
}

std::string Pick(FuzzedDataProvider& in, const std::vector<std::string>& from) {
  return from[in.ConsumeIntegralInRange<size_t>(0, from.size() - 1)];
}

std::string Key(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0: return std::string(in.ConsumeBool() ? mooncake::store::kMaxKeyBytes + 1 : 5000, 'k');
    case 1: return "";
    case 2: return in.ConsumeRandomLengthString(16);
    default: return "k" + std::to_string(in.ConsumeIntegralInRange<int>(0, 11));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;  // the master logs every mount and expiry: too slow, too noisy
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  MasterConfig config;
  const uint64_t leases[] = {1, 100, 10000};
  config.default_kv_lease_ttl_ms = leases[in.ConsumeIntegralInRange<int>(0, 2)];
  const double watermarks[] = {0.5, 0.9, 1.0};
  config.eviction_high_watermark_ratio = watermarks[in.ConsumeIntegralInRange<int>(0, 2)];
  config.eviction_ratio = in.ConsumeBool() ? 0.05 : 0.0;
  config.client_ttl_s = 10;
  config.put_start_discard_timeout_s = 30;
  Clock::time_point now = Clock::time_point() + std::chrono::hours(1000);
  MasterService master(config, [&] { return now; });
  const auto lease = std::chrono::milliseconds(config.default_kv_lease_ttl_ms);

  const std::vector<std::string> clients = {"c0", "c1", "c2"};
  const std::vector<std::string> segments = {"s0", "s1", "s2"};
  const std::vector<uint64_t> bases = {0x100000, 0x180000, 0x1000000};
  const std::vector<uint64_t> seg_sizes = {4096, 64 << 10, 1 << 20};
  std::vector<Range> grants;  // ranges readers were given, until their leases lapse
  const std::vector<std::string> readers = {"r0", "r1"};
  std::map<std::pair<std::string, std::string>, uint64_t> last_lease;  // (reader, key) -> id
  // Ranges writers were given, until they call PutEnd / PutRevoke (key, reader = the writer)
  // or their put is discarded (until).
  std::vector<Range> writes;
  std::vector<std::pair<uint64_t, uint64_t>> tasks;  // ids of replica tasks created
  struct Running {
    uint64_t hi, lo;
    std::string client;
  };
  std::vector<Running> running;  // replica tasks handed out by FetchTasks
  const auto discard = std::chrono::seconds(config.put_start_discard_timeout_s);

  // `reader` says none of its reads is in flight: its grants protect nothing any more.
  auto done_reading = [&](const std::string& reader) {
    for (Range& g : grants) {
      if (g.reader == reader) g.until = std::min(g.until, now);
    }
  };
  auto check_stats = [&] {
    auto st = master.GetStats();
    if (st.allocated() > st.capacity()) Fail("allocated > capacity");
  };

  for (int op = 0; op < 64 && in.remaining_bytes() > 0; ++op) {
    switch (in.ConsumeIntegralInRange<int>(0, 16)) {
      case 0: {  // MountSegment (sometimes a remount, sometimes over the bounds)
        rpc::MountSegmentRequest req;
        req.set_client_id(in.ConsumeIntegralInRange<int>(0, 20) == 0 ? std::string(300, 'c')
                                                                      : Pick(in, clients));
        req.set_segment_name(Pick(in, segments));
        req.set_base(bases[in.ConsumeIntegralInRange<size_t>(0, bases.size() - 1)]);
        req.set_size(seg_sizes[in.ConsumeIntegralInRange<size_t>(0, seg_sizes.size() - 1)]);
        req.set_remount(in.ConsumeBool());
        (void)master.MountSegment(req);
        break;
      }
      case 1: {
        rpc::UnmountSegmentRequest req;
        req.set_client_id(Pick(in, clients));
        req.set_segment_name(Pick(in, segments));
        req.set_base(bases[in.ConsumeIntegralInRange<size_t>(0, bases.size() - 1)]);
        (void)master.UnmountSegment(req);
        break;
      }
      case 2: {
        rpc::PingRequest req;
        req.set_client_id(Pick(in, clients));
        (void)master.Ping(req);
        break;
      }
      case 3:
      case 4: {  // PutStart
        rpc::PutStartRequest req;
        req.set_client_id(Pick(in, clients));
        const int items = in.ConsumeIntegralInRange<int>(0, 20) == 0
                              ? static_cast<int>(mooncake::store::kMaxBatchItems) + 1
                              : in.ConsumeIntegralInRange<int>(1, 4);
        for (int i = 0; i < items; ++i) {
          auto* item = req.add_items();
          item->set_key(i < 8 ? Key(in) : "many" + std::to_string(i));
          item->set_size(in.ConsumeIntegralInRange<uint64_t>(0, 70000));
        }
        auto* c = req.mutable_config();
        c->set_replica_num(in.ConsumeIntegralInRange<uint32_t>(0, 20));
        c->set_with_soft_pin(in.ConsumeBool());
        c->set_with_hard_pin(in.ConsumeIntegralInRange<int>(0, 7) == 0);
        if (in.ConsumeBool()) c->add_preferred_segments(Pick(in, segments));
        req.set_upsert(in.ConsumeIntegralInRange<int>(0, 3) == 0);
        auto resp = master.PutStart(req);
        if (resp.code() != 0 && resp.results_size() != 0) Fail("refused PutStart with results");
        std::vector<Range> fresh;
        for (int i = 0; i < resp.results_size(); ++i) {
          const auto& r = resp.results(i);
          for (const auto& rep : r.replicas()) {
            const auto& b = rep.buffer();
            for (const Range& g : grants) {
              if (g.until > now && Overlap(g, b.segment_name(), b.addr(), b.size())) {
                Fail("PutStart placed an object over a range a reader still holds a lease on");
              }
            }
            for (const Range& w : writes) {
              if (w.until > now && Overlap(w, b.segment_name(), b.addr(), b.size())) {
                Fail("PutStart placed an object over a range a writer may still be writing");
              }
            }
            for (const Range& f : fresh) {
              if (Overlap(f, b.segment_name(), b.addr(), b.size())) {
                Fail("one PutStart reply has overlapping ranges");
              }
            }
            fresh.push_back({b.segment_name(), b.addr(), b.size(), now, {}, {}});
          }
          if (r.code() == 0 && i < req.items_size()) {
            for (const auto& rep : r.replicas()) {
              writes.push_back({rep.buffer().segment_name(), rep.buffer().addr(),
                                rep.buffer().size(), now + discard, req.items(i).key(),
                                req.client_id()});
            }
          }
        }
        break;
      }
      case 5:
      case 6: {  // PutEnd / PutRevoke
        rpc::KeysRequest req;
        req.set_client_id(Pick(in, clients));
        for (int i = in.ConsumeIntegralInRange<int>(1, 3); i > 0; --i) req.add_keys(Key(in));
        (void)(in.ConsumeBool() ? master.PutEnd(req) : master.PutRevoke(req));
        // The writer has stopped writing these keys (whatever the master answered).
        for (const auto& k : req.keys()) {
          for (Range& w : writes) {
            if (w.key == k && w.reader == req.client_id()) w.until = now;
          }
        }
        break;
      }
      case 7: {  // GetReplicaList: remember the ranges under lease
        rpc::KeysRequest req;
        for (int i = in.ConsumeIntegralInRange<int>(1, 3); i > 0; --i) req.add_keys(Key(in));
        req.set_client_id(Pick(in, readers));
        auto resp = master.GetReplicaList(req);
        for (int i = 0; i < resp.results_size(); ++i) {
          const auto& r = resp.results(i);
          if (r.code() != 0) continue;
          if (r.lease_ttl_ms() != config.default_kv_lease_ttl_ms) Fail("lease_ttl_ms differs");
          last_lease[{req.client_id(), req.keys(i)}] = r.lease_id();
          for (const auto& rep : r.replicas()) {
            grants.push_back({rep.buffer().segment_name(), rep.buffer().addr(),
                              rep.buffer().size(), now + lease, req.keys(i), req.client_id()});
          }
        }
        break;
      }
      case 8: {
        rpc::KeysRequest req;
        for (int i = in.ConsumeIntegralInRange<int>(1, 3); i > 0; --i) req.add_keys(Key(in));
        (void)master.ExistKey(req);
        break;
      }
      case 9: {  // Remove; a reader whose reads are all done may pass its last lease id
        rpc::KeysRequest req;
        req.set_client_id(Pick(in, readers));
        req.set_force(in.ConsumeBool());
        const bool with_ids = in.ConsumeBool();
        for (int i = in.ConsumeIntegralInRange<int>(1, 3); i > 0; --i) {
          req.add_keys(Key(in));
          auto id = last_lease.find({req.client_id(), req.keys(req.keys_size() - 1)});
          const uint64_t v = id == last_lease.end() ? 0 : id->second;
          req.add_read_lease_ids(with_ids ? (in.ConsumeIntegralInRange<int>(0, 9) == 0 ? v ^ 2 : v)
                                          : 0);
        }
        auto resp = master.Remove(req);
        // This reader's reads of those keys are complete (the model's reads are instant): its
        // own grants no longer protect anything. Other readers' grants still do.
        if (with_ids) {
          for (const auto& k : req.keys()) {
            for (Range& g : grants) {
              if (g.key == k && g.reader == req.client_id()) g.until = now;
            }
          }
        }
        (void)resp;
        break;
      }
      case 10: {
        rpc::RemoveByRegexRequest req;
        req.set_regex(in.ConsumeIntegralInRange<int>(0, 20) == 0
                          ? std::string(mooncake::store::kMaxRegexBytes + 1, 'a')
                          : in.ConsumeRandomLengthString(24));
        req.set_force(in.ConsumeBool());
        req.set_client_id(Pick(in, readers));
        req.set_own_reads_done(in.ConsumeBool());
        (void)master.RemoveByRegex(req);
        if (req.own_reads_done()) done_reading(req.client_id());
        break;
      }
      case 11: {
        rpc::KeysRequest req;
        req.set_force(in.ConsumeBool());
        req.set_client_id(Pick(in, readers));
        req.set_own_reads_done(in.ConsumeBool());
        (void)master.RemoveAll(req);
        if (req.own_reads_done()) done_reading(req.client_id());
        break;
      }
      case 12:
        master.Tick();
        break;
      case 13: {
        const int steps[] = {0, 1, 50, 100, 1000, 5000, 10000, 31000};
        now += std::chrono::milliseconds(steps[in.ConsumeIntegralInRange<int>(0, 7)]);
        break;
      }
      case 14: {  // CreateReplicaTask (copy or move), sometimes of nonsense
        rpc::ReplicaTaskRequest req;
        req.set_client_id(Pick(in, readers));
        req.set_key(Key(in));
        req.set_type(in.ConsumeIntegralInRange<uint32_t>(0, 2));
        req.set_source(Pick(in, segments));
        for (int i = in.ConsumeIntegralInRange<int>(0, 3); i > 0; --i) {
          req.add_targets(in.ConsumeIntegralInRange<int>(0, 10) == 0 ? std::string(300, 's')
                                                                     : Pick(in, segments));
        }
        auto resp = master.CreateReplicaTask(req);
        if (resp.code() == 0) tasks.push_back({resp.id_hi(), resp.id_lo()});
        break;
      }
      case 15: {  // FetchTasks: the targets handed out are written until the task ends
        rpc::FetchTasksRequest req;
        req.set_client_id(Pick(in, clients));
        req.set_max_tasks(in.ConsumeIntegralInRange<uint32_t>(0, 5));
        auto resp = master.FetchTasks(req);
        for (const auto& t : resp.tasks()) {
          const std::string id = std::to_string(t.id_hi()) + "-" + std::to_string(t.id_lo());
          for (const auto& b : t.targets()) {
            for (const Range& g : grants) {
              if (g.until > now && Overlap(g, b.segment_name(), b.addr(), b.size())) {
                Fail("a replica task's target lies over a range a reader still holds a lease on");
              }
            }
            for (const Range& w : writes) {
              if (w.until > now && Overlap(w, b.segment_name(), b.addr(), b.size())) {
                Fail("a replica task's target lies over a range a writer may still be writing");
              }
            }
            writes.push_back({b.segment_name(), b.addr(), b.size(), now + discard, "task:" + id,
                              req.client_id()});
          }
          running.push_back({t.id_hi(), t.id_lo(), req.client_id()});
        }
        break;
      }
      case 16: {  // FinishTask of a task handed out (or of none), QueryTask
        rpc::FinishTaskRequest req;
        if (!running.empty() && in.ConsumeBool()) {
          const size_t i = in.ConsumeIntegralInRange<size_t>(0, running.size() - 1);
          req.set_id_hi(running[i].hi);
          req.set_id_lo(running[i].lo);
          req.set_client_id(in.ConsumeIntegralInRange<int>(0, 5) == 0 ? Pick(in, clients)
                                                                      : running[i].client);
        } else {
          req.set_id_hi(in.ConsumeIntegral<uint64_t>());
          req.set_id_lo(in.ConsumeIntegral<uint64_t>());
          req.set_client_id(Pick(in, clients));
        }
        req.set_ok(in.ConsumeBool());
        req.set_message(in.ConsumeRandomLengthString(16));
        (void)master.FinishTask(req);
        const std::string id = std::to_string(req.id_hi()) + "-" + std::to_string(req.id_lo());
        for (Range& w : writes) {  // that executor has stopped writing (whatever the answer)
          if (w.key == "task:" + id && w.reader == req.client_id()) w.until = now;
        }
        rpc::QueryTaskRequest q;
        if (!tasks.empty()) {
          const auto& t = tasks[in.ConsumeIntegralInRange<size_t>(0, tasks.size() - 1)];
          q.set_id_hi(t.first);
          q.set_id_lo(t.second);
        }
        auto qr = master.QueryTask(q);
        if (qr.code() == 0 && qr.status() > 3) Fail("a task status out of range");
        break;
      }
    }
    check_stats();
  }
  (void)master.MetricsText();
  // Everything removed, every lease and put lapsed, every client alive: nothing may be left.
  rpc::KeysRequest all;
  all.set_force(true);
  (void)master.RemoveAll(all);
  now += std::chrono::seconds(31) + lease;
  for (const auto& c : clients) {
    rpc::PingRequest p;
    p.set_client_id(c);
    (void)master.Ping(p);
  }
  master.Tick();
  auto st = master.GetStats();
  if (st.keys() != 0) Fail("keys left after removing everything: " + std::to_string(st.keys()));
  if (st.allocated() != 0) {
    Fail("space left allocated after removing everything: " + std::to_string(st.allocated()));
  }
  return 0;
}
