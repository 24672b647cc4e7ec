#include "mooncake/store/store_client.h"

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "master.grpc.pb.h"
#include "mooncake/transfer_engine.h"
#include "store/error_code.h"
#include "store/offset_allocator.h"

namespace mooncake {
namespace store {

namespace {

constexpr size_t kMaxStagingChunk = 4 << 20;
constexpr uint64_t kMinLocalBuffer = 4096;

std::string RandomClientId() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(gen()),
                static_cast<unsigned long long>(gen()));
  return buf;
}

size_t Total(const std::vector<Span>& parts) {
  size_t n = 0;
  for (const auto& p : parts) n += p.size;
  return n;
}

rpc::ReplicateConfig ToProto(const ReplicateConfig& c) {
  rpc::ReplicateConfig out;
  out.set_replica_num(static_cast<uint32_t>(std::max<size_t>(1, c.replica_num)));
  out.set_with_soft_pin(c.with_soft_pin);
  out.set_soft_pin_ttl_ms(c.soft_pin_ttl_ms);
  out.set_with_hard_pin(c.with_hard_pin);
  for (const auto& s : c.preferred_segments) out.add_preferred_segments(s);
  out.set_prefer_alloc_in_same_node(c.prefer_alloc_in_same_node);
  return out;
}

// One copy between local memory and a replica; `owner` says which key it belongs to.
struct Job {
  TransferRequest::OpCode op;
  char* local;
  size_t len;
  const std::string* segment;
  uint64_t remote;
  size_t owner;
};

}  // namespace

class StoreClient::Impl {
 public:
  explicit Impl(StoreClientOptions o) : opt(std::move(o)), client_id(RandomClientId()) {}
  ~Impl() { Close(); }

  int Start(std::string* message);
  int Close();
  int Mount();
  void HeartbeatLoop();

  template <class Req, class Resp>
  int Call(const char* what,
           grpc::Status (rpc::MasterService::Stub::*fn)(grpc::ClientContext*, const Req&, Resp*),
           const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + opt.rpc_timeout);
    grpc::Status s = (stub.get()->*fn)(&ctx, req, resp);
    if (!s.ok()) {
      LOG(ERROR) << what << ": master " << opt.master_server_addr
                 << " did not answer: " << s.error_message();
      return ToInt(ErrorCode::RPC_FAIL);
    }
    return 0;
  }

  bool IsRegistered(const void* p, size_t n);
  Result<SegmentID> Open(const std::string& name);
  // Runs the copies; sets failed[owner] for every job that did not complete.
  void RunJobs(const std::vector<Job>& jobs, std::vector<char>* failed);
  void* AllocStaging(size_t size, bool wait);
  void FreeStaging(void* p);

  std::vector<int> PutMany(const std::vector<std::string>& keys,
                           const std::vector<std::vector<Span>>& parts,
                           const ReplicateConfig& config);
  std::vector<int64_t> GetMany(const std::vector<std::string>& keys,
                               const StoreClient::PartsFor& parts_for);

  StoreClientOptions opt;
  const std::string client_id;
  std::shared_ptr<TransferEngine> engine;
  std::string seg_name;
  void* segment = nullptr;
  void* local_buf = nullptr;
  std::unique_ptr<rpc::MasterService::Stub> stub;

  std::mutex staging_mu;
  std::condition_variable staging_cv;
  std::unique_ptr<OffsetAllocator> staging;

  std::mutex reg_mu;
  std::map<uintptr_t, size_t> registered;  // start -> length
  std::mutex open_mu;
  std::unordered_map<std::string, SegmentID> opened;

  std::mutex hb_mu;
  std::condition_variable hb_cv;
  bool stopping = false;
  bool closed = false;
  std::thread heartbeat;
};

