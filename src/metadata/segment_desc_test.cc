// Unit tests for the segment descriptor and its JSON codec (src/metadata/segment_desc.h).
#include "metadata/segment_desc.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace mooncake {
namespace {

// The descriptor example of upstream's wire-protocol doc, byte for byte. Real upstream peers
// add "rdma_server_name" and "tcp_data_host" (tests/interop/UPSTREAM_FACTS.md §2.1); the doc's
// form must still decode.
const char kUpstreamExample[] =
    R"({"buffers":[{"addr":140230000000000,"length":2147483648,"name":"127.0.0.1:12345"}],)"
    R"("name":"127.0.0.1:12345","protocol":"tcp","tcp_data_port":15873,"tcp_proto_version":2,)"
    R"("timestamp":"2026-08-22 13:12:18.123456"})"
    "\n";

// The same descriptor as a real upstream peer writes it (key set and order as captured).
const char kUpstreamWireForm[] =
    R"({"buffers":[{"addr":140230000000000,"length":2147483648,"name":"127.0.0.1:12345"}],)"
    R"("name":"127.0.0.1:12345","protocol":"tcp","rdma_server_name":"",)"
    R"("tcp_data_host":"127.0.0.1","tcp_data_port":15873,"tcp_proto_version":2,)"
    R"("timestamp":"2026-08-22 13:12:18.123456"})"
    "\n";

SegmentDesc ExampleDesc() {
  SegmentDesc d;
  d.name = "127.0.0.1:12345";
  d.protocol = "tcp";
  d.tcp_data_port = 15873;
  d.tcp_proto_version = 2;
  d.timestamp = "2026-08-22 13:12:18.123456";
  d.buffers.push_back({"127.0.0.1:12345", 140230000000000ull, 2147483648ull});
  return d;
}

// A valid descriptor with one field replaced (or added) by `key: value_json`.
std::string With(const std::string& key, const std::string& value_json) {
  nlohmann::json j = nlohmann::json::parse(kUpstreamExample);
  j[key] = nlohmann::json::parse(value_json);
  return j.dump();
}

std::string WithBuffer(const std::string& buffer_json) {
  return With("buffers", "[" + buffer_json + "]");
}

// --- encode ------------------------------------------------------------------------------------

TEST(SegmentDescEncodeTest, MatchesUpstreamByteForByte) {
  SegmentDesc d = ExampleDesc();
  d.tcp_data_host = "127.0.0.1";
  EXPECT_EQ(EncodeSegmentDesc(d), kUpstreamWireForm);
}

TEST(SegmentDescEncodeTest, CompactSortedWithTrailingNewline) {
  SegmentDesc d;
  d.name = "n";
  d.host = "10.0.0.1";  // not part of the JSON
  std::string s = EncodeSegmentDesc(d);
  EXPECT_EQ(s, R"({"buffers":[],"name":"n","protocol":"tcp","rdma_server_name":"",)"
               R"("tcp_data_host":"","tcp_data_port":0,"tcp_proto_version":1,"timestamp":""})"
               "\n");
  EXPECT_EQ(s.find("10.0.0.1"), std::string::npos);
  EXPECT_EQ(s.find(' '), std::string::npos);
  EXPECT_EQ(s.find('\n'), s.size() - 1);
}

TEST(SegmentDescEncodeTest, RoundTrip) {
  SegmentDesc d = ExampleDesc();
  d.buffers.push_back({"second", UINT64_MAX - 10, 10});  // largest non-wrapping range
  d.buffers.push_back({"", 1, 1});
  d.tcp_data_port = 65535;
  d.tcp_data_host = "10.1.2.3";
  d.rdma_server_name = "rdma-x";
  auto r = DecodeSegmentDesc(EncodeSegmentDesc(d));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->SameContent(d));
  EXPECT_EQ(r->timestamp, d.timestamp);
  ASSERT_EQ(r->buffers.size(), 3u);
  EXPECT_EQ(r->buffers[1].addr, UINT64_MAX - 10);
  EXPECT_EQ(r->buffers[1].name, "second");
  EXPECT_EQ(r->tcp_data_port, 65535);
  EXPECT_EQ(r->tcp_data_host, "10.1.2.3");
  EXPECT_EQ(r->rdma_server_name, "rdma-x");
  EXPECT_EQ(EncodeSegmentDesc(*r), EncodeSegmentDesc(d));
}

