// The real mooncake_master binary (MC_MASTER_PATH) started the way upstream's scripts start
// it: the deprecated aliases --port / --max_threads, the embedded HTTP metadata server
// (--enable_http_metadata_server) used by Store clients' engines, a metadata port in use
// refused, and the HTTP endpoints on --metrics_port served to a legitimate client beside
// hundreds of idle connections and hostile requests.
#include <gtest/gtest.h>

#include <cstdlib>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "master_process.h"
#include "mooncake/store/store_client.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_master;  // NOLINT

void StopMaster(MasterProcess& m) {
  ::kill(m.pid(), SIGTERM);
  auto rc = m.WaitExit(seconds(10));
  EXPECT_TRUE(rc.has_value()) << "still running 10 s after SIGTERM:\n" << m.Log();
  if (rc) {
    EXPECT_EQ(*rc, 0) << m.Log();
  }
}

// A master started with the arguments args(ports) on `n` ports from FreePort, started again on
// new ports (up to 5 times) when one of them was taken between FreePort and the master's bind
// (another process of a parallel test run may take a free port first). Ready, or the last try.
std::unique_ptr<MasterProcess> StartOnFreePorts(
    size_t n, const std::function<std::vector<std::string>(const std::vector<int>&)>& args,
    std::vector<int>* ports) {
  std::unique_ptr<MasterProcess> m;
  for (int attempt = 0; attempt < 5; ++attempt) {
    ports->clear();
    for (size_t i = 0; i < n; ++i) ports->push_back(FreePort());
    m = std::make_unique<MasterProcess>(args(*ports));
    if (m->WaitReady(seconds(20))) return m;
    if (m->Log().find("cannot listen") == std::string::npos &&
        m->Log().find("in use") == std::string::npos) {
      return m;  // failed for another reason: the caller's ASSERT shows the log
    }
  }
  return m;
}

// upstream's test_cli.py: mooncake_master --port=... --max_threads=2 --metrics_port=...
TEST(MasterUpstreamFlags, DeprecatedPortAndMaxThreadsAliases) {
  std::vector<int> p;
  auto mp = StartOnFreePorts(2, [](const std::vector<int>& q) {
    return std::vector<std::string>{"--port=" + std::to_string(q[0]), "--max_threads=2",
                                    "--metrics_port=" + std::to_string(q[1])};
  }, &p);
  MasterProcess& m = *mp;
  const int port = p[0];
  ASSERT_TRUE(m.WaitReady(seconds(1))) << m.Log();
  EXPECT_NE(m.Log().find("--port is deprecated"), std::string::npos) << m.Log();
  EXPECT_NE(m.Log().find("--max_threads is deprecated"), std::string::npos);
  EXPECT_NE(m.Log().find("Master service started on 0.0.0.0:" + std::to_string(port)),
            std::string::npos)
      << m.Log();
  // max_threads=2, capped at the CPU count.
  EXPECT_TRUE(m.Log().find(", 2 RPC loops)") != std::string::npos ||
              m.Log().find(", 1 RPC loops)") != std::string::npos)
      << m.Log();
  auto c = MakeClient(port, 4 * MiB);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->HealthCheck(), 0);
  c.reset();
  StopMaster(m);

  // --rpc_port wins over --port; --rpc_thread_num over --max_threads.
  auto bp = StartOnFreePorts(3, [](const std::vector<int>& q) {
    return std::vector<std::string>{"--rpc_port=" + std::to_string(q[0]),
                                    "--port=" + std::to_string(q[1]), "--rpc_thread_num=3",
                                    "--max_threads=5", "--metrics_port=" + std::to_string(q[2])};
  }, &p);
  MasterProcess& both = *bp;
  const int rpc = p[0];
  ASSERT_TRUE(both.WaitReady(seconds(1))) << both.Log();
  EXPECT_NE(both.Log().find("using --rpc_port=" + std::to_string(rpc)), std::string::npos);
  EXPECT_NE(both.Log().find(", 3 RPC loops)"), std::string::npos) << both.Log();
  auto c2 = MakeClient(rpc, 4 * MiB);
  ASSERT_TRUE(c2);
  c2.reset();
  StopMaster(both);
}