int StoreClient::Impl::Start(std::string* message) {
  auto fail = [&](ErrorCode c, const std::string& m) {
    *message = m;
    LOG(ERROR) << "store setup: " << m;
    return ToInt(c);
  };
  if (opt.local_hostname.empty()) {
    return fail(ErrorCode::INVALID_PARAMS, "local_hostname is empty");
  }
  if (opt.local_buffer_size < kMinLocalBuffer) {
    return fail(ErrorCode::INVALID_PARAMS,
                "local_buffer_size must be at least " + std::to_string(kMinLocalBuffer) +
                    " bytes (it stages puts and gets of unregistered memory)");
  }
  // Reconnect quickly after a master restart: gRPC's default backoff grows to 120 s, during
  // which every call fails at once. Attempts here back off from 100 ms to 2 s, and each may
  // take at least 1 s to connect (a master across a network).
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  auto channel = grpc::CreateCustomChannel(opt.master_server_addr,
                                           grpc::InsecureChannelCredentials(), args);
  stub = rpc::MasterService::NewStub(channel);
  {
    rpc::PingRequest req;
    req.set_client_id(client_id);
    rpc::PingResponse resp;
    if (Call("store setup (ping)", &rpc::MasterService::Stub::Ping, req, &resp) != 0) {
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
    engine = std::make_shared<TransferEngine>();
    // As upstream's Python API: "tcp" (the default) and "rdma" do not restrict the engine;
    // requests take the best transport both ends share (same host: shm). MC_FORCE_TCP=1
    // forces TCP.
    const bool any = opt.protocol.empty() || opt.protocol == "tcp" || opt.protocol == "rdma";
    Status s = engine->Init(opt.metadata_server, opt.local_hostname, any ? "" : opt.protocol);
    if (!s.ok()) {
      return fail(ErrorCode::INTERNAL_ERROR, "transfer engine init failed: " + s.ToString());
    }
  }
  seg_name = engine->GetLocalSegmentName();
  auto buf = engine->AllocateSharedMemory(opt.local_buffer_size);
  if (!buf.ok()) {
    return fail(ErrorCode::INTERNAL_ERROR, "cannot allocate the local buffer of " +
                                               std::to_string(opt.local_buffer_size) +
                                               " bytes: " + buf.status().ToString());
  }
  local_buf = *buf;
  staging = std::make_unique<OffsetAllocator>(opt.local_buffer_size, 64);
  registered[reinterpret_cast<uintptr_t>(local_buf)] = opt.local_buffer_size;
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
  rpc::MountSegmentResponse resp;
  int rc = Call("MountSegment", &rpc::MasterService::Stub::MountSegment, req, &resp);
  if (rc != 0) return rc;
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
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + opt.rpc_timeout);
    grpc::Status s = stub->Ping(&ctx, req, &resp);
    if (!s.ok()) {
      if (!lost) LOG(WARNING) << "store heartbeat: master unreachable: " << s.error_message();
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
  if (segment != nullptr && stub) {
    rpc::UnmountSegmentRequest req;
    req.set_client_id(client_id);
    req.set_segment_name(seg_name);
    req.set_base(reinterpret_cast<uint64_t>(segment));
    rpc::UnmountSegmentResponse resp;
    rc = Call("UnmountSegment", &rpc::MasterService::Stub::UnmountSegment, req, &resp);
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
    if (local_buf != nullptr) (void)engine->FreeSharedMemory(local_buf);
    {
      std::lock_guard<std::mutex> lock(reg_mu);
      // Buffers the caller registered through us stay the caller's to unregister on a shared
      // engine; on our own engine they go with it.
      registered.clear();
    }
  }
  segment = local_buf = nullptr;
  engine.reset();
  return rc;
}

bool StoreClient::Impl::IsRegistered(const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(reg_mu);
  auto it = registered.upper_bound(a);
  if (it == registered.begin()) return false;
  --it;
  return a >= it->first && a + n <= it->first + it->second;
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

void StoreClient::Impl::RunJobs(const std::vector<Job>& jobs, std::vector<char>* failed) {
  struct Staged {
    const Job* job;
    size_t offset;  // within the job
    size_t len;
  };
  std::vector<TransferRequest> direct;
  std::vector<size_t> direct_owner;
  std::vector<Staged> staged;
  const size_t chunk = std::min<size_t>(kMaxStagingChunk, staging->capacity());
  for (const Job& job : jobs) {
    if ((*failed)[job.owner]) continue;
    if (*job.segment == seg_name) {  // a replica in our own segment: plain memory
      void* remote = reinterpret_cast<void*>(job.remote);
      if (job.op == TransferRequest::WRITE) {
        std::memcpy(remote, job.local, job.len);
      } else {
        std::memcpy(job.local, remote, job.len);
      }
      continue;
    }
    auto target = Open(*job.segment);
    if (!target.ok()) {
      LOG(ERROR) << "store: cannot reach segment " << *job.segment << ": "
                 << target.status().ToString();
      (*failed)[job.owner] = 1;
      continue;
    }
    if (IsRegistered(job.local, job.len)) {
      direct.push_back({job.op, job.local, *target, job.remote, job.len});
      direct_owner.push_back(job.owner);
    } else {
      for (size_t off = 0; off < job.len; off += chunk) {
        staged.push_back({&job, off, std::min(chunk, job.len - off)});
      }
    }
  }
  size_t next_staged = 0;
  bool first = true;
  while (first || next_staged < staged.size()) {
    std::vector<TransferRequest> reqs;
    std::vector<size_t> owners;
    std::vector<std::pair<const Staged*, char*>> round;
    if (first) {
      reqs = std::move(direct);
      owners = std::move(direct_owner);
      first = false;
    }
    while (next_staged < staged.size()) {
      const Staged& s = staged[next_staged];
      if ((*failed)[s.job->owner]) {
        ++next_staged;
        continue;
      }
      char* buf = static_cast<char*>(AllocStaging(s.len, reqs.empty()));
      if (buf == nullptr) {
        if (!reqs.empty()) break;  // submit what we have, then wait for room
        LOG(ERROR) << "store: no staging space for " << s.len << " bytes within the timeout";
        (*failed)[s.job->owner] = 1;
        ++next_staged;
        continue;
      }
      if (s.job->op == TransferRequest::WRITE) std::memcpy(buf, s.job->local + s.offset, s.len);
      auto target = Open(*s.job->segment);  // cached by now
      reqs.push_back({s.job->op, buf, *target, s.job->remote + s.offset, s.len});
      owners.push_back(s.job->owner);
      round.emplace_back(&s, buf);
      ++next_staged;
    }
    if (reqs.empty()) break;
    std::vector<char> req_failed(reqs.size(), 0);
    auto batch = engine->AllocateBatchID(reqs.size());
    if (!batch.ok()) {
      LOG(ERROR) << "store: " << batch.status().ToString();
      std::fill(req_failed.begin(), req_failed.end(), 1);
    } else {
      Status s = engine->SubmitTransfer(*batch, reqs);
      if (!s.ok()) {
        LOG(ERROR) << "store: transfer refused: " << s.ToString();
        std::fill(req_failed.begin(), req_failed.end(), 1);
      } else {
        size_t bytes = 0;
        for (const auto& r : reqs) bytes += r.length;
        const auto timeout = opt.transfer_timeout + std::chrono::milliseconds(bytes >> 20);
        // The engine ends every request (its slice timeout bounds a silent peer); staging
        // memory must outlive the requests, so wait for the end even past our timeout.
        auto st = engine->WaitBatch(*batch, timeout);
        while (st.ok() && st->s == WAITING) {
          LOG(WARNING) << "store: transfer of " << bytes << " bytes still running after "
                       << timeout.count() << " ms";
          st = engine->WaitBatch(*batch, std::chrono::seconds(5));
        }
        for (size_t i = 0; i < reqs.size(); ++i) {
          auto ts = engine->GetTransferStatus(*batch, i);
          if (!ts.ok() || ts->s != COMPLETED) {
            req_failed[i] = 1;
            auto err = engine->GetTransferError(*batch, i);
            LOG(ERROR) << "store: transfer " << (reqs[i].opcode == TransferRequest::WRITE ? "to" : "from")
                       << " a replica failed: " << (err.ok() ? *err : err.status().ToString());
          }
        }
      }
      (void)engine->FreeBatchID(*batch);
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (req_failed[i]) (*failed)[owners[i]] = 1;
    }
    for (const auto& [s, buf] : round) {
      if (s->job->op == TransferRequest::READ && !(*failed)[s->job->owner]) {
        std::memcpy(s->job->local + s->offset, buf, s->len);
      }
      FreeStaging(buf);
    }
  }
}

// Lays `parts` (the object, in order) over one replica at `remote`.
static void AddJobs(TransferRequest::OpCode op, const std::vector<Span>& parts,
                    const std::string* segment, uint64_t remote, size_t owner,
                    std::vector<Job>* jobs) {
  uint64_t off = 0;
  for (const auto& p : parts) {
    if (p.size == 0) continue;
    jobs->push_back({op, static_cast<char*>(p.ptr), p.size, segment, remote + off, owner});
    off += p.size;
  }
}

std::vector<int> StoreClient::Impl::PutMany(const std::vector<std::string>& keys,
                                            const std::vector<std::vector<Span>>& parts,
                                            const ReplicateConfig& config) {
  std::vector<int> codes(keys.size(), 0);
  if (keys.size() != parts.size()) {
    LOG(WARNING) << "put: " << keys.size() << " keys but " << parts.size() << " values";
    std::fill(codes.begin(), codes.end(), ToInt(ErrorCode::INVALID_PARAMS));
    return codes;
  }
  if (keys.empty()) return codes;
  rpc::PutStartRequest req;
  req.set_client_id(client_id);
  *req.mutable_config() = ToProto(config);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto* item = req.add_items();
    item->set_key(keys[i]);
    item->set_size(Total(parts[i]));
  }
  rpc::PutStartResponse resp;
  int rc = Call("PutStart", &rpc::MasterService::Stub::PutStart, req, &resp);
  if (rc != 0 || resp.results_size() != static_cast<int>(keys.size())) {
    std::fill(codes.begin(), codes.end(), ToInt(ErrorCode::RPC_FAIL));
    return codes;
  }
  std::vector<Job> jobs;
  std::vector<char> failed(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto& r = resp.results(static_cast<int>(i));
    codes[i] = r.code();
    if (r.code() != 0) {
      if (r.code() != ToInt(ErrorCode::OBJECT_ALREADY_EXISTS)) {
        LOG(WARNING) << "put " << keys[i] << ": " << ErrorCodeName(r.code()) << ": " << r.message();
      }
      continue;
    }
    for (const auto& rep : r.replicas()) {
      AddJobs(TransferRequest::WRITE, parts[i], &rep.buffer().segment_name(), rep.buffer().addr(),
              i, &jobs);
    }
  }
  RunJobs(jobs, &failed);
  rpc::KeysRequest end, revoke;
  end.set_client_id(client_id);
  revoke.set_client_id(client_id);
  std::vector<size_t> end_idx;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (codes[i] != 0) continue;
    if (failed[i]) {
      revoke.add_keys(keys[i]);
      codes[i] = ToInt(ErrorCode::TRANSFER_FAIL);
    } else {
      end.add_keys(keys[i]);
      end_idx.push_back(i);
    }
  }
  if (revoke.keys_size() > 0) {
    rpc::CodesResponse r;
    (void)Call("PutRevoke", &rpc::MasterService::Stub::PutRevoke, revoke, &r);
  }
  if (end.keys_size() > 0) {
    rpc::CodesResponse r;
    if (Call("PutEnd", &rpc::MasterService::Stub::PutEnd, end, &r) != 0 ||
        r.codes_size() != end.keys_size()) {
      for (size_t i : end_idx) codes[i] = ToInt(ErrorCode::RPC_FAIL);
    } else {
      for (size_t j = 0; j < end_idx.size(); ++j) {
        codes[end_idx[j]] = r.codes(static_cast<int>(j));
        if (r.codes(static_cast<int>(j)) != 0) {
          LOG(WARNING) << "put " << keys[end_idx[j]] << ": PutEnd: "
                       << ErrorCodeName(r.codes(static_cast<int>(j)));
        }
      }
    }
  }
  return codes;
}

