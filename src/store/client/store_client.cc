// StoreClient: setup (master ping, engine, segment and local buffer, mount), the heartbeat,
// teardown, and the calls that are one master RPC. Moving objects: store_client_data.cc.
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "store/client/store_client_impl.h"

namespace mooncake {
namespace store {

namespace {
constexpr uint64_t kMinLocalBuffer = 4096;
}  // namespace

std::string RandomClientId() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(gen()),
                static_cast<unsigned long long>(gen()));
  return buf;
}

int StoreClient::Impl::Start(std::string* message) {
  auto fail = [&](ErrorCode c, const std::string& m) {
    *message = m;
    LOG(ERROR) << "store setup: " << m;
    return ToInt(c);
  };
  if (opt.local_hostname.empty()) {
    return fail(ErrorCode::INVALID_PARAMS, "local_hostname is empty");
  }
  if (opt.local_buffer_size != 0 && opt.local_buffer_size < kMinLocalBuffer) {
    return fail(ErrorCode::INVALID_PARAMS,
                "local_buffer_size must be 0 (no staging: only registered memory moves) or at "
                "least " + std::to_string(kMinLocalBuffer) +
                    " bytes (it stages puts and gets of unregistered memory)");
  }
  // A call connects (again, after a master restart) when it has no connection: no backoff.
  master = std::make_unique<RpcClient>(opt.master_server_addr);
  {
    rpc::PingRequest req;
    req.set_client_id(client_id);
    rpc::PingResponse resp;
    if (Call("store setup (ping)", MasterMethod::kPing, req, &resp) != 0) {
      return fail(ErrorCode::RPC_FAIL, "the master at " + opt.master_server_addr +
                                           " does not answer: is mooncake_master running there?");
    }
  }
  if (opt.engine) {
    if (!opt.engine->initialized()) {
      return fail(ErrorCode::INVALID_PARAMS, "the engine passed in is not initialized");
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
      return fail(ErrorCode::INTERNAL_ERROR, "transfer engine init failed: " + s.ToString());
    }
  }
  seg_name = engine->GetLocalSegmentName();
  // The staging buffer holds values being put or got: only this process uses it, so it is
  // registered without remote access (not in the segment's descriptor; a peer's request for
  // a range in it is refused), as upstream does.
  // local_buffer_size 0 (zero-copy users): no staging; unregistered memory is refused.
  void* buf = opt.local_buffer_size == 0
                  ? nullptr
                  : ::mmap(nullptr, opt.local_buffer_size, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) {
    return fail(ErrorCode::INTERNAL_ERROR, "cannot allocate the local buffer of " +
                                               std::to_string(opt.local_buffer_size) +
                                               " bytes: " + std::strerror(errno));
  }
  if (buf != nullptr) {
    Status reg = engine->RegisterLocalMemory(buf, opt.local_buffer_size, "cpu:0",
                                             /*remote_accessible=*/false);
    if (!reg.ok()) {
      ::munmap(buf, opt.local_buffer_size);
      return fail(ErrorCode::INTERNAL_ERROR,
                  "cannot register the local buffer: " + reg.ToString());
    }
    local_buf = buf;
    staging = std::make_unique<AddressedAllocator>(opt.local_buffer_size, 64);
    registered[reinterpret_cast<uintptr_t>(local_buf)] = opt.local_buffer_size;
  }
  if (opt.global_segment_size > 0) {
    auto seg = engine->AllocateSharedMemory(opt.global_segment_size);
    if (!seg.ok()) {
      return fail(ErrorCode::INTERNAL_ERROR, "cannot allocate the global segment of " +
                                                 std::to_string(opt.global_segment_size) +
                                                 " bytes: " + seg.status().ToString());
    }
    segment = *seg;
    registered[reinterpret_cast<uintptr_t>(segment)] = opt.global_segment_size;
    int rc = Mount();
    if (rc != 0) return fail(static_cast<ErrorCode>(rc), "mounting the segment failed");
  }
  heartbeat = std::thread([this] { HeartbeatLoop(); });
  LOG(INFO) << "store client " << client_id << " ready: segment " << seg_name << " ("
            << opt.global_segment_size << " bytes), local buffer " << opt.local_buffer_size
            << " bytes, master " << opt.master_server_addr;
  return 0;
}

