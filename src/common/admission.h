// Admission: the one policy every server of the project applies when clients crowd it
// (issue 14, point 7; issue 28): a cap on the live connections in all and one per remote
// address, the choice of the connection to close to make room, and what was turned away,
// counted and logged at most once per 10 s (never per connection).
//
// Each server says which of its connections may be closed and how they rank (Victim's
// `rank`: the highest goes, ties to the first); the ranks are the servers' own, because what
// is cheap to lose differs: ConnServer and PollServer close the oldest connection that has
// not authenticated / is not pinned, GuardedServer the one waiting on its client from the
// address holding the most workers, RpcServer the one keeping a request pending the largest
// share of its life, else the one idle the longest.
//
// Not thread-safe: the server's own lock (or its one loop thread) guards it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace mooncake {

struct AdmissionCounters {
  uint64_t refused_full = 0;     // refused: max_connections live, none to close for it
  uint64_t refused_address = 0;  // refused: max_per_address live from its address
  uint64_t evicted = 0;          // closed to make room for a new connection
  uint64_t deadline_closed = 0;  // closed: it missed a deadline
  uint64_t thread_failures = 0;  // a thread could not be created for it
};

class Admission {
 public:
  struct Limits {
    size_t max_connections = SIZE_MAX;
    size_t max_per_address = 0;  // 0: no per-address cap
  };
  enum class Cap { kNone, kAddress, kTotal };

  // `name` begins its log lines.
  Admission(std::string name, Limits limits) : name_(std::move(name)), limits_(limits) {}

  const Limits& limits() const { return limits_; }
  // The connections counted (Add without Remove), in all and from `address`.
  void Add(const std::string& address);
  void Remove(const std::string& address);
  size_t live() const { return live_; }
  size_t live(const std::string& address) const;
  // The cap a new connection from `address` meets now: kNone when there is room.
  Cap Check(const std::string& address) const;

  // Counts one event in `which` and logs, at most once per 10 s, how many were turned away
  // since the last line, `why` (the last one) and the totals.
  void Note(uint64_t AdmissionCounters::*which, const std::string& why);
  const AdmissionCounters& counters() const { return counters_; }

  // The element of [begin, end) to close: the one whose rank(*it) (an optional of anything
  // ordered by <; nullopt: it may not be closed) is the highest, the first of equals. end
  // when none may go.
  template <class It, class RankFn>
  static It Victim(It begin, It end, RankFn rank) {
    It best = end;
    decltype(rank(*begin)) best_rank;
    for (It it = begin; it != end; ++it) {
      auto r = rank(*it);
      if (r && (!best_rank || *best_rank < *r)) {
        best = it;
        best_rank = std::move(r);
      }
    }
    return best;
  }

 private:
  const std::string name_;
  const Limits limits_;
  std::map<std::string, size_t> per_address_;
  size_t live_ = 0;
  AdmissionCounters counters_;
  std::chrono::steady_clock::time_point last_log_{};
  uint64_t unlogged_ = 0;
};

}  // namespace mooncake
