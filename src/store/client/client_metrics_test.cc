// The client's metrics (client_metrics.h: upstream's names, labels, buckets and summary), the
// master calls counted by MeteredMasterStub, the bytes and latencies a StoreClient records,
// and the client HTTP port (client_http.h), against an in-process master.
#include "store/client/client_metrics.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake/store/store_client.h"
#include "store/client/client_http.h"
#include "store/common/metrics_text.h"
#include "store/testing/client_fixture.h"
#include "store/testing/in_process_master.h"
#include "store/testing/loopback_http.h"

namespace mooncake {
namespace store {
namespace {

using testing::InProcessMaster;
using testing_master::BodyOf;
using testing_master::FreePort;
using testing_master::HttpGet;
using testing_master::StatusOf;
constexpr uint64_t MiB = 1 << 20;

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::unique_ptr<ClientMetrics> Metrics(std::string cluster = "") {
  ClientMetrics::Options o;
  o.cluster_id = std::move(cluster);
  return ClientMetrics::Create(o, "real");
}

TEST(LatencyHistogram, BucketsAreUpstreamsAndCumulative) {
  LatencyHistogram h;
  EXPECT_EQ(h.Brief(), "No data");
  for (uint64_t us : {10, 50, 51, 300, 25000000}) h.Observe(us);
  std::string out;
  h.Write("x", "{a=\"b\"}", &out);
  EXPECT_TRUE(Has(out, "x_bucket{a=\"b\",le=\"50\"} 2\n")) << out;     // 10 and 50 (le)
  EXPECT_TRUE(Has(out, "x_bucket{a=\"b\",le=\"75\"} 3\n")) << out;
  EXPECT_TRUE(Has(out, "x_bucket{a=\"b\",le=\"300\"} 4\n")) << out;
  EXPECT_TRUE(Has(out, "x_bucket{a=\"b\",le=\"20000000\"} 4\n")) << out;
  EXPECT_TRUE(Has(out, "x_bucket{a=\"b\",le=\"+Inf\"} 5\n")) << out;
  EXPECT_TRUE(Has(out, "x_sum{a=\"b\"} 25000411\n")) << out;
  EXPECT_TRUE(Has(out, "x_count{a=\"b\"} 5\n")) << out;
  EXPECT_FALSE(Has(out, "le=\"100\"")) << "upstream's buckets have no 100";
  // p95: the first bucket holding 5 * 95 / 100 = 4 observations (upstream's rule).
  EXPECT_EQ(h.Brief(), "count=5, p95<300μs, max>20000000μs");
  LatencyHistogram g;
  for (int i = 0; i < 19; ++i) g.Observe(100);
  g.Observe(4000);
  EXPECT_EQ(g.Brief(), "count=20, p95<125μs, max<5000μs");
}

TEST(ClientMetrics, ExportsUpstreamsNamesOnlyForWhatWasSeen) {
  auto m = Metrics();
  ASSERT_NE(m, nullptr);
  std::string t = m->Prometheus();
  for (const char* name :
       {"mooncake_transfer_read_bytes{client_mode=\"real\"} 0",
        "mooncake_transfer_write_bytes{client_mode=\"real\"} 0",
        "# TYPE mooncake_transfer_batch_put_latency histogram",
        "# TYPE mooncake_transfer_batch_get_latency histogram",
        "# TYPE mooncake_transfer_get_latency histogram",
        "mooncake_transfer_put_latency_count{client_mode=\"real\"} 0"}) {
    EXPECT_TRUE(Has(t, name)) << name;
  }
  EXPECT_FALSE(Has(t, "mooncake_client_rpc_count"));
  EXPECT_FALSE(Has(t, "operation"));
  m->AddRead(4096);
  m->CountRpc(ClientMetrics::RpcIndex("BatchGetReplicaList"));
  m->ObserveRpc(ClientMetrics::RpcIndex("BatchGetReplicaList"), 120);
  m->CountRpc(ClientMetrics::RpcIndex("Ping"));  // sent, never answered
  m->ObserveOp(OpKind::kRead, "batch_get_into", 4096, 700);
  m->ObserveOp(OpKind::kWrite, "put_from", 10, 60);
  m->ObserveOp(OpKind::kWrite, "not_an_op", 10, 60);  // ignored
  EXPECT_EQ(ClientMetrics::RpcIndex("NoSuchRpc"), -1);
  t = m->Prometheus();
  EXPECT_TRUE(Has(t, "mooncake_transfer_read_bytes{client_mode=\"real\"} 4096\n"));
  EXPECT_TRUE(Has(t, "mooncake_client_rpc_count{client_mode=\"real\",rpc_name="
                     "\"BatchGetReplicaList\"} 1\n"));
  EXPECT_TRUE(Has(t, "mooncake_client_rpc_count{client_mode=\"real\",rpc_name=\"Ping\"} 1\n"));
  EXPECT_TRUE(Has(t, "mooncake_client_rpc_latency_count{client_mode=\"real\",rpc_name="
                     "\"BatchGetReplicaList\"} 1\n"));
  EXPECT_FALSE(Has(t, "mooncake_client_rpc_latency_count{client_mode=\"real\",rpc_name=\"Ping\""));
  EXPECT_TRUE(Has(t, "mooncake_transfer_read_operation_count{client_mode=\"real\",op_name="
                     "\"batch_get_into\"} 1\n"));
  EXPECT_TRUE(Has(t, "mooncake_transfer_read_operation_bytes{client_mode=\"real\",op_name="
                     "\"batch_get_into\"} 4096\n"));
  EXPECT_TRUE(Has(t, "mooncake_transfer_read_operation_latency_bucket{client_mode=\"real\","
                     "op_name=\"batch_get_into\",le=\"750\"} 1\n"));
  EXPECT_TRUE(Has(t, "mooncake_transfer_write_operation_count{client_mode=\"real\",op_name="
                     "\"put_from\"} 1\n"));
  EXPECT_FALSE(Has(t, "not_an_op"));
  // One HELP and TYPE per family.
  size_t n = 0;
  for (size_t at = 0; (at = t.find("# TYPE mooncake_client_rpc_count ", at)) != std::string::npos;
       ++at) {
    ++n;
  }
  EXPECT_EQ(n, 1u);
  // MC_STORE_CLUSTER_ID's label, after client_mode (upstream orders static labels by name).
  auto c = Metrics("prod-a");
  EXPECT_TRUE(Has(c->Prometheus(),
                  "mooncake_transfer_read_bytes{client_mode=\"real\",cluster_id=\"prod-a\"} 0"));
}

TEST(ClientMetrics, SummaryHasUpstreamsSections) {
  auto m = Metrics();
  std::string s = m->Summary();
  for (const char* line :
       {"Client Metrics Summary\n", "=== Transfer Metrics Summary ===\n", "Total Read: 0 B\n",
        "Total Write: 0 B\n", "Average Read Throughput: ", "=== Latency Summary (microseconds) ===",
        "Get: No data\n", "Put: No data\n", "Batch Get: No data\n", "Batch Put: No data\n",
        "=== RPC Metrics Summary ===\nNo RPC calls recorded\n",
        "=== Interface Operation Metrics Summary ===\nRead Interfaces:\nNo data\n"
        "Write Interfaces:\nNo data\n"}) {
    EXPECT_TRUE(Has(s, line)) << line << "\n---\n" << s;
  }
  m->AddWrite(2 * MiB);
  m->AddRead(1024);
  for (int i = 0; i < 3; ++i) m->get_latency.Observe(250);
  m->CountRpc(ClientMetrics::RpcIndex("GetReplicaList"));
  m->ObserveRpc(ClientMetrics::RpcIndex("GetReplicaList"), 90);
  m->ObserveOp(OpKind::kRead, "get_buffer", 2048, 300);
  s = m->Summary();
  for (const char* line :
       {"Total Read: 1.00 KB\n", "Total Write: 2.00 MB\n", "Get: count=3, p95<250μs, max<250μs\n",
        "GetReplicaList: count=1, p95<125μs, max<125μs\n",
        "Read Interfaces:\nget_buffer: count=1, bytes=2.00 KB, p95<300μs, max<300μs\n"}) {
    EXPECT_TRUE(Has(s, line)) << line << "\n---\n" << s;
  }
  ClientMetrics::Options quiet;
  quiet.bandwidth = false;
  EXPECT_FALSE(Has(ClientMetrics::Create(quiet, "real")->Summary(), "Throughput"));
}

TEST(ClientMetrics, TheDiskTiersReadsAndWritesUnderUpstreamsSsdNames) {
  auto m = Metrics();
  std::string p = m->Prometheus();
  // Listed before any disk I/O, as upstream's.
  for (const char* line : {"# TYPE mooncake_ssd_read_bytes_total counter\n",
                           "mooncake_ssd_write_ops_total{client_mode=\"real\"} 0\n",
                           "# TYPE mooncake_ssd_total_latency_us histogram\n",
                           "mooncake_ssd_read_latency_us_count{client_mode=\"real\"} 0\n"}) {
    EXPECT_TRUE(Has(p, line)) << line << "\n---\n" << p;
  }
  m->ObserveSsd(OpKind::kWrite, 16, 16 * MiB, 30000);  // a bucket of 16 objects
  m->ObserveSsd(OpKind::kRead, 3, 3 * MiB, 900);       // a batch of 3 read back
  m->ObserveSsd(OpKind::kRead, 1, 4096, 60);
  p = m->Prometheus();
  for (const char* line :
       {"mooncake_ssd_write_bytes_total{client_mode=\"real\"} 16777216\n",
        "mooncake_ssd_write_ops_total{client_mode=\"real\"} 16\n",
        "mooncake_ssd_read_bytes_total{client_mode=\"real\"} 3149824\n",
        "mooncake_ssd_read_ops_total{client_mode=\"real\"} 4\n",
        "mooncake_ssd_total_bytes_total{client_mode=\"real\"} 19927040\n",
        "mooncake_ssd_total_ops_total{client_mode=\"real\"} 20\n",
        "mooncake_ssd_read_latency_us_count{client_mode=\"real\"} 2\n",
        "mooncake_ssd_read_latency_us_sum{client_mode=\"real\"} 960\n",
        "mooncake_ssd_read_latency_us_bucket{client_mode=\"real\",le=\"100\"} 1\n",
        "mooncake_ssd_read_latency_us_bucket{client_mode=\"real\",le=\"500\"} 1\n",
        "mooncake_ssd_read_latency_us_bucket{client_mode=\"real\",le=\"1000\"} 2\n",
        "mooncake_ssd_read_latency_us_bucket{client_mode=\"real\",le=\"30000000\"} 2\n",
        "mooncake_ssd_write_latency_us_bucket{client_mode=\"real\",le=\"20000\"} 0\n",
        "mooncake_ssd_write_latency_us_bucket{client_mode=\"real\",le=\"50000\"} 1\n",
        "mooncake_ssd_total_latency_us_count{client_mode=\"real\"} 3\n"}) {
    EXPECT_TRUE(Has(p, line)) << line << "\n---\n" << p;
  }
  EXPECT_FALSE(Has(p, "mooncake_ssd_read_latency_us_bucket{client_mode=\"real\",le=\"75\"}"))
      << "upstream's SSD buckets have no 75";
  const std::string s = m->Summary();
  for (const char* line :
       {"=== SSD Metrics Summary ===\nSSD Read: 3.00 MB, ops=4, throughput=",
        "\nSSD Write: 16.00 MB, ops=16, throughput=", "\nSSD Total: 19.00 MB, ops=20, throughput=",
        "=== SSD Latency Summary (microseconds) ===\n"
        "Read: count=2, p50<100us, p90<1000us, p99<1000us, avg=480.0us\n"
        "Write: count=1, p50<50000us, p90<50000us, p99<50000us, avg=30000.0us\n"
        "Total: count=3, p50<1000us, p90<50000us, p99<50000us, avg=10320.0us\n"}) {
    EXPECT_TRUE(Has(s, line)) << line << "\n---\n" << s;
  }
  EXPECT_TRUE(Has(Metrics()->Summary(), "SSD Read: 0 B, ops=0\n")) << "no rate without data";
  EXPECT_TRUE(Has(Metrics()->Summary(), "\nRead: No data\nWrite: No data\nTotal: No data\n"));
}

TEST(ClientMetrics, TheEnvironmentTurnsThemOffAndSetsTheReport) {
  EXPECT_EQ(ByteSizeString(0), "0 B");
  EXPECT_EQ(ByteSizeString(1536), "1.50 KB");
  setenv("MC_STORE_CLIENT_METRIC", " Off ", 1);
  EXPECT_FALSE(ClientMetrics::OptionsFromEnv().enabled);
  EXPECT_EQ(ClientMetrics::Create(ClientMetrics::OptionsFromEnv(), "real"), nullptr);
  setenv("MC_STORE_CLIENT_METRIC", "maybe", 1);  // not a boolean: the default (on), logged
  EXPECT_TRUE(ClientMetrics::OptionsFromEnv().enabled);
  unsetenv("MC_STORE_CLIENT_METRIC");
  EXPECT_TRUE(ClientMetrics::OptionsFromEnv().enabled);
  setenv("MC_STORE_CLIENT_METRIC_INTERVAL", "+5", 1);
  EXPECT_EQ(ClientMetrics::OptionsFromEnv().report_interval_s, 5u);
  setenv("MC_STORE_CLIENT_METRIC_INTERVAL", "5s", 1);
  EXPECT_EQ(ClientMetrics::OptionsFromEnv().report_interval_s, 0u);
  unsetenv("MC_STORE_CLIENT_METRIC_INTERVAL");
  setenv("MC_STORE_CLIENT_METRIC_BANDWIDTH", "no", 1);
  EXPECT_FALSE(ClientMetrics::OptionsFromEnv().bandwidth);
  unsetenv("MC_STORE_CLIENT_METRIC_BANDWIDTH");
  setenv("MC_STORE_CLIENT_METRIC_INTERVAL", "99999999999", 1);  // past a year: no report
  EXPECT_EQ(ClientMetrics::OptionsFromEnv().report_interval_s, 0u);
  unsetenv("MC_STORE_CLIENT_METRIC_INTERVAL");
  // The reporter writes a summary each second while calls are being recorded (each op's
  // first call among them: its count may be seen before its latency).
  ClientMetrics::Options every;
  every.report_interval_s = 1;
  auto m = ClientMetrics::Create(every, "real");
  std::atomic<bool> stop{false};
  std::thread calls([&] {
    const char* ops[] = {"put", "get_into", "batch_get_into", "upsert", "get_buffer"};
    for (uint64_t i = 0; !stop; ++i) {
      m->ObserveOp(i % 2 ? OpKind::kRead : OpKind::kWrite, ops[i % 5], i, i % 1000);
      m->CountRpc(static_cast<int>(i % 22));
      m->ObserveRpc(static_cast<int>(i % 22), i % 5000);
      if (i % 64 == 0) {
        EXPECT_FALSE(m->Summary().empty());
      }
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  stop = true;
  calls.join();
  m.reset();
}

TEST(ClientMetrics, LabelValuesAreEscaped) {
  auto m = Metrics("a\"b\\c\nd");
  EXPECT_TRUE(Has(m->Prometheus(), "cluster_id=\"a\\\"b\\\\c\\nd\"}")) << m->Prometheus();
}

class ClientMetricsStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<StoreClient> Client(uint64_t segment,
                                      std::chrono::milliseconds heartbeat = std::chrono::seconds(1)) {
    return testing::MakeClient(master_, segment, 16 * MiB, heartbeat);
  }
  std::shared_ptr<InProcessMaster> master_ = std::make_shared<InProcessMaster>();
};

TEST_F(ClientMetricsStoreTest, ACountsItsCallsBytesAndLatencies) {
  auto holder = Client(64 * MiB);
  auto user = Client(0);
  ASSERT_TRUE(holder && user);
  ClientMetrics* m = user->metrics();
  ASSERT_NE(m, nullptr);
  std::vector<char> v(100000, 'x'), out(100000);
  ASSERT_EQ(user->Put("a", {{v.data(), v.size()}}, ReplicateConfig()), 0);
  ASSERT_EQ(user->Get("a", {{out.data(), out.size()}}), 100000);
  ASSERT_EQ(user->Get("missing", {{out.data(), out.size()}}), ToInt(ErrorCode::OBJECT_NOT_FOUND));
  std::vector<std::vector<Span>> parts = {{{v.data(), 1000}}, {{v.data(), 2000}}};
  ASSERT_EQ(user->BatchPut({"b", "c"}, parts, ReplicateConfig()), (std::vector<int>{0, 0}));
  ReplicateConfig two;
  two.replica_num = 2;
  auto other = Client(64 * MiB);
  ASSERT_EQ(user->Put("d", {{v.data(), 500}}, two), 0);  // two replicas: 1000 bytes written
  EXPECT_EQ(m->put_latency.count(), 2u);
  EXPECT_EQ(m->get_latency.count(), 2u);
  EXPECT_EQ(m->batch_put_latency.count(), 1u);
  EXPECT_EQ(m->batch_get_latency.count(), 0u);
  const std::string t = m->Prometheus();
  EXPECT_TRUE(Has(t, "mooncake_transfer_write_bytes{client_mode=\"real\"} 104000\n")) << t;
  EXPECT_TRUE(Has(t, "mooncake_transfer_read_bytes{client_mode=\"real\"} 100000\n")) << t;
  for (const char* rpc : {"\"PutStart\"} 2", "\"PutEnd\"} 2", "\"BatchPutStart\"} 1",
                          "\"BatchPutEnd\"} 1", "\"GetReplicaList\"} 2"}) {
    EXPECT_TRUE(Has(t, std::string("mooncake_client_rpc_count{client_mode=\"real\",rpc_name=") +
                           rpc))
        << rpc << "\n" << t;
  }
  // The holder mounted its segment; the user lent none.
  EXPECT_TRUE(Has(holder->metrics()->Prometheus(), "rpc_name=\"MountSegment\"} 1\n"));
  EXPECT_FALSE(Has(t, "rpc_name=\"MountSegment\""));
}

TEST_F(ClientMetricsStoreTest, TurnedOffTheClientHasNone) {
  setenv("MC_STORE_CLIENT_METRIC", "0", 1);
  auto c = Client(0);
  unsetenv("MC_STORE_CLIENT_METRIC");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->metrics(), nullptr);
  std::vector<char> v(10, 'x');
  EXPECT_EQ(c->Put("k", {{v.data(), v.size()}}, ReplicateConfig()),
            ToInt(ErrorCode::NO_AVAILABLE_HANDLE));  // calls still work (no segment here)
  const HttpReply r = ClientHttpAnswer("/metrics", std::shared_ptr<StoreClient>(std::move(c)));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body, "metrics not available");
}

TEST_F(ClientMetricsStoreTest, TheHttpPortServesMetricsSummaryAndHealth) {
  std::atomic<bool> down{false};  // the master stops answering pings
  master_->on_Ping = [this, &down](const rpc::PingRequest& q, rpc::PingResponse* r) {
    if (down) return Status::Unavailable("down");
    return master_->ServePing(q, r);
  };
  std::shared_ptr<StoreClient> c = Client(16 * MiB, std::chrono::milliseconds(20));
  ASSERT_TRUE(c);
  std::shared_ptr<StoreClient> served = c;
  const int port = FreePort();
  auto server = StartClientHttp(port, [&served] { return served; });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::string r = HttpGet(port, "/health");
  EXPECT_EQ(StatusOf(r), 200) << r;
  EXPECT_EQ(BodyOf(r), "{\"status\":\"healthy\",\"code\":0}");
  EXPECT_TRUE(Has(r, "Content-Type: application/json")) << r;
  r = HttpGet(port, "/metrics");
  EXPECT_EQ(StatusOf(r), 200);
  EXPECT_TRUE(Has(r, "Content-Type: text/plain; version=0.0.4")) << r;
  EXPECT_TRUE(Has(BodyOf(r), "mooncake_client_rpc_count{client_mode=\"real\",rpc_name=\"Ping\"}"));
  r = HttpGet(port, "/metrics/summary?x=1");
  EXPECT_EQ(StatusOf(r), 200);
  EXPECT_TRUE(Has(BodyOf(r), "Client Metrics Summary")) << r;
  EXPECT_EQ(StatusOf(HttpGet(port, "/nothing")), 404);
  // A second server on the same port is refused (the caller logs it and goes on).
  EXPECT_FALSE(StartClientHttp(port, [&served] { return served; }).ok());
  // The heartbeat finds the master gone: unhealthy, without a call of its own.
  down = true;
  EXPECT_EQ(c->HealthCheck(), ToInt(ErrorCode::RPC_FAIL));
  for (int i = 0; i < 300 && c->master_reachable(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  r = HttpGet(port, "/health");
  EXPECT_EQ(StatusOf(r), 503);
  EXPECT_EQ(BodyOf(r), "{\"status\":\"master_unreachable\",\"code\":2}");
  served = nullptr;  // closed
  r = HttpGet(port, "/health");
  EXPECT_EQ(BodyOf(r), "{\"status\":\"not_initialized\",\"code\":1}");
  EXPECT_EQ(BodyOf(HttpGet(port, "/metrics")), "client not initialized");
  server.value().reset();
}

}  // namespace
}  // namespace store
}  // namespace mooncake
