// StoreClient: setup (master ping, engine, segment and local buffer, mount), the heartbeat,
// teardown, and the calls that are one master RPC. Moving objects: store_client_put.cc,
// store_client_get.cc.
#include <cstdio>
#include <random>

#include "store/client/huge_pages.h"
#include "store/client/store_client_impl.h"
#include "store/tenants/tenant_id.h"

namespace mooncake {
namespace store {

namespace {

constexpr uint64_t kMinLocalBuffer = 4096;

std::string RandomClientId() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(gen()),
                static_cast<unsigned long long>(gen()));
  return buf;
}

}  // namespace

namespace {

StoreClientOptions OnPages(StoreClientOptions o, size_t page) {
  o.global_segment_size = RoundUpToPage(o.global_segment_size, page);
  o.local_buffer_size = RoundUpToPage(o.local_buffer_size, page);
  return o;
}

}  // namespace

StoreClient::Impl::Impl(StoreClientOptions o)
    : huge_page_size(HugePageSizeFromEnv()),
      opt(OnPages(std::move(o), huge_page_size)),
      client_id(RandomClientId()) {}

int StoreClient::Impl::Start(std::string* message) {
  auto fail = [&](ErrorCode c, const std::string& m) {
    *message = m;
    LOG(ERROR) << "store setup: " << m;
    return ToInt(c);
  };
  if (opt.local_hostname.empty()) {
    return fail(ErrorCode::INVALID_PARAMS, "local_hostname is empty");
  }
  if (const std::string bad = TenantIdProblem(opt.tenant_id); !bad.empty()) {
    return fail(ErrorCode::INVALID_PARAMS, "tenant_id: " + bad);
  }
  if (opt.local_buffer_size != 0 && opt.local_buffer_size < kMinLocalBuffer) {
    return fail(ErrorCode::INVALID_PARAMS,
                "local_buffer_size must be 0 (no staging: only registered memory moves) or at "
                "least " + std::to_string(kMinLocalBuffer) +
                    " bytes (it stages puts and gets of unregistered memory)");
  }
  metrics = ClientMetrics::Create(ClientMetrics::OptionsFromEnv(), opt.client_mode);
  // A call connects (again, after a master restart) when it has no connection: no backoff.
  if (opt.master) {
    master = opt.master;
  } else {
    const std::string cluster = opt.cluster_id.empty()
                                    ? EngineOptions::FromEnvironment().store_cluster_id
                                    : opt.cluster_id;
    auto m = MakeMasterStub(opt.master_server_addr, cluster, opt.rpc_timeout,
                            opt.failover_timeout);
    if (!m.ok()) {
      const bool bad = m.status().IsInvalidArgument() ||
                       m.status().code() == Status::Code::kUnimplemented;
      return fail(bad ? ErrorCode::INVALID_PARAMS : ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                  m.status().message());
    }
    master = std::move(m).value();
  }
  if (metrics) master = std::make_shared<MeteredMasterStub>(master, metrics.get());
  {
    rpc::PingRequest req;
    req.set_client_id(client_id);
    rpc::PingResponse resp;
    const Status s = master->Ping(req, &resp);
    if (IsNotLeader(s)) {
      return fail(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, s.message() + kNotLeaderHint);
    }
    if (Checked("store setup (ping)", s) != 0) {
      return fail(ErrorCode::RPC_FAIL, "the master at " + master->address() +
                                           " does not answer: is mooncake_master running there?");
    }
  }
  int rc = StartEngine(message);
  if (rc == 0) rc = StartMemory(message);
  if (rc != 0) {
    LOG(ERROR) << "store setup: " << *message;
    return rc;
  }
  if (segment != nullptr) {
    rc = Mount();
    if (rc != 0) return fail(static_cast<ErrorCode>(rc), "mounting the segment failed");
  }
  rc = StartDisk(message);
  if (rc != 0) {
    LOG(ERROR) << "store setup: " << *message;
    return rc;
  }
  task_worker = std::make_unique<Worker>([this] { RunTasks(); });
  task_worker->Start();
  heartbeat_ = std::make_unique<Heartbeat>(opt.heartbeat_interval, [this] { Beat(); });
  heartbeat_->Start();
  LOG(INFO) << "store client " << client_id << " ready: segment " << seg_name << " ("
            << opt.global_segment_size << " bytes), local buffer " << opt.local_buffer_size
            << (huge_page_size ? " bytes, on " + std::to_string(huge_page_size >> 10) +
                                     " kB huge pages (MC_STORE_USE_HUGEPAGE)"
                               : std::string(" bytes"))
            << ", master " << master->address();
  return 0;
}

