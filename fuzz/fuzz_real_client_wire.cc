// Fuzzes the dummy-client protocol of the real client (src/store/real_client/real_client_wire.h): the
// config line a dummy decodes (DecodeConfig, on the line cut as DummyClient's Join cuts it),
// EncodeConfig of arbitrary field bytes, and a real RealClientServer on loopback TCP fed
// arbitrary bytes on one to four connections at once.
//
// Input format: byte 0 % 3 picks the mode.
//   0 - the rest is what a real client sent a dummy: the dummy takes it up to the first '\n'
//       (none: it would wait for more; refused past kMaxConfigBytes) and decodes it.
//       Checked: an accepted config has a non-empty master, metadata server and host; it
//       re-encodes to one line no longer than the line it came from (so it fits
//       kMaxConfigBytes again) that decodes to the same config; a refusal is DataLoss.
//   1 - six fields (a byte n, then n bytes each): EncodeConfig must not throw, gives one
//       line ending in '\n' that decodes exactly when the three required fields are
//       non-empty, and back to the same fields when they are valid UTF-8.
//   2 - byte 1 % 4 + 1 connections; each but the last takes a u16 length (LE) and that many
//       bytes, the last the rest. All connect, send, shut down their write side and read
//       until the server closes. Checked per connection, from real_client_wire.h: the server
//       answers exactly when the bytes start with the hello "MOONCAKE-DUMMY 1\n", with the
//       config line (which decodes to the server's config) then heartbeats ('\n') only, and
//       sends nothing otherwise; refused() counts each connection that sent bytes and was
//       not a dummy, unless it sent at most kMaxHelloBytes bytes with no '\n' (it closed
//       before the server could judge); dummies() is back to 0 once all are closed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "store/real_client/real_client_server.h"
#include "store/real_client/real_client_wire.h"

