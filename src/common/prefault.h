// Prefault: fault memory in before it is first used, in the background.
//
// A freshly mapped range takes a page fault per 4 KiB page on its first touch (allocation,
// zeroing and the page-table entry for shared memory; the page-table entry alone for a second
// process mapping pages already there). On a VM each fault costs microseconds, so the first
// fill of a new Store segment ran at a quarter to a tenth of the warm rate (issue 33). A
// Prefaulter job walks a range with madvise(MADV_POPULATE_WRITE) (Linux 5.14+) in chunks,
// on one process-wide thread, while the range is already in use: population changes no byte
// (it only faults pages in, as a write would without writing), so copies into the range may
// run beside it. It makes the range resident (as use would), it does not pin it (mlock): the
// kernel may still reclaim or swap it.
//
// MC_PREFAULT=0 turns it off (Start returns null). Where the kernel lacks
// MADV_POPULATE_WRITE (checked once, on one page), the first Start logs one line and every
// Start returns null. A range that cannot be populated (no access, device memory, unmapped)
// ends its job with one log line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace mooncake {

class PrefaultJob;

class Prefaulter {
 public:
  enum class Mode {
    // Every page: memory this process owns (a segment it lends, its staging buffer); pages
    // not yet there are allocated (and charged to this process, as a first write would),
    // while the machine keeps max(1 GiB, an eighth of its memory) available: past that the
    // job stops (one log line) and the rest is faulted in on use.
    kAll,
    // Only pages the memory's owner already has (mincore), mapped here without allocating
    // any: another process's memory mapped here (a peer's lent segment), which a peer must
    // not be able to make this process allocate. A pass that met pages not there yet is
    // tried again once, a second later (the owner may be prefaulting them). At most the
    // first 256 GiB of a range are walked.
    kResidentOnly,
  };
  // Queues [p, p + len) for population, after the jobs queued before it. Null when turned
  // off, when len is 0, or in a child forked from a process that had started the thread.
  static std::shared_ptr<PrefaultJob> Start(void* p, size_t len, std::string what,
                                            Mode mode = Mode::kAll);
  // Stops `job` (null is fine): returns once no chunk of it is being populated, so the range
  // may be unmapped right after. Idempotent.
  static void Cancel(const std::shared_ptr<PrefaultJob>& job);
  // Waits until `job` has ended (done, cancelled or failed); false on timeout.
  static bool WaitDone(const std::shared_ptr<PrefaultJob>& job, int timeout_ms);
  // Bytes of `job`'s current pass populated so far.
  static uint64_t Populated(const std::shared_ptr<PrefaultJob>& job);
  static bool Enabled();  // MC_PREFAULT is not 0
};

}  // namespace mooncake
