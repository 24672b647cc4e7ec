// soak: randomized, fully verified traffic between initiator threads (each with its own
// TransferEngine) and target processes (fail_peer), for a given time.
//
//   Short form (ctest soak_short, about 30 s):
//     soak --seconds 30 --targets 2 --initiators 4
//   Long form (by hand, e.g. before a release; hours, more peers, bigger regions):
//     soak --seconds 14400 --targets 4 --initiators 16 --region-mib 64 --batch 8
//   Flags: --seconds N (30)  --targets T (2)  --initiators I (4)  --region-mib M (16)
//          --max-size BYTES (4194304)  --batch K (4, most requests per batch)
//          --transport mixed|tcp|shm|auto (mixed: even initiators tcp, odd shm)
//          --seed S (1)  --peer PATH (the fail_peer built beside this program)
//          --slice-timeout-ms MS (10000)  --progress-s N (10; 0: no progress lines)
//          --inject-corruption N (0: off) self-check of the checker: after N steps,
//            initiator 0 overwrites one byte of its region behind the mirror's back; the run
//            must then report failures and exit 1
//
// Each target's buffer is I regions of M MiB; initiator i owns region i of every target, so
// initiators never touch each other's bytes. An initiator keeps a mirror of what its regions
// must hold (initially the target's fill pattern). Each step picks a target and 1..K
// non-overlapping ranges of 1 B .. max-size bytes (log-uniform) at random offsets, each a READ
// or a WRITE at random, submits them as one batch and waits:
//   - a completed WRITE (fresh seeded pattern) updates the mirror;
//   - a completed READ must equal the mirror byte for byte;
//   - every 8th step the target hashes a random range of the region and the hash must equal
//     the mirror's;
//   - at the end every region of every target is hashed and compared (every byte checked).
// A request that does not complete is a failure (its range is then re-read into the mirror).
// Prints one line:  soak: requests R, bytes B, failures F, seconds S
// and exits 1 if F > 0 (or set-up failed).
#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine_util.h"
#include "failure_util.h"
#include "pattern.h"

using namespace mooncake;
using namespace mc_failure;
using std::chrono::milliseconds;