// The engine: the caller's, or our own.
int StoreClient::Impl::StartEngine(std::string* message) {
  if (opt.engine) {
    if (!opt.engine->initialized()) {
      *message = "the engine passed in is not initialized";
      return ToInt(ErrorCode::INVALID_PARAMS);
    }
    engine = opt.engine;
  } else {
    // As upstream's Python API: "tcp" (the default) and "rdma" do not restrict the engine;
    // requests take the best transport both ends share (same host: shm). MC_FORCE_TCP=1
    // forces TCP. Under a metadata server a local_hostname without ":port" gets one
    // (client_port.h), so that several clients of one host may pass the same name.
    const bool any = opt.protocol.empty() || opt.protocol == "tcp" || opt.protocol == "rdma";
    Status s = InitClientEngine(opt.metadata_server, opt.local_hostname, any ? "" : opt.protocol,
                                EngineOptions::FromEnvironment(), &engine, &port_hold);
    if (!s.ok()) {
      *message = "transfer engine init failed: " + s.ToString();
      return ToInt(ErrorCode::INTERNAL_ERROR);
    }
  }
  seg_name = engine->GetLocalSegmentName();
  segments = std::make_unique<OpenedSegments>(engine.get());
  return 0;
}

// The local buffer (staging; none with local_buffer_size 0: zero-copy users, unregistered
// memory is refused), the global segment, and the copier over them.
int StoreClient::Impl::StartMemory(std::string* message) {
  auto hot = HotCache::FromEnv();
  if (!hot.ok()) {
    LOG(ERROR) << hot.status().message() << "; the local hot cache is off";
  } else if (hot->has_value()) {
    hot_cache = std::make_unique<HotCache>(**hot);
    LOG(INFO) << "local hot cache: " << (*hot)->capacity_bytes << " bytes in blocks of "
              << (*hot)->block_size;
  }
  if (opt.local_buffer_size != 0) {
    auto st = Staging::Create(engine.get(), opt.local_buffer_size, huge_page_size);
    if (!st.ok()) {
      *message = st.status().message();
      return ToInt(ErrorCode::INTERNAL_ERROR);
    }
    staging = std::move(*st);
    registrations.Add(staging->base(), staging->size());
  }
  if (opt.global_segment_size > 0) {
    auto seg = engine->AllocateSharedMemory(opt.global_segment_size, "cpu:0", huge_page_size);
    if (!seg.ok()) {
      *message = "cannot allocate the global segment of " +
                 std::to_string(opt.global_segment_size) + " bytes: " + seg.status().ToString();
      return ToInt(ErrorCode::INTERNAL_ERROR);
    }
    segment = *seg;
    registrations.Add(segment, opt.global_segment_size);
    // Faulted in behind setup's back, so that the first puts into it do not take a page
    // fault per 4 KiB (common/prefault.h; MC_PREFAULT=0 turns it off).
    segment_prefault = Prefaulter::Start(segment, opt.global_segment_size, "the global segment");
  }
  copier = std::make_unique<Copier>(engine.get(), seg_name, &registrations, staging.get(),
                                    segments.get(), opt.transfer_timeout, metrics.get(),
                                    &layout_mu);
  return 0;
}

int StoreClient::Impl::Mount() {
  rpc::MountSegmentRequest req;
  req.set_client_id(client_id);
  req.set_segment_name(seg_name);
  req.set_base(reinterpret_cast<uint64_t>(segment));
  req.set_size(opt.global_segment_size);
  req.set_remount(mounted_once_);
  rpc::MountSegmentResponse resp;
  int rc = Checked("MountSegment", master->MountSegment(req, &resp));
  if (rc != 0) return rc;
  if (resp.code() == 0) mounted_once_ = true;
  if (resp.code() != 0) {
    LOG(ERROR) << "MountSegment: " << ErrorCodeName(resp.code()) << ": " << resp.message();
  }
  return resp.code();
}