TEST(MasterUpstreamFlags, BadAliasValuesExitNonZero) {
  for (const char* bad : {"--port=0", "--port=70000", "--rpc_port=70000", "--max_threads=0",
                          "--rpc_thread_num=-1", "--http_metadata_server_port=70000"}) {
    MasterProcess m({bad, "--metrics_port=" + std::to_string(FreePort())});
    auto rc = m.WaitExit(seconds(20));
    ASSERT_TRUE(rc.has_value()) << bad;
    EXPECT_NE(*rc, 0) << bad;
    EXPECT_NE(m.Log().find("must be"), std::string::npos) << bad << ":\n" << m.Log();
  }
}

// upstream's run_tests.sh, last step: the master serves the metadata, Store clients' engines
// publish and find their segments there (MC_METADATA_SERVER=http://127.0.0.1:8080/metadata).
TEST(MasterUpstreamFlags, EmbeddedHttpMetadataServerServesStoreClients) {
  std::vector<int> p;
  auto mp = StartOnFreePorts(3, [](const std::vector<int>& q) {
    return std::vector<std::string>{"--rpc_address=127.0.0.1", "--rpc_port=" + std::to_string(q[0]),
                                    "--metrics_port=" + std::to_string(q[1]),
                                    "--enable_http_metadata_server=true",
                                    "--http_metadata_server_host=127.0.0.1",
                                    "--http_metadata_server_port=" + std::to_string(q[2])};
  }, &p);
  MasterProcess& m = *mp;
  const int rpc = p[0], metrics = p[1], meta = p[2];
  ASSERT_TRUE(m.WaitReady(seconds(20))) << m.Log();
  EXPECT_NE(m.Log().find("HTTP metadata server listening on 127.0.0.1:" + std::to_string(meta)),
            std::string::npos)
      << m.Log();

  // The raw protocol.
  EXPECT_EQ(StatusOf(HttpRequest(meta, "GET", "/metadata?key=nothing")), 404);
  EXPECT_EQ(StatusOf(HttpRequest(meta, "PUT", "/metadata?key=k1", "{\"v\":1}")), 200);
  std::string got = HttpRequest(meta, "GET", "/metadata?key=k1");
  EXPECT_EQ(StatusOf(got), 200);
  EXPECT_EQ(BodyOf(got), "{\"v\":1}");
  EXPECT_EQ(StatusOf(HttpRequest(meta, "GET", "/metadata")), 400);
  EXPECT_EQ(StatusOf(HttpRequest(meta, "DELETE", "/metadata?key=k1")), 200);
  EXPECT_EQ(StatusOf(HttpRequest(meta, "DELETE", "/metadata?key=k1")), 404);
  std::string health = HttpRequest(meta, "GET", "/health");
  EXPECT_EQ(StatusOf(health), 200);
  EXPECT_EQ(BodyOf(health), "OK");

  // Two Store clients whose engines use it instead of P2PHANDSHAKE (names must differ there).
  auto options = [&] {
    StoreClientOptions o;
    o.master_server_addr = "127.0.0.1:" + std::to_string(rpc);
    o.local_hostname = "127.0.0.1:" + std::to_string(FreePort());
    o.metadata_server = "http://127.0.0.1:" + std::to_string(meta) + "/metadata";
    o.global_segment_size = 8 * MiB;
    o.local_buffer_size = 4 * MiB;
    return o;
  };
  int code = 0;
  std::string msg;
  auto a = StoreClient::Create(options(), &code, &msg);
  ASSERT_TRUE(a) << code << ": " << msg;
  auto b = StoreClient::Create(options(), &code, &msg);
  ASSERT_TRUE(b) << code << ": " << msg;
  // Their descriptors are in the master's metadata server.
  for (auto* c : {a.get(), b.get()}) {
    std::string desc = HttpRequest(meta, "GET", "/metadata?key=mooncake/ram/" + c->segment_name());
    EXPECT_EQ(StatusOf(desc), 200) << c->segment_name() << "\n" << desc;
    EXPECT_NE(BodyOf(desc).find("\"buffers\""), std::string::npos) << desc;
  }
  ReplicateConfig on_b;
  on_b.preferred_segments = {b->segment_name()};
  std::vector<char> in(MiB + 3);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<char>(i * 7 + 1);
  ASSERT_EQ(a->Put("through-http-metadata", {{in.data(), in.size()}}, on_b), 0);
  std::vector<char> out(in.size());
  ASSERT_EQ(a->Get("through-http-metadata", {{out.data(), out.size()}}),
            static_cast<int64_t>(in.size()));
  EXPECT_TRUE(in == out);
  // The master's endpoints see the object on b's segment.
  std::string q = HttpGet(metrics, "/query_key?key=through-http-metadata");
  EXPECT_EQ(StatusOf(q), 200) << q;
  EXPECT_NE(q.find("\"transport_endpoint_\":\"" + b->segment_name() + "\""), std::string::npos)
      << q;
  a.reset();
  b.reset();
  StopMaster(m);
}

