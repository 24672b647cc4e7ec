// The same-host protocol after the hello (src/transport/shm/shm_wire.h, docs in
// src/transport/shm/README.md), written from the wire header and the README, not from the
// server: given the messages fuzz_shm_server sends (with their descriptors) and the memory
// of both sides, what the target must reply and what the memory must look like afterwards.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "transport/shm/shm_wire.h"

namespace fuzz {

namespace shm = mooncake::shm;

inline Arena g_shm_arena;

template <typename T>
void Append(std::string* s, const T& v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Mapping caps the harness gives the server (EngineOptions::shm_max_map_*).
constexpr uint64_t kShmMapCapPerConn = 256 << 20;
constexpr uint64_t kShmMapCapTotal = 512 << 20;

// Initiator addresses handed to process_vm_* must stay inside [guard][scratch][guard][slots][guard].
inline uint64_t WindowBegin() { return g_shm_arena.scratch_addr() - Arena::kGuard; }
inline uint64_t WindowEnd() {
  return g_shm_arena.slot_addr(0) + Arena::kSlots * Arena::kSlotStride + Arena::kGuard;
}

// What a map range's descriptor is.
enum class FdKind { kMemfd, kPipe, kUnsealed, kHuge, kFile, kEventfd };

// Initiator-side memory of one input: the scratch area and the memfds mapped at the slots.
struct Memfd {
  FdKind kind = FdKind::kMemfd;
  int fd = -1;  // what is attached (for a pipe: its read end)
  int pipe_fd[2] = {-1, -1};
  uint64_t size = 0;
  int slot = -1;  // kMemfd only: mapped here at this slot
};

// Descriptors attached to the stream byte at `offset`: memfds (indices into Input::memfds)
// first, then `extra` copies of a pipe's read end.
struct Attachment {
  size_t offset;
  std::vector<int> memfds;
  size_t extra = 0;
};

struct Input {
  uint8_t hello_mode = 0;
  std::string hello_raw;     // mode 7: the whole HelloRequest
  uint32_t hello_magic = 0;  // mode 4
  uint64_t proof_addr = 0;   // mode 6
  size_t cut = SIZE_MAX;     // of hello + messages
  std::string stream;        // the messages after the hello
  std::vector<Attachment> attach;
  std::vector<Memfd> memfds;
  int extra_pipe[2] = {-1, -1};
  ~Input() {
    for (Memfd& m : memfds) {
      if (m.slot >= 0) {
        void* p = ::mmap(g_shm_arena.slot(m.slot), Arena::kSlotSize, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (p == MAP_FAILED) Fail("restoring slot %d: %s", m.slot, std::strerror(errno));
      }
      if (m.fd >= 0 && m.kind != FdKind::kPipe) ::close(m.fd);
      for (int f : m.pipe_fd) {
        if (f >= 0) ::close(f);
      }
    }
    for (int f : extra_pipe) {
      if (f >= 0) ::close(f);
    }
  }
};

// Memory model: a value per byte, or "unknown" after a copy that failed part-way.
struct Mem {
  uint64_t addr = 0;  // where it is mapped in this process
  std::vector<uint8_t> val, unk;
  void Load(const uint8_t* p, size_t n) {
    addr = reinterpret_cast<uint64_t>(p);
    val.assign(p, p + n);
    unk.assign(n, 0);
  }
  bool Holds(uint64_t a, uint64_t len) const {
    return len > 0 && a >= addr && len <= val.size() && a - addr <= val.size() - len;
  }
  void MarkUnknown(uint64_t a, uint64_t len) {  // the part of [a, a+len) inside this memory
    uint64_t end = a + len < a ? UINT64_MAX : a + len;
    uint64_t lo = std::max(a, addr), hi = std::min<uint64_t>(end, addr + val.size());
    if (lo < hi) std::memset(unk.data() + (lo - addr), 1, hi - lo);
  }
  void Check(const uint8_t* p, const char* what) const {
    if (std::memcmp(p, val.data(), val.size()) == 0) return;
    for (size_t i = 0; i < val.size(); ++i) {
      if (!unk[i] && p[i] != val[i]) {
        Fail("ShmServer: %s differs from the model at offset %zu (0x%02x, expected 0x%02x)",
             what, i, p[i], val[i]);
      }
    }
  }
};

inline void Copy(Mem& dst, uint64_t d, const Mem& src, uint64_t s, uint64_t len) {
  std::memcpy(dst.val.data() + (d - dst.addr), src.val.data() + (s - src.addr), len);
  std::memcpy(dst.unk.data() + (d - dst.addr), src.unk.data() + (s - src.addr), len);
}

struct ShmExpectation {
  std::string full;  // exact expected reply bytes to the messages
  Mem target;
  std::vector<Mem> initiator;  // [0]: scratch; [1 + k]: memfd k (if it is mapped here)
  bool sigbus = false;         // the server will copy beyond the end of a memfd
  bool dropped = false;        // the server closes for the descriptors it was sent
  size_t maps = 0, copies = 0, refused_maps = 0;
};

inline bool InRemote(uint64_t a, uint64_t len) {
  uint64_t b = g_shm_arena.remote_addr();
  return len > 0 && a + len >= a && a >= b && a + len <= b + Arena::kRemoteSize;
}

// What the server must do with the messages of `in` after an accepted hello. With
// `sanitize`, also rewrites initiator addresses the server would pass to process_vm_* outside
// the window (see the top of fuzz_shm_server.cc).
inline ShmExpectation Model(Input* in, bool sanitize) {
  ShmExpectation e;
  std::string& s = in->stream;
  e.target.Load(g_shm_arena.remote(), Arena::kRemoteSize);
  e.initiator.resize(1 + in->memfds.size());
  e.initiator[0].Load(g_shm_arena.scratch(), Arena::kScratchSize);
  for (size_t k = 0; k < in->memfds.size(); ++k) {
    if (in->memfds[k].slot >= 0) {
      e.initiator[1 + k].Load(g_shm_arena.slot(in->memfds[k].slot), in->memfds[k].size);
    }
  }
  // Descriptors ride on stream bytes. Those on a header's bytes come with the header
  // (recvmsg); those on any other byte are read with plain recv, and the kernel drops them.
  size_t next_attach = 0;
  auto take_fds = [&](size_t from, size_t to, std::vector<int>* got, size_t* extra) {
    while (next_attach < in->attach.size() && in->attach[next_attach].offset < from) ++next_attach;
    while (next_attach < in->attach.size() && in->attach[next_attach].offset < to) {
      if (got) {
        for (int k : in->attach[next_attach].memfds) got->push_back(k);
        *extra += in->attach[next_attach].extra;
      }
      ++next_attach;
    }
  };
  struct Map {
    uint64_t addr, length;
    int k;
  };
  std::vector<Map> maps;
  auto translate = [&](uint64_t a, uint64_t len) -> const Map* {
    for (const Map& m : maps) {
      if (a >= m.addr && len <= m.length && a - m.addr <= m.length - len) return &m;
    }
    return nullptr;
  };

  size_t pos = 0;
  while (s.size() - pos >= sizeof(shm::RequestHeader)) {
    shm::RequestHeader h;
    std::memcpy(&h, s.data() + pos, sizeof(h));
    std::vector<int> fds;
    size_t extra = 0;
    take_fds(pos, pos + sizeof(h), &fds, &extra);
    pos += sizeof(h);
    // More than a map message may carry, or descriptors on another message: closed.
    if (fds.size() + extra > shm::kMaxSharedRanges ||
        (fds.size() + extra > 0 && h.magic != shm::kMapMagic)) {
      e.dropped = true;
      break;
    }
    if (h.magic == shm::kMapMagic && h.count <= shm::kMaxSharedRanges) {
      // The old set goes in every case; the new one only if every range passes.
      maps.clear();
      size_t need = size_t{h.count} * sizeof(shm::SharedRange);
      take_fds(pos, pos + std::min(need, s.size() - pos), nullptr, nullptr);
      if (s.size() - pos < need) break;  // EOF inside the ranges: no reply
      shm::MapReply rh;
      rh.seq = h.seq;
      std::vector<Map> fresh;
      if (fds.size() + extra != h.count) rh.status = shm::kMapBadDescriptors;
      uint64_t total = 0;
      for (uint32_t i = 0; rh.status == shm::kMapOk && i < h.count; ++i) {
        shm::SharedRange sr;
        std::memcpy(&sr, s.data() + pos + i * sizeof(sr), sizeof(sr));
        // (Past the memfds come the extra pipe ends.)
        const Memfd* m = i < fds.size() ? &in->memfds[fds[i]] : nullptr;
        bool sealed = m && (m->kind == FdKind::kMemfd || m->kind == FdKind::kHuge);
        if (!sealed || sr.length == 0 || sr.length > m->size) {
          rh.status = shm::kMapBadRange;  // SIGBUS otherwise, or not shareable memory
          rh.detail = i;
        } else if (sr.length > kShmMapCapPerConn - total) {
          rh.status = shm::kMapOverCap;
          rh.detail = i;
        } else {
          total += sr.length;
          fresh.push_back({sr.addr, sr.length, fds[i]});  // (i < fds.size(): sealed)
        }
      }
      pos += need;
      if (rh.status == shm::kMapOk) {
        maps = fresh;
      } else {
        ++e.refused_maps;
      }
      rh.count = static_cast<uint32_t>(maps.size());
      Append(&e.full, rh);
      e.maps += maps.size();
      continue;
    }
    if (h.magic == shm::kExportMagic && h.count == 0) {
      // An export request: the harness's registry has no memfd-backed memory to lend, so an
      // empty loan (no descriptors), and the connection goes on.
      shm::ExportReply er;
      er.seq = h.seq;
      Append(&e.full, er);
      continue;
    }
    if (h.magic != shm::kMagic || h.count == 0 || h.count > shm::kMaxItems) break;
    size_t need = size_t{h.count} * sizeof(shm::Item);
    take_fds(pos, pos + std::min(need, s.size() - pos), nullptr, nullptr);
    if (s.size() - pos < need) break;
    shm::ReplyHeader rh;
    rh.count = h.count;
    rh.seq = h.seq;
    Append(&e.full, rh);
    std::vector<shm::Item> items(h.count);
    std::vector<uint32_t> st(h.count, shm::kOk);
    std::vector<const Map*> via(h.count, nullptr);
    for (uint32_t i = 0; i < h.count; ++i) {
      size_t at = pos + i * sizeof(shm::Item);
      std::memcpy(&items[i], s.data() + at, sizeof(shm::Item));
      shm::Item& it = items[i];
      via[i] = translate(it.initiator_addr, it.length);
      if (via[i] == nullptr && sanitize &&
          !(it.initiator_addr >= WindowBegin() && it.initiator_addr <= WindowEnd() &&
            it.length <= WindowEnd() - it.initiator_addr)) {
        it.initiator_addr = WindowBegin();  // (also for items to be rejected: belt and braces)
        std::memcpy(s.data() + at, &it, sizeof(it));
        via[i] = translate(it.initiator_addr, it.length);
      }
      if (it.op > 1 || !InRemote(it.target_addr, it.length)) st[i] = shm::kRejected;
    }
    pos += need;
    // Pass 1: items in an announced mapping, memcpy through the server's mapping.
    for (uint32_t i = 0; i < h.count; ++i) {
      if (st[i] != shm::kOk || via[i] == nullptr) continue;
      const shm::Item& it = items[i];
      const Memfd& m = in->memfds[via[i]->k];
      uint64_t off = it.initiator_addr - via[i]->addr;
      if (off + it.length > m.size) {  // past the end of the memfd: SIGBUS in the server
        e.sigbus = true;
        continue;
      }
      Mem& mem = e.initiator[1 + via[i]->k];
      uint64_t here = mem.addr + off;  // the same bytes, through our mapping
      if (it.op == 1) {
        Copy(e.target, it.target_addr, mem, here, it.length);
      } else {
        Copy(mem, here, e.target, it.target_addr, it.length);
      }
      ++e.copies;
    }
    // Pass 2: the rest through process_vm_readv/writev at the initiator's addresses.
    for (uint32_t i = 0; i < h.count; ++i) {
      if (st[i] != shm::kOk || via[i] != nullptr) continue;
      const shm::Item& it = items[i];
      Mem* mem = nullptr;
      for (Mem& m : e.initiator) {
        if (!m.val.empty() && m.Holds(it.initiator_addr, it.length)) mem = &m;
      }
      if (mem) {
        if (it.op == 1) {
          Copy(e.target, it.target_addr, *mem, it.initiator_addr, it.length);
        } else {
          Copy(*mem, it.initiator_addr, e.target, it.target_addr, it.length);
        }
        ++e.copies;
      } else {
        st[i] = shm::kCopyFailed;  // part of the range faults; the rest may have been copied
        if (it.op == 1) {
          e.target.MarkUnknown(it.target_addr, it.length);
        } else {
          for (Mem& m : e.initiator) m.MarkUnknown(it.initiator_addr, it.length);
        }
      }
    }
    for (uint32_t v : st) Append(&e.full, v);
  }
  return e;
}

}  // namespace fuzz
