// The real mooncake_master binary (MC_MASTER_PATH) refuses each bad HA combination and each
// bad config file before it connects to anything (no etcd is needed): a non-zero exit status
// and stderr naming the problem. A good config file starts it, the command line winning.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <string>
#include <vector>

#include "master_process.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_master;  // NOLINT

std::string TempFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "master_ha_flags_test_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

struct BadCase {
  std::vector<std::string> args;
  std::string want;  // in stderr
};

void ExpectRefused(const BadCase& c) {
  std::vector<std::string> args = c.args;
  args.push_back("--metrics_port=" + std::to_string(FreePort()));
  args.push_back("--rpc_port=" + std::to_string(FreePort()));
  MasterProcess m(args);
  auto rc = m.WaitExit(seconds(10));
  std::string joined;
  for (const auto& a : c.args) joined += a + " ";
  ASSERT_TRUE(rc.has_value()) << joined << ": still running";
  EXPECT_NE(*rc, 0) << joined;
  EXPECT_NE(m.Log().find(c.want), std::string::npos) << joined << ":\n" << m.Log();
  EXPECT_EQ(m.Log().find("Master service started"), std::string::npos) << joined;
}

TEST(MasterHaFlags, BadHaCombinationsExitNonZeroNamingTheProblem) {
  const std::string conn = "--ha_backend_connstring=127.0.0.1:1";
  const std::vector<BadCase> cases = {
      {{"--enable_oplog"}, "--enable_oplog requires --enable_ha=true"},
      {{"--enable_ha", "--rpc_address=127.0.0.1"}, "--enable_ha=true needs the etcd members"},
      {{"--enable_ha", "--rpc_address=127.0.0.1", "--enable_oplog", "--ha_backend_type=redis",
        conn},
       "--enable_oplog requires --ha_backend_type=etcd"},
      {{"--enable_ha", "--rpc_address=127.0.0.1", "--ha_backend_type=redis",
        "--ha_backend_connstring=redis://127.0.0.1:6379"},
       "this build supports etcd only"},
      {{"--enable_ha", "--rpc_address=127.0.0.1", "--ha_backend_type=consul", conn},
       "'consul' is not a backend"},
      {{"--cluster_id=bad id"}, "character ' ' at position 4 is not allowed"},
      {{"--enable_ha", conn}, "other hosts cannot dial 0.0.0.0"},
      {{"--enable_ha", conn, "--rpc_address=::"}, "set --rpc_address to this host's address"},
      {{"--enable_ha", "--rpc_address=127.0.0.1", "--ha_backend_connstring=h:notaport"},
       "--ha_backend_connstring='h:notaport'"},
      {{"--ha_lease_ttl_sec=1"}, "--ha_lease_ttl_sec=1 is out of range"},
      {{"--oplog_batch_max_entries=0"}, "--oplog_batch_max_entries=0 is out of range"},
      {{"--oplog_poll_interval_ms=0"}, "--oplog_poll_interval_ms=0 is out of range"},
  };
  for (const auto& c : cases) ExpectRefused(c);
}

TEST(MasterHaFlags, BadConfigFilesExitNonZeroNamingTheFileAndKey) {
  const std::string unknown = TempFile("unknown.yaml", "rpc_address: 127.0.0.1\nbogus: 1\n");
  const std::string badvalue = TempFile("badvalue.json", R"({"ha_lease_ttl_sec": "five"})");
  const std::string malformed = TempFile("malformed.yaml", "enable_ha: [true\n");
  const std::string oplog = TempFile("oplog.yml", "enable_oplog: true\n");
  const std::vector<BadCase> cases = {
      {{"--config_path=" + unknown}, "config file " + unknown + ": key 'bogus'"},
      {{"--config_path=" + badvalue}, "key 'ha_lease_ttl_sec': 'five' is not a valid int32"},
      {{"--config_path=" + malformed}, "config file " + malformed + ": not valid YAML"},
      {{"--config_path=/nonexistent/m.json"}, "config file /nonexistent/m.json: cannot be read"},
      // The file's values are checked like the command line's.
      {{"--config_path=" + oplog}, "--enable_oplog requires --enable_ha=true"},
  };
  for (const auto& c : cases) ExpectRefused(c);
}

TEST(MasterHaFlags, AConfigFileStartsTheMasterAndTheCommandLineWins) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    const int rpc = FreePort(), metrics = FreePort();
    const std::string path =
        TempFile("good.yaml", "rpc_address: 127.0.0.1\nrpc_port: " + std::to_string(rpc) +
                                  "\nmetrics_port: 1\nclient_live_ttl_sec: 7\n");
    MasterProcess m({"--config_path=" + path, "--metrics_port=" + std::to_string(metrics)});
    if (!m.WaitReady(seconds(20))) {
      if (m.Log().find("in use") != std::string::npos ||
          m.Log().find("cannot listen") != std::string::npos) {
        continue;  // a port taken meanwhile by another process
      }
      FAIL() << m.Log();
    }
    EXPECT_NE(m.Log().find("Master service started on 127.0.0.1:" + std::to_string(rpc) +
                           " (lease 10000 ms, client ttl 7 s"),
              std::string::npos)
        << m.Log();
    EXPECT_NE(m.Log().find("HTTP endpoints on :" + std::to_string(metrics)), std::string::npos)
        << m.Log();
    ::kill(m.pid(), SIGTERM);
    auto rc = m.WaitExit(seconds(10));
    ASSERT_TRUE(rc.has_value());
    EXPECT_EQ(*rc, 0);
    return;
  }
  FAIL() << "no free ports in 5 tries";
}

}  // namespace
}  // namespace store
}  // namespace mooncake