TEST(MasterUpstreamFlags, MetadataServerOnlyWhenEnabled) {
  std::vector<int> p;
  auto mp = StartOnFreePorts(3, [](const std::vector<int>& q) {
    return std::vector<std::string>{"--rpc_address=127.0.0.1", "--rpc_port=" + std::to_string(q[0]),
                                    "--metrics_port=" + std::to_string(q[1]),
                                    "--enable_http_metadata_server=false",
                                    "--http_metadata_server_port=" + std::to_string(q[2])};
  }, &p);
  ASSERT_TRUE(mp->WaitReady(seconds(20))) << mp->Log();
  EXPECT_EQ(HttpRequest(p[2], "GET", "/metadata?key=x"), "");  // nothing listens
  StopMaster(*mp);
  // The bare flag turns it on.
  auto on = StartOnFreePorts(3, [](const std::vector<int>& q) {
    return std::vector<std::string>{"--rpc_address=127.0.0.1", "--rpc_port=" + std::to_string(q[0]),
                                    "--metrics_port=" + std::to_string(q[1]),
                                    "--enable_http_metadata_server",
                                    "--http_metadata_server_host=127.0.0.1",
                                    "--http_metadata_server_port=" + std::to_string(q[2])};
  }, &p);
  ASSERT_TRUE(on->WaitReady(seconds(20))) << on->Log();
  EXPECT_EQ(StatusOf(HttpRequest(p[2], "GET", "/metadata?key=x")), 404);
  StopMaster(*on);
}

TEST(MasterUpstreamFlags, EmbeddedMetadataServerTakesTheClustersSecret) {
  auto args = [](const std::vector<int>& q) {
    return std::vector<std::string>{"--rpc_address=127.0.0.1", "--rpc_port=" + std::to_string(q[0]),
                                    "--metrics_port=" + std::to_string(q[1]),
                                    "--enable_http_metadata_server",
                                    "--http_metadata_server_host=127.0.0.1",
                                    "--http_metadata_server_port=" + std::to_string(q[2])};
  };
  std::vector<int> p;
  ::setenv("MC_AUTH_SECRET", "cluster-secret", 1);  // inherited by the master's process
  auto m = StartOnFreePorts(3, args, &p);
  ::unsetenv("MC_AUTH_SECRET");
  ASSERT_TRUE(m->WaitReady(seconds(20))) << m->Log();
  const int meta = p[2];
  // A write without the secret's proof is refused, saying why; reads stay open.
  const std::string put = HttpRequest(meta, "PUT", "/metadata?key=mooncake/ram/x", "{}");
  EXPECT_EQ(StatusOf(put), 403) << put;
  EXPECT_NE(BodyOf(put).find("MC_AUTH_SECRET"), std::string::npos) << put;
  EXPECT_EQ(StatusOf(HttpRequest(meta, "DELETE", "/metadata?key=mooncake/ram/x")), 403);
  EXPECT_EQ(StatusOf(HttpRequest(meta, "GET", "/metadata?key=mooncake/ram/x")), 404);
  EXPECT_NE(m->Log().find("need MC_AUTH_SECRET's proof"), std::string::npos) << m->Log();
  StopMaster(*m);
  // Without the secret: open, as upstream's.
  auto open = StartOnFreePorts(3, args, &p);
  ASSERT_TRUE(open->WaitReady(seconds(20))) << open->Log();
  EXPECT_EQ(StatusOf(HttpRequest(p[2], "PUT", "/metadata?key=mooncake/ram/x", "{}")), 200);
  StopMaster(*open);
}

