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
  if (Export(b) != first) Fail("a checkpoint did not round-trip");

  // Promotion: refused on overlaps, else placements hold and new puts avoid them.
  auto promoted = a.Promote();
  if (!promoted.ok()) {
    if (!promoted.IsFailedPrecondition()) Fail("Promote failed other than FailedPrecondition");
    return 0;
  }
  struct Span {
    uint64_t off, size;
  };
  std::map<uint32_t, std::string> names;             // segment id -> name (MOUNT entries)
  std::map<std::string, std::vector<Span>> held;     // segment name -> placements held
  std::vector<oplog::Entry> entries(first.size());
  for (size_t i = 0; i < first.size(); ++i) entries[i].ParseFromString(first[i]);
  for (const auto& e : entries) {
    if (e.kind() == oplog::Entry::MOUNT) names[e.segment_id()] = e.segment_name();
  }
  for (const auto& e : entries) {
    for (const auto& p : e.object().replicas()) {
      auto n = names.find(p.segment_id());
      if (n != names.end()) held[n->second].push_back({p.offset(), e.object().size()});
    }
  }
  size_t total = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> segs;  // name -> base, size
  for (const auto& v : a.ListSegments(1000, &total)) segs[v.name] = {v.base, v.size};
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
        const uint64_t off = rep.buffer().addr() - it->second.first;
        const uint64_t len = rep.buffer().size();
        if (off + len > it->second.second || off > it->second.second) {
          Fail("a new put lies outside its segment");
        }
        for (const Span& h : held[name]) {
          if (off < h.off + h.size && h.off < off + len) {
            Fail("a new put overlaps a placement the log holds");
          }
        }
        held[name].push_back({off, len});
      }
    }
  }
  const auto sum = a.GetSummary();
  if (sum.allocated > sum.capacity) Fail("allocated > capacity after promotion");
  return 0;
}