// BUG (segment_desc.cc, EncodeSegmentDesc): json::dump() throws nlohmann::type_error 316 on a
// string that is not valid UTF-8. Nothing checks the segment name for that (ParseHostPort
// accepts any bytes, e.g. initialize("host\xff", ...)), and the encoder runs in the
// handshake server's worker thread for each Metadata request, where the exception
// terminates the process.
TEST(SegmentDescEncodeTest, InvalidUtf8DoesNotThrow) {
  SegmentDesc d = ExampleDesc();
  d.name = "host\xff:12345";
  d.buffers[0].name = d.name;
  std::string out;
  EXPECT_NO_THROW(out = EncodeSegmentDesc(d));
}

TEST(SegmentDescEncodeTest, SameHostFieldsOnlyWhenSet) {
  SegmentDesc d = ExampleDesc();
  d.mc_host_id = "boot-1/ns-2";
  d.mc_pid = 4321;
  d.mc_shm_path = "/tmp/mc.sock";
  std::string s = EncodeSegmentDesc(d);
  EXPECT_NE(s.find(R"("mc_host_id":"boot-1/ns-2","mc_pid":4321,"mc_shm_path":"/tmp/mc.sock")"),
            std::string::npos) << s;
  auto r = DecodeSegmentDesc(s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->SameContent(d));
  EXPECT_FALSE(r->SameContent(ExampleDesc()));
  EXPECT_EQ(r->mc_pid, 4321u);
  EXPECT_EQ(EncodeSegmentDesc(ExampleDesc()).find("mc_"), std::string::npos);
}

TEST(SegmentDescEncodeTest, TimestampFormat) {
  std::string ts = DescriptorTimestampNow();
  ASSERT_EQ(ts.size(), 26u) << ts;  // "YYYY-mm-dd HH:MM:SS.uuuuuu"
  EXPECT_EQ(ts[4], '-');
  EXPECT_EQ(ts[10], ' ');
  EXPECT_EQ(ts[13], ':');
  EXPECT_EQ(ts[19], '.');
}

// --- decode ------------------------------------------------------------------------------------

TEST(SegmentDescDecodeTest, UpstreamExample) {
  auto r = DecodeSegmentDesc(kUpstreamExample);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->name, "127.0.0.1:12345");
  EXPECT_EQ(r->protocol, "tcp");
  EXPECT_EQ(r->tcp_data_port, 15873);
  EXPECT_EQ(r->tcp_proto_version, 2);
  EXPECT_EQ(r->timestamp, "2026-08-22 13:12:18.123456");
  ASSERT_EQ(r->buffers.size(), 1u);
  EXPECT_EQ(r->buffers[0].name, "127.0.0.1:12345");
  EXPECT_EQ(r->buffers[0].addr, 140230000000000ull);
  EXPECT_EQ(r->buffers[0].length, 2147483648ull);
  EXPECT_TRUE(r->host.empty());
  EXPECT_TRUE(r->tcp_data_host.empty());  // absent in the doc's form
}

TEST(SegmentDescDecodeTest, UpstreamWireForm) {
  auto r = DecodeSegmentDesc(kUpstreamWireForm);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tcp_data_host, "127.0.0.1");
  EXPECT_EQ(r->rdma_server_name, "");
  EXPECT_EQ(r->tcp_data_port, 15873);
  EXPECT_EQ(EncodeSegmentDesc(*r), kUpstreamWireForm);
}

TEST(SegmentDescDecodeTest, MissingProtoVersionMeansOne) {
  nlohmann::json j = nlohmann::json::parse(kUpstreamExample);
  j.erase("tcp_proto_version");
  auto r = DecodeSegmentDesc(j.dump());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tcp_proto_version, 1);
}