int StoreClient::Impl::Mount() {
  rpc::MountSegmentRequest req;
  req.set_client_id(client_id);
  req.set_segment_name(seg_name);
  req.set_base(reinterpret_cast<uint64_t>(segment));
  req.set_size(opt.global_segment_size);
  req.set_remount(mounted_once);
  rpc::MountSegmentResponse resp;
  int rc = Call("MountSegment", MasterMethod::kMountSegment, req, &resp);
  if (rc != 0) return rc;
  if (resp.code() == 0) mounted_once = true;
  if (resp.code() != 0) {
    LOG(ERROR) << "MountSegment: " << ErrorCodeName(resp.code()) << ": " << resp.message();
  }
  return resp.code();
}

void StoreClient::Impl::HeartbeatLoop() {
  bool lost = false;
  std::unique_lock<std::mutex> lock(hb_mu);
  while (!stopping) {
    hb_cv.wait_for(lock, opt.heartbeat_interval, [this] { return stopping; });
    if (stopping) break;
    lock.unlock();
    rpc::PingRequest req;
    req.set_client_id(client_id);
    rpc::PingResponse resp;
    Status s = master->Call(MasterMethod::kPing, req, &resp, opt.rpc_timeout);
    if (!s.ok()) {
      if (!lost) LOG(WARNING) << "store heartbeat: master unreachable: " << s.message();
      lost = true;
    } else {
      if (lost) LOG(INFO) << "store heartbeat: master reachable again";
      lost = false;
      if (!resp.client_known() && segment != nullptr) {
        LOG(WARNING) << "store heartbeat: the master no longer knows this client (restarted, or "
                        "the heartbeat was late past client_ttl): remounting the segment; "
                        "objects stored in it before are gone";
        (void)Mount();
      }
    }
    lock.lock();
  }
}

int StoreClient::Impl::Close() {
  {
    std::lock_guard<std::mutex> lock(hb_mu);
    if (closed) return 0;
    closed = true;
    stopping = true;
  }
  hb_cv.notify_all();
  if (heartbeat.joinable()) heartbeat.join();
  int rc = 0;
  if (segment != nullptr && master) {
    rpc::UnmountSegmentRequest req;
    req.set_client_id(client_id);
    req.set_segment_name(seg_name);
    req.set_base(reinterpret_cast<uint64_t>(segment));
    rpc::UnmountSegmentResponse resp;
    rc = Call("UnmountSegment", MasterMethod::kUnmountSegment, req, &resp);
    if (rc == 0 && resp.code() != 0 && resp.code() != ToInt(ErrorCode::SEGMENT_NOT_FOUND)) {
      rc = resp.code();
    }
  }
  if (engine) {
    {
      std::lock_guard<std::mutex> lock(open_mu);
      for (const auto& [name, id] : opened) (void)engine->CloseSegment(id);
      opened.clear();
    }
    if (segment != nullptr) (void)engine->FreeSharedMemory(segment);
    {
      std::lock_guard<std::mutex> lock(reg_mu);
      for (void* p : shared_bufs) (void)engine->FreeSharedMemory(p);
      shared_bufs.clear();
      nested.clear();
    }
    if (local_buf != nullptr) {
      Status s = engine->UnregisterLocalMemory(local_buf);
      // Still in use by a transfer that did not end: leak it rather than free it under one.
      if (s.ok()) ::munmap(local_buf, opt.local_buffer_size);
      else LOG(WARNING) << "store close: the local buffer stays allocated: " << s.ToString();
    }
    {
      std::lock_guard<std::mutex> lock(reg_mu);
      // Buffers the caller registered through us stay the caller's to unregister on a shared
      // engine; on our own engine they go with it.
      registered.clear();
    }
  }
  segment = local_buf = nullptr;
  engine.reset();
  port_hold.reset();
  return rc;
}

