// Fuzzes the master's RPC port (src/store/rpc_server.*, rpc_wire.h, master_rpc.cc): a real
// RpcServer on loopback TCP serving a small MasterService, fed arbitrary bytes.
//
// Input format: byte 0 % 3 + 1 connections; each but the last takes a u16 length (LE) and
// that many bytes, the last the rest. All connect, send their bytes, shut down their write
// side and read until the server closes. Checked per connection, from rpc_wire.h:
//   - what comes back is a sequence of whole frames (magic, length <= kMaxMessageBytes);
//   - the replies answer the complete requests sent, in order, each echoing its method and
//     sequence number, and stop at the first frame that is not this protocol; a request over
//     the size limit gets one kTooLarge reply and nothing after it;
//   - a kOk reply's payload parses as the method's response message;
//   - the server closes the connection (EOF) once the client is done;
// and once all are closed the server holds no connection. And, a differential oracle for the
// shape check that master_rpc.cc runs before it parses (ScanMasterRequest): on every complete
// request frame, when the scan finds the payload malformed protobuf's parse of the method's
// request fails too, and when the scan passes and the parse succeeds, the counts (batch
// entries, read_lease_ids, preferred segments) are the parsed message's.
#include <arpa/inet.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fuzz_common.h"
#include "master.pb.h"
#include "store/master/master_rpc.h"
#include "store/master/master_service.h"
#include "store/rpc/rpc_server.h"
#include "store/rpc/rpc_wire.h"

namespace {

using namespace mooncake::store;  // NOLINT

MasterService* g_master = nullptr;
MasterService* g_strict = nullptr;  // strict multi-tenant mode: payloads of odd length go here
RpcServer* g_server = nullptr;

void Setup() {
  FLAGS_minloglevel = 3;
  MasterConfig config;
  g_master = new MasterService(config);
  config.enable_multi_tenants = true;
  g_strict = new MasterService(config);
  g_strict->SetTenantPolicies({{"default", 1ull << 29}, {"a", 1ull << 20}});
  rpc::MountSegmentRequest m;
  m.set_client_id("fuzz-client");
  m.set_segment_name("127.0.0.1:1");
  m.set_base(1ull << 40);
  m.set_size(1ull << 30);
  (void)g_master->MountSegment(m);
  (void)g_strict->MountSegment(m);
  RpcServer::Options o;
  o.threads = 1;
  o.slow = &IsSlowMasterMethod;
  g_server = new RpcServer(o, [](uint16_t method, const char* data, size_t n, std::string* out) {
    return ServeMasterRpc(n % 2 ? g_strict : g_master, method, data, n, out);
  });
  if (!g_server->Start("127.0.0.1", 0).ok()) fuzz::Fail("cannot start the RPC server");
}

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!fuzz::Connect(fd, &a, sizeof(a))) fuzz::Fail("connect: %s", std::strerror(errno));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

// The shape check against protobuf's parse of the same payload (see the top).
void CheckShape(uint16_t method, const char* data, size_t n) {
  if (method < 1 || method > kMaxMethod) return;
  const RequestShape shape = ScanMasterRequest(method, data, n);
  bool parsed = false;
  size_t items = 0, leases = 0, preferred = 0;
  switch (static_cast<MasterMethod>(method)) {
    case MasterMethod::kPutStart: {
      rpc::PutStartRequest q;
      parsed = q.ParseFromArray(data, static_cast<int>(n));
      items = q.items_size();
      preferred = q.config().preferred_segments_size();
      break;
    }
    case MasterMethod::kReplicaClear: {
      rpc::ReplicaClearRequest q;
      parsed = q.ParseFromArray(data, static_cast<int>(n));
      items = q.keys_size();
      break;
    }
    case MasterMethod::kOffloadDone: {  // the disk tier's batches
      rpc::OffloadDoneRequest q;
      parsed = q.ParseFromArray(data, static_cast<int>(n));
      items = q.items_size();
      break;
    }
    case MasterMethod::kEvictDisk: {
      rpc::EvictDiskRequest q;
      parsed = q.ParseFromArray(data, static_cast<int>(n));
      items = q.keys_size();
      break;
    }
    case MasterMethod::kPutEnd:
    case MasterMethod::kPutRevoke:
    case MasterMethod::kGetReplicaList:
    case MasterMethod::kExistKey:
    case MasterMethod::kRemove:
    case MasterMethod::kRemoveAll: {
      rpc::KeysRequest q;
      parsed = q.ParseFromArray(data, static_cast<int>(n));
      items = q.keys_size();
      leases = q.read_lease_ids_size();
      break;
    }
    default: {
      rpc::PingRequest q;  // no repeated field: only malformed-ness is compared
      parsed = q.ParseFromArray(data, static_cast<int>(n));
      break;
    }
  }
  if (shape.malformed) {
    if (parsed) fuzz::Fail("method %u: the shape check refused what protobuf parses", method);
    return;
  }
  if (!parsed || !shape.over.empty()) return;
  if (shape.items != items || shape.lease_ids != leases || shape.preferred != preferred) {
    fuzz::Fail("method %u: the shape check counted %zu/%zu/%zu, the parse %zu/%zu/%zu", method,
               shape.items, shape.lease_ids, shape.preferred, items, leases, preferred);
  }
}

