// Reads of disk replicas (src/store/disk/README.md): this client's own disk directly into the
// caller's memory; another client's through its offload service, which reads the records
// into its offload buffer for this client to copy with the engine and check.
#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <unordered_map>

#include "common/crc32c.h"
#include "store/client/store_client_impl.h"

namespace mooncake {
namespace store {
namespace {

// A read from another client's disk goes in chunks of about this many bytes, two in flight:
// the owner reads and checks the next chunk from its disk while this client copies and
// checks the one before (the owner's service serves one request at a time, so a whole batch
// in one request would leave one side idle while the other works). Within a chunk the owner
// keeps its next record's read in flight while it checks one (DiskStore::ReadMany): 4 MiB
// leaves its disk idle only for the check of a chunk's last record.
constexpr uint64_t kDiskReadChunk = 4 << 20;
constexpr size_t kDiskReadsInFlight = 2;

}  // namespace

void StoreClient::Impl::ReadFromDisks(const std::vector<std::string>& keys,
                                      const std::vector<size_t>& which,
                                      const rpc::GetReplicaListResponse& resp,
                                      const std::vector<std::vector<Span>>& parts,
                                      std::vector<int64_t>* out) {
  // By owner: this client's own disk is read directly; others' through their service.
  std::map<std::string, std::vector<size_t>> by_owner;
  std::unordered_map<size_t, const rpc::DiskReplica*> replica;
  for (size_t i : which) {
    for (const auto& rep : resp.results(static_cast<int>(i)).replicas()) {
      if (!rep.has_disk()) continue;
      replica[i] = &rep.disk();
      by_owner[rep.disk().endpoint()].push_back(i);
      break;
    }
  }
  auto stored_key = [&](size_t i) -> const std::string& {
    return replica[i]->key().empty() ? keys[i] : replica[i]->key();
  };
  auto size_of = [&](size_t i) { return resp.results(static_cast<int>(i)).size(); };
  for (const auto& owner : by_owner) {
    const std::string& endpoint = owner.first;  // (a structured binding: not capturable in C++17)
    const std::vector<size_t>& idx = owner.second;
    if (disk && replica[idx[0]]->store_id() == disk->id()) {
      ReadOwnDisk(keys, idx, resp, parts, stored_key, out);
      continue;
    }
    RpcClient* peer = nullptr;
    {
      MutexLock lock(&offload_peers_mu);
      auto& c = offload_peers[endpoint];
      if (!c) c = std::make_unique<RpcClient>(endpoint, 4, "the offload service");
      peer = c.get();
    }
    // Copies a chunk the owner read (its results for left[b, e)) into the caller's memory
    // and checks each end to end against its record's CRC32C: bytes the owner's buffer no
    // longer held (or that changed on the way) are never returned. Keys the owner had no
    // room for now go to `again`.
    auto take = [&](const rpc::OffloadReadResponse& rr, const std::vector<size_t>& left,
                    size_t b, size_t e, std::vector<size_t>* again) {
      std::vector<Job> jobs;
      std::vector<Span> clipped;
      for (size_t k = b; k < e; ++k) {
        const size_t i = left[k];
        const auto& res = rr.results(static_cast<int>(k - b));
        if (res.code() == ToInt(ErrorCode::NO_AVAILABLE_HANDLE)) {
          again->push_back(i);
          continue;
        }
        if (res.code() != 0) {
          LOG(WARNING) << "get " << keys[i] << " from the disk of " << endpoint << ": "
                       << res.message();
          (*out)[i] = res.code();
          continue;
        }
        uint64_t size = size_of(i);
        clipped.clear();
        for (const auto& p : parts[i]) {
          if (size == 0) break;
          clipped.push_back({p.ptr, std::min<uint64_t>(size, p.size)});
          size -= clipped.back().size;
        }
        AddJobs(TransferRequest::READ, clipped, &rr.segment_name(), res.addr(), i, &jobs);
      }
      std::vector<char> failed(keys.size(), 0);
      if (!jobs.empty()) copier->Run(jobs, &failed);
      for (size_t k = b; k < e; ++k) {
        const size_t i = left[k];
        const auto& res = rr.results(static_cast<int>(k - b));
        if (res.code() != 0) continue;
        bool intact = !failed[i];
        if (intact) {
          const std::string& stored = stored_key(i);
          uint32_t crc = Crc32c(0, stored.data(), stored.size());
          uint64_t left_bytes = size_of(i);
          for (const auto& p : parts[i]) {
            if (left_bytes == 0) break;
            const uint64_t n = std::min<uint64_t>(p.size, left_bytes);
            crc = Crc32c(crc, p.ptr, n);
            left_bytes -= n;
          }
          intact = crc == res.crc();
          if (!intact) {
            LOG(WARNING) << "get " << keys[i] << " from the disk of " << endpoint
                         << ": the copy fails its CRC32C; not returned";
          }
        }
        if (!intact) {
          (*out)[i] = ToInt(ErrorCode::TRANSFER_FAIL);
        } else {
          (*out)[i] = static_cast<int64_t>(size_of(i));
          ++offload_rpc_reads;
        }
      }
    };
    std::vector<size_t> left = idx;
    bool broken = false;
    for (int attempt = 0; attempt < 3 && !left.empty() && !broken; ++attempt) {
      // left[cuts[c], cuts[c + 1]) is chunk c.
      // Cut from the back: the last chunk is a quarter of the others (what this client
      // still copies and checks once the owner's disk is done), the first takes what is left.
      std::vector<size_t> cuts{left.size()};
      uint64_t bytes = 0;
      uint64_t limit = kDiskReadChunk / 4;
      for (size_t k = left.size(); k-- > 0;) {
        bytes += size_of(left[k]);
        if ((bytes >= limit || cuts.back() - k >= kMaxBatchItems) && k > 0) {
          cuts.push_back(k);
          bytes = 0;
          limit = kDiskReadChunk;
        }
      }
      cuts.push_back(0);
      std::reverse(cuts.begin(), cuts.end());
      struct Read {
        size_t chunk;
        rpc::OffloadReadRequest req;  // lives until its call is finished
        std::optional<RpcClient::PendingCall> call;
      };
      struct Release {
        rpc::OffloadReleaseRequest req;
        std::optional<RpcClient::PendingCall> call;
      };
      std::deque<Read> reads;  // a deque: its elements stay where they are
      std::deque<Release> releases;
      size_t next = 0;
      auto start = [&]() {
        Read& r = reads.emplace_back();
        r.chunk = next++;
        r.req.set_client_id(client_id);
        for (size_t k = cuts[r.chunk]; k < cuts[r.chunk + 1]; ++k) {
          const size_t i = left[k];
          r.req.add_keys(stored_key(i));
          r.req.add_versions(resp.results(static_cast<int>(i)).version());
          r.req.add_sizes(size_of(i));
        }
        r.call.emplace(peer->Start(MasterMethod::kOffloadRead, r.req, opt.rpc_timeout));
      };
      auto finish_release = [&]() {
        rpc::OffloadReleaseResponse relr;
        (void)peer->Finish(&*releases.front().call, &relr);
        releases.pop_front();
      };
      std::vector<size_t> again;
      while (next + 1 < cuts.size() && reads.size() < kDiskReadsInFlight) start();
      while (!reads.empty()) {
        Read& r = reads.front();
        const size_t b = cuts[r.chunk], e = cuts[r.chunk + 1];
        rpc::OffloadReadResponse rr;
        Status s = peer->Finish(&*r.call, &rr, static_cast<int>(reads.size()));
        if (!s.ok() || rr.code() != 0 || rr.results_size() != static_cast<int>(e - b)) {
          if (!broken) {
            LOG(WARNING) << "get from the disk of " << endpoint << ": "
                         << (s.ok() ? rr.message() : s.message());
          }
          broken = true;  // nothing more is asked of this owner in this call
          for (size_t k = b; k < e; ++k) (*out)[left[k]] = ToInt(ErrorCode::RPC_FAIL);
        } else {
          // The next chunk is asked for first, so that the owner reads it during the copy.
          const uint64_t batch_id = rr.batch_id();
          if (!broken && next + 1 < cuts.size()) start();
          take(rr, left, b, e, &again);
          Release& rel = releases.emplace_back();
          rel.req.set_batch_id(batch_id);
          rel.req.set_client_id(client_id);
          rel.call.emplace(peer->Start(MasterMethod::kOffloadRelease, rel.req, opt.rpc_timeout));
          while (releases.size() > 1) finish_release();
        }
        reads.pop_front();
      }
      while (!releases.empty()) finish_release();
      for (size_t c = next; c + 1 < cuts.size(); ++c) {  // never asked for (broken)
        for (size_t k = cuts[c]; k < cuts[c + 1]; ++k) (*out)[left[k]] = ToInt(ErrorCode::RPC_FAIL);
      }
      left.swap(again);
    }
    for (size_t i : left) (*out)[i] = ToInt(ErrorCode::NO_AVAILABLE_HANDLE);
  }
}

void StoreClient::Impl::ReadOwnDisk(const std::vector<std::string>& keys,
                                    const std::vector<size_t>& idx,
                                    const rpc::GetReplicaListResponse& resp,
                                    const std::vector<std::vector<Span>>& parts,
                                    const std::function<const std::string&(size_t)>& stored_key,
                                    std::vector<int64_t>* out) {
  // Each read straight into the caller's memory where it is one piece, else through a
  // temporary copied out to its pieces after; all read together (disk_store.h ReadMany).
  std::vector<std::string> tmp(idx.size());
  std::vector<DiskStore::ReadItem> reads(idx.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    const size_t i = idx[k];
    const auto& r = resp.results(static_cast<int>(i));
    DiskStore::ReadItem& read = reads[k];
    read.key = &stored_key(i);
    read.len = r.size();
    read.put_id = r.version();
    if (parts[i].size() == 1 && parts[i][0].size >= r.size()) {
      read.dst = parts[i][0].ptr;
    } else {
      tmp[k].resize(r.size());
      read.dst = tmp[k].data();
    }
  }
  disk->ReadMany(&reads);
  for (size_t k = 0; k < idx.size(); ++k) {
    const size_t i = idx[k];
    const uint64_t size = reads[k].len;
    const Status& s = reads[k].status;
    if (!s.ok()) {
      LOG(WARNING) << "get " << keys[i] << " from this client's disk: " << s.message();
      if (!s.IsNotFound() && offload_worker) offload_worker->Poke();
      (*out)[i] = ToInt(s.IsNotFound() ? ErrorCode::OBJECT_NOT_FOUND : ErrorCode::FILE_READ_FAIL);
      continue;
    }
    if (!tmp[k].empty()) {  // scattered over the caller's parts
      uint64_t off = 0;
      for (const auto& p : parts[i]) {
        if (off == size) break;
        const uint64_t n = std::min<uint64_t>(p.size, size - off);
        std::memcpy(p.ptr, tmp[k].data() + off, n);
        off += n;
      }
    }
    (*out)[i] = static_cast<int64_t>(size);
    ++offload_rpc_reads;
  }
}

}  // namespace store
}  // namespace mooncake
