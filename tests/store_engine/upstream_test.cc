// Upstream's engine (the PyPI wheel in build/upstream-venv, driven by upstream_store_peer.py)
// and ours share one metadata store: each publishes under its name with upstream's keys, and
// each opens the other by name and moves data both ways, every byte checked. Runs with our
// HTTP metadata server and with etcd (the wheel has no redis client: it aborts with "Unable
// to find metadata storage plugin redis"). Skipped when the wheel is not installed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "harness.h"
#include "store_server.h"

namespace mooncake::store_engine {
namespace {

using ::mooncake::testing::StoreServer;

std::string UpstreamPython() {
  const char* v = std::getenv("MC_UPSTREAM_PYTHON");
  return v && *v ? v : MC_UPSTREAM_PYTHON_DEFAULT;
}

// Empty when the wheel imports; otherwise why not.
std::string UpstreamUnavailable() {
  static const std::string why = [] {
    const std::string py = UpstreamPython();
    if (::access(py.c_str(), X_OK) != 0) {
      return "no upstream venv at " + py +
             " (run tests/interop/setup_upstream_venv.sh, or set MC_UPSTREAM_PYTHON)";
    }
    std::string out;
    int rc = Shell("timeout 60 '" + py + "' -c 'from mooncake.engine import TransferEngine'",
                   &out);
    if (rc != 0) return "upstream's wheel does not import with " + py + ": " + out;
    return std::string();
  }();
  return why;
}

std::string N(uint64_t v) { return std::to_string(v); }

class UpstreamSharedStore : public ::testing::TestWithParam<std::string> {};

TEST_P(UpstreamSharedStore, EachOpensTheOtherByNameAndTransfers) {
  const std::string why = UpstreamUnavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  std::string error;
  auto server = StoreServer::Start(GetParam(), "", &error);
  if (!server) {
    if (::mooncake::testing::StoreServersRequired()) FAIL() << error;
    GTEST_SKIP() << "cannot start " << GetParam() << ": " << error;
  }
  const std::string conn = server->ConnString();
  TempDir dir;
  constexpr uint64_t kSize = 4 << 20;
  Peer up = StartPeer(MC_UPSTREAM_DRIVER_PATH, conn, "prefill-up-0", EngineEnv(),
                      dir.path() + "/upstream.err", {"--size", N(kSize)},
                      {UpstreamPython()});
  ASSERT_TRUE(up.ready.ok) << "upstream did not start: " << up.ready.line << "\n"
                           << (up.proc ? up.proc->Stderr() : "");
  Peer ours = StartPeer(MC_STORE_PEER_PATH, conn, "decode-ours-1", EngineEnv(),
                        dir.path() + "/ours.err", {"--size", N(kSize), "--transport", "tcp"});
  ASSERT_TRUE(ours.ready.ok) << ours.ready.line;

  // Upstream's keys, under upstream's names; and loopback addresses only, checked before
  // anything connects to what they say.
  StoreReader store(conn);
  ASSERT_TRUE(store.ok()) << store.error();
  auto rpc = store.GetJson("mooncake/rpc_meta/prefill-up-0");
  ASSERT_TRUE(rpc.ok()) << rpc.status().ToString();
  ASSERT_EQ((*rpc)["ip_or_host_name"], "127.0.0.1") << rpc->dump();
  EXPECT_EQ((*rpc)["rpc_port"], up.ready.rpc_port);
  auto desc = store.GetJson("mooncake/ram/prefill-up-0");
  ASSERT_TRUE(desc.ok()) << desc.status().ToString();
  ASSERT_EQ((*desc)["tcp_data_host"], "127.0.0.1") << desc->dump();
  std::cout << "[ info ] upstream's descriptor in " << GetParam() << ": " << desc->dump()
            << "\n";
  EXPECT_EQ((*desc)["name"], "prefill-up-0");
  EXPECT_EQ((*desc)["buffers"][0]["addr"], up.ready.addr);

  // Ours opens upstream's segment by name.
  std::string open = ours.proc->Command("OPEN prefill-up-0");
  ASSERT_EQ(open.rfind("OK ", 0), 0u) << open;
  EXPECT_NE(open.find(" tcp "), std::string::npos) << open;
  for (auto [off, len, seed] : {std::tuple<uint64_t, uint64_t, int>{0, kSize, 5},
                                {12345, (1 << 20) + 17, 9}}) {
    EXPECT_EQ(ours.proc->Command("PUT prefill-up-0 " + N(off) + " " + N(len) + " " + N(seed)),
              "OK");
    EXPECT_EQ(up.proc->Command("CHECK " + N(off) + " " + N(len) + " " + N(seed), 30), "OK");
    EXPECT_EQ(up.proc->Command("FILL " + N(off) + " " + N(len) + " " + N(seed + 1), 30), "OK");
    EXPECT_EQ(ours.proc->Command("GET prefill-up-0 " + N(off) + " " + N(len) + " " +
                                 N(seed + 1)),
              "OK");
  }
  // Upstream opens ours by name.
  EXPECT_EQ(up.proc->Command("PUT decode-ours-1 0 " + N(kSize) + " 33", 30), "OK");
  EXPECT_EQ(ours.proc->Command("CHECK 0 " + N(kSize) + " 33"), "OK");
  EXPECT_EQ(ours.proc->Command("FILL 0 " + N(kSize) + " 44"), "OK");
  EXPECT_EQ(up.proc->Command("GET decode-ours-1 0 " + N(kSize) + " 44", 30), "OK");

  // Clean shutdowns: each removes its own keys.
  EXPECT_EQ(up.proc->Command("QUIT", 30), "BYE");
  EXPECT_EQ(up.proc->Wait(30), 0);
  EXPECT_TRUE(store.Get("mooncake/rpc_meta/prefill-up-0").status().IsNotFound());
  EXPECT_TRUE(store.Get("mooncake/ram/prefill-up-0").status().IsNotFound());
  EXPECT_EQ(ours.proc->Command("QUIT"), "BYE");
  EXPECT_EQ(ours.proc->Wait(10), 0);
  EXPECT_TRUE(store.Get("mooncake/rpc_meta/decode-ours-1").status().IsNotFound());
  EXPECT_TRUE(store.Get("mooncake/ram/decode-ours-1").status().IsNotFound());
}

INSTANTIATE_TEST_SUITE_P(Stores, UpstreamSharedStore, ::testing::Values("http", "etcd"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace mooncake::store_engine