bool StoreClient::Impl::IsRegistered(const void* p, size_t n) {
  uint64_t lo, len;
  return RegisteredRange(p, n, &lo, &len);
}

bool StoreClient::Impl::RegisteredRange(const void* p, size_t n, uint64_t* lo, uint64_t* len) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(reg_mu);
  auto it = registered.upper_bound(a);
  if (it == registered.begin()) return false;
  --it;
  if (a < it->first || a + n > it->first + it->second) return false;
  *lo = it->first;
  *len = it->second;
  return true;
}

Result<SegmentID> StoreClient::Impl::Open(const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(open_mu);
    auto it = opened.find(name);
    if (it != opened.end()) return it->second;
  }
  MC_ASSIGN_OR_RETURN(SegmentID id, engine->OpenSegment(name));
  std::lock_guard<std::mutex> lock(open_mu);
  auto [it, inserted] = opened.emplace(name, id);
  if (!inserted) (void)engine->CloseSegment(id);
  return it->second;
}

void* StoreClient::Impl::AllocStaging(size_t size, bool wait) {
  std::unique_lock<std::mutex> lock(staging_mu);
  const auto deadline = std::chrono::steady_clock::now() + opt.transfer_timeout;
  while (true) {
    if (!staging) return nullptr;
    auto off = staging->Allocate(size);
    if (off) return static_cast<char*>(local_buf) + *off;
    if (!wait) return nullptr;
    if (staging_cv.wait_until(lock, deadline) == std::cv_status::timeout) return nullptr;
  }
}