void StoreClient::Impl::Beat() {
  rpc::PingRequest req;
  req.set_client_id(client_id);
  rpc::PingResponse resp;
  Status s = master->Ping(req, &resp);
  if (!s.ok()) {
    if (!master_lost_) LOG(WARNING) << "store heartbeat: master unreachable: " << s.message();
    master_lost_ = true;
    return;
  }
  if (master_lost_) LOG(INFO) << "store heartbeat: master reachable again";
  master_lost_ = false;
  if (!resp.client_known() && segment != nullptr) {
    LOG(WARNING) << "store heartbeat: the master no longer knows this client (restarted, or "
                    "the heartbeat was late past client_ttl): remounting the segment; "
                    "objects stored in it before are gone";
    (void)Mount();
  }
  if (!resp.client_known()) RemountRuntime();
  UnmountDueRuntime();
  if (resp.tasks_waiting() > 0 && task_worker) task_worker->Poke();
  if (offload_worker) {
    // What the master sends, a master that forgot the disk, and the disk's watermarks
    // (checked every MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS).
    const auto now = std::chrono::steady_clock::now();
    const auto every = std::chrono::seconds(disk->config().heartbeat_interval_seconds);
    if (resp.offload_waiting() > 0 || !resp.client_known() || now - last_disk_check >= every ||
        disk_unmount_at_ns.load() != 0) {
      last_disk_check = now;
      offload_worker->Poke();
    }
  }
}

int StoreClient::Impl::Close() {
  if (closed.exchange(true)) return 0;
  if (heartbeat_) heartbeat_->Stop();
  if (task_worker) task_worker->Stop();  // a task running ends first (engine timeouts bound it)
  if (offload_worker) {
    // What waits for this client's disk is written before its memory leaves (bounded by
    // rpc_timeout): a restart on the same directory finds it. The worker's fetch waiting at
    // the master (a long poll) is answered first, so the worker stops at once.
    if (offload_master_waits.load() && master) {
      rpc::OffloadFetchRequest end;
      end.set_client_id(client_id);
      end.set_end_wait(true);
      rpc::OffloadFetchResponse ended;
      (void)master->OffloadFetch(end, &ended);
    }
    offload_worker->Stop();
    if (disk_mounted.load() && !disk_unmounted.load() && master) RunOffload(/*final=*/true);
  }
  int rc = 0;
  if (segment != nullptr && master) {
    rpc::UnmountSegmentRequest req;
    req.set_client_id(client_id);
    req.set_segment_name(seg_name);
    req.set_base(reinterpret_cast<uint64_t>(segment));
    rpc::UnmountSegmentResponse resp;
    rc = Checked("UnmountSegment", master->UnmountSegment(req, &resp));
    if (rc == 0 && resp.code() != 0 && resp.code() != ToInt(ErrorCode::SEGMENT_NOT_FOUND)) {
      rc = resp.code();
    }
  }
  if (master) CloseRuntime();
  CloseDisk();
  if (engine) {
    if (segments) segments->CloseAll();
    Prefaulter::Cancel(segment_prefault);
    if (segment != nullptr) (void)engine->FreeSharedMemory(segment);
    // Buffers the caller registered through us stay the caller's to unregister on a shared
    // engine; on our own engine they go with it. Pools go with us either way.
    for (void* p : registrations.Clear()) (void)engine->FreeSharedMemory(p);
    if (staging) staging->Release();
  }
  segment = nullptr;
  engine.reset();
  port_hold.reset();
  return rc;
}

// ---- StoreClient ----

StoreClient::StoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreClient::~StoreClient() { impl_->Close(); }

std::unique_ptr<StoreClient> StoreClient::Create(StoreClientOptions options, int* code,
                                                 std::string* message) {
  auto impl = std::make_unique<Impl>(std::move(options));
  std::string msg;
  int rc = impl->Start(&msg);
  if (code) *code = rc;
  if (message) *message = msg;
  if (rc != 0) {
    impl->Close();
    return nullptr;
  }
  return std::unique_ptr<StoreClient>(new StoreClient(std::move(impl)));
}

