// KV events: the key parser, the msgpack batch (decoded here with msgpack-cxx), and the
// publisher over real ZeroMQ sockets (ipc endpoints): the live stream, drops leaving gaps,
// replay from a sequence number, snapshots and their rate limit, and requests that are not
// requests. Skipped when libzmq5 cannot be loaded.
#include <endian.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <msgpack.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "store/kv_events/kv_event_codec.h"
#include "store/kv_events/kv_event_publisher.h"
#include "store/kv_events/zmq_lib.h"

namespace mooncake::store::kv_events {
namespace {

TEST(KvEventCodec, ParsesDecimalAndHexKeysOnly) {
  EXPECT_EQ(ParseSeqHash("12345"), 12345u);
  EXPECT_EQ(ParseSeqHash("0x1f"), 31u);
  EXPECT_EQ(ParseSeqHash("0XFFFFFFFFFFFFFFFF"), UINT64_MAX);
  EXPECT_EQ(ParseSeqHash("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"", "0x", "18446744073709551616", "0x10000000000000000", "-1", "+1",
                          " 1", "1 ", "12a", "0xg", "abc-123", "sglang/0/abc"}) {
    EXPECT_FALSE(ParseSeqHash(bad).has_value()) << bad;
  }
}

std::map<std::string, msgpack::object> AsMap(const msgpack::object& o) {
  std::map<std::string, msgpack::object> m;
  for (uint32_t i = 0; i < o.via.map.size; ++i) {
    m[o.via.map.ptr[i].key.as<std::string>()] = o.via.map.ptr[i].val;
  }
  return m;
}

TEST(KvEventCodec, BatchHasUpstreamsFields) {
  CodecOptions o;
  o.backend_id = "pool-0";
  std::vector<Event> events(2);
  events[0].key = "0x2a";
  events[1].stored = false;
  events[1].key = "not-a-hash";
  uint64_t ids = 7, unparsed = 0;
  std::string out;
  ASSERT_EQ(EncodeBatch(events, o, 1700000000000, &ids, &unparsed, &out), 2u);
  EXPECT_EQ(ids, 9u);
  EXPECT_EQ(unparsed, 1u);
  msgpack::object_handle h = msgpack::unpack(out.data(), out.size());
  const msgpack::object& root = h.get();
  ASSERT_EQ(root.type, msgpack::type::ARRAY);
  ASSERT_EQ(root.via.array.size, 3u);
  EXPECT_EQ(root.via.array.ptr[0].as<int64_t>(), 1700000000000);
  EXPECT_EQ(root.via.array.ptr[2].as<uint32_t>(), 0u);
  const msgpack::object& list = root.via.array.ptr[1];
  ASSERT_EQ(list.via.array.size, 2u);
  auto stored = AsMap(list.via.array.ptr[0]);
  EXPECT_EQ(stored.size(), 20u);  // 13 + type, block_hashes + object_key + 4 stored fields
  EXPECT_EQ(stored["event_id"].as<uint64_t>(), 7u);
  EXPECT_EQ(stored["event_type"].as<std::string>(), "stored");
  EXPECT_EQ(stored["type"].as<std::string>(), "BlockStored");
  EXPECT_EQ(stored["backend_id"].as<std::string>(), "pool-0");
  EXPECT_EQ(stored["tenant_id"].as<std::string>(), "default");
  EXPECT_EQ(stored["medium"].as<std::string>(), "cpu");
  EXPECT_EQ(stored["object_key"].as<std::string>(), "0x2a");
  EXPECT_EQ(stored["seq_hashes"].as<std::vector<uint64_t>>(), std::vector<uint64_t>{42});
  EXPECT_EQ(stored["block_hashes"].as<std::vector<int64_t>>(), std::vector<int64_t>{42});
  EXPECT_EQ(stored["base_block_idx"].as<uint32_t>(), 0u);
  for (const char* nil : {"model_name", "block_size", "additional_salt", "lora_name", "dp_rank",
                          "group_id", "parent_hash", "token_ids", "parent_block_hash"}) {
    EXPECT_TRUE(stored[nil].is_nil()) << nil;
  }
  auto removed = AsMap(list.via.array.ptr[1]);
  EXPECT_EQ(removed.size(), 17u);  // 13 + 2 legacy + object_key + base_block_idx
  EXPECT_EQ(removed["event_type"].as<std::string>(), "removed");
  EXPECT_EQ(removed["type"].as<std::string>(), "BlockRemoved");
  EXPECT_TRUE(removed["seq_hashes"].via.array.size == 0);
  EXPECT_TRUE(removed["base_block_idx"].is_nil());

  // Without object keys, an event whose key is no hash would say nothing: it is left out.
  o.emit_object_key = false;
  o.legacy_compat = false;
  unparsed = 0;
  ASSERT_EQ(EncodeBatch(events, o, 1, &ids, &unparsed, &out), 1u);
  EXPECT_EQ(unparsed, 1u);
  h = msgpack::unpack(out.data(), out.size());
  auto only = AsMap(h.get().via.array.ptr[1].via.array.ptr[0]);
  EXPECT_EQ(only.size(), 16u);
  EXPECT_EQ(only.count("object_key") + only.count("type") + only.count("block_hashes"), 0u);
  events.pop_back();
  events[0].key = "plain";
  EXPECT_EQ(EncodeBatch(events, o, 1, &ids, &unparsed, &out), 0u);
  EXPECT_TRUE(out.empty());
}

// A client socket of the test (SUB or DEALER) on the loaded libzmq.
class Client {
 public:
  Client(const ZmqLib* z, void* ctx, int type, const std::string& endpoint) : z_(z) {
    s_ = z_->socket(ctx, type);
    const int linger = 0;
    z_->setsockopt(s_, ZMQ_LINGER, &linger, sizeof(linger));
    if (type == ZMQ_SUB) z_->setsockopt(s_, ZMQ_SUBSCRIBE, "", 0);
    EXPECT_EQ(z_->connect(s_, endpoint.c_str()), 0);
  }
  ~Client() { z_->close(s_); }
  // One message's frames, or empty after `timeout_ms`.
  std::vector<std::string> Recv(int timeout_ms = 5000) {
    zmq_pollitem_t item{};
    item.socket = s_;
    item.events = ZMQ_POLLIN;
    if (z_->poll(&item, 1, timeout_ms) <= 0) return {};
    std::vector<std::string> frames;
    bool more = true;
    while (more) {
      zmq_msg_t m;
      z_->msg_init(&m);
      if (z_->msg_recv(&m, s_, 0) < 0) break;
      frames.emplace_back(static_cast<const char*>(z_->msg_data(&m)), z_->msg_size(&m));
      more = z_->msg_more(&m) != 0;
      z_->msg_close(&m);
    }
    return frames;
  }
  void Send(const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      z_->send(s_, frames[i].data(), frames[i].size(), i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
    }
  }