TEST(SegmentDescDecodeTest, OptionalFieldsMayBeAbsent) {
  auto r = DecodeSegmentDesc(R"({"name":"a","protocol":"tcp"})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tcp_data_port, 0);
  EXPECT_TRUE(r->timestamp.empty());
  EXPECT_TRUE(r->buffers.empty());
}

TEST(SegmentDescDecodeTest, ProtocolAsArrayTakesFirst) {
  auto r = DecodeSegmentDesc(With("protocol", R"(["tcp","rdma"])"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->protocol, "tcp");
  auto r2 = DecodeSegmentDesc(With("protocol", R"(["rdma"])"));
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->protocol, "rdma");
}

TEST(SegmentDescDecodeTest, UnknownFieldsIgnored) {
  nlohmann::json j = nlohmann::json::parse(kUpstreamExample);
  j["devices"] = nlohmann::json::array({{{"name", "mlx5_0"}, {"lid", 0}, {"gid", "fe80::"}}});
  j["priority_matrix"] = nlohmann::json::object({{"cpu:0", {{"mlx5_0"}, nlohmann::json::array()}}});
  j["rank_info"] = nullptr;
  j["buffers"][0]["lkey"] = {1, 2};
  j["buffers"][0]["rkey"] = {3, 4};
  j["buffers"][0]["shm_name"] = "x";
  auto r = DecodeSegmentDesc(j.dump(2));  // pretty-printed and reordered input is fine too
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->SameContent(ExampleDesc()));
}

TEST(SegmentDescDecodeTest, BracketsInsideStringsDoNotCountAsNesting) {
  std::string name(100, '[');
  name += "\\\"{{{{";  // an escaped quote does not end the string
  name += std::string(100, '{');
  auto r = DecodeSegmentDesc(R"({"protocol":"tcp","name":")" + name + R"("})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->name.size(), 100u + 1 + 4 + 100);
}

TEST(SegmentDescDecodeTest, ModerateNestingInUnknownFieldAccepted) {
  std::string deep = std::string(20, '[') + std::string(20, ']');
  auto r = DecodeSegmentDesc(With("extra", deep));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
}

struct BadCase {
  const char* what;
  std::string json;
  const char* must_mention;  // the field (or problem) the message names
};

TEST(SegmentDescDecodeTest, MalformedInputsRejectedWithDataLoss) {
  const std::string deep_arrays =
      R"({"name":"a","protocol":"tcp","x":)" + std::string(1000, '[') + std::string(1000, ']') +
      "}";
  std::string deep_objects;
  for (int i = 0; i < 1000; ++i) deep_objects += R"({"a":)";
  deep_objects += "1" + std::string(1000, '}');
  const std::string unbalanced = std::string(1000, '[');  // deep and not even closed

  const BadCase cases[] = {
      {"not JSON", "this is not json", "JSON"},
      {"truncated", std::string(kUpstreamExample).substr(0, 40), "JSON"},
      {"empty input", "", "JSON"},
      {"array", "[1,2,3]", "object"},
      {"string", "\"name\"", "object"},
      {"null", "null", "object"},
      {"missing name", R"({"protocol":"tcp"})", "name"},
      {"empty name", With("name", R"("")"), "name"},
      {"name not string", With("name", "42"), "name"},
      {"name null", With("name", "null"), "name"},
      {"protocol not string", With("protocol", "7"), "protocol"},
      {"protocol empty array", With("protocol", "[]"), "protocol"},
      {"protocol array of numbers", With("protocol", "[1]"), "protocol"},
      {"port string", With("tcp_data_port", R"("15873")"), "tcp_data_port"},
      {"port negative", With("tcp_data_port", "-1"), "tcp_data_port"},
      {"port > 65535", With("tcp_data_port", "65536"), "tcp_data_port"},
      {"port fractional", With("tcp_data_port", "1.5"), "tcp_data_port"},
      {"version string", With("tcp_proto_version", R"("2")"), "tcp_proto_version"},
      {"version negative", With("tcp_proto_version", "-2"), "tcp_proto_version"},
      {"version huge", With("tcp_proto_version", "4294967298"), "tcp_proto_version"},
      {"timestamp number", With("timestamp", "5"), "timestamp"},
      {"tcp_data_host number", With("tcp_data_host", "1"), "tcp_data_host"},
      {"rdma_server_name array", With("rdma_server_name", "[]"), "rdma_server_name"},
      {"mc_pid too big", With("mc_pid", "4294967296"), "mc_pid"},
      {"buffers object", With("buffers", "{}"), "buffers"},
      {"buffers string", With("buffers", R"("x")"), "buffers"},
      {"buffer not object", With("buffers", "[5]"), "buffers[0]"},
      {"buffer addr 0", WithBuffer(R"({"addr":0,"length":10,"name":"a"})"), "buffers[0]"},
      {"buffer addr missing", WithBuffer(R"({"length":10,"name":"a"})"), "buffers[0]"},
      {"buffer length 0", WithBuffer(R"({"addr":4096,"length":0,"name":"a"})"), "buffers[0]"},
      {"buffer wraps",
       WithBuffer(R"({"addr":18446744073709551615,"length":2,"name":"a"})"), "buffers[0]"},
      {"buffer addr negative", WithBuffer(R"({"addr":-4096,"length":10,"name":"a"})"),
       "addr"},
      {"buffer length negative", WithBuffer(R"({"addr":4096,"length":-1,"name":"a"})"),
       "length"},
      {"buffer addr string", WithBuffer(R"({"addr":"4096","length":10,"name":"a"})"), "addr"},
      {"buffer addr float", WithBuffer(R"({"addr":4096.0,"length":10,"name":"a"})"), "addr"},
      {"buffer addr > u64", WithBuffer(R"({"addr":18446744073709551616,"length":1})"), "addr"},
      {"buffer name number", WithBuffer(R"({"addr":4096,"length":10,"name":1})"), "name"},
      {"second buffer bad",
       With("buffers", R"([{"addr":4096,"length":10},{"addr":0,"length":10}])"), "buffers[1]"},
      {"nested arrays 1000 deep", deep_arrays, "nests"},
      {"nested objects 1000 deep", deep_objects, "nests"},
      {"1000 unclosed brackets", unbalanced, "nests"},
      {"33 deep", With("x", std::string(32, '[') + std::string(32, ']')), "nests"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto r = DecodeSegmentDesc(c.json);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Status::Code::kDataLoss) << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.must_mention), std::string::npos)
        << "message does not name '" << c.must_mention << "': " << r.status().message();
  }
}