int StoreClient::Close() { return impl_->Close(); }
std::string StoreClient::segment_name() const { return impl_->seg_name; }
TransferEngine* StoreClient::engine() const { return impl_->engine.get(); }
Span StoreClient::local_buffer() const {
  if (!impl_->staging) return {nullptr, 0};
  return {impl_->staging->base(), impl_->staging->size()};
}

int StoreClient::HealthCheck() {
  if (!impl_->master || impl_->closed) return ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  rpc::PingRequest req;
  req.set_client_id(impl_->client_id);
  rpc::PingResponse resp;
  return Impl::Checked("health_check", impl_->master->Ping(req, &resp));
}

namespace {

// Observes a call's duration into one of the client's latency histograms (none when the
// metrics are off), as upstream times its Put / Get / BatchPut / BatchGet.
class Timed {
 public:
  explicit Timed(LatencyHistogram* h) : h_(h) {}
  ~Timed() {
    if (h_ != nullptr) {
      h_->Observe(std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::steady_clock::now() - start_)
                      .count());
    }
  }

 private:
  LatencyHistogram* const h_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

LatencyHistogram* StoreClient::Impl::Latency(LatencyHistogram ClientMetrics::*which) const {
  return metrics ? &(metrics.get()->*which) : nullptr;
}

int StoreClient::Put(const std::string& key, const std::vector<Span>& parts,
                     const ReplicateConfig& config) {
  Timed t(impl_->Latency(&ClientMetrics::put_latency));
  return impl_->PutMany({key}, {parts}, config)[0];
}

std::vector<int> StoreClient::BatchPut(const std::vector<std::string>& keys,
                                       const std::vector<std::vector<Span>>& parts,
                                       const ReplicateConfig& config) {
  Timed t(keys.empty() ? nullptr : impl_->Latency(&ClientMetrics::batch_put_latency));
  return impl_->PutMany(keys, parts, config);
}

int StoreClient::Upsert(const std::string& key, const std::vector<Span>& parts,
                        const ReplicateConfig& config) {
  Timed t(impl_->Latency(&ClientMetrics::put_latency));
  return impl_->PutMany({key}, {parts}, config, /*upsert=*/true)[0];
}

std::vector<int> StoreClient::BatchUpsert(const std::vector<std::string>& keys,
                                          const std::vector<std::vector<Span>>& parts,
                                          const ReplicateConfig& config) {
  Timed t(keys.empty() ? nullptr : impl_->Latency(&ClientMetrics::batch_put_latency));
  return impl_->PutMany(keys, parts, config, /*upsert=*/true);
}

int64_t StoreClient::Get(const std::string& key, const std::vector<Span>& parts) {
  Timed t(impl_->Latency(&ClientMetrics::get_latency));
  return impl_->GetMany({key}, [&](size_t, uint64_t) { return parts; })[0];
}

std::vector<int64_t> StoreClient::BatchGet(const std::vector<std::string>& keys,
                                           const std::vector<std::vector<Span>>& parts) {
  if (keys.size() != parts.size()) {
    LOG(WARNING) << "get: " << keys.size() << " keys but " << parts.size() << " buffers";
    return std::vector<int64_t>(keys.size(), ToInt(ErrorCode::INVALID_PARAMS));
  }
  Timed t(keys.empty() ? nullptr : impl_->Latency(&ClientMetrics::batch_get_latency));
  return impl_->GetMany(keys, [&](size_t i, uint64_t) { return parts[i]; });
}

std::vector<int64_t> StoreClient::BatchGetWith(const std::vector<std::string>& keys,
                                               const PartsFor& parts_for) {
  // A call of one key is a get (upstream's get and get_buffer come here), of several a batch.
  Timed t(keys.empty() ? nullptr
                       : impl_->Latency(keys.size() == 1 ? &ClientMetrics::get_latency
                                                         : &ClientMetrics::batch_get_latency));
  return impl_->GetMany(keys, parts_for);
}

ClientMetrics* StoreClient::metrics() const { return impl_->metrics.get(); }

bool StoreClient::master_reachable() const {
  return !impl_->closed.load() && !impl_->master_lost();
}

namespace {

// Calls `call` on slices of at most kMaxBatchItems keys and joins the results.
template <class T, class F>
std::vector<T> InBatches(const std::vector<std::string>& keys, F call) {
  if (keys.size() <= kMaxBatchItems) return call(keys);
  std::vector<T> out;
  for (size_t at = 0; at < keys.size(); at += kMaxBatchItems) {
    auto part = call(std::vector<std::string>(
        keys.begin() + at, keys.begin() + std::min(keys.size(), at + kMaxBatchItems)));
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

}  // namespace

std::vector<int64_t> StoreClient::BatchGetSize(const std::vector<std::string>& keys) {
  return InBatches<int64_t>(keys, [this](const std::vector<std::string>& keys) {
    std::vector<int64_t> out(keys.size(), ToInt(ErrorCode::RPC_FAIL));
    if (keys.empty()) return out;
    rpc::KeysRequest req;
    req.set_client_id(impl_->client_id);
    req.set_tenant_id(impl_->opt.tenant_id);
    for (const auto& k : keys) req.add_keys(k);
    rpc::ExistResponse resp;
    if (Impl::Checked("ExistKey", impl_->master->ExistKey(req, &resp)) != 0) return out;
    if (resp.code() != 0) {
      LOG(WARNING) << "get_size: the master refused the request: " << resp.message();
      return std::vector<int64_t>(keys.size(), resp.code());
    }
    if (resp.results_size() != static_cast<int>(keys.size())) return out;
    for (size_t i = 0; i < keys.size(); ++i) {
      const auto& r = resp.results(static_cast<int>(i));
      out[i] = r.code() == 0 ? static_cast<int64_t>(r.size()) : r.code();
    }
    return out;
  });
}

int64_t StoreClient::GetSize(const std::string& key) { return BatchGetSize({key})[0]; }

StoreClient::HotCacheStats StoreClient::GetHotCacheStats() const {
  return impl_->hot_cache ? impl_->hot_cache->stats() : HotCacheStats{};
}

std::vector<int> StoreClient::BatchIsExist(const std::vector<std::string>& keys) {
  std::vector<int> out;
  for (int64_t s : BatchGetSize(keys)) {
    out.push_back(s >= 0 ? 1 : (s == ToInt(ErrorCode::OBJECT_NOT_FOUND) ? 0 : static_cast<int>(s)));
  }
  return out;
}

std::vector<int> StoreClient::BatchRemove(const std::vector<std::string>& keys, bool force) {
  return InBatches<int>(keys, [this, force](const std::vector<std::string>& keys) {
    std::vector<int> out(keys.size(), ToInt(ErrorCode::RPC_FAIL));
    if (keys.empty()) return out;
    rpc::KeysRequest req;
    req.set_client_id(impl_->client_id);
    req.set_tenant_id(impl_->opt.tenant_id);
    req.set_force(force);
    for (const auto& k : keys) req.add_keys(k);
    if (force) {
      for (uint64_t id : impl_->reads.TakeIdle(keys)) req.add_read_lease_ids(id);
    }
    rpc::CodesResponse resp;
    if (Impl::Checked("Remove", impl_->master->Remove(req, &resp)) != 0) return out;
    if (resp.code() != 0) {
      LOG(WARNING) << "remove: the master refused the request: " << resp.message();
      return std::vector<int>(keys.size(), resp.code());
    }
    if (resp.codes_size() != static_cast<int>(keys.size())) return out;
    for (size_t i = 0; i < keys.size(); ++i) out[i] = resp.codes(static_cast<int>(i));
    return out;
  });
}

int StoreClient::Remove(const std::string& key, bool force) { return BatchRemove({key}, force)[0]; }

namespace {

// A RemoveAll / RemoveByRegex: with force, no read of ours begins until the master has
// answered, so that when none is in flight it may free what only we had leased at once.
template <class Req, class Send>
int64_t RemoveMany(ReadTracker* reads, Req* req, bool force, Send send) {
  if (!force) return send();
  return reads->WhileNoneBegins([&](bool idle) {
    req->set_own_reads_done(idle);
    return send();
  });
}

}  // namespace

int64_t StoreClient::RemoveByRegex(const std::string& regex, bool force) {
  rpc::RemoveByRegexRequest req;
  req.set_client_id(impl_->client_id);
  req.set_tenant_id(impl_->opt.tenant_id);
  req.set_force(force);
  req.set_regex(regex);
  rpc::CountResponse resp;
  int64_t rc = RemoveMany(&impl_->reads, &req, force, [&]() -> int64_t {
    return Impl::Checked("RemoveByRegex", impl_->master->RemoveByRegex(req, &resp));
  });
  if (rc != 0) return rc;
  if (resp.code() != 0) {
    LOG(WARNING) << "remove_by_regex: " << resp.message();
    return resp.code();
  }
  return resp.count();
}

int64_t StoreClient::RemoveAll(bool force) {
  rpc::KeysRequest req;
  req.set_client_id(impl_->client_id);
  req.set_tenant_id(impl_->opt.tenant_id);
  req.set_force(force);
  rpc::CountResponse resp;
  int64_t rc = RemoveMany(&impl_->reads, &req, force, [&]() -> int64_t {
    return Impl::Checked("RemoveAll", impl_->master->RemoveAll(req, &resp));
  });
  if (rc != 0) return rc;
  return resp.code() != 0 ? resp.code() : resp.count();
}

int StoreClient::RegisterBuffer(void* ptr, size_t size, bool remote_accessible) {
  if (ptr == nullptr || size == 0) {
    LOG(WARNING) << "register_buffer: null address or zero size";
    return ToInt(ErrorCode::INVALID_PARAMS);
  }
  // Upstream's dummies register ranges of their memory pool (alloc_from_mem_pool), which is
  // registered as a whole already: nothing to do but remember it.
  if (impl_->registrations.AddInPool(ptr, size)) return 0;
  // "*": the engine asks the device backend, so a CUDA tensor registers as cuda:N memory
  // (which the engine moves with device copies) rather than as host memory the CPU touches.
  Status s = impl_->engine->RegisterLocalMemory(ptr, size, "*", remote_accessible);
  if (!s.ok()) {
    LOG(WARNING) << "register_buffer: " << s.ToString();
    return ToInt(ErrorCode::INVALID_PARAMS);
  }
  impl_->registrations.Add(ptr, size);
  return 0;
}

int StoreClient::UnregisterBuffer(void* ptr) {
  switch (impl_->registrations.Remove(ptr)) {
    case Registrations::Removed::kInPool:
      return 0;
    case Registrations::Removed::kPool:
      LOG(WARNING) << "unregister_buffer: that is the memory pool; it goes with close()";
      return ToInt(ErrorCode::INVALID_PARAMS);
    case Registrations::Removed::kNotRegistered:
      LOG(WARNING) << "unregister_buffer: address was not registered with register_buffer";
      return ToInt(ErrorCode::INVALID_PARAMS);
    case Registrations::Removed::kRemoved:
      break;
  }
  Status s = impl_->engine->UnregisterLocalMemory(ptr);
  if (!s.ok()) {
    LOG(WARNING) << "unregister_buffer: " << s.ToString();
    return ToInt(ErrorCode::INVALID_PARAMS);
  }
  return 0;
}

void* StoreClient::AllocateSharedBuffer(size_t size) {
  if (size == 0) {
    LOG(WARNING) << "allocate shared buffer: zero size";
    return nullptr;
  }
  // On huge pages as the segment (MC_STORE_USE_HUGEPAGE), rounded up to whole pages there.
  auto mem = impl_->engine->AllocateSharedMemory(size, "cpu:0", impl_->huge_page_size);
  if (!mem.ok()) {
    LOG(WARNING) << "allocate shared buffer of " << size << " bytes: " << mem.status().ToString();
    return nullptr;
  }
  impl_->registrations.AddPool(*mem, size);
  return *mem;
}

uint64_t StoreClient::RegisteredRoom(const void* p) { return impl_->registrations.Room(p); }

}  // namespace store
}  // namespace mooncake