 private:
  const ZmqLib* z_;
  void* s_;
};

uint64_t Seq(const std::string& frame) {
  uint64_t be;
  EXPECT_EQ(frame.size(), 8u);
  std::memcpy(&be, frame.data(), 8);
  return be64toh(be);
}

std::string Be(uint64_t v) {
  const uint64_t be = htobe64(v);
  return std::string(reinterpret_cast<const char*>(&be), 8);
}

std::vector<std::string> Keys(const std::string& payload) {
  msgpack::object_handle h = msgpack::unpack(payload.data(), payload.size());
  std::vector<std::string> keys;
  const msgpack::object& list = h.get().via.array.ptr[1];
  for (uint32_t i = 0; i < list.via.array.size; ++i) {
    auto m = AsMap(list.via.array.ptr[i]);
    keys.push_back(m["event_type"].as<std::string>() + ":" + m["object_key"].as<std::string>());
  }
  return keys;
}

class KvEventPublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto z = LoadZmq();
    if (!z.ok()) GTEST_SKIP() << z.status().message();
    z_ = *z;
    ctx_ = z_->ctx_new();
    const std::string base = "ipc:///tmp/mc_kv_events_test_" + std::to_string(::getpid()) + "_" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name();
    options_.bind_endpoint = base + ".pub";
    options_.replay_endpoint = base + ".replay";
    options_.codec.backend_id = "pool-test";
    options_.snapshot_interval = std::chrono::milliseconds(60000);
  }
  void TearDown() override {
    publisher_.reset();
    if (ctx_ != nullptr) z_->ctx_term(ctx_);
  }
  void StartPublisher() {
    auto p = KvEventPublisher::Start(options_, [this](const auto& fn) {
      for (const auto& k : state_) fn(k);
    });
    ASSERT_TRUE(p.ok()) << p.status().message();
    publisher_ = std::move(p).value();
  }
  // A SUB socket that receives: it is connected, and a probe event has come through.
  std::unique_ptr<Client> Subscribe() {
    auto sub = std::make_unique<Client>(z_, ctx_, ZMQ_SUB, options_.bind_endpoint);
    for (int i = 0; i < 100; ++i) {
      publisher_->ObjectStored("probe");
      auto f = sub->Recv(100);
      if (!f.empty()) {
        while (!sub->Recv(200).empty()) {
        }
        return sub;
      }
    }
    ADD_FAILURE() << "the subscriber never received";
    return sub;
  }

