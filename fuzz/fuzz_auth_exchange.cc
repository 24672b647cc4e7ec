// Fuzzes the MCAUTHv2 exchange (common/auth.h, docs/wire_protocol.md §5) from both ends.
//
// Input: byte 0 picks the side (even: the fuzzer is the client, odd: the server) and the
// purpose; the rest is what the fuzzer's side sends, over a socketpair, to a real
// Authenticator of the other side. Oracles: nothing crashes or hangs; the real side never
// accepts (the fuzzer cannot know the MAC over a fresh random nonce), and refuses with
// PermissionDenied; Authenticator::ParseHello on the raw bytes never accepts a hello whose
// sizes do not add up.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>

#include <glog/logging.h>

#include "common/auth.h"
#include "common/net.h"
#include "fuzz_common.h"

using namespace mooncake;

namespace {

const char* const kPurposes[] = {"handshake", "tcp-data", "shm"};

void CheckParse(std::string_view bytes) {
  auto h = Authenticator::ParseHello(bytes);
  if (!h.ok()) return;
  if (h->client_nonce.size() != Authenticator::kNonce || h->mac.size() != Authenticator::kMac ||
      h->name.size() > Authenticator::kMaxName ||
      bytes.size() != Authenticator::kNonce + 2 + h->name.size() + Authenticator::kMac) {
    fuzz::Fail("ParseHello accepted an inconsistent hello of %zu bytes", bytes.size());
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::InitGoogleLogging("fuzz_auth_exchange");
  FLAGS_minloglevel = 3;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool fuzzer_is_client = (data[0] & 1) == 0;
  const char* purpose = kPurposes[(data[0] >> 1) % 3];
  std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  CheckParse(input);
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return 0;
  UniqueFd mine(fds[0]), theirs(fds[1]);
  // The fuzzer's side: send everything, half-close, drain what comes back.
  std::thread peer([&] {
    (void)WriteFull(mine.get(), input.data(), input.size(), 1000);
    ::shutdown(mine.get(), SHUT_WR);
    char sink[256];
    while (ReadFull(mine.get(), sink, 1, 1000).ok()) {
    }
  });
  Authenticator auth("fuzz-secret");
  Status s = fuzzer_is_client ? auth.Challenge(theirs.get(), purpose, {"seg"}, 500)
                              : auth.Answer(theirs.get(), purpose, "seg", 500);
  ::shutdown(theirs.get(), SHUT_RDWR);
  peer.join();
  if (s.ok()) fuzz::Fail("the %s side accepted forged bytes", fuzzer_is_client ? "server" : "client");
  if (s.code() != Status::Code::kPermissionDenied && s.code() != Status::Code::kUnavailable &&
      s.code() != Status::Code::kDeadlineExceeded) {
    fuzz::Fail("unexpected status %s", s.ToString().c_str());
  }
  return 0;
}