std::vector<int64_t> StoreClient::Impl::GetMany(const std::vector<std::string>& keys,
                                                const StoreClient::PartsFor& parts_for) {
  std::vector<int64_t> out(keys.size(), 0);
  if (keys.empty()) return out;
  std::vector<std::vector<Span>> parts(keys.size());
  rpc::KeysRequest req;
  req.set_client_id(client_id);
  for (const auto& k : keys) req.add_keys(k);
  rpc::GetReplicaListResponse resp;
  int rc = Call("GetReplicaList", &rpc::MasterService::Stub::GetReplicaList, req, &resp);
  if (rc != 0 || resp.results_size() != static_cast<int>(keys.size())) {
    std::fill(out.begin(), out.end(), ToInt(ErrorCode::RPC_FAIL));
    return out;
  }
  // Replica order per key: ours first (a memcpy), then the master's order.
  std::vector<std::vector<const rpc::Replica*>> choices(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto& r = resp.results(static_cast<int>(i));
    if (r.code() != 0) {
      out[i] = r.code();
      continue;
    }
    parts[i] = parts_for(i, r.size());
    if (r.size() > Total(parts[i])) {
      LOG(WARNING) << "get " << keys[i] << ": the buffer holds " << Total(parts[i])
                   << " bytes but the object has " << r.size();
      out[i] = ToInt(ErrorCode::INVALID_PARAMS);
      continue;
    }
    out[i] = static_cast<int64_t>(r.size());
    for (const auto& rep : r.replicas()) {
      if (rep.buffer().segment_name() == seg_name) choices[i].insert(choices[i].begin(), &rep);
      else choices[i].push_back(&rep);
    }
    if (choices[i].empty()) out[i] = ToInt(ErrorCode::INVALID_REPLICA);
  }
  // Try replica 0 of every key in one round; keys that failed try their next replica.
  std::vector<size_t> attempt(keys.size(), 0);
  std::vector<size_t> pending;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (out[i] > 0) pending.push_back(i);
  }
  while (!pending.empty()) {
    std::vector<Job> jobs;
    std::vector<char> failed(keys.size(), 0);
    std::vector<std::vector<Span>> clipped(keys.size());
    for (size_t i : pending) {
      const rpc::Replica* rep = choices[i][attempt[i]];
      // Only the object's bytes: clip the parts to its size.
      size_t left = rep->buffer().size();
      for (const auto& p : parts[i]) {
        if (left == 0) break;
        clipped[i].push_back({p.ptr, std::min(left, p.size)});
        left -= clipped[i].back().size;
      }
      AddJobs(TransferRequest::READ, clipped[i], &rep->buffer().segment_name(),
              rep->buffer().addr(), i, &jobs);
    }
    RunJobs(jobs, &failed);
    std::vector<size_t> retry;
    for (size_t i : pending) {
      if (!failed[i]) continue;
      if (++attempt[i] < choices[i].size()) {
        LOG(WARNING) << "get " << keys[i] << ": replica failed, trying the next one";
        retry.push_back(i);
      } else {
        out[i] = ToInt(ErrorCode::TRANSFER_FAIL);
      }
    }
    pending.swap(retry);
  }
  return out;
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

