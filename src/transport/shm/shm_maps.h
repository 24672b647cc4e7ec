// One same-host connection's received descriptors and mapped shareable memory, within the
// target's limits: descriptors only on map messages, at most kMaxSharedRanges per message
// header and a server-wide number held at once; mapped bytes capped per connection and in
// total. See README.md in this folder.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mooncake/status.h"
#include "transport/shm/shm_wire.h"

namespace mooncake::shm {

// Limits and counters shared by the connections of one ShmServer.
struct ShmLimits {
  uint64_t max_map_per_conn = 0;
  uint64_t max_map_total = 0;
  size_t max_held_fds = 0;  // descriptors of messages not yet complete, all connections
  std::atomic<uint64_t> mapped{0};
  std::atomic<size_t> held_fds{0};
  std::atomic<uint64_t> maps_refused{0};      // announcements refused (any reason)
  std::atomic<uint64_t> dropped_for_fds{0};   // connections closed for their descriptors
};

class ConnMaps {
 public:
  explicit ConnMaps(ShmLimits* limits) : limits_(limits) {}
  ~ConnMaps();  // unmaps everything, closes what it holds
  ConnMaps(const ConnMaps&) = delete;
  ConnMaps& operator=(const ConnMaps&) = delete;

  // Reads one message header, taking the descriptors that come with it. Waits without a
  // deadline for the first byte, then up to `timeout_ms`. Fails (the caller closes the
  // connection) on EOF, I/O errors, more than kMaxSharedRanges descriptors before the header
  // is complete, or descriptors on a header that is not a map message's. Descriptors over
  // the server-wide budget are closed at once (the announcement is then refused).
  Status RecvHeader(int fd, RequestHeader* h, int timeout_ms);
  // After a map header: reads the `count` ranges and replaces the mapped set with them
  // (the old set goes in every case). *reply says what was mapped; *refusal the reason a
  // set was refused. Non-OK: the socket failed.
  Status Map(int fd, uint32_t count, int timeout_ms, MapReply* reply, std::string* refusal);
  // The local pointer for the initiator's [addr, addr+len) if it lies in a mapped range.
  uint8_t* Translate(uint64_t addr, uint64_t len) const;
  bool empty() const { return maps_.empty(); }

 private:
  struct Mapped {
    uint64_t addr;
    uint64_t length;
    uint8_t* ptr;
  };
  void CloseFds();
  void UnmapAll();

  ShmLimits* const limits_;
  std::vector<int> fds_;
  std::vector<Mapped> maps_;
  uint64_t mapped_bytes_ = 0;
  bool fds_refused_ = false;  // this header's descriptors were closed (budget, EMFILE)
};

}  // namespace mooncake::shm
