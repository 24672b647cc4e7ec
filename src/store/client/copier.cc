#include "store/client/copier.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "store/client/client_metrics.h"
#include "store/client/device_copy.h"
#include "store/client/opened_segments.h"
#include "store/client/registrations.h"
#include "store/client/staging.h"

namespace mooncake {
namespace store {

namespace {
constexpr size_t kMaxStagingChunk = 4 << 20;

// A copy between the caller's memory and the client's host memory (device_copy.h: through
// the device backend when the caller's is device memory); false, logged, when it failed.
bool CopyOut(bool device, void* dst, const void* src, size_t n) {
  Status s = CopyKnown(device, dst, src, n);
  if (!s.ok()) LOG(ERROR) << "store: device copy of " << n << " bytes failed: " << s.ToString();
  return s.ok();
}
}  // namespace

void AddJobs(TransferRequest::OpCode op, const std::vector<Span>& parts,
             const std::string* segment, uint64_t remote, size_t owner, std::vector<Job>* jobs) {
  uint64_t off = 0;
  for (const auto& p : parts) {
    if (p.size == 0) continue;
    jobs->push_back({op, static_cast<char*>(p.ptr), p.size, segment, remote + off, owner});
    off += p.size;
  }
}

Copier::Copier(TransferEngine* engine, std::string own_segment, Registrations* registrations,
               Staging* staging, OpenedSegments* segments, std::chrono::milliseconds timeout,
               ClientMetrics* metrics, SegmentLayout* layout)
    : engine_(engine),
      own_segment_(std::move(own_segment)),
      registrations_(registrations),
      staging_(staging),
      segments_(segments),
      timeout_(timeout),
      chunk_(staging ? std::min(kMaxStagingChunk, staging->capacity()) : 0),
      metrics_(metrics),
      layout_(layout) {}

void Copier::Run(const std::vector<Job>& jobs, std::vector<char>* failed,
                 const std::function<bool()>& check) {
  std::optional<ReaderLock> layout;
  if (layout_ != nullptr) {
    { MutexLock wait_for_writer(&layout_->turnstile); }
    layout.emplace(&layout_->rw);
  }
  if (check && !check()) {
    for (const Job& job : jobs) (*failed)[job.owner] = 1;
    return;
  }
  Round round;
  std::vector<Staged> staged;
  Sort(jobs, failed, &round, &staged);
  bool all_inline = true;
  size_t next = 0;
  for (bool first = true; first || next < staged.size(); first = false) {
    if (!first) round = Round();
    Stage(staged, &next, &round, failed);
    if (round.reqs.empty()) break;
    if (!Transfer(round, failed)) all_inline = false;
    Unstage(round, failed);
  }
  copies_inline_.store(all_inline, std::memory_order_relaxed);
  if (metrics_ != nullptr) {  // the bytes of the jobs whose object or range completed
    uint64_t read = 0, written = 0;
    for (const Job& job : jobs) {
      if ((*failed)[job.owner]) continue;
      (job.op == TransferRequest::READ ? read : written) += job.len;
    }
    if (read > 0) metrics_->AddRead(read);
    if (written > 0) metrics_->AddWrite(written);
  }
}

void Copier::Sort(const std::vector<Job>& jobs, std::vector<char>* failed, Round* direct,
                  std::vector<Staged>* staged) {
  // A batch's jobs mostly name one segment and one registered buffer: the last ones found
  // are tried first (no lock, no lookup).
  const std::string* last_segment = nullptr;
  SegmentID last_target = 0;
  const char* reg_lo = nullptr;
  const char* reg_hi = nullptr;
  // Likewise the registration of the last own-segment replica (one stays registered while
  // Run holds the layout lock: an unmount waits for it).
  const char* own_lo = nullptr;
  const char* own_hi = nullptr;
  direct->reqs.reserve(jobs.size());
  direct->owners.reserve(jobs.size());
  for (const Job& job : jobs) {
    if ((*failed)[job.owner]) continue;
    if (*job.segment == own_segment_) {  // a replica in our own segment: plain memory
      char* remote = reinterpret_cast<char*>(job.remote);
      if (own_lo == nullptr || remote < own_lo || remote > own_hi ||
          job.len > static_cast<size_t>(own_hi - remote)) {
        uint64_t lo = 0, len = 0;
        if (!registrations_->Find(remote, job.len, &lo, &len)) {  // a run-time segment unmounted
          LOG(WARNING) << "store: a replica in this client's own memory at "
                       << static_cast<void*>(remote) << " is gone (its segment was unmounted)";
          (*failed)[job.owner] = 1;
          continue;
        }
        own_lo = reinterpret_cast<const char*>(lo);
        own_hi = own_lo + len;
      }
      const bool device = IsDeviceMemory(job.local);
      const bool copied = job.op == TransferRequest::WRITE
                              ? CopyOut(device, remote, job.local, job.len)
                              : CopyOut(device, job.local, remote, job.len);
      if (!copied) (*failed)[job.owner] = 1;
      continue;
    }
    if (last_segment == nullptr || *job.segment != *last_segment) {
      auto target = segments_->Open(*job.segment);
      if (!target.ok()) {
        LOG(ERROR) << "store: cannot reach segment " << *job.segment << ": "
                   << target.status().ToString();
        (*failed)[job.owner] = 1;
        continue;
      }
      last_segment = job.segment;
      last_target = *target;
    }
    bool registered = reg_lo != nullptr && job.local >= reg_lo && job.local <= reg_hi &&
                      job.len <= static_cast<size_t>(reg_hi - job.local);
    if (!registered) {
      uint64_t lo = 0, len = 0;
      registered = registrations_->Find(job.local, job.len, &lo, &len);
      if (registered) {
        reg_lo = reinterpret_cast<const char*>(lo);
        reg_hi = reg_lo + len;
      }
    }
    if (registered) {
      direct->reqs.push_back({job.op, job.local, last_target, job.remote, job.len});
      direct->owners.push_back(job.owner);
    } else if (chunk_ == 0) {
      LOG(ERROR) << "store: unregistered memory and no local buffer to stage it";
      (*failed)[job.owner] = 1;
    } else {
      const bool device = IsDeviceMemory(job.local);
      for (size_t off = 0; off < job.len; off += chunk_) {
        staged->push_back({&job, off, std::min(chunk_, job.len - off), device});
      }
    }
  }
}

void Copier::Stage(const std::vector<Staged>& staged, size_t* next, Round* round,
                   std::vector<char>* failed) {
  for (; *next < staged.size(); ++*next) {
    const Staged& s = staged[*next];
    if ((*failed)[s.job->owner]) continue;
    const bool wait = round->reqs.empty();
    char* buf =
        staging_->Alloc(s.len, wait, std::chrono::steady_clock::now() + timeout_);
    if (buf == nullptr) {
      if (!wait) return;  // submit what we have, then wait for room
      LOG(ERROR) << "store: no staging space for " << s.len << " bytes within the timeout";
      (*failed)[s.job->owner] = 1;
      continue;
    }
    if (s.job->op == TransferRequest::WRITE &&
        !CopyOut(s.device, buf, s.job->local + s.offset, s.len)) {
      staging_->Free(buf);
      (*failed)[s.job->owner] = 1;
      continue;
    }
    auto target = segments_->Open(*s.job->segment);  // opened by Sort
    round->reqs.push_back({s.job->op, buf, *target, s.job->remote + s.offset, s.len});
    round->owners.push_back(s.job->owner);
    round->staged.emplace_back(&s, buf);
  }
}

bool Copier::Transfer(const Round& round, std::vector<char>* failed) {
  const auto& reqs = round.reqs;
  auto fail_all = [&] {
    for (size_t owner : round.owners) (*failed)[owner] = 1;
  };
  auto batch = engine_->AllocateBatchID(reqs.size());
  if (!batch.ok()) {
    LOG(ERROR) << "store: " << batch.status().ToString();
    fail_all();
    return true;
  }
  bool ended_inline = true;
  Status s = engine_->SubmitTransfer(*batch, reqs);
  if (!s.ok()) {
    LOG(ERROR) << "store: transfer refused: " << s.ToString();
    fail_all();
  } else {
    auto now = engine_->GetBatchTransferStatus(*batch);
    ended_inline = now.ok() && now->s != WAITING;
    size_t bytes = 0;
    for (const auto& r : reqs) bytes += r.length;
    const auto timeout = timeout_ + std::chrono::milliseconds(bytes >> 20);
    // The engine ends every request (its slice timeout bounds a silent peer); staging
    // memory must outlive the requests, so wait for the end even past our timeout.
    auto st = engine_->WaitBatch(*batch, timeout);
    while (st.ok() && st->s == WAITING) {
      LOG(WARNING) << "store: transfer of " << bytes << " bytes still running after "
                   << timeout.count() << " ms";
      st = engine_->WaitBatch(*batch, std::chrono::seconds(5));
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto ts = engine_->GetTransferStatus(*batch, i);
      if (ts.ok() && ts->s == COMPLETED) continue;
      (*failed)[round.owners[i]] = 1;
      auto err = engine_->GetTransferError(*batch, i);
      LOG(ERROR) << "store: transfer " << (reqs[i].opcode == TransferRequest::WRITE ? "to" : "from")
                 << " a replica failed: " << (err.ok() ? *err : err.status().ToString());
    }
  }
  (void)engine_->FreeBatchID(*batch);
  return ended_inline;
}

void Copier::Unstage(const Round& round, std::vector<char>* failed) {
  for (const auto& [s, buf] : round.staged) {
    if (s->job->op == TransferRequest::READ && !(*failed)[s->job->owner] &&
        !CopyOut(s->device, s->job->local + s->offset, buf, s->len)) {
      (*failed)[s->job->owner] = 1;
    }
    staging_->Free(buf);
  }
}

}  // namespace store
}  // namespace mooncake