int StoreClient::HealthCheck() {
  {
    std::lock_guard<std::mutex> lock(impl_->hb_mu);
    if (!impl_->stub || impl_->closed) return ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  }
  rpc::PingRequest req;
  req.set_client_id(impl_->client_id);
  rpc::PingResponse resp;
  return impl_->Call("health_check", &rpc::MasterService::Stub::Ping, req, &resp);
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
  std::vector<int64_t> out(keys.size(), ToInt(ErrorCode::RPC_FAIL));
  if (keys.empty()) return out;
  rpc::KeysRequest req;
  req.set_client_id(impl_->client_id);
  for (const auto& k : keys) req.add_keys(k);
  rpc::ExistResponse resp;
  if (impl_->Call("ExistKey", &rpc::MasterService::Stub::ExistKey, req, &resp) != 0 ||
      resp.results_size() != static_cast<int>(keys.size())) {
    return out;
  }
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
  std::vector<int> out(keys.size(), ToInt(ErrorCode::RPC_FAIL));
  if (keys.empty()) return out;
  rpc::KeysRequest req;
  req.set_client_id(impl_->client_id);
  req.set_force(force);
  for (const auto& k : keys) req.add_keys(k);
  rpc::CodesResponse resp;
  if (impl_->Call("Remove", &rpc::MasterService::Stub::Remove, req, &resp) != 0 ||
      resp.codes_size() != static_cast<int>(keys.size())) {
    return out;
  }
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
  int rc = impl_->Call("RemoveByRegex", &rpc::MasterService::Stub::RemoveByRegex, req, &resp);
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
  int rc = impl_->Call("RemoveAll", &rpc::MasterService::Stub::RemoveAll, req, &resp);
  if (rc != 0) return rc;
  return resp.code() != 0 ? resp.code() : resp.count();
}

int StoreClient::RegisterBuffer(void* ptr, size_t size) {
  if (ptr == nullptr || size == 0) {
    LOG(WARNING) << "register_buffer: null address or zero size";
    return ToInt(ErrorCode::INVALID_PARAMS);
  }
  Status s = impl_->engine->RegisterLocalMemory(ptr, size, "cpu:0");
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


}  // namespace store
}  // namespace mooncake
