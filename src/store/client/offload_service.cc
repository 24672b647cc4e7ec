#include "store/client/offload_service.h"

#include <glog/logging.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <climits>
#include <random>

#include "mooncake/store/error_code.h"
#include "mooncake/transfer_engine.h"
#include "store/common/limits.h"

namespace mooncake {
namespace store {

namespace {

// Whether an OffloadRead carries more fields than kMaxBatchItems keys with their versions
// and sizes can: walked before parsing, so a request of millions of empty keys costs no
// more than one within the bounds.
bool OverBatch(const char* data, size_t n) {
  if (n > static_cast<size_t>(INT_MAX)) return true;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(data),
                                            static_cast<int>(n));
  size_t fields = 0;
  while (const uint32_t tag = in.ReadTag()) {
    if (++fields > 3 * kMaxBatchItems + 8) return true;
    if (!google::protobuf::internal::WireFormatLite::SkipField(&in, tag)) return true;
  }
  return false;
}

}  // namespace

Result<std::unique_ptr<OffloadService>> OffloadService::Start(TransferEngine* engine,
                                                              DiskStore* disk, Options options) {
  std::unique_ptr<OffloadService> s(new OffloadService(engine, disk, std::move(options)));
  auto mem = engine->AllocateSharedMemory(s->opt_.buffer_size);
  if (!mem.ok()) {
    return Status::ResourceExhausted("cannot allocate the offload buffer of " +
                                     std::to_string(s->opt_.buffer_size) +
                                     " bytes (MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES): " +
                                     mem.status().message());
  }
  s->buffer_ = static_cast<char*>(*mem);
  RpcServer::Options ro;
  ro.threads = 1;
  ro.max_connections = 1024;
  ro.max_buffered_bytes = 64ull << 20;
  OffloadService* self = s.get();
  s->server_ = std::make_unique<RpcServer>(
      ro, [self](uint16_t method, const char* data, size_t n, std::string* out) {
        return self->Handle(method, data, n, out);
      });
  MC_RETURN_IF_ERROR(s->server_->Start(s->opt_.host, 0));
  return s;
}

OffloadService::OffloadService(TransferEngine* engine, DiskStore* disk, Options options)
    : engine_(engine), disk_(disk), opt_(std::move(options)), alloc_(opt_.buffer_size, 64) {
  std::random_device rd;
  MutexLock l(&mu_);
  batch_ids_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
}

OffloadService::~OffloadService() { Stop(); }

void OffloadService::Stop() {
  if (server_) server_->Stop();
  if (buffer_ != nullptr) {
    Status s = engine_->FreeSharedMemory(buffer_);
    if (!s.ok()) LOG(WARNING) << "offload buffer: " << s.ToString();
    buffer_ = nullptr;
  }
}

std::string OffloadService::endpoint() const {
  const bool v6 = opt_.host.find(':') != std::string::npos;
  return (v6 ? "[" + opt_.host + "]" : opt_.host) + ":" + std::to_string(server_->port());
}

size_t OffloadService::batches() const {
  MutexLock l(&mu_);
  return batches_.size();
}

void OffloadService::ExpireLocked(std::chrono::steady_clock::time_point now) {
  for (auto it = batches_.begin(); it != batches_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    for (uint64_t off : it->second.offsets) alloc_.Free(off);
    auto h = held_by_reader_.find(it->second.reader);
    if (h != held_by_reader_.end()) {
      h->second -= std::min(h->second, it->second.bytes);
      if (h->second == 0) held_by_reader_.erase(h);
    }
    it = batches_.erase(it);
  }
}

rpc::OffloadReadResponse OffloadService::Read(const rpc::OffloadReadRequest& req) {
  rpc::OffloadReadResponse resp;
  resp.set_segment_name(opt_.segment_name);
  resp.set_hold_ms(static_cast<uint64_t>(opt_.hold.count()));
  if (req.keys_size() > static_cast<int>(kMaxBatchItems) ||
      req.versions_size() != req.keys_size() || req.sizes_size() != req.keys_size() ||
      !NameProblem("client id", req.client_id()).empty()) {
    resp.set_code(ToInt(ErrorCode::INVALID_PARAMS));
    resp.set_message("an OffloadRead needs at most " + std::to_string(kMaxBatchItems) +
                     " keys, each with its version and size");
    return resp;
  }
  // Space for every key first (under the lock), then the disk reads (without it).
  std::vector<uint64_t> offsets(req.keys_size(), UINT64_MAX);
  uint64_t batch_id = 0;
  {
    MutexLock l(&mu_);
    const auto now = std::chrono::steady_clock::now();
    ExpireLocked(now);
    uint64_t& held = held_by_reader_[req.client_id()];
    const uint64_t reader_cap = std::max<uint64_t>(opt_.buffer_size / 4, 1);
    Batch b;
    b.reader = req.client_id();
    b.expires = std::chrono::steady_clock::time_point::max();  // set once the reads are done
    for (int i = 0; i < req.keys_size(); ++i) {
      const uint64_t size = req.sizes(i);
      if (size == 0 || held + size > reader_cap) continue;
      auto off = alloc_.Allocate(size);
      if (!off) continue;
      offsets[i] = *off;
      held += size;
      b.bytes += size;
      b.offsets.push_back(*off);
    }
    if (held == 0) held_by_reader_.erase(req.client_id());
    do {
      batch_id = batch_ids_() | 1;
    } while (batches_.count(batch_id) != 0);
    if (!b.offsets.empty()) batches_.emplace(batch_id, std::move(b));
  }
  resp.set_batch_id(batch_id);
  resp.set_code(ToInt(ErrorCode::OK));
  // The disk reads of every key given room, together (the next in flight behind each).
  std::vector<DiskStore::ReadItem> reads;
  for (int i = 0; i < req.keys_size(); ++i) {
    if (offsets[i] == UINT64_MAX) continue;
    DiskStore::ReadItem& r = reads.emplace_back();
    r.key = &req.keys(i);
    r.len = req.sizes(i);
    r.put_id = req.versions(i);
    r.dst = buffer_ + offsets[i];
  }
  disk_->ReadMany(&reads);
  std::vector<uint64_t> bad;
  size_t next = 0;
  for (int i = 0; i < req.keys_size(); ++i) {
    rpc::OffloadReadResult* r = resp.add_results();
    if (offsets[i] == UINT64_MAX) {
      r->set_code(ToInt(req.sizes(i) == 0 ? ErrorCode::INVALID_PARAMS
                                          : ErrorCode::NO_AVAILABLE_HANDLE));
      r->set_message("no room in the offload buffer now: read it again");
      continue;
    }
    const DiskStore::ReadItem& read = reads[next++];
    const Status& s = read.status;
    if (!s.ok()) {
      r->set_code(ToInt(s.code() == Status::Code::kDataLoss ? ErrorCode::FILE_READ_FAIL
                        : s.IsNotFound() || s.IsInvalidArgument() ? ErrorCode::OBJECT_NOT_FOUND
                                                                   : ErrorCode::FILE_READ_FAIL));
      r->set_message(s.message());
      bad.push_back(offsets[i]);
      continue;
    }
    reads_served_.fetch_add(1, std::memory_order_relaxed);
    r->set_code(ToInt(ErrorCode::OK));
    r->set_addr(reinterpret_cast<uint64_t>(read.dst));
    r->set_crc(read.crc);
  }
  {
    // The hold starts now that the bytes are there; the space of the failed reads goes back.
    MutexLock l(&mu_);
    auto it = batches_.find(batch_id);
    if (it != batches_.end()) {
      it->second.expires = std::chrono::steady_clock::now() + opt_.hold;
      auto& offs = it->second.offsets;
      for (uint64_t off : bad) {
        auto at = std::find(offs.begin(), offs.end(), off);
        if (at == offs.end()) continue;
        offs.erase(at);
        alloc_.Free(off);
      }
    }
  }
  return resp;
}

void OffloadService::Release(uint64_t batch_id, const std::string& reader) {
  MutexLock l(&mu_);
  auto it = batches_.find(batch_id);
  if (it == batches_.end() || it->second.reader != reader) return;
  it->second.expires = std::chrono::steady_clock::time_point::min();
  ExpireLocked(std::chrono::steady_clock::now());
}

RpcStatus OffloadService::Handle(uint16_t method, const char* data, size_t n, std::string* out) {
  switch (static_cast<MasterMethod>(method)) {
    case MasterMethod::kOffloadRead: {
      rpc::OffloadReadRequest req;
      if (OverBatch(data, n)) {
        out->append("an OffloadRead of more than " + std::to_string(kMaxBatchItems) +
                    " keys: split it");
        return RpcStatus::kBadRequest;
      }
      if (!req.ParseFromArray(data, static_cast<int>(n))) {
        out->append("the payload is not an OffloadRead request");
        return RpcStatus::kBadRequest;
      }
      Read(req).AppendToString(out);
      return RpcStatus::kOk;
    }
    case MasterMethod::kOffloadRelease: {
      rpc::OffloadReleaseRequest req;
      if (!req.ParseFromArray(data, static_cast<int>(n))) {
        out->append("the payload is not an OffloadRelease request");
        return RpcStatus::kBadRequest;
      }
      Release(req.batch_id(), req.client_id());
      rpc::OffloadReleaseResponse resp;
      resp.set_code(0);
      resp.AppendToString(out);
      return RpcStatus::kOk;
    }
    default:
      out->append("this is a client's offload service: it serves OffloadRead and "
                  "OffloadRelease only");
      return RpcStatus::kUnknownMethod;
  }
}

}  // namespace store
}  // namespace mooncake