namespace {

struct Config {
  double seconds = 30;
  int targets = 2;
  int initiators = 4;
  uint64_t region = 16ull << 20;
  uint64_t max_size = 4ull << 20;
  int batch = 4;
  std::string transport = "mixed";
  uint64_t seed = 1;
  std::string peer = FAIL_PEER_PATH;
  int slice_timeout_ms = 10000;
  double progress_s = 10;
  uint64_t inject_corruption = 0;
};

struct Target {
  Peer peer;
  std::mutex mu;  // one command at a time on its pipe
  uint64_t Hash(uint64_t off, uint64_t len, bool* ok) {
    std::lock_guard lock(mu);
    return peer.Hash(off, len, ok);
  }
};

std::atomic<uint64_t> g_requests{0}, g_bytes{0}, g_failures{0};
std::mutex g_log_mu;

void Fail(int initiator, const std::string& what) {
  g_failures.fetch_add(1);
  std::lock_guard lock(g_log_mu);
  std::fprintf(stderr, "soak: initiator %d: FAILURE: %s\n", initiator, what.c_str());
}

void RunInitiator(const Config& cfg, int me, std::vector<std::unique_ptr<Target>>& targets,
                  Clock::time_point deadline) {
  const uint64_t base = me * cfg.region;  // our region's offset in every target
  const size_t slots = cfg.batch;
  std::vector<std::unique_ptr<Buffer>> mirrors;
  for (size_t t = 0; t < targets.size(); ++t) {
    mirrors.push_back(std::make_unique<Buffer>(cfg.region));
    FillPattern(mirrors.back()->data(), cfg.region, 1000 + t, base);
  }
  Buffer work(2 * slots * cfg.max_size);  // per slot: a source area and a destination area
  if (!work.data()) return Fail(me, "out of memory");
  uint8_t* src = work.data();
  uint8_t* dst = work.data() + slots * cfg.max_size;

  std::string transport = cfg.transport;
  if (transport == "mixed") transport = me % 2 == 0 ? "tcp" : "shm";
  if (transport == "auto") transport = "";
  EngineOptions o;
  o.slice_timeout_ms = cfg.slice_timeout_ms;
  TransferEngine engine(o);
  Status s = engine.Init("P2PHANDSHAKE", "127.0.0.1", transport);
  if (s.ok()) s = engine.RegisterLocalMemory(work.data(), work.size());
  if (!s.ok()) return Fail(me, "set-up: " + s.ToString());
  std::vector<SegmentID> segs;
  for (auto& t : targets) {
    auto seg = engine.OpenSegment(t->peer.segment);
    if (!seg.ok()) return Fail(me, "open " + t->peer.segment + ": " + seg.status().ToString());
    segs.push_back(*seg);
  }

  std::mt19937_64 rng(cfg.seed * 7919 + me);
  auto random_size = [&] {
    uint64_t bits = rng() % 23;  // 1 B .. 4 MiB, log-uniform
    uint64_t n = 1 + rng() % (1ull << bits);
    return std::min(n, std::min(cfg.max_size, cfg.region));
  };
  struct Op {
    TransferRequest::OpCode op;
    uint64_t off, len;
  };
  std::vector<Op> ops;
  std::vector<TransferRequest> reqs;
  uint64_t step = 0, pattern_seq = 0;
  while (Clock::now() < deadline) {
    ++step;
    const size_t t = rng() % targets.size();
    uint8_t* mirror = mirrors[t]->data();
    const uint64_t remote = targets[t]->peer.addr + base;
    // 1..K non-overlapping ranges.
    ops.clear();
    size_t want = 1 + rng() % slots;
    for (int tries = 0; ops.size() < want && tries < 32; ++tries) {
      uint64_t len = random_size();
      uint64_t off = rng() % (cfg.region - len + 1);
      bool overlaps = false;
      for (const Op& x : ops) overlaps |= off < x.off + x.len && x.off < off + len;
      if (overlaps) continue;
      ops.push_back({rng() % 2 ? TransferRequest::WRITE : TransferRequest::READ, off, len});
    }
    reqs.clear();
    std::vector<uint64_t> seeds(ops.size(), 0);
    for (size_t j = 0; j < ops.size(); ++j) {
      const Op& x = ops[j];
      if (x.op == TransferRequest::WRITE) {
        seeds[j] = (static_cast<uint64_t>(me + 1) << 40) | ++pattern_seq;
        FillPattern(src + j * cfg.max_size, x.len, seeds[j], 0);
        reqs.push_back({x.op, src + j * cfg.max_size, segs[t], remote + x.off, x.len});
      } else {
        reqs.push_back({x.op, dst + j * cfg.max_size, segs[t], remote + x.off, x.len});
      }
    }
    auto id = engine.AllocateBatchID(reqs.size());
    if (!id.ok()) return Fail(me, "allocate: " + id.status().ToString());
    s = engine.SubmitTransfer(*id, reqs);
    if (!s.ok()) {
      (void)engine.FreeBatchID(*id);
      Fail(me, "submit: " + s.ToString());
      continue;
    }
    auto st = engine.WaitBatch(*id, milliseconds(cfg.slice_timeout_ms * 3 + 10000));
    if (!st.ok() || st->s == WAITING) {
      // Leaves the batch to finish; it is not freed (a hang is the failure reported here).
      return Fail(me, "batch did not end within " + std::to_string(cfg.slice_timeout_ms * 3 + 10000) +
                          " ms");
    }
    for (size_t j = 0; j < ops.size(); ++j) {
      const Op& x = ops[j];
      auto ts = engine.GetTransferStatus(*id, j);
      g_requests.fetch_add(1);
      if (!ts.ok() || ts->s != COMPLETED) {
        auto err = engine.GetTransferError(*id, j);
        Fail(me, std::string(x.op == TransferRequest::WRITE ? "write" : "read") + " of " +
                     std::to_string(x.len) + " B at region offset " + std::to_string(x.off) +
                     " on target " + std::to_string(t) + ": " +
                     (ts.ok() ? TransferStatusName(ts->s) : ts.status().ToString()) + " " +
                     (err.ok() ? *err : ""));
        if (x.op == TransferRequest::WRITE) {
          // The range is now unknown: learn what the target holds.
          Status r = engine.TransferSync(
              {{TransferRequest::READ, dst, segs[t], remote + x.off, x.len}}, milliseconds(60000));
          if (!r.ok()) return Fail(me, "cannot re-read after a failed write: " + r.ToString());
          std::memcpy(mirror + x.off, dst, x.len);
        }
        continue;
      }
      g_bytes.fetch_add(x.len);
      if (x.op == TransferRequest::WRITE) {
        std::memcpy(mirror + x.off, src + j * cfg.max_size, x.len);
      } else if (std::memcmp(dst + j * cfg.max_size, mirror + x.off, x.len) != 0) {
        uint64_t k = 0;
        while (dst[j * cfg.max_size + k] == mirror[x.off + k]) ++k;
        Fail(me, "read of " + std::to_string(x.len) + " B at region offset " +
                     std::to_string(x.off) + " on target " + std::to_string(t) +
                     " differs at byte " + std::to_string(k));
        std::memcpy(mirror + x.off, dst + j * cfg.max_size, x.len);  // resync, keep going
      }
    }
    if (!engine.FreeBatchID(*id).ok()) Fail(me, "free of a finished batch refused");
    if (me == 0 && step == cfg.inject_corruption) {
      uint64_t off = rng() % cfg.region;
      uint8_t bad = static_cast<uint8_t>(mirror[off] ^ 0x5a);
      std::memcpy(src, &bad, 1);
      s = engine.TransferSync({{TransferRequest::WRITE, src, segs[t], remote + off, 1}});
      std::lock_guard lock(g_log_mu);
      std::fprintf(stderr, "soak: injected a corrupt byte at region offset %" PRIu64
                   " of target %zu (%s)\n", off, t, s.ToString().c_str());
    }
    if (step % 8 == 0) {
      uint64_t len = random_size() * 4;
      len = std::min(len, cfg.region);
      uint64_t off = rng() % (cfg.region - len + 1);
      bool ok = false;
      uint64_t h = targets[t]->Hash(base + off, len, &ok);
      if (!ok || h != HashBytes(mirror + off, len)) {
        Fail(me, "target " + std::to_string(t) + " hash of region offset " + std::to_string(off) +
                     " + " + std::to_string(len) + (ok ? " differs from the mirror" : ": no reply"));
      }
    }
  }
  // Every byte of every region.
  for (size_t t = 0; t < targets.size(); ++t) {
    bool ok = false;
    uint64_t h = targets[t]->Hash(base, cfg.region, &ok);
    if (!ok || h != HashBytes(mirrors[t]->data(), cfg.region)) {
      Fail(me, "final hash of the region on target " + std::to_string(t) +
                   (ok ? " differs from the mirror" : ": no reply"));
    }
  }
}

bool ParseFlags(int argc, char** argv, Config* c) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "soak: flag %s needs a value\n", k.c_str());
      return false;
    }
    std::string v = argv[++i];
    try {
      if (k == "--seconds") c->seconds = std::stod(v);
      else if (k == "--targets") c->targets = std::stoi(v);
      else if (k == "--initiators") c->initiators = std::stoi(v);
      else if (k == "--region-mib") c->region = std::stoull(v) << 20;
      else if (k == "--max-size") c->max_size = std::stoull(v);
      else if (k == "--batch") c->batch = std::stoi(v);
      else if (k == "--transport") c->transport = v;
      else if (k == "--seed") c->seed = std::stoull(v);
      else if (k == "--peer") c->peer = v;
      else if (k == "--slice-timeout-ms") c->slice_timeout_ms = std::stoi(v);
      else if (k == "--progress-s") c->progress_s = std::stod(v);
      else if (k == "--inject-corruption") c->inject_corruption = std::stoull(v);
      else {
        std::fprintf(stderr, "soak: unknown flag %s\n", k.c_str());
        return false;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "soak: bad value for %s: %s\n", k.c_str(), v.c_str());
      return false;
    }
  }
  if (c->seconds < 0 || c->targets < 1 || c->initiators < 1 || c->batch < 1 ||
      c->max_size < 1 || c->region < c->max_size || c->slice_timeout_ms < 1000) {
    std::fprintf(stderr, "soak: need targets, initiators, batch >= 1, region >= max-size\n");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  google::InitGoogleLogging(argv[0]);
  Config cfg;
  if (!ParseFlags(argc, argv, &cfg)) return 2;

  std::vector<std::unique_ptr<Target>> targets;
  for (int t = 0; t < cfg.targets; ++t) {
    auto tg = std::make_unique<Target>();
    Peer::Options po;
    po.seed = 1000 + t;
    tg->peer = Peer::Start(cfg.peer, cfg.region * cfg.initiators, po);
    if (!tg->peer.ok()) {
      std::fprintf(stderr, "soak: target %d did not start: %s\n", t, tg->peer.error.c_str());
      std::printf("soak: requests 0, bytes 0, failures 1, seconds 0\n");
      return 1;
    }
    targets.push_back(std::move(tg));
  }

  auto start = Clock::now();
  auto deadline = start + std::chrono::milliseconds(static_cast<int64_t>(cfg.seconds * 1000));
  std::vector<std::thread> threads;
  for (int i = 0; i < cfg.initiators; ++i) {
    threads.emplace_back([&, i] { RunInitiator(cfg, i, targets, deadline); });
  }
  std::atomic<bool> done{false};
  std::thread progress([&] {
    if (cfg.progress_s <= 0) return;
    auto next = start + std::chrono::milliseconds(static_cast<int64_t>(cfg.progress_s * 1000));
    while (!done.load()) {
      std::this_thread::sleep_for(milliseconds(50));
      if (Clock::now() < next) continue;
      next += std::chrono::milliseconds(static_cast<int64_t>(cfg.progress_s * 1000));
      std::lock_guard lock(g_log_mu);
      std::fprintf(stderr, "soak: %.0f s: requests %" PRIu64 ", bytes %" PRIu64 ", failures %" PRIu64 "\n",
                   SecondsSince(start), g_requests.load(), g_bytes.load(), g_failures.load());
    }
  });
  for (auto& th : threads) th.join();
  done.store(true);
  progress.join();
  double elapsed = SecondsSince(start);
  for (size_t t = 0; t < targets.size(); ++t) {
    if (!targets[t]->peer.Ping()) Fail(-1, "target " + std::to_string(t) + " is not answering");
  }
  uint64_t failures = g_failures.load();
  std::printf("soak: requests %" PRIu64 ", bytes %" PRIu64 ", failures %" PRIu64 ", seconds %.1f\n",
              g_requests.load(), g_bytes.load(), failures, elapsed);
  std::fflush(stdout);
  return failures > 0 ? 1 : 0;
}
