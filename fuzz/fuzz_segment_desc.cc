// Fuzzes the segment descriptor JSON (docs/wire_protocol.md §2): DecodeSegmentDesc on any
// text; whatever decodes must satisfy the documented rules and survive EncodeSegmentDesc ->
// DecodeSegmentDesc with the same content (and the encoding must be canonical: encoding the
// re-decoded descriptor gives the same bytes).
//
// Input: the descriptor text as received in a Metadata reply.
#include <cstdint>
#include <string>
#include <string_view>

#include <glog/logging.h>

#include "common/net.h"
#include "fuzz_common.h"
#include "metadata/segment_desc.h"

using namespace mooncake;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;
  FLAGS_logtostderr = true;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto d = DecodeSegmentDesc(text);
  if (!d.ok()) {
    if (d.status().code() != Status::Code::kDataLoss) {
      fuzz::Fail("DecodeSegmentDesc failed with %s, not DataLoss", d.status().ToString().c_str());
    }
    return 0;
  }
  // Documented rules of what may be accepted.
  if (d->name.empty()) fuzz::Fail("accepted an empty name");
  if (d->tcp_proto_version < 1 || d->tcp_proto_version > 1000) {
    fuzz::Fail("tcp_proto_version %d out of 1..1000", d->tcp_proto_version);
  }
  if (d->buffers.size() > kMaxDescriptorBuffers) fuzz::Fail("too many buffers accepted");
  for (const auto& b : d->buffers) {
    if (b.addr == 0 || b.length == 0 || b.addr + b.length < b.addr) {
      fuzz::Fail("accepted buffer addr=%llu length=%llu", (unsigned long long)b.addr,
                 (unsigned long long)b.length);
    }
    if (d->FindBuffer(b.addr, b.length) == nullptr) fuzz::Fail("FindBuffer misses a buffer");
    if (d->FindBuffer(b.addr, 0) != nullptr) fuzz::Fail("FindBuffer matched length 0");
  }
  if (d->FindBuffer(UINT64_MAX, 2) != nullptr) fuzz::Fail("FindBuffer matched a wrapping range");

  // Round trip.
  std::string enc = EncodeSegmentDesc(*d);
  if (enc.empty() || enc.back() != '\n') fuzz::Fail("encoding does not end in a newline");
  auto d2 = DecodeSegmentDesc(enc);
  if (!d2.ok()) {
    fuzz::Fail("re-decoding our own encoding failed: %s\nencoding: %s",
               d2.status().ToString().c_str(), enc.c_str());
  }
  if (!d->SameContent(*d2)) {
    fuzz::Fail("EncodeSegmentDesc -> DecodeSegmentDesc changed the content\ninput:    %.*s\n"
               "encoding: %s", static_cast<int>(size), text.data(), enc.c_str());
  }
  if (d->timestamp != d2->timestamp || d->rdma_server_name != d2->rdma_server_name) {
    fuzz::Fail("round trip changed timestamp or rdma_server_name");
  }
  if (EncodeSegmentDesc(*d2) != enc) fuzz::Fail("encoding is not canonical");
  // A signature covers SegmentDescSigningBytes of what the owner encoded; a verifier computes
  // it from what it decoded: the two must agree, and the signature field must stay out.
  if (SegmentDescSigningBytes(*d2) != SegmentDescSigningBytes(*d) ||
      d2->mc_auth_sig != d->mc_auth_sig || d2->mc_auth_instance != d->mc_auth_instance) {
    fuzz::Fail("the signed bytes or the auth fields changed in a round trip");
  }
  auto unsigned_copy = DecodeSegmentDesc(SegmentDescSigningBytes(*d));
  if (!unsigned_copy.ok() || !unsigned_copy->mc_auth_sig.empty()) {
    fuzz::Fail("the signed bytes do not decode, or include the signature");
  }

  // The engine derives the data host from the segment name.
  auto hp = ParseHostPort(d->name);
  if (hp.ok()) (void)hp->ToString();
  return 0;
}
