// Helpers for transport tests that move bytes between two buffers of one process through a
// Transport: one Submit of a run of slices waited for, byte patterns, and several threads
// writing and reading back their own areas at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/slice_recorder_test_util.h"
#include "engine/transport.h"

namespace mooncake::testing_util {

// `count` slices of `len` bytes at local + off + i * len <-> remote + off + i * len, as one
// Submit; true when every one completed (else *why says what happened).
inline bool SubmitAndWait(Transport& transport, const std::shared_ptr<const SegmentDesc>& peer,
                          TransferRequest::OpCode op, uint8_t* local, uint8_t* remote,
                          size_t off, size_t len, size_t count, std::string* why) {
  SliceRecorder rec;
  std::vector<Slice> slices(count);
  for (size_t i = 0; i < count; ++i) {
    Slice& s = slices[i];
    s.opcode = op;
    s.local = reinterpret_cast<uint64_t>(local) + off + i * len;
    s.remote = reinterpret_cast<uint64_t>(remote) + off + i * len;
    s.length = len;
    s.hook = &rec;
  }
  Status st = transport.Submit(peer, slices.data(), count);
  if (!st.ok()) {
    *why = st.ToString();
    return false;
  }
  if (!rec.Wait(count)) {
    *why = "not every slice was reported within 10 s";
    return false;
  }
  for (TransferStatusEnum r : rec.results()) {
    if (r != COMPLETED) {
      *why = rec.message();
      return false;
    }
  }
  return true;
}

// The bytes [off, off + n) of a buffer hold pattern `seed`.
inline void FillPattern(uint8_t* base, size_t off, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) base[off + i] = static_cast<uint8_t>((off + i) * 31 + seed);
}
// `p` (the bytes of offset `off` on) holds n bytes of pattern `seed`.
inline bool HasPattern(const uint8_t* p, size_t off, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != static_cast<uint8_t>((off + i) * 31 + seed)) return false;
  }
  return true;
}

// `threads` threads, each with its own part of `bytes`-long local and remote buffers, for
// `rounds` rounds: fill a run of 1..96 slices of 512 B..4 KiB with its own pattern, write it,
// check the remote bytes, clear the local ones, read it back, check. Returns what failed
// (empty: nothing): a reply matched to the wrong request, a slice lost, failed or completed
// twice shows as a failure or wrong bytes.
inline std::vector<std::string> RaceOwnAreas(Transport& transport,
                                             const std::shared_ptr<const SegmentDesc>& peer,
                                             uint8_t* local, uint8_t* remote, size_t bytes,
                                             int threads, int rounds) {
  std::atomic<int> failures{0};
  std::vector<std::string> whys(threads);
  std::vector<std::thread> workers;
  for (int th = 0; th < threads; ++th) {
    workers.emplace_back([&, th] {
      const size_t area = bytes / threads;
      for (int round = 0; round < rounds && failures.load() == 0; ++round) {
        const size_t len = size_t{512} << (round % 4);
        const size_t count = 1 + (round * 7 + th) % 96;
        const size_t off = th * area + (round % 4) * (area / 4);
        const uint32_t seed = th * 1000 + round;
        FillPattern(local, off, len * count, seed);
        std::string w;
        if (!SubmitAndWait(transport, peer, TransferRequest::WRITE, local, remote, off, len, count,
                           &w) ||
            !HasPattern(remote + off, off, len * count, seed)) {
          whys[th] = "write, round " + std::to_string(round) + ": " + w;
          failures.fetch_add(1);
          return;
        }
        std::memset(local + off, 0xEE, len * count);
        if (!SubmitAndWait(transport, peer, TransferRequest::READ, local, remote, off, len, count,
                           &w) ||
            !HasPattern(local + off, off, len * count, seed)) {
          whys[th] = "read, round " + std::to_string(round) + ": " + w;
          failures.fetch_add(1);
          return;
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  std::vector<std::string> failed;
  for (std::string& w : whys) {
    if (!w.empty()) failed.push_back(std::move(w));
  }
  return failed;
}

}  // namespace mooncake::testing_util
