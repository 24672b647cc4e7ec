// Fuzzes the P2P handshake framing (docs/wire_protocol.md §1): DecodeHandshakeFrame,
// DecodeHandshakeBody, ReadHandshakeFrame (over a socketpair) and, for Notify frames, the
// payload parsing the engine does (ParseJsonBounded + GetString on "name"/"notify_msg").
//
// Input: byte 0 picks the length limit (kLimits[b % 8]); the rest is the frame as it would
// arrive on the socket (u64 LE length, type byte, payload).
#include <endian.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include <glog/logging.h>

#include "fuzz_common.h"
#include "metadata/handshake.h"
#include "metadata/json_util.h"

using namespace mooncake;

namespace {

constexpr size_t kLimits[8] = {1 << 20, 1, 2, 9, 64, 4096, 65536, 128u << 20};

// Depth of a parsed JSON value: [] and {} count one level, scalars none.
int Depth(const nlohmann::json& j) {
  if (!j.is_structured()) return 0;
  int d = 0;
  for (const auto& v : j) d = std::max(d, Depth(v));
  return d + 1;
}

void CheckNotifyPayload(const std::string& payload) {
  auto parsed = ParseJsonBounded(payload, "notify");
  if (!parsed.ok()) {
    if (parsed.status().code() != Status::Code::kDataLoss) fuzz::Fail("ParseJsonBounded: not DataLoss");
    return;
  }
  if (Depth(*parsed) > kMaxJsonDepth) {
    fuzz::Fail("ParseJsonBounded accepted JSON nested %d deep (limit %d)", Depth(*parsed),
               kMaxJsonDepth);
  }
  // As TransferEngine::Impl::HandleHandshake does. Must not throw.
  if (!parsed->is_object()) return;
  std::string name = "unchanged", msg = "unchanged";
  Status a = GetString(*parsed, "name", false, &name);
  Status b = GetString(*parsed, "notify_msg", false, &msg);
  auto check = [&](const char* key, const Status& s, const std::string& got) {
    auto it = parsed->find(key);
    if (it == parsed->end()) {
      if (!s.ok() || got != "unchanged") fuzz::Fail("GetString(%s) on a missing key", key);
    } else if (it->is_string()) {
      if (!s.ok() || got != it->get<std::string>()) fuzz::Fail("GetString(%s) wrong value", key);
    } else if (s.ok()) {
      fuzz::Fail("GetString(%s) accepted a non-string", key);
    }
  };
  check("name", a, name);
  check("notify_msg", b, msg);
  // The sender's side: the reply check of SendNotifyTo.
  std::string dumped = parsed->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  auto again = ParseJsonBounded(dumped, "notify");
  if (!again.ok() || *again != *parsed) fuzz::Fail("notify JSON does not survive dump/parse");
}

// What DecodeHandshakeBody must return, from the spec.
void CheckBody(std::string_view body, const Result<HandshakeFrame>& got) {
  if (body.empty()) {
    if (got.ok()) fuzz::Fail("empty body accepted");
    return;
  }
  uint8_t first = static_cast<uint8_t>(body[0]);
  if (first == 0xfe || first == 0xff) {
    if (got.ok()) fuzz::Fail("reserved type byte 0x%02x accepted", first);
    return;
  }
  if (!got.ok()) fuzz::Fail("valid body rejected: %s", got.status().ToString().c_str());
  if (first > 3) {
    if (!got->legacy || got->type != HandshakeType::kConnection || got->payload != body) {
      fuzz::Fail("legacy body decoded wrongly");
    }
  } else {
    if (got->legacy || static_cast<uint8_t>(got->type) != first ||
        got->payload != body.substr(1)) {
      fuzz::Fail("typed body decoded wrongly");
    }
  }
}

bool SameFrame(const Result<HandshakeFrame>& a, const Result<HandshakeFrame>& b) {
  if (a.ok() != b.ok()) return false;
  if (!a.ok()) return true;
  return a->type == b->type && a->legacy == b->legacy && a->payload == b->payload;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;  // the code under test logs every refusal
  FLAGS_logtostderr = true;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t max_length = kLimits[data[0] % 8];
  std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);

  auto frame = DecodeHandshakeFrame(bytes, max_length);

  // The spec of DecodeHandshakeFrame in terms of the prefix and DecodeHandshakeBody.
  uint64_t len = 0;
  bool prefix = bytes.size() >= 8;
  if (prefix) {
    std::memcpy(&len, bytes.data(), 8);
    len = le64toh(len);
  }
  bool length_ok = prefix && len != 0 && len <= max_length;
  bool complete = length_ok && bytes.size() - 8 >= len;
  if (!complete) {
    if (frame.ok()) fuzz::Fail("DecodeHandshakeFrame accepted a short or over-long frame");
    if (frame.status().code() != Status::Code::kDataLoss) fuzz::Fail("DecodeHandshakeFrame: not DataLoss");
    if (prefix && CheckHandshakeLength(len, max_length).ok() != length_ok) {
      fuzz::Fail("CheckHandshakeLength disagrees with the spec");
    }
  } else {
    std::string_view body = bytes.substr(8, len);
    CheckBody(body, frame);
    auto body_only = DecodeHandshakeBody(body);
    if (!SameFrame(frame, body_only)) fuzz::Fail("frame and body decoding disagree");
    if (frame.ok() && !frame->legacy) {
      // Re-encoding gives the same bytes back.
      std::string enc = EncodeHandshakeFrame(frame->type, frame->payload);
      if (enc != bytes.substr(0, 8 + len)) fuzz::Fail("EncodeHandshakeFrame does not round-trip");
    }
  }
  if (frame.ok()) {
    if (frame->type == HandshakeType::kNotify || frame->legacy) CheckNotifyPayload(frame->payload);
    HandshakeTypeName(frame->type);
  } else if (bytes.size() > 9) {
    // Also parse the raw tail as a notify payload: reaches JSON paths without a valid prefix.
    CheckNotifyPayload(std::string(bytes.substr(9)));
  }

  // The socket reader must agree with the buffer decoder (limits up to 1 MiB: it allocates
  // the announced length).
  if (max_length <= (1u << 20) && bytes.size() <= 65536) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) fuzz::Fail("socketpair");
    if (!bytes.empty() &&
        ::send(sv[0], bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
      fuzz::Fail("socketpair send");
    }
    ::shutdown(sv[0], SHUT_WR);
    auto read = ReadHandshakeFrame(sv[1], max_length, 1000);
    if (!SameFrame(frame, read)) {
      fuzz::Fail("ReadHandshakeFrame (%s) and DecodeHandshakeFrame (%s) disagree",
                 read.ok() ? "ok" : read.status().ToString().c_str(),
                 frame.ok() ? "ok" : frame.status().ToString().c_str());
    }
    ::close(sv[0]);
    ::close(sv[1]);
  }
  return 0;
}