namespace {

using mooncake::store::DecodeConfig;
using mooncake::store::EncodeConfig;
using mooncake::store::kDummyHello;
using mooncake::store::kMaxConfigBytes;
using mooncake::store::kMaxHelloBytes;
using mooncake::store::RealClientConfig;
using mooncake::store::RealClientServer;

bool Same(const RealClientConfig& a, const RealClientConfig& b) {
  return a.master_server_address == b.master_server_address &&
         a.metadata_server == b.metadata_server && a.protocol == b.protocol &&
         a.device_names == b.device_names && a.host == b.host && a.segment_name == b.segment_name;
}

// The server's config: quotes, backslashes, a control byte and UTF-8, so that its line has
// escapes for the dummy to undo.
RealClientConfig ServerConfig() {
  RealClientConfig c;
  c.master_server_address = "127.0.0.1:50051";
  c.metadata_server = "http://127.0.0.1:8080/metadata";
  c.protocol = "tcp";
  c.device_names = "";
  c.host = "h\"\\\x01\xc3\xa9";
  c.segment_name = "h\"\\\x01\xc3\xa9:12345";
  return c;
}

RealClientServer* g_server = nullptr;

void CheckAccepted(const RealClientConfig& c, const std::string& line, const char* who) {
  if (c.master_server_address.empty() || c.metadata_server.empty() || c.host.empty()) {
    fuzz::Fail("%s: DecodeConfig accepted an empty master, metadata server or host", who);
  }
  const std::string again = EncodeConfig(c);
  if (again.empty() || again.back() != '\n' || again.find('\n') != again.size() - 1) {
    fuzz::Fail("%s: EncodeConfig is not one line ending in a newline", who);
  }
  if (again.size() > line.size() + 1) {
    fuzz::Fail("%s: a decoded config re-encodes longer (%zu) than its line (%zu) + 1", who,
               again.size(), line.size());
  }
  auto back = DecodeConfig(again.substr(0, again.size() - 1));
  if (!back.ok()) fuzz::Fail("%s: EncodeConfig's line does not decode", who);
  if (!Same(back.value(), c)) fuzz::Fail("%s: Encode -> Decode changed the config", who);
}

// What a dummy does with the bytes a real client sent (dummy_client.cc, Join).
void DummySide(const std::string& bytes) {
  const size_t nl = bytes.find('\n');
  if (nl == std::string::npos) return;  // the dummy would wait (and refuse past 4 KiB)
  const std::string line = bytes.substr(0, nl);
  auto c = DecodeConfig(line);
  if (!c.ok()) {
    if (!(c.status().code() == mooncake::Status::Code::kDataLoss)) fuzz::Fail("DecodeConfig refused with a non-DataLoss status");
    return;
  }
  if (line.size() > kMaxConfigBytes) fuzz::Fail("DecodeConfig accepted a line over 4 KiB");
  CheckAccepted(c.value(), line, "DecodeConfig");
}

// Every field valid UTF-8 (else EncodeConfig replaces the bad bytes).
bool Utf8(const RealClientConfig& c) {
  for (const std::string* f : {&c.master_server_address, &c.metadata_server, &c.protocol,
                               &c.device_names, &c.host, &c.segment_name}) {
    try {
      (void)nlohmann::json(*f).dump();
    } catch (const std::exception&) {
      return false;
    }
  }
  return true;
}

void EncodeSide(fuzz::Reader& in) {
  RealClientConfig c;
  std::string* fields[] = {&c.master_server_address, &c.metadata_server, &c.protocol,
                           &c.device_names, &c.host, &c.segment_name};
  for (std::string* f : fields) *f = in.Bytes(in.U8());
  std::string line;
  try {
    line = EncodeConfig(c);
  } catch (const std::exception& e) {
    fuzz::Fail("EncodeConfig threw: %s", e.what());
  }
  if (line.empty() || line.back() != '\n' || line.find('\n') != line.size() - 1) {
    fuzz::Fail("EncodeConfig is not one line ending in a newline");
  }
  auto back = DecodeConfig(line.substr(0, line.size() - 1));
  const bool complete =
      !c.master_server_address.empty() && !c.metadata_server.empty() && !c.host.empty();
  if (line.size() - 1 > kMaxConfigBytes) return;  // refused for its length: fine
  if (complete != back.ok()) {
    fuzz::Fail("EncodeConfig's line %s decode", complete ? "does not" : "does");
  }
  if (back.ok() && Utf8(c) && !Same(back.value(), c)) {
    fuzz::Fail("Encode -> Decode changed a config that is valid UTF-8");
  }
}

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fuzz::Fail("socket: %s", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!fuzz::Connect(fd, &a, sizeof(a))) {
    fuzz::Fail("connect: %s", std::strerror(errno));
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

void ServerSide(fuzz::Reader& in) {
  const size_t n = in.U8() % 4 + 1;
  std::vector<std::string> streams;
  for (size_t i = 0; i + 1 < n; ++i) streams.push_back(in.Bytes(in.U16()));
  streams.push_back(in.Rest());
  const uint64_t refused_before = g_server->refused();
  std::vector<int> fds;
  for (size_t i = 0; i < n; ++i) fds.push_back(Connect(g_server->port()));
  // Everything first (small: it fits the socket buffers), then each reply to EOF.
  for (size_t i = 0; i < n; ++i) {
    size_t sent = 0;
    while (sent < streams[i].size()) {
      ssize_t w = ::send(fds[i], streams[i].data() + sent, streams[i].size() - sent,
                         MSG_NOSIGNAL);
      if (w > 0) {
        sent += static_cast<size_t>(w);
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        break;  // the server closed already (refused): fine
      }
    }
  }
  uint64_t expect_refused = 0;
  const std::string hello = kDummyHello;
  const std::string config_line = EncodeConfig(ServerConfig());
  for (size_t i = 0; i < n; ++i) {
    std::string got;
    if (!fuzz::Exchange(fds[i], std::string(), &got, 10000)) {
      fuzz::Fail("RealClientServer: connection %zu not closed within 10 s after EOF", i);
    }
    fuzz::CloseAbortive(fds[i]);
    const std::string& s = streams[i];
    const bool dummy = s.compare(0, hello.size(), hello) == 0;
    if (!dummy && !s.empty() && (s.find('\n') != std::string::npos || s.size() > kMaxHelloBytes)) {
      ++expect_refused;
    }
    if (!dummy) {
      if (!got.empty()) {
        fuzz::Fail("RealClientServer answered %zu bytes to a connection without the hello",
                   got.size());
      }
      continue;
    }
    if (got.compare(0, config_line.size(), config_line) != 0) {
      fuzz::Fail("RealClientServer: a dummy's reply does not start with the config line "
                 "(%zu bytes)", got.size());
    }
    if (got.find_first_not_of('\n', config_line.size()) != std::string::npos) {
      fuzz::Fail("RealClientServer: bytes other than heartbeats after the config line");
    }
    auto c = DecodeConfig(got.substr(0, got.find('\n')));
    if (!c.ok() || !Same(c.value(), ServerConfig())) {
      fuzz::Fail("RealClientServer: the dummy cannot decode the server's config line");
    }
  }
  const uint64_t refused = g_server->refused() - refused_before;
  if (refused != expect_refused) {
    fuzz::Fail("RealClientServer refused %llu connections, expected %llu",
               static_cast<unsigned long long>(refused),
               static_cast<unsigned long long>(expect_refused));
  }
  // The server's thread closes a connection (dummies() down first) before we see EOF.
  if (g_server->dummies() != 0) {
    fuzz::Fail("RealClientServer counts %zu dummies after every connection closed",
               g_server->dummies());
  }
  if (fuzz::Trace()) {
    std::fprintf(stderr, "%zu connections, %llu refused\n", n,
                 static_cast<unsigned long long>(refused));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;
  static RealClientServer server(ServerConfig());
  const mooncake::Status started = server.Start("127.0.0.1", 0);
  const std::string err = started.ok() ? "" : started.message();
  if (!started.ok()) fuzz::Fail("RealClientServer::Start: %s", err.c_str());
  g_server = &server;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Reader in(data, size);
  switch (in.U8() % 3) {
    case 0: DummySide(in.Rest()); break;
    case 1: EncodeSide(in); break;
    default: ServerSide(in); break;
  }
  return 0;
}