  const ZmqLib* z_ = nullptr;
  void* ctx_ = nullptr;
  PublisherOptions options_;
  std::set<std::string> state_;
  std::unique_ptr<KvEventPublisher> publisher_;
};

TEST_F(KvEventPublisherTest, RefusesMissingEndpointOrBackendAndBadBinds) {
  PublisherOptions o = options_;
  o.bind_endpoint.clear();
  EXPECT_FALSE(KvEventPublisher::Start(o, nullptr).ok());
  o = options_;
  o.codec.backend_id.clear();
  EXPECT_FALSE(KvEventPublisher::Start(o, nullptr).ok());
  o = options_;
  o.bind_endpoint = "tcp://256.1.1.1:1";
  auto bad = KvEventPublisher::Start(o, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("256.1.1.1"), std::string::npos);
}

TEST_F(KvEventPublisherTest, PublishesInOrderWithThreeFramesAndCountsThem) {
  StartPublisher();
  auto sub = Subscribe();
  const uint64_t before = publisher_->Stats().next_sequence;
  for (int i = 0; i < 100; ++i) publisher_->ObjectStored(std::to_string(i));
  publisher_->ObjectRemoved("7");
  std::vector<std::string> seen;
  uint64_t last = before - 1;
  while (seen.size() < 101) {
    auto f = sub->Recv();
    ASSERT_EQ(f.size(), 3u);
    EXPECT_TRUE(f[0].empty());
    const uint64_t seq = Seq(f[1]);
    EXPECT_EQ(seq, last + 1);  // no gap: nothing was dropped
    last = seq;
    for (auto& k : Keys(f[2])) seen.push_back(k);
  }
  EXPECT_EQ(seen.front(), "stored:0");
  EXPECT_EQ(seen[99], "stored:99");
  EXPECT_EQ(seen.back(), "removed:7");
  const PublisherStats s = publisher_->Stats();
  EXPECT_EQ(s.next_sequence, last + 1);
  EXPECT_GE(s.published_events, 101u);
  EXPECT_NE(publisher_->StatusJson().find("\"enabled\":true"), std::string::npos);
}

TEST_F(KvEventPublisherTest, AFullQueueDropsTheOldestAndLeavesAGap) {
  options_.queue_capacity = 3;
  StartPublisher();
  auto sub = Subscribe();
  const uint64_t before = publisher_->Stats().next_sequence;
  publisher_->PauseForTest(true);
  for (int i = 0; i < 10; ++i) publisher_->ObjectStored(std::to_string(i));
  EXPECT_EQ(publisher_->Stats().dropped_events, 7u);
  publisher_->PauseForTest(false);
  auto f = sub->Recv();
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(Seq(f[1]), before + 7);  // seven numbers skipped, one per dropped event
  EXPECT_EQ(Keys(f[2]), (std::vector<std::string>{"stored:7", "stored:8", "stored:9"}));
}

