// mooncake_master's flags (master_flags.h): the config file (YAML and JSON, the command line
// winning, upstream's alias, every refusal naming the file and the key) and the HA settings
// (resolution, upstream's legacy alias, every validation message).
#include "store/master/master_flags.h"

#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

DECLARE_int32(rpc_port);
DECLARE_int64(client_ttl);
DECLARE_double(eviction_ratio);
DECLARE_bool(enable_ha);
DECLARE_bool(enable_oplog);
DECLARE_string(ha_backend_type);
DECLARE_string(ha_backend_connstring);
DECLARE_string(etcd_endpoints);
DECLARE_string(cluster_id);
DECLARE_int32(ha_lease_ttl_sec);
DECLARE_uint32(oplog_batch_max_entries);
DECLARE_uint64(oplog_checkpoint_entries);
DECLARE_bool(oplog_ack_before_durable);

namespace mooncake {
namespace store {
namespace {

class MasterFlagsTest : public ::testing::Test {
 protected:
  // Parses `args` as gflags parses main()'s command line (the flags count as given).
  static void CommandLine(std::vector<std::string> args) {
    args.insert(args.begin(), "mooncake_master");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    int argc = static_cast<int>(argv.size());
    char** p = argv.data();
    gflags::ParseCommandLineNonHelpFlags(&argc, &p, false);
  }
  // A file named `name` in the test's temporary directory holding `text`; its path.
  static std::string File(const std::string& name, const std::string& text) {
    const std::string path = ::testing::TempDir() + "master_flags_test_" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  // The message of ApplyConfigFile(path), which must fail.
  static std::string ConfigError(const std::string& path) {
    Status s = ApplyConfigFile(path);
    EXPECT_FALSE(s.ok()) << path;
    return s.message();
  }
  static Status Resolve(const std::vector<std::string>& args, HaSettings* out,
                        int rpc_port = 50051) {
    CommandLine(args);
    return ResolveHaSettings(rpc_port, out);
  }
  // The message of ResolveHaSettings with `args` on the command line, which must fail.
  static std::string HaError(const std::vector<std::string>& args) {
    HaSettings s;
    Status st = Resolve(args, &s);
    EXPECT_FALSE(st.ok());
    return st.message();
  }

 private:
  gflags::FlagSaver saver_;  // every test starts from the defaults, none "given"
};

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

TEST_F(MasterFlagsTest, YamlFileSetsFlagsTheCommandLineDidNotGive) {
  const std::string path = File("a.yaml",
                                "rpc_port: 7777\n"
                                "client_ttl: 33\n"
                                "eviction_ratio: 0.25\n"
                                "enable_ha: true\n"
                                "cluster_id: \"from_file\"\n"
                                "ha_backend_connstring: 10.0.0.1:2379;10.0.0.2:2379\n");
  // Given on the command line, even at its default value: the command line wins.
  CommandLine({"--client_ttl=10", "--cluster_id=from_cmdline"});
  ASSERT_TRUE(ApplyConfigFile(path).ok());
  EXPECT_EQ(FLAGS_rpc_port, 7777);
  EXPECT_EQ(FLAGS_client_ttl, 10);
  EXPECT_DOUBLE_EQ(FLAGS_eviction_ratio, 0.25);
  EXPECT_TRUE(FLAGS_enable_ha);
  EXPECT_EQ(FLAGS_cluster_id, "from_cmdline");
  EXPECT_EQ(FLAGS_ha_backend_connstring, "10.0.0.1:2379;10.0.0.2:2379");
  // Flags set from the file count as given: a second file does not override them.
  ASSERT_TRUE(ApplyConfigFile(File("b.yml", "rpc_port: 8888\n")).ok());
  EXPECT_EQ(FLAGS_rpc_port, 7777);
  // An empty document sets nothing.
  EXPECT_TRUE(ApplyConfigFile(File("empty.yaml", "")).ok());
  EXPECT_TRUE(ApplyConfigFile("").ok());
}

TEST_F(MasterFlagsTest, JsonFileSetsFlagsTheCommandLineDidNotGive) {
  const std::string path = File("a.json",
                                R"({"rpc_port": 7000, "enable_oplog": true, "enable_ha": "true",
                                    "eviction_ratio": 0.5, "cluster_id": "json_c",
                                    "oplog_checkpoint_entries": 500})");
  CommandLine({"--rpc_port=6000"});
  ASSERT_TRUE(ApplyConfigFile(path).ok());
  EXPECT_EQ(FLAGS_rpc_port, 6000);
  EXPECT_TRUE(FLAGS_enable_oplog);
  EXPECT_TRUE(FLAGS_enable_ha);
  EXPECT_DOUBLE_EQ(FLAGS_eviction_ratio, 0.5);
  EXPECT_EQ(FLAGS_cluster_id, "json_c");
  EXPECT_EQ(FLAGS_oplog_checkpoint_entries, 500u);
  EXPECT_TRUE(ApplyConfigFile(File("empty.json", "{}")).ok());
}

TEST_F(MasterFlagsTest, UpstreamsClientLiveTtlSecAliasIsClientTtl) {
  ASSERT_TRUE(ApplyConfigFile(File("alias.yaml", "client_live_ttl_sec: 42\n")).ok());
  EXPECT_EQ(FLAGS_client_ttl, 42);
  MasterConfig config;
  ASSERT_TRUE(MasterConfigFromFlags(&config).ok());
  EXPECT_EQ(config.client_ttl_s, 42u);
  std::string e = ConfigError(File("both.json", R"({"client_ttl": 1, "client_live_ttl_sec": 2})"));
  EXPECT_HAS(e, "key 'client_live_ttl_sec' sets --client_ttl a second time");
}

TEST_F(MasterFlagsTest, ReplicaTaskFlagsReachTheConfigAndZeroIsRefused) {
  ASSERT_TRUE(ApplyConfigFile(File("tasks.yaml", "max_total_pending_tasks: 7\n"
                                                 "pending_task_timeout_sec: 60\n")).ok());
  CommandLine({"--processing_task_timeout_sec=90", "--max_total_finished_tasks=0"});
  MasterConfig config;
  ASSERT_TRUE(MasterConfigFromFlags(&config).ok());
  EXPECT_EQ(config.task_limits.max_pending, 7u);
  EXPECT_EQ(config.task_limits.max_processing, 10000u);
  EXPECT_EQ(config.task_limits.max_finished, 0u);  // none kept: allowed
  EXPECT_EQ(config.task_limits.pending_timeout.count(), 60);
  EXPECT_EQ(config.task_limits.processing_timeout.count(), 90);
  CommandLine({"--max_total_processing_tasks=0"});
  auto st = MasterConfigFromFlags(&config);
  EXPECT_FALSE(st.ok());
  EXPECT_HAS(std::string(st.message()), "must be > 0");
}

TEST_F(MasterFlagsTest, EveryBadFileIsRefusedNamingTheFileAndTheKey) {
  struct Case {
    std::string name, text, key, why;
  };
  const std::vector<Case> cases = {
      {"unknown.yaml", "rpc_port: 1\nno_such_flag: 3\n", "no_such_flag",
       "not a mooncake_master flag"},
      {"unknown.json", R"({"enable_snapshot": true})", "enable_snapshot",
       "not a mooncake_master flag"},
      {"badint.yaml", "rpc_port: abc\n", "rpc_port", "'abc' is not a valid int32"},
      {"badbool.json", R"({"enable_ha": "maybe"})", "enable_ha", "not a valid bool"},
      {"float.json", R"({"rpc_port": 1.5})", "rpc_port", "not a valid int32"},
      {"negative.yaml", "oplog_batch_max_entries: -1\n", "oplog_batch_max_entries",
       "not a valid uint32"},
      {"null.yaml", "cluster_id:\n", "cluster_id", "has no value"},
      {"list.yaml", "cluster_id: [a, b]\n", "cluster_id", "must be a scalar"},
      {"object.json", R"({"cluster_id": {"a": 1}})", "cluster_id", "string, number or bool"},
      {"null.json", R"({"cluster_id": null})", "cluster_id", "string, number or bool"},
      {"nested.yaml", "config_path: other.yaml\n", "config_path", "cannot be set in a config"},
      {"flagfile.json", R"({"flagfile": "/etc/passwd"})", "flagfile", "cannot be set in a config"},
      {"malformed.yaml", "rpc_port: [1, 2\n", "", "not valid YAML"},
      {"malformed.json", R"({"rpc_port": 1,)", "", "not valid JSON"},
      {"toplist.yaml", "- rpc_port\n- 1\n", "", "must be a mapping"},
      {"toplist.json", "[1, 2]", "", "must be an object"},
      {"config.toml", "rpc_port = 1\n", "", "name it .yaml, .yml or .json"},
  };
  for (const auto& c : cases) {
    const std::string path = File(c.name, c.text);
    const std::string e = ConfigError(path);
    EXPECT_HAS(e, "config file " + path);
    if (!c.key.empty()) {
      EXPECT_HAS(e, "key '" + c.key + "'");
    }
    EXPECT_HAS(e, c.why);
  }
  // A value that does not parse is refused even where the command line gives the flag.
  CommandLine({"--rpc_port=5"});
  EXPECT_HAS(ConfigError(File("badint2.yaml", "rpc_port: x\n")), "not a valid int32");
  EXPECT_EQ(FLAGS_rpc_port, 5);
  // Unreadable: missing, or a directory.
  EXPECT_HAS(ConfigError("/nonexistent/dir/m.yaml"),
             "config file /nonexistent/dir/m.yaml: cannot be read");
  const std::string dir = ::testing::TempDir() + "master_flags_test_dir.json";
  std::filesystem::create_directories(dir);
  EXPECT_HAS(ConfigError(dir), "cannot be read");
}

TEST_F(MasterFlagsTest, WithoutHaTheDefaultsResolve) {
  HaSettings s;
  ASSERT_TRUE(Resolve({}, &s).ok());
  EXPECT_FALSE(s.enabled);
  EXPECT_FALSE(s.oplog);
  EXPECT_EQ(s.backend, "etcd");
  EXPECT_EQ(s.cluster_id, "mooncake_cluster");
  EXPECT_TRUE(s.endpoints.empty());
  EXPECT_EQ(s.advertise_address, "");
  EXPECT_EQ(s.oplog_poll_interval_ms, 1000u);
  EXPECT_EQ(s.oplog_batch_max_entries, 1024u);
  EXPECT_EQ(s.batch_oplog_retry_timeout_sec, 180u);
  EXPECT_EQ(s.lease_ttl_sec, 5u);
  EXPECT_FALSE(s.ack_before_durable);
  EXPECT_EQ(s.checkpoint_entries, 100000u);
}

TEST_F(MasterFlagsTest, HaSettingsFromTheFlags) {
  HaSettings s;
  ASSERT_TRUE(Resolve({"--enable_ha", "--enable_oplog", "--rpc_address=10.0.0.7",
                       "--ha_backend_connstring=h1:2379;h2, http://h3:2380/",
                       "--cluster_id=prod.a-1/", "--ha_lease_ttl_sec=3",
                       "--oplog_poll_interval_ms=200", "--oplog_batch_max_entries=64",
                       "--batch_oplog_retry_timeout_sec=30", "--oplog_ack_before_durable",
                       "--oplog_checkpoint_entries=10"},
                      &s, 50052)
                  .ok());
  EXPECT_TRUE(s.enabled);
  EXPECT_TRUE(s.oplog);
  ASSERT_EQ(s.endpoints.size(), 3u);
  EXPECT_EQ(s.endpoints[0].ToString(), "h1:2379");
  EXPECT_EQ(s.endpoints[1].ToString(), "h2:2379");
  EXPECT_EQ(s.endpoints[2].ToString(), "h3:2380");
  EXPECT_EQ(s.cluster_id, "prod.a-1");
  EXPECT_EQ(s.advertise_address, "10.0.0.7:50052");
  EXPECT_EQ(s.lease_ttl_sec, 3u);
  EXPECT_EQ(s.oplog_poll_interval_ms, 200u);
  EXPECT_EQ(s.oplog_batch_max_entries, 64u);
  EXPECT_EQ(s.batch_oplog_retry_timeout_sec, 30u);
  EXPECT_TRUE(s.ack_before_durable);
  EXPECT_EQ(s.checkpoint_entries, 10u);
}

TEST_F(MasterFlagsTest, IPv6RpcAddressIsPublishedInBrackets) {
  HaSettings s;
  ASSERT_TRUE(Resolve({"--enable_ha", "--rpc_address=fd00::1", "--etcd_endpoints=[::1]:2379"},
                      &s, 50051)
                  .ok());
  EXPECT_EQ(s.advertise_address, "[fd00::1]:50051");
  ASSERT_EQ(s.endpoints.size(), 1u);
  EXPECT_EQ(s.endpoints[0].host, "::1");
}

TEST_F(MasterFlagsTest, LegacyEtcdEndpointsAreUsedWhenTheConnstringIsEmpty) {
  HaSettings s;
  ASSERT_TRUE(Resolve({"--enable_ha", "--rpc_address=127.0.0.1", "--etcd_endpoints=e1:1,e2:2"},
                      &s)
                  .ok());
  ASSERT_EQ(s.endpoints.size(), 2u);
  EXPECT_EQ(s.endpoints[1].ToString(), "e2:2");

  ::testing::internal::CaptureStderr();
  HaSettings t;
  Status st = Resolve({"--ha_backend_connstring=c1:3"}, &t);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_HAS(log, "differ: using --ha_backend_connstring");
  ASSERT_EQ(t.endpoints.size(), 1u);
  EXPECT_EQ(t.endpoints[0].ToString(), "c1:3");
}

TEST_F(MasterFlagsTest, AConnstringWithoutHaOnlyWarns) {
  ::testing::internal::CaptureStderr();
  HaSettings s;
  Status st = Resolve({"--ha_backend_connstring=h:2379"}, &s);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_FALSE(s.enabled);
  EXPECT_HAS(log, "ignored without --enable_ha=true");
}

TEST_F(MasterFlagsTest, EveryValidationMessageSaysWhatToChange) {
  const std::string ha = "--enable_ha", conn = "--ha_backend_connstring=h:2379",
                    addr = "--rpc_address=10.0.0.1";
  struct Case {
    std::vector<std::string> args;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{"--enable_oplog"}, "--enable_oplog requires --enable_ha=true"},
      {{ha, addr}, "--enable_ha=true needs the etcd members: set --ha_backend_connstring"},
      {{ha, addr, "--ha_backend_connstring=  "}, "needs the etcd members"},
      {{ha, addr, "--ha_backend_connstring= ;"}, "is empty"},
      {{ha, "--enable_oplog", "--ha_backend_type=redis", conn, addr},
       "--enable_oplog requires --ha_backend_type=etcd"},
      {{ha, "--ha_backend_type=redis", "--ha_backend_connstring=redis://r:6379", addr},
       "--ha_backend_type=redis: this build supports etcd only"},
      {{ha, "--ha_backend_type=k8s", conn, addr}, "this build supports etcd only"},
      {{ha, "--ha_backend_type=zookeeper", conn, addr},
       "'zookeeper' is not a backend (upstream's are etcd, redis and k8s; this build supports "
       "etcd only)"},
      {{"--cluster_id=a b"}, "character ' ' at position 2 is not allowed"},
      {{"--cluster_id=x/y"}, "character '/' at position 2"},
      {{"--cluster_id=/"}, "--cluster_id is empty"},
      {{"--cluster_id=" + std::string(129, 'c')}, "129 characters long: shorten it to at most 128"},
      {{ha, conn}, "other hosts cannot dial 0.0.0.0: set --rpc_address to this host's address"},
      {{ha, conn, "--rpc_address="}, "set --rpc_address to this host's address"},
      {{ha, conn, "--rpc_address=::"}, "set --rpc_address to this host's address"},
      {{ha, "--ha_backend_connstring=h1:2379;;h2", addr}, "item 2 is empty"},
      {{ha, "--ha_backend_connstring=h1:99999", addr}, "port must be a number in 1..65535"},
      {{ha, "--ha_backend_connstring=https://h1:2379", addr}, "https (TLS to etcd) is not supported"},
      {{ha, "--etcd_endpoints=h1:x", addr}, "--etcd_endpoints='h1:x'"},
      {{"--ha_lease_ttl_sec=1"}, "--ha_lease_ttl_sec=1 is out of range: give 2..60"},
      {{"--ha_lease_ttl_sec=61"}, "give 2..60 seconds"},
      {{"--oplog_poll_interval_ms=0"}, "--oplog_poll_interval_ms=0 is out of range: give 1..60000"},
      {{"--oplog_batch_max_entries=0"}, "--oplog_batch_max_entries=0 is out of range"},
      {{"--oplog_batch_max_entries=65537"}, "give 1..65536"},
      {{"--batch_oplog_retry_timeout_sec=0"}, "--batch_oplog_retry_timeout_sec must be >= 1"},
      {{"--oplog_checkpoint_entries=0"}, "--oplog_checkpoint_entries must be >= 1"},
  };
  for (const auto& c : cases) {
    gflags::FlagSaver per_case;
    EXPECT_HAS(HaError(c.args), c.want);
  }
  // The RPC port as resolved must be usable.
  gflags::FlagSaver last;
  HaSettings s;
  EXPECT_HAS(Resolve({ha, conn, addr}, &s, 0).message(), "--rpc_port must be 1..65535");
}

}  // namespace
}  // namespace store
}  // namespace mooncake
