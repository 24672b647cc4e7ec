// Fuzz target: what a standby reads from etcd (src/store/ha): a stored batch value decoded
// (DecodeBatch: CRC, parse, id) and its entries applied to a standby MasterService, then the
// promotion. The input is the batch's protobuf bytes (the CRC is computed here, so the
// fuzzer reaches the parse and the apply; a few inputs also get a wrong CRC or id).
//
// Oracles, beyond "no crash, no sanitizer report":
// - EncodeBatch -> DecodeBatch gives the batch back; a flipped CRC byte or another id is
//   refused with DataLoss;
// - the standby's state exported (ExportState: a checkpoint's entries) and applied to a fresh
//   standby exports the same again (a checkpoint round-trips whatever the log held);
// - Promote either refuses (FailedPrecondition: overlapping placements) or succeeds, and then
//   new puts never overlap a placement the state holds, and allocated <= capacity.
#include <glog/logging.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "store/ha/oplog_codec.h"
#include "store/master/master_service.h"

namespace {

using mooncake::store::MasterConfig;
using mooncake::store::MasterService;
namespace oplog = mooncake::store::oplog;
namespace rpc = mooncake::store::rpc;
namespace ha = mooncake::store::ha;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "\n*** FUZZ ORACLE FAILURE: %s\n", what.c_str());
  std::abort();
}

MasterConfig Standby() {
  MasterConfig c;
  c.standby = true;
  return c;
}

std::vector<std::string> Export(const MasterService& m) {
  std::vector<std::string> out;
  m.ExportState([&](oplog::Entry&& e) { out.push_back(e.SerializeAsString()); });
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  oplog::Batch batch;
  if (!batch.ParseFromArray(data, static_cast<int>(size)) || batch.entries_size() > 4096) return 0;
  const uint64_t id = batch.batch_id();
  const std::string value = ha::EncodeBatch(batch);
  auto back = ha::DecodeBatch(value, id);
  const bool valid_shape = id != 0 && batch.first_seq() != 0 && batch.entries_size() > 0;
  if (back.ok() != valid_shape) Fail("DecodeBatch accepted a batch of a bad shape, or refused a good one");
  if (back.ok() && back->SerializeAsString() != batch.SerializeAsString()) {
    Fail("EncodeBatch -> DecodeBatch changed the batch");
  }
  if (!value.empty()) {
    std::string bad = value;
    bad[size % bad.size()] ^= 0x01;
    if (ha::DecodeBatch(bad, id).ok()) Fail("a flipped byte passed the CRC");
    if (ha::DecodeBatch(value, id + 1).ok()) Fail("a batch was accepted under another id");
  }

  MasterService a(Standby());
  for (const oplog::Entry& e : batch.entries()) (void)a.Apply(e);  // a refusal is fine
  const std::vector<std::string> first = Export(a);
  MasterService b(Standby());
  for (const std::string& s : first) {
    oplog::Entry e;
    e.ParseFromString(s);
    if (!b.Apply(e).ok()) Fail("a checkpoint entry was refused by a fresh standby");
  }
  // The same entries: the tables are hashed, so their order may differ between the two.
  std::vector<std::string> again = Export(b), sorted_first = first;
  std::sort(again.begin(), again.end());
  std::sort(sorted_first.begin(), sorted_first.end());
  if (again != sorted_first) Fail("a checkpoint did not round-trip");

  // Promotion: refused on overlaps, else placements hold and new puts avoid them.
  auto promoted = a.Promote();
  if (!promoted.ok()) {
    if (!promoted.IsFailedPrecondition()) Fail("Promote failed other than FailedPrecondition");
    return 0;
  }
  // Spans in absolute addresses: a client may mount several segments under one name (each
  // its own range of its address space), and a reply names only the segment and the address.
  struct Span {
    uint64_t addr, size;
  };
  std::map<uint32_t, std::pair<std::string, uint64_t>> mounts;  // id -> name, base (MOUNTs)
  std::map<std::string, std::vector<Span>> held;  // segment name -> placements held
  std::vector<oplog::Entry> entries(first.size());
  for (size_t i = 0; i < first.size(); ++i) entries[i].ParseFromString(first[i]);
  for (const auto& e : entries) {
    if (e.kind() == oplog::Entry::MOUNT) mounts[e.segment_id()] = {e.segment_name(), e.base()};
  }
  for (const auto& e : entries) {
    for (const auto& p : e.object().replicas()) {
      auto m = mounts.find(p.segment_id());
      if (m != mounts.end()) {
        held[m->second.first].push_back({m->second.second + p.offset(), e.object().size()});
      }
    }
  }
  size_t total = 0;
  std::map<std::string, std::vector<Span>> segs;  // name -> the ranges mounted under it
  for (const auto& v : a.ListSegments(1000, &total)) segs[v.name].push_back({v.base, v.size});
  auto overlaps = [](const Span& x, const Span& y) {
    return x.addr < y.addr + y.size && y.addr < x.addr + x.size;
  };
  for (int i = 0; i < 8; ++i) {
    rpc::PutStartRequest req;
    req.set_client_id("fuzz");
    auto* item = req.add_items();
    item->set_key("new-" + std::to_string(i));
    item->set_size(4096u << (i % 6));
    auto resp = a.PutStart(req);
    for (const auto& r : resp.results()) {
      for (const auto& rep : r.replicas()) {
        const std::string& name = rep.buffer().segment_name();
        const auto it = segs.find(name);
        if (it == segs.end()) Fail("a new put is on a segment not mounted");
        const Span put{rep.buffer().addr(), rep.buffer().size()};
        bool inside = false, ambiguous = false;
        for (size_t k = 0; k < it->second.size(); ++k) {
          const Span& g = it->second[k];
          if (put.addr >= g.addr && put.addr - g.addr <= g.size && put.size <= g.size - (put.addr - g.addr)) {
            inside = true;
          }
          for (size_t j = 0; j < k; ++j) ambiguous |= overlaps(g, it->second[j]);
        }
        if (!inside) Fail("a new put lies outside the segments of its name");
        // Two ranges of one name that overlap (a mount beside a draining one, which the log
        // may hold): which one a placement belongs to is not in the reply; not checked.
        if (ambiguous) continue;
        for (const Span& h : held[name]) {
          if (overlaps(put, h)) Fail("a new put overlaps a placement the log holds");
        }
        held[name].push_back(put);
      }
    }
  }
  const auto sum = a.GetSummary();
  if (sum.allocated > sum.capacity) Fail("allocated > capacity after promotion");
  return 0;
}