TEST_F(KvEventPublisherTest, ReplaysKeptBatchesThenSnapshotsWhatItCannotReplay) {
  options_.replay_batches = 4;
  StartPublisher();
  auto sub = Subscribe();
  publisher_->PauseForTest(true);  // one batch per event: pause between them
  const uint64_t first = publisher_->Stats().next_sequence;
  for (int i = 0; i < 6; ++i) {
    publisher_->PauseForTest(true);
    publisher_->ObjectStored("k" + std::to_string(i));
    publisher_->PauseForTest(false);
    ASSERT_EQ(sub->Recv().size(), 3u);
  }
  Client dealer(z_, ctx_, ZMQ_DEALER, options_.replay_endpoint);
  // From first + 3: kept (the last four batches are first + 2 .. first + 5).
  dealer.Send({Be(first + 3)});
  std::vector<uint64_t> seqs;
  for (;;) {
    auto f = dealer.Recv();
    ASSERT_EQ(f.size(), 2u);
    if (Seq(f[0]) == kEndOfReplay) {
      EXPECT_TRUE(f[1].empty());
      break;
    }
    seqs.push_back(Seq(f[0]));
  }
  EXPECT_EQ(seqs, (std::vector<uint64_t>{first + 3, first + 4, first + 5}));
  // From first: no longer kept -> a snapshot of the state, and where live batches resume.
  state_ = {"a", "b", "0x10"};
  dealer.Send({Be(first)});
  auto head = dealer.Recv();
  ASSERT_EQ(head.size(), 2u);
  EXPECT_EQ(Seq(head[0]), kSnapshotMarker);
  EXPECT_EQ(Seq(head[1]), first + 6);
  std::set<std::string> keys;
  for (;;) {
    auto f = dealer.Recv();
    ASSERT_EQ(f.size(), 2u);
    if (Seq(f[0]) == kEndOfReplay) break;
    EXPECT_EQ(Seq(f[0]), kSnapshotMarker);
    for (auto& k : Keys(f[1])) keys.insert(k);
  }
  EXPECT_EQ(keys, (std::set<std::string>{"stored:a", "stored:b", "stored:0x10"}));
  // A second snapshot within the interval: told when to retry.
  dealer.Send({Be(kSnapshotRequest)});
  auto retry = dealer.Recv();
  ASSERT_EQ(retry.size(), 2u);
  EXPECT_EQ(Seq(retry[0]), kRetryMarker);
  EXPECT_GT(Seq(retry[1]), 0u);
  EXPECT_EQ(Seq(dealer.Recv()[0]), kEndOfReplay);
  EXPECT_EQ(publisher_->Stats().snapshots, 1u);
}

TEST_F(KvEventPublisherTest, RequestsThatAreNotRequestsAreIgnoredAndRealOnesStillServed) {
  StartPublisher();
  Client rogue(z_, ctx_, ZMQ_DEALER, options_.replay_endpoint);
  rogue.Send({"short"});
  rogue.Send({std::string(9, 'x')});
  rogue.Send({"a", "b", "c", "d", "e"});
  rogue.Send({std::string(4096, 'y')});  // over the socket's message limit: the peer is dropped
  // A REQ-style request (empty delimiter) is answered with the delimiter.
  Client req(z_, ctx_, ZMQ_DEALER, options_.replay_endpoint);
  const uint64_t next = publisher_->Stats().next_sequence;
  req.Send({"", Be(next)});
  auto end = req.Recv();
  ASSERT_EQ(end.size(), 3u);
  EXPECT_TRUE(end[0].empty());
  EXPECT_EQ(Seq(end[1]), kEndOfReplay);
  EXPECT_TRUE(rogue.Recv(300).empty());
  EXPECT_EQ(publisher_->Stats().replay_requests, 1u);
}

}  // namespace
}  // namespace mooncake::store::kv_events