TEST(MasterUpstreamFlags, MetadataPortInUseIsRefusedWithAClearMessage) {
  // A plain listening socket holds the port.
  int port = 0;
  const int fd = HoldLoopbackPort(&port);
  ASSERT_GE(fd, 0);
  MasterProcess m({"--rpc_address=127.0.0.1", "--rpc_port=" + std::to_string(FreePort()),
                   "--metrics_port=" + std::to_string(FreePort()),
                   "--enable_http_metadata_server=true",
                   "--http_metadata_server_host=127.0.0.1",
                   "--http_metadata_server_port=" + std::to_string(port)});
  auto rc = m.WaitExit(seconds(20));
  ::close(fd);
  ASSERT_TRUE(rc.has_value()) << "kept running on a metadata port in use:\n" << m.Log();
  EXPECT_NE(*rc, 0);
  EXPECT_NE(m.Log().find("cannot serve HTTP metadata"), std::string::npos) << m.Log();
  EXPECT_NE(m.Log().find("in use"), std::string::npos) << m.Log();
  EXPECT_EQ(m.Log().find("Master service started"), std::string::npos);
}

TEST(MasterUpstreamFlags, EndpointsServeBesideIdleConnectionsAndHostileRequests) {
  const int rpc = FreePort(), metrics = FreePort();
  MasterProcess m({"--rpc_address=127.0.0.1", "--rpc_port=" + std::to_string(rpc),
                   "--metrics_port=" + std::to_string(metrics)});
  ASSERT_TRUE(m.WaitReady(seconds(20))) << m.Log();
  auto c = MakeClient(rpc, 4 * MiB);
  ASSERT_TRUE(c);
  std::vector<char> v(100, 'v');
  ASSERT_EQ(c->Put("key-1", {{v.data(), v.size()}}, {}), 0);

  // Hundreds of connections that never send a request, and some that send half of one.
  std::vector<int> idle;
  for (int i = 0; i < 600; ++i) {
    int fd = ConnectLoopback(metrics);
    if (fd < 0) continue;
    if (i % 10 == 0) (void)::send(fd, "GET /get_all_se", 15, MSG_NOSIGNAL);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(milliseconds(200));
  const auto t0 = Clock::now();
  std::string segs = HttpGet(metrics, "/get_all_segments");
  EXPECT_LT(Clock::now() - t0, seconds(1));
  EXPECT_EQ(StatusOf(segs), 200) << segs;
  EXPECT_EQ(BodyOf(segs), c->segment_name() + "\n");
  EXPECT_EQ(BodyOf(HttpGet(metrics, "/get_all_keys")), "key-1\n");
  for (int fd : idle) ::close(fd);

  // Hostile or wrong requests get an answer, and the master keeps serving.
  EXPECT_EQ(StatusOf(HttpGet(metrics, "/query_key?key=" + std::string(200000, 'k'))), 414);
  EXPECT_EQ(StatusOf(HttpGet(metrics, "/query_key?key=" + std::string(5000, 'k'))), 400);
  EXPECT_EQ(StatusOf(HttpGet(metrics, "/query_key?key=%GG")), 400);
  EXPECT_EQ(StatusOf(HttpGet(metrics, "/query_key")), 400);
  EXPECT_EQ(StatusOf(HttpGet(metrics, "/query_key?key=nope")), 404);
  EXPECT_EQ(StatusOf(HttpGet(metrics, "/batch_query_keys")), 400);
  EXPECT_EQ(StatusOf(HttpRequest(metrics, "PUT", "/get_all_keys", "x")), 405);
  EXPECT_EQ(StatusOf(HttpGet(metrics, "/../../etc/passwd")), 404);
  std::string q = HttpGet(metrics, "/batch_query_keys?keys=key-1,nope");
  EXPECT_EQ(StatusOf(q), 200);
  EXPECT_NE(BodyOf(q).find("\"key-1\":{\"ok\":true,\"values\":[{\"size_\":100,"),
            std::string::npos)
      << q;
  std::string health = HttpGet(metrics, "/health");
  EXPECT_EQ(StatusOf(health), 200);
  EXPECT_NE(BodyOf(health).find("\"status\":\"ok\""), std::string::npos);
  std::string summary = HttpGet(metrics, "/metrics/summary");
  EXPECT_NE(BodyOf(summary).find("Keys: 1 (soft-pinned: 0) | Clients: 1 | Segments: 1"),
            std::string::npos)
      << summary;
  EXPECT_EQ(c->HealthCheck(), 0);
  c.reset();
  StopMaster(m);
}

}  // namespace
}  // namespace store
}  // namespace mooncake