void StoreClient::Impl::FreeStaging(void* p) {
  {
    std::lock_guard<std::mutex> lock(staging_mu);
    if (staging) staging->Free(static_cast<char*>(p) - static_cast<char*>(local_buf));
  }
  staging_cv.notify_all();
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
Span StoreClient::local_buffer() const { return {impl_->local_buf, impl_->opt.local_buffer_size}; }

int StoreClient::HealthCheck() {
  {
    std::lock_guard<std::mutex> lock(impl_->hb_mu);
    if (!impl_->master || impl_->closed) return ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  }
  rpc::PingRequest req;
  req.set_client_id(impl_->client_id);
  rpc::PingResponse resp;
  return impl_->Call("health_check", MasterMethod::kPing, req, &resp);
}

int StoreClient::Put(const std::string& key, const std::vector<Span>& parts,
                     const ReplicateConfig& config) {
  return impl_->PutMany({key}, {parts}, config)[0];
}

std::vector<int> StoreClient::BatchPut(const std::vector<std::string>& keys,
                                       const std::vector<std::vector<Span>>& parts,
                                       const ReplicateConfig& config) {
  return impl_->PutMany(keys, parts, config);
}

int StoreClient::Upsert(const std::string& key, const std::vector<Span>& parts,
                        const ReplicateConfig& config) {
  return impl_->PutMany({key}, {parts}, config, /*upsert=*/true)[0];
}

std::vector<int> StoreClient::BatchUpsert(const std::vector<std::string>& keys,
                                          const std::vector<std::vector<Span>>& parts,
                                          const ReplicateConfig& config) {
  return impl_->PutMany(keys, parts, config, /*upsert=*/true);
}

int64_t StoreClient::Get(const std::string& key, const std::vector<Span>& parts) {
  return BatchGet({key}, {parts})[0];
}

std::vector<int64_t> StoreClient::BatchGet(const std::vector<std::string>& keys,
                                           const std::vector<std::vector<Span>>& parts) {
  if (keys.size() != parts.size()) {
    LOG(WARNING) << "get: " << keys.size() << " keys but " << parts.size() << " buffers";
    return std::vector<int64_t>(keys.size(), ToInt(ErrorCode::INVALID_PARAMS));
  }
  return impl_->GetMany(keys, [&](size_t i, uint64_t) { return parts[i]; });
}

std::vector<int64_t> StoreClient::BatchGetWith(const std::vector<std::string>& keys,
                                               const PartsFor& parts_for) {
  return impl_->GetMany(keys, parts_for);
}

std::vector<int64_t> StoreClient::BatchGetSize(const std::vector<std::string>& keys) {
  if (keys.size() > kMaxBatchItems) {
    std::vector<int64_t> out;
    for (size_t at = 0; at < keys.size(); at += kMaxBatchItems) {
      auto part = BatchGetSize({keys.begin() + at,
                                keys.begin() + std::min(keys.size(), at + kMaxBatchItems)});
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }
  std::vector<int64_t> out(keys.size(), ToInt(ErrorCode::RPC_FAIL));
  if (keys.empty()) return out;
  rpc::KeysRequest req;
  req.set_client_id(impl_->client_id);
  for (const auto& k : keys) req.add_keys(k);
  rpc::ExistResponse resp;
  if (impl_->Call("ExistKey", MasterMethod::kExistKey, req, &resp) != 0) return out;
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
}

int64_t StoreClient::GetSize(const std::string& key) { return BatchGetSize({key})[0]; }

std::vector<int> StoreClient::BatchIsExist(const std::vector<std::string>& keys) {
  std::vector<int> out;
  for (int64_t s : BatchGetSize(keys)) {
    out.push_back(s >= 0 ? 1 : (s == ToInt(ErrorCode::OBJECT_NOT_FOUND) ? 0 : static_cast<int>(s)));
  }
  return out;
}

std::vector<int> StoreClient::BatchRemove(const std::vector<std::string>& keys, bool force) {
  if (keys.size() > kMaxBatchItems) {
    std::vector<int> out;
    for (size_t at = 0; at < keys.size(); at += kMaxBatchItems) {
      auto part = BatchRemove(
          {keys.begin() + at, keys.begin() + std::min(keys.size(), at + kMaxBatchItems)}, force);
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }
  std::vector<int> out(keys.size(), ToInt(ErrorCode::RPC_FAIL));
  if (keys.empty()) return out;
  rpc::KeysRequest req;
  req.set_client_id(impl_->client_id);
  req.set_force(force);
  for (const auto& k : keys) req.add_keys(k);
  if (force) {
    std::lock_guard<std::mutex> lock(impl_->reads_mu);
    for (const auto& k : keys) req.add_read_lease_ids(impl_->reads.TakeIdle(Impl::KeyHash(k)));
  }
  rpc::CodesResponse resp;
  if (impl_->Call("Remove", MasterMethod::kRemove, req, &resp) != 0) return out;
  if (resp.code() != 0) {
    LOG(WARNING) << "remove: the master refused the request: " << resp.message();
    return std::vector<int>(keys.size(), resp.code());
  }
  if (resp.codes_size() != static_cast<int>(keys.size())) return out;
  for (size_t i = 0; i < keys.size(); ++i) out[i] = resp.codes(static_cast<int>(i));
  return out;
}

int StoreClient::Remove(const std::string& key, bool force) { return BatchRemove({key}, force)[0]; }

int64_t StoreClient::RemoveByRegex(const std::string& regex, bool force) {
  rpc::RemoveByRegexRequest req;
  req.set_client_id(impl_->client_id);
  req.set_force(force);
  req.set_regex(regex);
  rpc::CountResponse resp;
  int rc;
  {
    // With force: no read of ours starts until the reply (reads_mu held), so that when none
    // is in flight the master may free what only we had leased at once.
    std::unique_lock<std::mutex> lock(impl_->reads_mu, std::defer_lock);
    if (force) {
      lock.lock();
      req.set_own_reads_done(impl_->active_reads == 0);
      if (impl_->active_reads == 0) impl_->reads.ForgetAll();
    }
    rc = impl_->Call("RemoveByRegex", MasterMethod::kRemoveByRegex, req, &resp);
  }
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
  req.set_force(force);
  rpc::CountResponse resp;
  int rc;
  {
    std::unique_lock<std::mutex> lock(impl_->reads_mu, std::defer_lock);  // as RemoveByRegex
    if (force) {
      lock.lock();
      req.set_own_reads_done(impl_->active_reads == 0);
      if (impl_->active_reads == 0) impl_->reads.ForgetAll();
    }
    rc = impl_->Call("RemoveAll", MasterMethod::kRemoveAll, req, &resp);
  }
  if (rc != 0) return rc;
  return resp.code() != 0 ? resp.code() : resp.count();
}

int StoreClient::RegisterBuffer(void* ptr, size_t size, bool remote_accessible) {
  if (ptr == nullptr || size == 0) {
    LOG(WARNING) << "register_buffer: null address or zero size";
    return ToInt(ErrorCode::INVALID_PARAMS);
  }
  {
    // Upstream's dummies register ranges of their memory pool (alloc_from_mem_pool), which
    // is registered as a whole already: nothing to do but remember it.
    std::lock_guard<std::mutex> lock(impl_->reg_mu);
    const auto a = reinterpret_cast<uintptr_t>(ptr);
    if (impl_->InSharedBuf(a, size)) {
      auto& n = impl_->nested[a];
      n.size = std::max(n.size, size);
      ++n.count;
      return 0;
    }
  }
  Status s = impl_->engine->RegisterLocalMemory(ptr, size, "cpu:0", remote_accessible);
  if (!s.ok()) {
    LOG(WARNING) << "register_buffer: " << s.ToString();
    return ToInt(ErrorCode::INVALID_PARAMS);
  }
  std::lock_guard<std::mutex> lock(impl_->reg_mu);
  impl_->registered[reinterpret_cast<uintptr_t>(ptr)] = size;
  return 0;
}

int StoreClient::UnregisterBuffer(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(impl_->reg_mu);
    auto n = impl_->nested.find(reinterpret_cast<uintptr_t>(ptr));
    if (n != impl_->nested.end()) {
      if (--n->second.count == 0) impl_->nested.erase(n);
      return 0;
    }
    for (void* p : impl_->shared_bufs) {
      if (p == ptr) {
        LOG(WARNING) << "unregister_buffer: that is the memory pool; it goes with close()";
        return ToInt(ErrorCode::INVALID_PARAMS);
      }
    }
    if (impl_->registered.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
      LOG(WARNING) << "unregister_buffer: address was not registered with register_buffer";
      return ToInt(ErrorCode::INVALID_PARAMS);
    }
  }
  Status s = impl_->engine->UnregisterLocalMemory(ptr);
  if (!s.ok()) {
    LOG(WARNING) << "unregister_buffer: " << s.ToString();
    return ToInt(ErrorCode::INVALID_PARAMS);
  }
  return 0;
}

bool StoreClient::Impl::InSharedBuf(uintptr_t a, size_t n) {
  for (void* p : shared_bufs) {
    auto it = registered.find(reinterpret_cast<uintptr_t>(p));
    if (it != registered.end() && a >= it->first && n <= it->second &&
        a - it->first <= it->second - n) {
      return true;
    }
  }
  return false;
}

void* StoreClient::AllocateSharedBuffer(size_t size) {
  if (size == 0) {
    LOG(WARNING) << "allocate shared buffer: zero size";
    return nullptr;
  }
  auto mem = impl_->engine->AllocateSharedMemory(size);
  if (!mem.ok()) {
    LOG(WARNING) << "allocate shared buffer of " << size << " bytes: " << mem.status().ToString();
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(impl_->reg_mu);
  impl_->registered[reinterpret_cast<uintptr_t>(*mem)] = size;
  impl_->shared_bufs.push_back(*mem);
  return *mem;
}

}  // namespace store
}  // namespace mooncake