void CheckShapes(const std::string& sent) {
  size_t at = 0;
  while (sent.size() - at >= kFrameHeaderBytes) {
    FrameHeader h;
    if (DecodeHeader(sent.data() + at, &h) != HeaderCheck::kOk) return;
    if (sent.size() - at - kFrameHeaderBytes < h.length) return;
    CheckShape(h.method, sent.data() + at + kFrameHeaderBytes, h.length);
    at += kFrameHeaderBytes + h.length;
  }
}

bool ParsesAsResponse(uint16_t method, const std::string& payload) {
  auto parse = [&](auto msg) { return msg.ParseFromString(payload); };
  switch (static_cast<MasterMethod>(method)) {  // every method, from rpc_wire.h's list
#define MC_X(Name, number, Req, Resp, resend) \
  case MasterMethod::k##Name:                 \
    return parse(rpc::Resp());
    MC_MASTER_METHODS(MC_X)
#undef MC_X
  }
  return false;
}

// The requests the server must answer: the complete frames of `sent`, up to the first one
// that is not this protocol or is over the limit (included: it gets kTooLarge).
struct Expected {
  uint16_t method;
  uint32_t seq;
  bool too_large;
};
// *clean: every byte was read by the server before it closed (no bad or oversized frame), so
// the close is a FIN and every reply arrives; else the close may be a reset that drops some.
std::vector<Expected> ExpectedReplies(const std::string& sent, bool* clean) {
  std::vector<Expected> out;
  *clean = false;
  size_t at = 0;
  while (sent.size() - at >= kFrameHeaderBytes) {
    FrameHeader h;
    HeaderCheck c = DecodeHeader(sent.data() + at, &h);
    if (c == HeaderCheck::kBadMagic) break;
    if (c == HeaderCheck::kTooLarge) {
      out.push_back({h.method, h.seq, true});
      break;
    }
    if (sent.size() - at - kFrameHeaderBytes < h.length) break;
    out.push_back({h.method, h.seq, false});
    at += kFrameHeaderBytes + h.length;
  }
  FrameHeader tail;
  if (sent.size() - at < kFrameHeaderBytes ||
      DecodeHeader(sent.data() + at, &tail) == HeaderCheck::kOk) {
    *clean = true;  // ends with whole frames or a partial one of this protocol
  }
  return out;
}

void Check(const std::string& sent, const std::string& got) {
  bool clean = false;
  const std::vector<Expected> want = ExpectedReplies(sent, &clean);
  size_t at = 0, n = 0;
  while (at < got.size()) {
    if (got.size() - at < kFrameHeaderBytes) fuzz::Fail("a partial reply header");
    FrameHeader h;
    if (DecodeHeader(got.data() + at, &h) != HeaderCheck::kOk) fuzz::Fail("a malformed reply");
    if (got.size() - at - kFrameHeaderBytes < h.length) fuzz::Fail("a partial reply payload");
    if (n >= want.size()) fuzz::Fail("a reply to no complete request (%zu replies)", n + 1);
    const Expected& e = want[n];
    if (h.method != e.method || h.seq != e.seq) fuzz::Fail("reply %zu answers another request", n);
    const std::string payload = got.substr(at + kFrameHeaderBytes, h.length);
    if (e.too_large != (h.status == static_cast<uint16_t>(RpcStatus::kTooLarge))) {
      fuzz::Fail("reply %zu: status %u for a request %s the limit", n, h.status,
                 e.too_large ? "over" : "within");
    }
    if (h.status == static_cast<uint16_t>(RpcStatus::kOk) && !ParsesAsResponse(h.method, payload)) {
      fuzz::Fail("reply %zu: a kOk payload that is not the method's response", n);
    }
    at += kFrameHeaderBytes + h.length;
    ++n;
  }
  if (clean && n != want.size()) {
    fuzz::Fail("%zu replies for %zu complete requests", n, want.size());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (g_server == nullptr) Setup();
  fuzz::Reader in(data, size);
  const int conns = in.U8() % 3 + 1;
  std::vector<std::string> parts;
  for (int i = 0; i < conns; ++i) {
    if (i + 1 < conns) {
      parts.push_back(in.Bytes(in.U16()));
    } else {
      parts.push_back(in.Bytes(size));
    }
  }
  std::vector<int> fds;
  for (int i = 0; i < conns; ++i) fds.push_back(Connect(g_server->port()));
  std::vector<std::string> got(conns);
  std::vector<std::thread> ts;
  for (int i = 0; i < conns; ++i) {
    ts.emplace_back([&, i] {
      if (!fuzz::Exchange(fds[i], parts[i], &got[i], 20000)) {
        fuzz::Fail("connection %d: the server did not close within 20 s", i);
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int i = 0; i < conns; ++i) {
    close(fds[i]);
    Check(parts[i], got[i]);
    CheckShapes(parts[i]);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (g_server->open_connections() != 0) {
    if (std::chrono::steady_clock::now() > deadline) fuzz::Fail("connections left open");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return 0;
}