// --- FindBuffer / SameContent ------------------------------------------------------------------

TEST(SegmentDescTest, FindBufferEdges) {
  SegmentDesc d;
  d.name = "s";
  d.buffers.push_back({"a", 0x1000, 0x1000});  // [0x1000, 0x2000)
  d.buffers.push_back({"b", 0x2000, 0x1000});  // [0x2000, 0x3000), adjacent to a
  d.buffers.push_back({"c", 0x8000, 0x100});   // [0x8000, 0x8100)

  EXPECT_EQ(d.FindBuffer(0x1000, 0x1000), &d.buffers[0]);  // exact fit
  EXPECT_EQ(d.FindBuffer(0x1fff, 1), &d.buffers[0]);       // last byte
  EXPECT_EQ(d.FindBuffer(0x2000, 1), &d.buffers[1]);       // first byte of the next
  EXPECT_EQ(d.FindBuffer(0x1000, 0x1001), nullptr);        // one past the end
  EXPECT_EQ(d.FindBuffer(0x1fff, 2), nullptr);             // straddles a and b
  EXPECT_EQ(d.FindBuffer(0xfff, 2), nullptr);              // starts before a
  EXPECT_EQ(d.FindBuffer(0x8000, 0x100), &d.buffers[2]);
  EXPECT_EQ(d.FindBuffer(0x8100, 1), nullptr);  // just past c
  EXPECT_EQ(d.FindBuffer(0x4000, 1), nullptr);  // gap
  EXPECT_EQ(d.FindBuffer(0x1000, 0), nullptr);  // zero length never matches
  EXPECT_EQ(d.FindBuffer(0x1800, UINT64_MAX), nullptr);  // wraps
  EXPECT_EQ(d.FindBuffer(UINT64_MAX, 2), nullptr);       // wraps

  SegmentDesc top;
  top.buffers.push_back({"t", UINT64_MAX - 0x1000, 0x1000});  // [.., UINT64_MAX)
  EXPECT_EQ(top.FindBuffer(UINT64_MAX - 0x10, 0x10), &top.buffers[0]);
  EXPECT_EQ(top.FindBuffer(UINT64_MAX - 0x10, 0x11), nullptr);
  EXPECT_EQ(SegmentDesc{}.FindBuffer(0x1000, 1), nullptr);
}

