// The disk tier in the client (src/store/disk/README.md): the local disk (DiskStore) and its
// offload service, the worker writing what the master sends to disk, promotions. Reads of
// disk replicas: store_client_disk_read.cc.
#include <glog/logging.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "store/client/store_client_impl.h"

namespace mooncake {
namespace store {
namespace {

// An idle offload worker's OffloadFetch waits at the master up to kOffloadWait for this
// client's disk to get work and is answered as soon as it has some (a long poll:
// RpcServer::WakeWaiting), so a burst's first bucket starts within a round trip of its first
// put. A master that does not wait (an older one) is asked again every kOffloadPoll, as
// before the long poll: a burst's first bucket then waits up to that long (a 512 MiB burst
// of 1 MiB puts into a 128 MiB holder offloaded at 0.84-0.93 GB/s with 200 ms, 1.08-1.19
// with 50 ms, 1.05-1.26 with 20 ms: bench/disk_tier_bench.py, 2026-12-05). A turn that
// waited pokes the next at once, so the worker always has a fetch waiting, and what it
// checks each turn (dropped keys to report, the disk's watermarks) is checked at least every
// kOffloadWait. Close ends the wait of a fetch in flight (OffloadFetchRequest.end_wait)
// before it stops the worker.
constexpr std::chrono::milliseconds kOffloadWait{100};
constexpr std::chrono::milliseconds kOffloadPoll{50};
// A promotion the master found no room for (its pool full of objects waiting for this disk,
// offload_on_evict) is tried again after each bucket write this client reports, which frees
// their memory, else every kPromotionRetry; after kPromotionKeep it is let go (a later read
// queues it again). At most kPromotionsKept wait (the master's queue is bounded too).
constexpr std::chrono::milliseconds kPromotionRetry{500};
constexpr std::chrono::seconds kPromotionKeep{30};
constexpr size_t kPromotionsKept = 1024;
// At most this many promotions a retry turn (each a disk read, maybe a transfer, two master
// calls), so that offload turns come between them.
constexpr size_t kPromotionsPerTurn = 16;

// The host of an engine segment name: "host:port", "[v6]:port" or "host".
std::string HostOf(const std::string& name) {
  if (!name.empty() && name[0] == '[') {
    const size_t end = name.find(']');
    return end == std::string::npos ? name : name.substr(1, end - 1);
  }
  const size_t colon = name.rfind(':');
  return colon == std::string::npos ? name : name.substr(0, colon);
}

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  return end != v && *end == '\0' ? x : fallback;
}

}  // namespace

int StoreClient::Impl::StartDisk(std::string* message) {
  if (!opt.enable_offload) return 0;
  auto cfg = DiskConfig::FromEnvironment(opt.offload_path);
  if (!cfg.ok()) {
    *message = "enable_ssd_offload: " + cfg.status().message();
    return ToInt(ErrorCode::INVALID_PARAMS);
  }
  auto d = DiskStore::Open(*cfg);
  if (!d.ok()) {
    *message = "enable_ssd_offload: " + d.status().message();
    return ToInt(d.status().IsFailedPrecondition() ? ErrorCode::FILE_LOCK_FAIL
                                                   : ErrorCode::FILE_OPEN_FAIL);
  }
  disk = std::move(d).value();
  if (ClientMetrics* m = metrics.get()) {  // mooncake_ssd_*
    disk->SetIoObserver([m](bool write, uint64_t keys, uint64_t bytes, uint64_t us) {
      m->ObserveSsd(write ? OpKind::kWrite : OpKind::kRead, keys, bytes, us);
    });
  }
  OffloadService::Options so;
  so.buffer_size = cfg->local_buffer_size;
  so.hold = std::chrono::milliseconds(EnvU64("MOONCAKE_OFFLOAD_CLIENT_BUFFER_GC_TTL_MS", 5000));
  so.host = HostOf(seg_name);
  so.segment_name = seg_name;
  auto svc = OffloadService::Start(engine.get(), disk.get(), so);
  if (!svc.ok()) {
    *message = "enable_ssd_offload: cannot serve the disk: " + svc.status().message();
    return ToInt(ErrorCode::INTERNAL_ERROR);
  }
  offload_service = std::move(svc).value();
  const int rc = MountDisk();
  if (rc != 0) {
    *message = rc == ToInt(ErrorCode::UNABLE_OFFLOAD)
                   ? "enable_ssd_offload: the master at " + master->address() +
                         " runs without --enable_offload (UNABLE_OFFLOAD): start it with "
                         "--enable_offload, or set up without enable_ssd_offload"
                   : "enable_ssd_offload: mounting the disk at the master failed";
    return rc;
  }
  // Turn after turn, each waiting at the master for work (kOffloadWait), else every
  // kOffloadPoll; poked by the heartbeat when the master holds work for this disk.
  offload_worker = std::make_unique<Worker>([this] { RunOffload(); }, kOffloadPoll);
  offload_worker->Start();
  LOG(INFO) << "disk tier: store " << disk->id() << " over " << cfg->roots.size()
            << " directories, served at " << offload_service->endpoint();
  return 0;
}

int StoreClient::Impl::MountDisk() {
  rpc::MountLocalDiskRequest req;
  req.set_client_id(client_id);
  req.set_store_id(disk->id());
  req.set_endpoint(offload_service->endpoint());
  req.set_enable_offloading(true);
  rpc::MountLocalDiskResponse resp;
  if (int rc = Checked("MountLocalDisk", master->MountLocalDisk(req, &resp)); rc != 0) return rc;
  if (resp.code() != 0) {
    LOG(ERROR) << "disk tier: MountLocalDisk: " << ErrorCodeName(resp.code()) << ": "
               << resp.message();
    return resp.code();
  }
  // What the disk holds (a restart, or a master that forgot it): registered again; what the
  // master refuses (removed or replaced meanwhile) is deleted.
  const std::vector<DiskObject> objects = disk->Objects();
  size_t kept = 0;
  for (size_t at = 0; at < objects.size(); at += kMaxBatchItems) {
    const size_t end = std::min(objects.size(), at + kMaxBatchItems);
    rpc::OffloadDoneRequest done;
    done.set_client_id(client_id);
    done.set_registration(true);
    for (size_t i = at; i < end; ++i) {
      auto* item = done.add_items();
      item->set_key(objects[i].key);
      item->set_version(objects[i].put_id);
      item->set_size(objects[i].size);
    }
    rpc::OffloadDoneResponse dr;
    if (int rc = Checked("OffloadDone", master->OffloadDone(done, &dr)); rc != 0) return rc;
    if (dr.code() != 0 || dr.codes_size() != static_cast<int>(end - at)) {
      LOG(ERROR) << "disk tier: registering the disk's objects: " << dr.message();
      return dr.code() != 0 ? dr.code() : ToInt(ErrorCode::RPC_FAIL);
    }
    std::vector<std::pair<std::string, uint64_t>> refused;
    for (size_t i = at; i < end; ++i) {
      if (dr.codes(static_cast<int>(i - at)) == 0) {
        ++kept;
      } else {
        refused.emplace_back(objects[i].key, objects[i].put_id);
      }
    }
    if (!refused.empty()) (void)disk->RemoveUpTo(refused);
  }
  if (!objects.empty()) {
    LOG(INFO) << "disk tier: " << kept << " of " << objects.size()
              << " objects on disk registered with the master";
  }
  disk_mounted = true;
  return 0;
}

namespace {

// Frees `bytes` of the disk (whole buckets): the master forgets their keys first.
bool EvictFromDisk(StoreClient::Impl* impl, uint64_t bytes) {
  DiskStore::Plan plan = impl->disk->PlanEviction(bytes);
  if (plan.buckets.empty()) return false;
  for (size_t at = 0; at < plan.keys.size(); at += kMaxBatchItems) {
    rpc::EvictDiskRequest req;
    req.set_client_id(impl->client_id);
    const size_t end = std::min(plan.keys.size(), at + kMaxBatchItems);
    for (size_t i = at; i < end; ++i) req.add_keys(plan.keys[i]);
    rpc::EvictDiskResponse resp;
    if (StoreClient::Impl::Checked("EvictDisk", impl->master->EvictDisk(req, &resp)) != 0 ||
        resp.code() != 0) {
      if (at == 0) {
        impl->disk->CancelEviction(plan);  // nothing deleted that the master may still name
        return false;
      }
      // Part told: the files go all the same (the master forgot some of their keys, which
      // must not come back), and the rest is told later.
      impl->disk->ReportLater({plan.keys.begin() + static_cast<ptrdiff_t>(at), plan.keys.end()});
      break;
    }
  }
  Status s = impl->disk->FinishEviction(plan);
  if (!s.ok()) LOG(WARNING) << "disk tier: " << s.message();
  VLOG(1) << "disk tier: evicted " << plan.buckets.size() << " buckets, " << plan.keys.size()
          << " objects";
  return true;
}

}  // namespace

int StoreClient::Impl::SendDiskMount(bool offloading, bool unmount) {
  rpc::MountLocalDiskRequest req;
  req.set_client_id(client_id);
  req.set_store_id(disk->id());
  req.set_endpoint(offload_service->endpoint());
  req.set_enable_offloading(offloading);
  req.set_unmount(unmount);
  rpc::MountLocalDiskResponse resp;
  if (int rc = Checked("MountLocalDisk", master->MountLocalDisk(req, &resp)); rc != 0) return rc;
  return resp.code();
}

int StoreClient::UnmountDisk(int64_t grace_s) {
  Impl& m = *impl_;
  if (!m.disk) {
    LOG(WARNING) << "unmount_local_disk_segment: this client has no disk tier (set up with "
                    "enable_ssd_offload=True)";
    return ToInt(ErrorCode::INVALID_PARAMS);
  }
  if (m.disk_unmounted.exchange(true)) return 0;
  if (grace_s > 0) {
    // Nothing new written from now; readers are still sent here until the grace ends.
    const int rc = m.SendDiskMount(false, false);
    m.disk_unmount_at_ns = (std::chrono::steady_clock::now() + std::chrono::seconds(grace_s))
                               .time_since_epoch()
                               .count();
    return rc;
  }
  const int rc = m.SendDiskMount(false, true);
  m.disk_mounted = false;
  return rc;
}

void StoreClient::Impl::RunOffload(bool final) {
  if (disk_unmounted.load()) {
    const int64_t at = disk_unmount_at_ns.load();
    if (at != 0 && std::chrono::steady_clock::now().time_since_epoch().count() >= at &&
        disk_unmount_at_ns.exchange(0) != 0) {
      (void)SendDiskMount(false, true);
      disk_mounted = false;
    }
    return;
  }
  const DiskConfig& cfg = disk->config();
  // Keys the disk dropped (a record failing its checks) or still owes the master: told, so
  // that no reader is sent to them and the key may be put again.
  if (std::vector<std::string> gone = disk->TakeDropped(); !gone.empty() && disk_mounted.load()) {
    for (size_t at = 0; at < gone.size(); at += kMaxBatchItems) {
      rpc::EvictDiskRequest req;
      req.set_client_id(client_id);
      const size_t end = std::min(gone.size(), at + kMaxBatchItems);
      for (size_t i = at; i < end; ++i) req.add_keys(gone[i]);
      rpc::EvictDiskResponse resp;
      if (Checked("EvictDisk", master->EvictDisk(req, &resp)) != 0 || resp.code() != 0) {
        disk->ReportLater({gone.begin() + static_cast<ptrdiff_t>(at), gone.end()});
        break;
      }
    }
  }
  const auto until = std::chrono::steady_clock::now() + opt.rpc_timeout;
  // The long poll's wait, well inside the call's own timeout; none for Close's last run.
  const auto wait = final ? std::chrono::milliseconds(0)
                          : std::min(kOffloadWait, opt.rpc_timeout / 4);
  bool worked = false;
  int idle_polls = 0;
  for (int round = 0; round < 10000 && (final ? std::chrono::steady_clock::now() < until
                                              : !closed.load());
       ++round) {
    rpc::OffloadFetchRequest req;
    req.set_client_id(client_id);
    req.set_max_items(static_cast<uint32_t>(std::min<uint64_t>(cfg.bucket_keys_limit, kMaxBatchItems)));
    // At most a quarter of the segment per bucket: its memory is freed for new puts a
    // quarter at a time, not once the whole pool is written.
    req.set_max_bytes(std::min<uint64_t>(cfg.bucket_size_limit,
                                         std::max<uint64_t>(opt.global_segment_size / 4, 1)));
    req.set_removals_done(removals_done);
    req.set_wait_ms(static_cast<uint32_t>(wait.count()));
    rpc::OffloadFetchResponse resp;
    const auto asked = std::chrono::steady_clock::now();
    if (Status fs = master->OffloadFetch(req, &resp); !fs.ok()) {
      // The worker asks again every kOffloadPoll: a master away is said once every 10 s,
      // not each time.
      const auto now = std::chrono::steady_clock::now();
      if (now - offload_fetch_logged >= std::chrono::seconds(10)) {
        offload_fetch_logged = now;
        (void)Checked("OffloadFetch", fs);
      }
      break;
    }
    if (resp.code() != 0) break;
    if (disk_unmounted.load()) break;  // unmount_local_disk_segment meanwhile: not again
    if (resp.disk_unknown()) {
      disk_mounted = false;
      LOG(WARNING) << "disk tier: the master does not know this client's disk (restarted, or "
                      "a new leader): mounting it again";
      removals_done = 0;
      if (MountDisk() != 0) break;
      continue;
    }
    if (resp.removals_size() > 0) {
      std::vector<std::pair<std::string, uint64_t>> rm;
      rm.reserve(resp.removals_size());
      for (const auto& r : resp.removals()) rm.emplace_back(r.key(), r.version());
      if (!disk->RemoveUpTo(rm).ok()) break;  // not durable: not acknowledged, sent again
      removals_done = resp.removals_end();
    }
    for (const auto& p : resp.promotions()) {
      if (Promote(p.key(), p.version(), p.size())) continue;
      KeepRefusedPromotion(p.key(), p.version(), p.size());
    }
    if (!final) RetryPromotions(false);
    if (resp.items_size() == 0) {
      if (resp.removals_size() > 0 || resp.promotions_size() > 0) continue;
      if (final) break;
      if (std::chrono::steady_clock::now() - asked >= wait / 2) {
        offload_master_waits = true;
        offload_worker->Poke();  // it waited for work: the next turn waits again at once
        break;
      }
      // A master that answers at once (no long poll): after work, asked again every 20 ms
      // for a while (puts arriving while the pool is full of objects waiting for this disk
      // would otherwise wait for the next heartbeat), else every kOffloadPoll.
      if (worked && idle_polls++ < 25) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      break;
    }
    worked = true;
    idle_polls = 0;
    // Room first (the master is told before anything is deleted; no RPC under the layout).
    uint64_t incoming = 0;
    for (const auto& it : resp.items()) incoming += it.size() + it.key().size() + 96;
    if (const uint64_t need = disk->NeedFreed(incoming + incoming / 16 + 4096); need > 0) {
      EvictFromDisk(this, need);
    }
    // The bytes come straight from this client's own lent memory (checked, with the layout
    // held so that no run-time segment leaves meanwhile) into bucket files.
    std::vector<DiskStore::Item> written;
    bool short_of_room = false;  // the keys limit or a directory's free space: evict after
    {
      { MutexLock wait_for_writer(&layout_mu.turnstile); }
      ReaderLock layout(&layout_mu.rw);
      auto own = [&](uint64_t addr, uint64_t size) { return InLentMemory(addr, size); };
      std::vector<DiskStore::Item> group;
      uint64_t group_bytes = 0;
      auto flush = [&]() {
        if (group.empty()) return;
        Status s = disk->Write(group, &offload_io);
        if (s.ok()) {
          written.insert(written.end(), group.begin(), group.end());
        } else {
          LOG(WARNING) << "disk tier: " << group.size() << " objects stay in memory only: "
                       << s.message();
          if (s.code() == Status::Code::kResourceExhausted) short_of_room = true;
        }
        group.clear();
        group_bytes = 0;
      };
      for (const auto& it : resp.items()) {
        const uint64_t addr = it.buffer().addr();
        if (it.buffer().segment_name() != seg_name || it.buffer().size() != it.size() ||
            it.size() == 0 || !own(addr, it.size())) {
          LOG(WARNING) << "disk tier: the master named memory this client does not lend for "
                       << it.key().substr(0, 256) << "; not written";
          continue;
        }
        const uint64_t rec = it.size() + it.key().size() + 96;
        if (!group.empty() && (group.size() >= cfg.bucket_keys_limit ||
                               group_bytes + rec > cfg.bucket_size_limit)) {
          flush();
        }
        group.push_back({it.key(), it.version(), reinterpret_cast<const void*>(addr), it.size()});
        group_bytes += rec;
      }
      flush();
    }
    if (short_of_room) EvictFromDisk(this, incoming);  // the next round has room
    if (written.empty()) continue;
    // Each reported with where it was read: the master records it only while the object
    // still holds that replica (so the bytes were the value, however long the write took).
    rpc::OffloadDoneRequest done;
    done.set_client_id(client_id);
    for (const auto& w : written) {
      auto* item = done.add_items();
      item->set_key(w.key);
      item->set_version(w.put_id);
      item->set_size(w.size);
      item->mutable_buffer()->set_segment_name(seg_name);
      item->mutable_buffer()->set_addr(reinterpret_cast<uint64_t>(w.data));
      item->mutable_buffer()->set_size(w.size);
    }
    rpc::OffloadDoneResponse dr;
    if (Checked("OffloadDone", master->OffloadDone(done, &dr)) != 0 || dr.code() != 0 ||
        dr.codes_size() != static_cast<int>(written.size())) {
      // Unreported copies go: the master may have forgotten these values meanwhile, and a
      // later registration must not bring them back.
      std::vector<std::pair<std::string, uint64_t>> rm;
      for (const auto& w : written) rm.emplace_back(w.key, w.put_id);
      (void)disk->RemoveUpTo(rm);
      break;
    }
    std::vector<std::pair<std::string, uint64_t>> refused;
    for (size_t i = 0; i < written.size(); ++i) {
      if (dr.codes(static_cast<int>(i)) == 0) {
        ++offloaded;
      } else {
        refused.emplace_back(written[i].key, written[i].put_id);
      }
    }
    if (!refused.empty()) (void)disk->RemoveUpTo(refused);
    if (!final) RetryPromotions(true);  // their memory is free now: room for promotions
  }
  if (!closed.load()) {
    if (const uint64_t excess = disk->WatermarkExcess(); excess > 0) EvictFromDisk(this, excess);
  }
}

void StoreClient::Impl::KeepRefusedPromotion(const std::string& key, uint64_t version,
                                             uint64_t size) {
  const auto now = std::chrono::steady_clock::now();
  promotions_tried = now;  // just refused: not tried again before the pool may change
  // The master hands a key read again meanwhile over again: kept once, as its latest.
  for (auto& p : refused_promotions) {
    if (p.key != key) continue;
    p.version = version;
    p.size = size;
    return;
  }
  if (refused_promotions.size() >= kPromotionsKept) refused_promotions.pop_front();
  refused_promotions.push_back({key, version, size, now});
}

void StoreClient::Impl::RetryPromotions(bool after_write) {
  if (refused_promotions.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  if (!after_write && now - promotions_tried < kPromotionRetry) return;
  promotions_tried = now;
  // Oldest first, at most kPromotionsPerTurn, until one is refused for room again: the rest
  // wait for the next turn (a pool still full would refuse them too, one PutStart each).
  std::deque<RefusedPromotion> again;
  again.swap(refused_promotions);
  bool stop = false;
  size_t tried = 0;
  for (auto& p : again) {
    if (closed.load() || now - p.since >= kPromotionKeep) continue;
    if (stop || tried++ >= kPromotionsPerTurn || !Promote(p.key, p.version, p.size)) {
      stop = true;
      refused_promotions.push_back(std::move(p));
    }
  }
}

bool StoreClient::Impl::Promote(const std::string& key, uint64_t version, uint64_t size) {
  auto on_disk = disk->Size(key);
  if (!on_disk.ok() || *on_disk != size) return true;  // not this value (a master's mistake)
  rpc::PutStartRequest req;
  req.set_client_id(client_id);
  req.set_promote_version(version);
  req.mutable_config()->set_replica_num(1);
  if (segment != nullptr) req.mutable_config()->add_preferred_segments(seg_name);
  auto* item = req.add_items();
  item->set_key(key);
  item->set_size(size);
  rpc::PutStartResponse resp;
  if (Checked("PutStart (promotion)", master->PutStart(req, &resp)) != 0 || resp.code() != 0 ||
      resp.results_size() != 1 || resp.results(0).code() != 0) {
    // No room: tried again later. Otherwise (the master away, a memory replica again,
    // a newer value, the key gone) there is nothing to promote.
    const bool no_room = resp.results_size() == 1 &&
                         resp.results(0).code() == ToInt(ErrorCode::NO_AVAILABLE_HANDLE);
    VLOG(1) << "disk tier: promotion of " << key << " not started"
            << (no_room ? " (no room yet)" : "");
    return !no_room;
  }
  // The value from the disk (checked) into the new replica: read straight into it when it
  // lies in this client's own segment, else staged and written with the engine.
  bool ok = true;
  std::string tmp;
  std::vector<Job> jobs;
  const auto& reps = resp.results(0).replicas();
  for (const auto& rep : reps) {
    const uint64_t addr = rep.buffer().addr();
    const uint64_t base = reinterpret_cast<uint64_t>(segment);
    const bool mine = rep.buffer().segment_name() == seg_name && segment != nullptr &&
                      addr >= base && size <= opt.global_segment_size &&
                      addr - base <= opt.global_segment_size - size;
    if (mine) {
      ok = ok && disk->Read(key, reinterpret_cast<void*>(addr), size, version).ok();
      continue;
    }
    if (tmp.empty()) {
      tmp.resize(size);
      ok = ok && disk->Read(key, tmp.data(), size, version).ok();
    }
    AddJobs(TransferRequest::WRITE, {{tmp.data(), size}}, &rep.buffer().segment_name(), addr, 0,
            &jobs);
  }
  if (ok && !jobs.empty()) {
    std::vector<char> failed(1, 0);
    copier->Run(jobs, &failed);
    ok = !failed[0];
  }
  rpc::KeysRequest end;
  end.set_client_id(client_id);
  end.add_keys(key);
  rpc::CodesResponse done;
  (void)Checked("PutEnd (promotion)",
                ok ? master->PutEnd(end, &done) : master->PutRevoke(end, &done));
  return true;
}

void StoreClient::Impl::CloseDisk() {
  if (offload_worker) offload_worker->Stop();
  if (offload_service) offload_service->Stop();
  offload_service.reset();
  disk.reset();
  MutexLock lock(&offload_peers_mu);
  offload_peers.clear();
}

uint64_t StoreClient::offload_rpc_reads() const { return impl_->offload_rpc_reads.load(); }
uint64_t StoreClient::offloaded() const { return impl_->offloaded.load(); }
const DiskStore* StoreClient::disk_store() const { return impl_->disk.get(); }

}  // namespace store
}  // namespace mooncake
