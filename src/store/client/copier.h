// Copier: moves the bytes of puts and gets between local memory and replicas. A job whose
// replica is in this client's own segment is a memcpy (a device copy when the local memory
// is device memory, device_copy.h); one in registered memory is an
// engine request as it is; any other is staged through the local buffer (Staging) in
// chunks of at most 4 MiB, as many rounds as the buffer needs. Every request ends (the
// engine's timeouts bound a silent peer) before the staging memory it uses is reused.
//
// Stateless but for copies_inline; its collaborators lock themselves (no lock held here).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/thread_annotations.h"
#include "mooncake/store/store_client.h"
#include "mooncake/transfer_engine.h"

namespace mooncake {
namespace store {

class ClientMetrics;
class OpenedSegments;
class Registrations;
class Staging;

// What a run-time segment's memory leaves under (store_client_segments.cc): every Copier::Run
// holds `rw` shared; the memory goes with it held exclusively. A writer shuts the turnstile
// first, so a stream of copies cannot keep an unmount waiting.
struct SegmentLayout {
  Mutex turnstile;
  RwMutex rw;
};

// One copy between local memory and a replica; `owner` says which object (or range) it
// belongs to: a failed job marks failed[owner].
struct Job {
  TransferRequest::OpCode op;
  char* local;
  size_t len;
  const std::string* segment;
  uint64_t remote;
  size_t owner;
};

// Lays `parts` (the object, in order) over one replica at `remote` as jobs of `owner`.
void AddJobs(TransferRequest::OpCode op, const std::vector<Span>& parts,
             const std::string* segment, uint64_t remote, size_t owner, std::vector<Job>* jobs);

class Copier {
 public:
  // `own_segment`: this client's segment name (its replicas are memcpy'd). `staging` may
  // be null (no local buffer: callers refuse unregistered memory before they copy).
  // `metrics` (may be null) counts the bytes of the jobs that complete. `layout` (may be
  // null) is held shared by each Run: memory of the own segment name leaves only under it
  // held exclusively, and a job whose own-segment range is no longer registered fails.
  Copier(TransferEngine* engine, std::string own_segment, Registrations* registrations,
         Staging* staging, OpenedSegments* segments, std::chrono::milliseconds timeout,
         ClientMetrics* metrics = nullptr, SegmentLayout* layout = nullptr);

  // Runs the jobs (skipping those whose owner has failed already); sets failed[owner] for
  // every job that did not complete. `check` (may be empty) is called once with the layout
  // held, before any copy: false fails every job (a replica task's source memory, checked
  // to be this client's own segment while no unmount can take it away).
  void Run(const std::vector<Job>& jobs, std::vector<char>* failed,
           const std::function<bool()>& check = {});

  // Whether the last Run's transfers had all ended by the time their Submit returned
  // (same-host copies through memory a holder lends): then overlapping the master's next
  // lookups with the copies pays (the pipelined gets and puts).
  bool copies_inline() const { return copies_inline_.load(std::memory_order_relaxed); }

 private:
  struct Staged {
    const Job* job;
    size_t offset;  // within the job
    size_t len;
    bool device;  // the job's local memory is device memory (copied by the device backend)
  };
  struct Round {
    std::vector<TransferRequest> reqs;
    std::vector<size_t> owners;                      // per request
    std::vector<std::pair<const Staged*, char*>> staged;  // the staging memory it uses
  };

  // Copies the jobs on this client's segment, puts those in registered memory into
  // *direct, and cuts the others into *staged chunks.
  void Sort(const std::vector<Job>& jobs, std::vector<char>* failed, Round* direct,
            std::vector<Staged>* staged);
  // Adds staged chunks from *next on to *round while staging memory is free (waiting for
  // it only when the round would be empty).
  void Stage(const std::vector<Staged>& staged, size_t* next, Round* round,
             std::vector<char>* failed);
  // One engine batch; marks the owners of the requests that did not complete. Returns
  // whether the batch had ended when its Submit returned.
  bool Transfer(const Round& round, std::vector<char>* failed);
  // Copies staged reads out (a failed device copy fails its owner) and frees the round's
  // staging memory.
  void Unstage(const Round& round, std::vector<char>* failed);

  TransferEngine* const engine_;
  const std::string own_segment_;
  Registrations* const registrations_;
  Staging* const staging_;
  OpenedSegments* const segments_;
  const std::chrono::milliseconds timeout_;
  const size_t chunk_;  // staged chunk bytes; 0: no staging
  ClientMetrics* const metrics_;
  SegmentLayout* const layout_;
  std::atomic<bool> copies_inline_{false};
};

}  // namespace store
}  // namespace mooncake