TEST(SegmentDescTest, SameContentIgnoresTimestampOnly) {
  SegmentDesc a = ExampleDesc();
  SegmentDesc b = ExampleDesc();
  b.timestamp = "1999-01-01 00:00:00.000000";
  b.host = "elsewhere";
  EXPECT_TRUE(a.SameContent(b));
  EXPECT_TRUE(b.SameContent(a));

  auto differs = [&](auto mutate) {
    SegmentDesc c = ExampleDesc();
    mutate(c);
    return !a.SameContent(c) && !c.SameContent(a);
  };
  EXPECT_TRUE(differs([](SegmentDesc& c) { c.name = "other"; }));
  EXPECT_TRUE(differs([](SegmentDesc& c) { c.protocol = "rdma"; }));
  EXPECT_TRUE(differs([](SegmentDesc& c) { c.tcp_data_port = 1; }));
  EXPECT_TRUE(differs([](SegmentDesc& c) { c.tcp_data_host = "127.0.0.2"; }));
  EXPECT_TRUE(differs([](SegmentDesc& c) { c.tcp_proto_version = 1; }));
  EXPECT_TRUE(differs([](SegmentDesc& c) { c.buffers.clear(); }));
  EXPECT_TRUE(differs([](SegmentDesc& c) { c.buffers.push_back({"x", 1, 1}); }));
  EXPECT_TRUE(differs([](SegmentDesc& c) { c.buffers[0].name = "x"; }));
  EXPECT_TRUE(differs([](SegmentDesc& c) { c.buffers[0].addr += 1; }));
  EXPECT_TRUE(differs([](SegmentDesc& c) { c.buffers[0].length -= 1; }));
}

// --- a descriptor captured from a real upstream peer, when present ------------------------------

std::filesystem::path SourceRoot() {
#ifdef MC_SOURCE_DIR
  return std::filesystem::path(MC_SOURCE_DIR);
#else
  // This file is <root>/src/metadata/segment_desc_test.cc.
  std::filesystem::path self(__FILE__);
  if (self.is_relative()) return {};
  return self.parent_path().parent_path().parent_path();
#endif
}

TEST(SegmentDescDecodeTest, CapturedUpstreamDescriptor) {
  std::filesystem::path root = SourceRoot();
  if (root.empty()) GTEST_SKIP() << "source directory unknown (__FILE__ is relative)";
  auto path = root / "tests/interop/fixtures/upstream_descriptor_tcp.json";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << "no captured upstream descriptor at " << path.string();
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();

  auto r = DecodeSegmentDesc(text);
  ASSERT_TRUE(r.ok()) << r.status().ToString() << "\n" << text;
  EXPECT_FALSE(r->name.empty());
  EXPECT_EQ(r->protocol, "tcp");
  EXPECT_GT(r->tcp_data_port, 0);
  for (const auto& b : r->buffers) {
    EXPECT_GT(b.addr, 0u);
    EXPECT_GT(b.length, 0u);
  }
  // Every field we know agrees with a plain JSON reading of the same text.
  nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(r->name, j.at("name").get<std::string>());
  EXPECT_EQ(r->tcp_data_port, j.at("tcp_data_port").get<uint64_t>());
  if (j.contains("buffers")) {
    ASSERT_EQ(r->buffers.size(), j["buffers"].size());
    for (size_t i = 0; i < r->buffers.size(); ++i) {
      EXPECT_EQ(r->buffers[i].addr, j["buffers"][i].at("addr").get<uint64_t>());
      EXPECT_EQ(r->buffers[i].length, j["buffers"][i].at("length").get<uint64_t>());
    }
  }
  // We write it back byte for byte (all of upstream's fields are ones we know).
  EXPECT_EQ(EncodeSegmentDesc(*r), text);
  // And our encoding decodes to the same content.
  auto again = DecodeSegmentDesc(EncodeSegmentDesc(*r));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->SameContent(*r));
}

}  // namespace
}  // namespace mooncake

