#include "store/ha/ha_master.h"

#include <glog/logging.h>

#include <limits>

#include "store/ha/checkpoint.h"
#include "store/ha/master_view.h"
#include "store/ha/oplog_codec.h"
#include "store/master/master_rpc.h"

namespace mooncake {
namespace store {
namespace ha {

namespace {

// What Serve() tells HoldPosition() about the call it just made on this thread.
thread_local bool tl_served = false;
thread_local uint64_t tl_term = 0;
thread_local uint64_t tl_wait = 0;

constexpr auto kViewPoll = std::chrono::milliseconds(200);
// The lease is renewed every min(1 s, TTL / 3), and the master serves until the last
// renewal sent + TTL - min(1 s, TTL / 4): with the default 5 s, every second and 4 s.
std::chrono::milliseconds RenewEvery(uint32_t ttl_s) {
  return std::chrono::milliseconds(std::min<int64_t>(1000, ttl_s * 1000 / 3));
}
std::chrono::milliseconds ServeFor(int64_t ttl_s) {
  return std::chrono::milliseconds(ttl_s * 1000 - std::min<int64_t>(1000, ttl_s * 1000 / 4));
}
constexpr auto kStep = std::chrono::milliseconds(20);
constexpr auto kRetryFailed = std::chrono::seconds(2);
// Batches read at once (each at most kMaxBatchBytes: 32 MiB, under EtcdKv's 64 MiB reply cap).
constexpr int64_t kTailBatches = 64;
// --oplog_ack_before_durable: at most this many batches (of --oplog_batch_max_entries) of
// acknowledged entries are not durable; a reply past that waits.
constexpr uint32_t kUndurableBatches = 8;

int64_t Ticks(HaMaster::Clock::time_point t) { return t.time_since_epoch().count(); }

}  // namespace

Result<std::unique_ptr<HaMaster>> HaMaster::Create(Options options) {
  if (Status s = CheckStoreClusterId(options.cluster_id); !s.ok()) return s;
  if (options.advertise_address.empty()) {
    return Status::InvalidArgument("HA master: no address to publish for clients");
  }
  if (options.lease_ttl_sec < 2) {
    return Status::InvalidArgument("HA master: the lease TTL must be at least 2 s");
  }
  EtcdKv::Options kvo;
  kvo.connect_timeout_ms = options.etcd_timeout_ms;
  kvo.request_timeout_ms = options.etcd_timeout_ms;
  auto kv = EtcdKv::Create(options.endpoints, kvo);
  if (!kv.ok()) return kv.status();
  return std::unique_ptr<HaMaster>(new HaMaster(std::move(options), std::move(*kv)));
}

HaMaster::HaMaster(Options options, std::unique_ptr<EtcdKv> kv)
    : options_(std::move(options)), kv_(std::move(kv)) {
  BecomeStandby();
}

HaMaster::~HaMaster() { Stop(); }

void HaMaster::Start(RpcServer* server) {
  server_ = server;
  thread_ = std::thread([this] { Run(); });
}

void HaMaster::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

const char* HaMaster::StateName(State s) {
  switch (s) {
    case State::kStandby: return "standby";
    case State::kRecovering: return "recovering";
    case State::kWarmup: return "leader_warmup";
    case State::kServing: return "serving";
    case State::kFailed: return "failed";
    case State::kStopped: return "stopped";
  }
  return "unknown";
}

void HaMaster::SetState(State s) {
  std::lock_guard<std::mutex> l(mu_);
  state_ = s;
}

std::shared_ptr<MasterService> HaMaster::master() const {
  std::lock_guard<std::mutex> l(mu_);
  return master_;
}

RpcStatus HaMaster::Serve(uint16_t method, const char* data, size_t n, std::string* out) {
  tl_served = false;
  std::shared_ptr<MasterService> m;
  std::shared_ptr<OplogWriter> w;
  uint64_t term = 0;
  if (serving_.load() && Ticks(Clock::now()) < serve_until_ticks_.load()) {
    std::lock_guard<std::mutex> l(mu_);
    m = master_;
    w = writer_;
    term = term_.load();
  }
  if (!m || !serving_.load()) {
    std::string leader, state;
    {
      std::lock_guard<std::mutex> l(mu_);
      leader = leader_address_;
      state = StateName(state_);
    }
    *out += "master " + options_.advertise_address + " is " +
            (state == "serving" ? std::string("past its lease") : state) +
            ", not the serving leader; the leader is " +
            (leader.empty() || leader == options_.advertise_address ? std::string("not known yet")
                                                                    : leader) +
            " (clients follow the leader with master_server_addr=etcd://<the etcd endpoints>)";
    return RpcStatus::kNotLeader;
  }
  const size_t base = out->size();
  const RpcStatus st = ServeMasterRpc(m.get(), method, data, n, out);
  if (term_.load() != term) {
    // Stepped down while the call ran: its changes may never be durable. (A step-down after
    // this check is caught by HoldPosition.)
    out->resize(base);
    *out += "master " + options_.advertise_address +
            " stepped down while serving this call; its changes may not be durable: retry on "
            "the new leader";
    (void)MasterService::TakeLogPosition();
    return RpcStatus::kNotLeader;
  }
  tl_served = true;
  tl_term = term;
  // Every reply waits for what was appended up to now to be durable: its own changes and
  // those it may have read (a read must not show what a failover could take back). With
  // --oplog_ack_before_durable it waits only while more than kUndurableBatches batches'
  // worth of entries are not durable yet: the loss window, and the writer's queue, stay
  // bounded however fast clients change things (else the writer falls behind for good and
  // no checkpoint can cover what is durable: etcd grew without bound).
  tl_wait = 0;
  if (w) {
    const uint64_t appended = w->last_appended();
    const uint64_t window = uint64_t{kUndurableBatches} * options_.batch_max_entries;
    if (!options_.ack_before_durable) {
      tl_wait = appended;
    } else if (appended > w->durable() + window) {
      tl_wait = appended - window;
    }
  }
  return st;
}

uint64_t HaMaster::HoldPosition(uint16_t, RpcStatus) {
  (void)MasterService::TakeLogPosition();  // reset this thread's; tl_wait covers it
  if (!tl_served) return 0;
  tl_served = false;
  // Stepped down while the call ran: its changes may never be durable. Held, and failed by
  // the FailHeld of the step-down (which may have run already).
  if (tl_term != term_.load()) return std::numeric_limits<uint64_t>::max();
  return tl_wait;
}

HaView HaMaster::View() const {
  HaView v;
  std::lock_guard<std::mutex> l(mu_);
  v.enabled = true;
  v.ha_state = StateName(state_);
  v.role = (state_ == State::kWarmup || state_ == State::kServing) ? "leader" : "standby";
  v.service_ready = serving_.load();
  v.leader_address = leader_address_;
  v.view_version = view_version_;
  v.promotions = promotions_;
  v.fenced_writes = fenced_total_;
  v.durable_batches = batches_total_;
  v.durable_entries = entries_total_;
  if (writer_) {
    v.applied_seq = writer_->last_appended();
    v.durable_seq = writer_->durable();
    v.pending_entries = v.applied_seq - v.durable_seq;
    v.durable_batches += writer_->batches();
    v.durable_entries += writer_->entries();
    v.fenced_writes += writer_->fenced();
  } else {
    v.applied_seq = applied_seq_;
    v.durable_seq = applied_seq_;  // a standby applies only what is durable
  }
  v.checkpoint_seq = checkpoint_seq_;
  return v;
}

void HaMaster::Tick() {
  if (!serving_.load()) return;
  if (auto m = master()) m->Tick();
}

void HaMaster::BecomeStandby() {
  MasterConfig cfg = options_.config;
  cfg.standby = true;
  auto fresh = std::make_shared<MasterService>(cfg);
  std::lock_guard<std::mutex> l(mu_);
  master_ = std::move(fresh);
  applied_seq_ = 0;
  next_batch_id_ = 0;
  need_checkpoint_ = true;
  state_ = State::kStandby;
}

Status HaMaster::TailOnce(int64_t limit, bool* more) {
  *more = false;
  uint64_t next, applied;
  bool load;
  std::shared_ptr<MasterService> m;
  {
    std::lock_guard<std::mutex> l(mu_);
    next = next_batch_id_;
    applied = applied_seq_;
    load = need_checkpoint_;
    m = master_;
  }
  if (load) {
    auto cp = LoadCheckpoint(kv_.get(), options_.cluster_id, m.get(), options_.etcd_timeout_ms);
    if (!cp.ok() && !cp.status().IsNotFound()) {
      // Partly applied: this state is thrown away (the caller starts a fresh standby).
      return Status::DataLoss("loading the checkpoint: " + cp.status().message());
    }
    std::lock_guard<std::mutex> l(mu_);
    need_checkpoint_ = false;
    if (cp.ok()) {
      applied_seq_ = applied = cp->seq;
      checkpoint_seq_ = cp->seq;
      checkpoint_last_batch_ = cp->last_batch;
      LOG(INFO) << "HA: loaded checkpoint " << cp->seq << " (" << cp->entries << " entries in "
                << cp->chunks << " chunks)";
    }
  }
  const std::string start =
      next == 0 ? OplogPrefix(options_.cluster_id) : OplogKey(options_.cluster_id, next);
  auto r = kv_->Range(start, EtcdPrefixEnd(OplogPrefix(options_.cluster_id)), limit);
  if (!r.ok()) return Status::Unavailable("reading the oplog: " + r.status().message());
  for (const EtcdKeyValue& kv : r->kvs) {
    auto id = ParseOplogKey(options_.cluster_id, kv.key);
    if (!id.ok()) return Status::DataLoss(id.status().message());
    if (next != 0 && *id != next) {
      return Status::DataLoss("the oplog jumps from batch " + std::to_string(next - 1) + " to " +
                              std::to_string(*id) +
                              " (compacted past this standby: it starts again from the "
                              "checkpoint)");
    }
    auto b = DecodeBatch(kv.value, *id);
    if (!b.ok()) return b.status();
    const uint64_t last = b->first_seq() + static_cast<uint64_t>(b->entries_size()) - 1;
    if (b->first_seq() > applied + 1) {
      return Status::DataLoss("oplog batch " + std::to_string(*id) + " starts at sequence " +
                              std::to_string(b->first_seq()) + ", expected " +
                              std::to_string(applied + 1) +
                              (next == 0 ? " (the log after the checkpoint is not there)" : ""));
    }
    if (next != 0 && b->first_seq() != applied + 1) {
      return Status::DataLoss("oplog batch " + std::to_string(*id) + " starts at sequence " +
                              std::to_string(b->first_seq()) + ", expected " +
                              std::to_string(applied + 1));
    }
    next = *id;
    if (last <= applied) {  // covered by the checkpoint
      ++next;
      std::lock_guard<std::mutex> l(mu_);
      next_batch_id_ = next;
      continue;
    }
    for (int i = static_cast<int>(applied + 1 - b->first_seq()); i < b->entries_size(); ++i) {
      const oplog::Entry& e = b->entries(i);
      Status s = m->Apply(e);
      if (!s.ok()) {
        return Status::DataLoss("oplog batch " + std::to_string(*id) + ": " + s.message());
      }
    }
    applied = last;
    ++next;
    std::lock_guard<std::mutex> l(mu_);
    applied_seq_ = applied;
    next_batch_id_ = next;
  }
  *more = r->more;
  return Status::OK();
}

void HaMaster::Run() {
  auto next_view = Clock::now();
  auto next_poll = Clock::now();
  Clock::time_point retry_at{};
  while (!stop_.load()) {
    const auto now = Clock::now();
    State s;
    {
      std::lock_guard<std::mutex> l(mu_);
      s = state_;
    }
    if (s == State::kStandby) {
      if (options_.oplog && now >= next_poll) {
        bool more = false;
        Status t = TailOnce(kTailBatches, &more);
        next_poll = more ? now : now + std::chrono::milliseconds(options_.poll_interval_ms);
        if (!t.ok() && t.code() == Status::Code::kDataLoss) {
          LOG(ERROR) << "HA: " << t.message() << "; this master does not serve (starting again from etcd in 2 s)";
          std::lock_guard<std::mutex> l(mu_);
          failure_ = t.message();
          state_ = State::kFailed;
          retry_at = now + kRetryFailed;
          continue;
        }
        if (!t.ok()) {
          LOG_EVERY_N(WARNING, 20) << "HA: " << t.message();
        }
      }
      if (now >= next_view) {
        next_view = now + kViewPoll;
        auto view = kv_->Range(MasterViewKey(options_.cluster_id));
        if (view.ok() && view->kvs.empty()) {
          Campaign();
        } else if (view.ok()) {
          auto hp = ParseMasterViewValue(view->kvs[0].value);
          std::lock_guard<std::mutex> l(mu_);
          leader_address_ = hp.ok() ? view->kvs[0].value : "";
          view_version_ = view->kvs[0].create_revision;
        } else {
          LOG_EVERY_N(WARNING, 50) << "HA: cannot read master_view: " << view.status().message();
        }
      }
    } else if (s == State::kServing || s == State::kWarmup) {
      std::string why;
      if (writer_failed_.load()) {
        std::lock_guard<std::mutex> l(mu_);
        why = writer_failure_;
      }
      if (!why.empty()) {
        StepDown("the oplog writer stopped: " + why);
      } else {
        Renew(now);
        if (options_.oplog && s == State::kServing && serving_.load()) Checkpoint();
      }
    } else if (s == State::kFailed && now >= retry_at) {
      BecomeStandby();
    }
    std::this_thread::sleep_for(kStep);
  }
  if (lease_ != 0 || serving_.load()) StepDown("stopping");
  SetState(State::kStopped);
}

void HaMaster::Renew(Clock::time_point now) {
  if (Ticks(now) >= serve_until_ticks_.load()) {
    StepDown("the lease was not renewed in time (no renewal answered for " +
             std::to_string(ServeFor(options_.lease_ttl_sec).count()) + " ms of its " +
             std::to_string(options_.lease_ttl_sec) + " s)");
    return;
  }
  if (now < next_renew_) return;
  const auto sent = Clock::now();
  auto r = kv_->LeaseKeepAlive(lease_, options_.etcd_timeout_ms);
  if (r.ok()) {
    const int64_t ttl = std::min<int64_t>(*r, options_.lease_ttl_sec);
    serve_until_ticks_ = Ticks(sent + ServeFor(ttl));
    next_renew_ = sent + RenewEvery(options_.lease_ttl_sec);
  } else if (r.status().IsNotFound()) {
    StepDown("the lease is gone in etcd: " + r.status().message());
  } else {
    next_renew_ = Clock::now() + std::chrono::milliseconds(200);
    LOG_EVERY_N(WARNING, 5) << "HA: renewing the lease failed: " << r.status().message();
  }
}

void HaMaster::Campaign() {
  const auto sent = Clock::now();
  auto lease = kv_->LeaseGrant(options_.lease_ttl_sec, options_.etcd_timeout_ms);
  if (!lease.ok()) {
    LOG_EVERY_N(WARNING, 20) << "HA: cannot take a lease: " << lease.status().message();
    return;
  }
  const std::string view_key = MasterViewKey(options_.cluster_id);
  EtcdCompare absent;
  absent.key = view_key;
  absent.target = EtcdCompare::Target::kCreateRevision;
  absent.op = EtcdCompare::Op::kEqual;
  absent.number = 0;
  auto won = kv_->Txn({absent},
                      {EtcdOp::Put(view_key,
                                   std::string(kMasterViewWarmingPrefix) + ":" +
                                       std::to_string(*lease),
                                   *lease)},
                      {EtcdOp::Get(view_key)}, options_.etcd_timeout_ms);
  if (!won.ok() || !won->succeeded) {
    (void)kv_->LeaseRevoke(*lease, options_.etcd_timeout_ms);
    return;
  }
  lease_ = *lease;
  serve_until_ticks_ =
      Ticks(sent + ServeFor(options_.lease_ttl_sec));
  next_renew_ = sent + RenewEvery(options_.lease_ttl_sec);
  const int64_t version = won->revision;
  {
    std::lock_guard<std::mutex> l(mu_);
    state_ = State::kRecovering;
    view_version_ = version;
    leader_address_ = "";
  }
  LOG(INFO) << "HA: won master_view (view version " << version << ", lease " << *lease
            << "); reading the log to its end";
  if (options_.oplog) {
    // Nothing can be appended to the log now (every write is fenced on the view version).
    for (;;) {
      if (stop_.load()) return StepDown("stopping");
      Renew(Clock::now());
      if (lease_ == 0) return;  // stepped down
      bool more = false;
      Status t = TailOnce(kTailBatches, &more);
      if (!t.ok()) return StepDown("catching up failed: " + t.message());
      if (!more) break;
    }
    std::shared_ptr<MasterService> m = master();
    Status p = m->Promote();
    if (!p.ok()) return StepDown("promotion failed: " + p.message());
    if (options_.before_serving) {
      p = options_.before_serving(m.get());
      if (!p.ok()) return StepDown("cannot serve: " + p.message());
    }
    uint64_t applied, next_id;
    {
      std::lock_guard<std::mutex> l(mu_);
      applied = applied_seq_;
      // Batch ids keep growing past a compaction (a standby waits at the id after its last).
      next_id = next_batch_id_ != 0 ? next_batch_id_ : checkpoint_last_batch_ + 1;
    }
    OplogWriter::Options wo;
    wo.cluster_id = options_.cluster_id;
    wo.view_version = version;
    wo.next_batch_id = next_id;
    wo.next_seq = applied + 1;
    wo.max_entries = options_.batch_max_entries;
    wo.retry_timeout = std::chrono::seconds(options_.retry_timeout_sec);
    wo.txn_timeout_ms = options_.etcd_timeout_ms;
    server_->ResetHeld(applied);
    auto w = std::make_shared<OplogWriter>(
        kv_.get(), wo, [this](uint64_t durable) { server_->ReleaseHeld(durable); },
        [this](const std::string& why) {
          serving_ = false;
          ++term_;
          server_->FailHeld("master " + options_.advertise_address +
                            " lost the leadership before this call's changes were durable (" +
                            why + "); retry on the new leader");
          std::lock_guard<std::mutex> l(mu_);
          writer_failure_ = why;
          writer_failed_ = true;
        });
    m->SetChangeSink(w.get());
    if (options_.events != nullptr) m->SetEventSink(options_.events);
    if (server_ != nullptr) {
      m->SetDiskWorkWaker([s = server_](const std::string& c) { s->WakeWaiting(c); });
    }
    std::lock_guard<std::mutex> l(mu_);
    writer_ = std::move(w);
    writer_failed_ = false;
    writer_failure_.clear();
  } else {
    auto fresh = std::make_shared<MasterService>(options_.config);  // nothing replicated
    if (options_.events != nullptr) fresh->SetEventSink(options_.events);
    if (server_ != nullptr) {
      fresh->SetDiskWorkWaker([s = server_](const std::string& c) { s->WakeWaiting(c); });
    }
    if (options_.before_serving) {
      Status p = options_.before_serving(fresh.get());
      if (!p.ok()) return StepDown("cannot serve: " + p.message());
    }
    server_->ResetHeld(0);
    std::lock_guard<std::mutex> l(mu_);
    master_ = std::move(fresh);
  }
  SetState(State::kWarmup);
  EtcdCompare ours;
  ours.key = view_key;
  ours.target = EtcdCompare::Target::kCreateRevision;
  ours.op = EtcdCompare::Op::kEqual;
  ours.number = version;
  auto published = kv_->Txn({ours}, {EtcdOp::Put(view_key, options_.advertise_address, lease_)},
                            {}, options_.etcd_timeout_ms);
  if (!published.ok() || !published->succeeded) {
    return StepDown("publishing this master's address failed: " +
                    (published.ok() ? std::string("master_view changed hands")
                                    : published.status().message()));
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    leader_address_ = options_.advertise_address;
    state_ = State::kServing;
    ++promotions_;
    failure_.clear();
  }
  ++term_;
  serving_ = true;
  LOG(INFO) << "HA: serving as the leader at " << options_.advertise_address << " (view version "
            << version << ")";
}

void HaMaster::Checkpoint() {
  std::shared_ptr<MasterService> m;
  std::shared_ptr<OplogWriter> w;
  uint64_t since;
  int64_t version;
  {
    std::lock_guard<std::mutex> l(mu_);
    m = master_;
    w = writer_;
    since = checkpoint_seq_;
    version = view_version_;
  }
  if (!w || w->durable() < since + options_.checkpoint_entries) return;
  const auto t0 = Clock::now();
  uint64_t seq = 0, entries = 0;
  std::vector<std::string> chunks =
      ExportCheckpoint(*m, [&w] { return w->last_appended(); }, &seq, &entries);
  const auto exported = Clock::now();
  if (seq <= since) return;  // changes raced an empty export: next time
  // Only what is durable may be checkpointed (a new leader's log must reach it).
  while (w->durable() < seq) {
    if (stop_.load() || !serving_.load() || Clock::now() - exported > std::chrono::seconds(10)) {
      return;
    }
    Renew(Clock::now());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CheckpointManifest manifest;
  manifest.seq = seq;
  manifest.last_batch = w->LastBatchUpTo(seq);
  manifest.chunks = chunks.size();
  manifest.entries = entries;
  manifest.view_version = version;
  manifest.unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  Status s = WriteCheckpoint(kv_.get(), options_.cluster_id, version, manifest, chunks,
                             options_.etcd_timeout_ms);
  if (s.IsFailedPrecondition()) return StepDown("writing a checkpoint: " + s.message());
  if (!s.ok()) {
    LOG(WARNING) << "HA: checkpoint " << seq << " not written: " << s.message();
    return;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    checkpoint_seq_ = seq;
    checkpoint_last_batch_ = manifest.last_batch;
    ++checkpoints_;
  }
  auto compacted = CompactLog(kv_.get(), options_.cluster_id, version, manifest.last_batch, seq,
                              options_.etcd_timeout_ms);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const double export_ms = std::chrono::duration<double, std::milli>(exported - t0).count();
  if (compacted.ok()) {
    LOG(INFO) << "HA: checkpoint " << seq << ": " << entries << " entries in " << chunks.size()
              << " chunks (exported in " << export_ms << " ms, " << ms
              << " ms in all); the log before it deleted, etcd compacted to revision "
              << *compacted;
  } else {
    LOG(WARNING) << "HA: checkpoint " << seq << " written; compacting failed: "
                 << compacted.status().message();
  }
}

void HaMaster::StepDown(const std::string& why) {
  const bool was_serving = serving_.exchange(false);
  ++term_;
  if (server_ != nullptr) {
    server_->FailHeld("master " + options_.advertise_address + " stepped down (" + why +
                      ") before this call's changes were durable; retry on the new leader");
  }
  std::shared_ptr<OplogWriter> w;
  std::shared_ptr<MasterService> m;
  {
    std::lock_guard<std::mutex> l(mu_);
    w = std::move(writer_);
    writer_.reset();
    m = master_;
    failure_ = why;
  }
  if (m) {
    m->SetEventSink(nullptr);  // a master that does not lead reports no events
    m->SetDiskWorkWaker(nullptr);  // nor wakes offload fetches (the server may stop next)
  }
  if (w) {
    m->SetChangeSink(nullptr);  // waits for a change being logged; none is logged after
    w->Stop();
    std::lock_guard<std::mutex> l(mu_);
    batches_total_ += w->batches();
    entries_total_ += w->entries();
    fenced_total_ += w->fenced();
  }
  if (lease_ != 0) {
    (void)kv_->LeaseRevoke(lease_, options_.etcd_timeout_ms);  // master_view goes with it
    lease_ = 0;
  }
  LOG(WARNING) << "HA: " << (was_serving ? "stepped down" : "gave up leading") << ": " << why;
  BecomeStandby();
}

}  // namespace ha
}  // namespace store
}  // namespace mooncake
