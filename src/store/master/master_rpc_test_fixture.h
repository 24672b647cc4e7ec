// The fixture of the RPC tests (master_rpc_test.cc, master_rpc_bounds_test.cc): an RpcServer
// on loopback with a handler whose methods sleep on cue, and an RpcClient to it.
#pragma once

#include <google/protobuf/stubs/logging.h>
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <atomic>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "store/testing/loopback_http.h"
#include "master.pb.h"
#include "store/testing/rpc_frames.h"
#include "mooncake/store/error_code.h"
#include "store/master/master_rpc.h"
#include "store/master/master_service.h"
#include "store/rpc/rpc_client.h"
#include "store/rpc/rpc_server.h"

namespace mooncake {
namespace store {
namespace testing_rpc_fixture {

using namespace testing_rpc;     // NOLINT
using namespace testing_master;  // NOLINT
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Ping answers client_known = (client_id == "known"); ExistKey answers each key's length
// as its code, after sleeping 600 ms for a key "sleep" and 2 ms for a key "2ms"; RemoveAll
// (the slow method) sleeps 400 ms.
inline RpcStatus Handle(uint16_t method, const char* data, size_t n, std::string* out) {
  switch (static_cast<MasterMethod>(method)) {
    case MasterMethod::kPing: {
      rpc::PingRequest q;
      if (!q.ParseFromArray(data, static_cast<int>(n))) return RpcStatus::kBadRequest;
      rpc::PingResponse r;
      r.set_client_known(q.client_id() == "known");
      r.AppendToString(out);
      return RpcStatus::kOk;
    }
    case MasterMethod::kExistKey: {
      rpc::KeysRequest q;
      if (!q.ParseFromArray(data, static_cast<int>(n))) {
        out->append("not a KeysRequest");
        return RpcStatus::kBadRequest;
      }
      rpc::CodesResponse r;
      for (const auto& k : q.keys()) {
        if (k == "sleep") std::this_thread::sleep_for(milliseconds(600));
        if (k == "2ms") std::this_thread::sleep_for(milliseconds(2));
        r.add_codes(static_cast<int32_t>(k.size()));
      }
      r.AppendToString(out);
      return RpcStatus::kOk;
    }
    case MasterMethod::kRemoveAll: {
      std::this_thread::sleep_for(milliseconds(400));
      rpc::CountResponse r;
      r.set_count(7);
      r.AppendToString(out);
      return RpcStatus::kOk;
    }
    default:
      out->append("unknown method");
      return RpcStatus::kUnknownMethod;
  }
}

class RpcTest : public ::testing::Test {
 protected:
  void Start(RpcServer::Options o = {}) {
    if (!o.slow) o.slow = [](uint16_t m) { return m == uint16_t(MasterMethod::kRemoveAll); };
    server_ = std::make_unique<RpcServer>(o, &Handle);
    ASSERT_TRUE(server_->Start("127.0.0.1", port_).ok());
    port_ = server_->port();
    client_ = std::make_unique<RpcClient>("127.0.0.1:" + std::to_string(port_));
  }
  Status Ping(const std::string& id, bool* known, RpcClient* c = nullptr,
              milliseconds timeout = milliseconds(2000)) {
    rpc::PingRequest q;
    q.set_client_id(id);
    rpc::PingResponse r;
    Status s = (c ? c : client_.get())->Call(MasterMethod::kPing, q, &r, timeout);
    *known = r.client_known();
    return s;
  }
  int port_ = 0;
  std::unique_ptr<RpcServer> server_;
  std::unique_ptr<RpcClient> client_;
};

// A listening socket on 127.0.0.1 for a hand-written server; -1 on failure.
inline int ListenLoopback(int* port) {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (lfd < 0 || ::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(lfd, 4) != 0 || ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (lfd >= 0) ::close(lfd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return lfd;
}

inline size_t ResidentBytes() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// The slowest of `n` pings of `c` (each must succeed; with Handle's server, answer known), in
// ms.
inline double SlowestPingMs(RpcClient* c, int n, bool handle = true) {
  double worst = 0;
  for (int i = 0; i < n; ++i) {
    rpc::PingRequest q;
    q.set_client_id("known");
    rpc::PingResponse r;
    const auto t0 = Clock::now();
    Status s = c->Call(MasterMethod::kPing, q, &r, milliseconds(3000));
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    EXPECT_TRUE(s.ok() && (r.client_known() || !handle)) << "ping " << i << ": " << s.ToString();
    worst = std::max(worst, ms);
  }
  return worst;
}

}  // namespace testing_rpc_fixture
}  // namespace store
}  // namespace mooncake