namespace mooncake {
namespace {

TEST(SegmentDescDeviceTest, DeviceFieldsRoundTripAndHostBuffersStayUpstreamShaped) {
  SegmentDesc d;
  d.name = "127.0.0.1:1";
  d.buffers.push_back({"127.0.0.1:1", 4096, 100});
  BufferDesc dev{"127.0.0.1:1", 1 << 20, 4096};
  dev.location = "cuda:3";
  dev.ipc_handle = std::string(128, 'a');
  dev.ipc_offset = 512;
  d.buffers.push_back(dev);
  std::string json = EncodeSegmentDesc(d);
  // Host buffers carry upstream's three fields only.
  EXPECT_NE(json.find(R"({"addr":4096,"length":100,"name":"127.0.0.1:1"})"), std::string::npos)
      << json;
  auto back = DecodeSegmentDesc(json);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->buffers.size(), 2u);
  EXPECT_EQ(back->buffers[0].device, -1);
  EXPECT_EQ(back->buffers[1].device, 3);
  EXPECT_EQ(back->buffers[1].location, "cuda:3");
  EXPECT_EQ(back->buffers[1].ipc_handle, dev.ipc_handle);
  EXPECT_EQ(back->buffers[1].ipc_offset, 512u);
  EXPECT_TRUE(back->SameContent(d));
  SegmentDesc other = *back;
  other.buffers[1].ipc_handle = std::string(128, 'b');
  EXPECT_FALSE(other.SameContent(d)) << "a new handle is a changed descriptor";
}

TEST(SegmentDescDeviceTest, MalformedDeviceFieldsAreRejected) {
  const std::string head = R"({"name":"a","protocol":"tcp","buffers":[{"name":"a","addr":1,"length":2,)";
  EXPECT_FALSE(DecodeSegmentDesc(head + R"("mc_location":"cuda:x"}]})").ok());
  EXPECT_FALSE(DecodeSegmentDesc(head + R"("mc_location":"cuda:"}]})").ok());
  EXPECT_FALSE(DecodeSegmentDesc(head + R"("mc_location":"npu:x"}]})").ok());
  EXPECT_FALSE(DecodeSegmentDesc(head + R"("mc_location":"npu:"}]})").ok());
  auto npu = DecodeSegmentDesc(head + R"("mc_location":"npu:2"}]})");
  ASSERT_TRUE(npu.ok()) << npu.status().ToString();
  EXPECT_EQ(npu->buffers[0].device, 2);
  EXPECT_FALSE(DecodeSegmentDesc(head + R"("mc_ipc_handle":"abc"}]})").ok());
  EXPECT_FALSE(DecodeSegmentDesc(head + R"("mc_ipc_handle":")" + std::string(128, 'z') +
                                 R"("}]})").ok());
  EXPECT_FALSE(DecodeSegmentDesc(head + R"("mc_ipc_offset":-1}]})").ok());
  auto ok = DecodeSegmentDesc(head + R"("mc_location":"cpu:0"}]})");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->buffers[0].device, -1);
}

TEST(SegmentDescUcxTest, UcxFieldsRoundTripAndAreWrittenOnlyWhenSet) {
  SegmentDesc d;
  d.name = "127.0.0.1:1";
  d.buffers.push_back({"127.0.0.1:1", 4096, 100});
  const std::string plain = EncodeSegmentDesc(d);
  EXPECT_EQ(plain.find("mc_ucx"), std::string::npos) << plain;
  d.mc_ucx_worker = "00ff10ab";
  d.buffers[0].ucx_rkey = "0102";
  auto back = DecodeSegmentDesc(EncodeSegmentDesc(d));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->mc_ucx_worker, "00ff10ab");
  EXPECT_EQ(back->buffers[0].ucx_rkey, "0102");
  EXPECT_TRUE(back->SameContent(d));
  SegmentDesc restarted = *back;
  restarted.buffers[0].ucx_rkey = "0103";
  EXPECT_FALSE(restarted.SameContent(d)) << "new keys are a changed descriptor";
  restarted = *back;
  restarted.mc_ucx_worker = "00ff10ac";
  EXPECT_FALSE(restarted.SameContent(d)) << "a new worker address is a changed descriptor";
}

TEST(SegmentDescUcxTest, HostileUcxFieldsAreRefusedWithTheirName) {
  const std::string buf = R"({"name":"a","protocol":"tcp","buffers":[{"name":"a","addr":1,"length":2,)";
  const std::string top = R"({"name":"a","protocol":"tcp","buffers":[],)";
  auto expect_refused = [](const std::string& json, const std::string& words) {
    auto r = DecodeSegmentDesc(json);
    ASSERT_FALSE(r.ok()) << json.substr(0, 200);
    EXPECT_EQ(r.status().code(), Status::Code::kDataLoss);
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().ToString();
  };
  // Absurd lengths: one digit past the bound is refused, the bound itself is accepted.
  const std::string huge_worker(2 * kMaxUcxWorkerAddressBytes + 2, 'a');
  expect_refused(top + R"("mc_ucx_worker":")" + huge_worker + R"("})", "mc_ucx_worker is");
  expect_refused(top + R"("mc_ucx_worker":")" + std::string(200000, 'a') + R"("})",
                 "mc_ucx_worker is");
  EXPECT_TRUE(DecodeSegmentDesc(top + R"("mc_ucx_worker":")" +
                                std::string(2 * kMaxUcxWorkerAddressBytes, 'a') + R"("})")
                  .ok());
  expect_refused(buf + R"("mc_ucx_rkey":")" + std::string(2 * kMaxUcxRkeyBytes + 2, 'b') +
                     R"("}]})",
                 "mc_ucx_rkey is");
  EXPECT_TRUE(DecodeSegmentDesc(buf + R"("mc_ucx_rkey":")" +
                                std::string(2 * kMaxUcxRkeyBytes, 'b') + R"("}]})")
                  .ok());
  // Not hex, odd digit counts, wrong types.
  expect_refused(top + R"("mc_ucx_worker":"zz"})", "not an even number of hex digits");
  expect_refused(top + R"("mc_ucx_worker":"abc"})", "not an even number of hex digits");
  expect_refused(buf + R"("mc_ucx_rkey":"0g"}]})", "mc_ucx_rkey");
  expect_refused(buf + R"("mc_ucx_rkey":12}]})", "mc_ucx_rkey");
  expect_refused(top + R"("mc_ucx_worker":[1]})", "mc_ucx_worker");
}


TEST(SegmentDescAuthTest, AuthFieldsRoundTripAndStayOutOfTheSignedBytes) {
  SegmentDesc d;
  d.name = "seg";
  d.tcp_data_port = 1234;
  d.buffers.push_back({"seg", 4096, 4096});
  const std::string plain = EncodeSegmentDesc(d);
  EXPECT_EQ(plain.find("mc_auth"), std::string::npos) << "written only when set";
  d.mc_auth_instance = std::string(32, 'a');
  d.mc_auth_sig = std::string(64, 'b');
  auto back = DecodeSegmentDesc(EncodeSegmentDesc(d));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->mc_auth_instance, d.mc_auth_instance);
  EXPECT_EQ(back->mc_auth_sig, d.mc_auth_sig);
  EXPECT_EQ(SegmentDescSigningBytes(*back), SegmentDescSigningBytes(d));
  EXPECT_EQ(SegmentDescSigningBytes(d).find(d.mc_auth_sig), std::string::npos);
  // Whitespace, key order and unknown keys added by others do not change the signed bytes.
  auto j = nlohmann::json::parse(EncodeSegmentDesc(d));
  j["zzz_unknown"] = 1;
  auto other = DecodeSegmentDesc(j.dump(2));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(SegmentDescSigningBytes(*other), SegmentDescSigningBytes(d));
  // A changed port is a changed signed text and a changed instance a changed descriptor.
  SegmentDesc moved = d;
  moved.tcp_data_port = 999;
  EXPECT_NE(SegmentDescSigningBytes(moved), SegmentDescSigningBytes(d));
  SegmentDesc restarted = d;
  restarted.mc_auth_instance = std::string(32, 'c');
  EXPECT_FALSE(restarted.SameContent(d));
  // Bounded and hex only.
  for (const char* bad : {R"("mc_auth_sig":"xyz")", R"("mc_auth_instance":"abc")"}) {
    std::string text = std::string(R"({"name":"s","protocol":"tcp",)") + bad + "}";
    auto r = DecodeSegmentDesc(text);
    EXPECT_FALSE(r.ok()) << text;
  }
  std::string longsig = R"({"name":"s","protocol":"tcp","mc_auth_sig":")" + std::string(130, 'a') + "\"}";
  EXPECT_FALSE(DecodeSegmentDesc(longsig).ok());
}

}  // namespace
}  // namespace mooncake
