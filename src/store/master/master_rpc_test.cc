// RpcServer and RpcClient in one process: round trips, concurrency, timeouts, restarts, and
// the bounds a hostile client meets (foreign bytes, huge announcements, trickled requests,
// the connection cap, the buffer budget, a slow method beside fast ones). Issue 28's attacks
// on those bounds: master_rpc_bounds_test.cc.
#include "store/master/master_rpc_test_fixture.h"

namespace mooncake {
namespace store {
namespace {

using namespace testing_rpc_fixture;  // NOLINT

TEST_F(RpcTest, RoundTripsReuseOneConnection) {
  Start();
  for (int i = 0; i < 200; ++i) {
    bool known = false;
    ASSERT_TRUE(Ping(i % 2 ? "known" : "other", &known).ok());
    EXPECT_EQ(known, i % 2 == 1);
  }
  EXPECT_EQ(server_->open_connections(), 1u);
}

TEST_F(RpcTest, LargeRequestsAndRepliesArriveWhole) {
  Start();
  rpc::KeysRequest q;
  for (int i = 0; i < 4096; ++i) q.add_keys(std::string(1000 + i % 7, 'k'));
  rpc::CodesResponse r;
  ASSERT_TRUE(client_->Call(MasterMethod::kExistKey, q, &r, milliseconds(5000)).ok());
  ASSERT_EQ(r.codes_size(), 4096);
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(r.codes(i), 1000 + i % 7);
}

TEST_F(RpcTest, ConcurrentCallersEachGetTheirOwnReply) {
  Start();
  std::atomic<int> wrong{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        rpc::KeysRequest q;
        q.add_keys(std::string(1 + (t * 300 + i) % 97, 'x'));
        rpc::CodesResponse r;
        Status s = client_->Call(MasterMethod::kExistKey, q, &r, milliseconds(5000));
        if (!s.ok() || r.codes_size() != 1 || r.codes(0) != 1 + (t * 300 + i) % 97) ++wrong;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(server_->open_connections(), 8u);
}

TEST_F(RpcTest, CallsStartedTogetherEachGetTheirOwnReplyInAnyOrder) {
  Start();
  std::vector<rpc::KeysRequest> q(3);
  for (int i = 0; i < 3; ++i) q[i].add_keys(std::string(10 + i, 'k'));
  std::vector<RpcClient::PendingCall> calls;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(client_->Start(MasterMethod::kExistKey, q[i], milliseconds(2000)));
  }
  for (int i : {2, 0, 1}) {  // finished out of order: each on its own connection
    rpc::CodesResponse r;
    ASSERT_TRUE(client_->Finish(&calls[i], &r, 3).ok());
    ASSERT_EQ(r.codes_size(), 1);
    EXPECT_EQ(r.codes(0), 10 + i);
  }
  EXPECT_EQ(server_->open_connections(), 3u);
  // A call started and dropped unfinished closes its connection: its late reply never
  // reaches another call.
  {
    rpc::KeysRequest slow;
    slow.add_keys("sleep");
    RpcClient::PendingCall dropped =
        client_->Start(MasterMethod::kExistKey, slow, milliseconds(2000));
  }
  for (int i = 0; i < 5; ++i) {
    rpc::CodesResponse r;
    ASSERT_TRUE(client_->Call(MasterMethod::kExistKey, q[1], &r, milliseconds(2000)).ok());
    ASSERT_EQ(r.codes_size(), 1);
    EXPECT_EQ(r.codes(0), 11);
  }
  // Started against a master that is gone: Finish says so.
  server_->Stop();
  RpcClient fresh("127.0.0.1:" + std::to_string(port_));
  RpcClient::PendingCall gone = fresh.Start(MasterMethod::kExistKey, q[0], milliseconds(500));
  rpc::CodesResponse r;
  EXPECT_EQ(fresh.Finish(&gone, &r).code(), Status::Code::kUnavailable);
}

TEST_F(RpcTest, TimeoutClosesTheConnectionAndTheNextCallWorks) {
  Start();
  rpc::KeysRequest q;
  q.add_keys("sleep");
  rpc::CodesResponse r;
  const auto t0 = Clock::now();
  Status s = client_->Call(MasterMethod::kExistKey, q, &r, milliseconds(150));
  EXPECT_EQ(s.code(), Status::Code::kDeadlineExceeded) << s.ToString();
  EXPECT_LT(Clock::now() - t0, milliseconds(500));
  EXPECT_NE(s.message().find("did not answer ExistKey"), std::string::npos) << s.message();
  // The late reply of the timed-out call must not be taken for this one's.
  bool known = false;
  ASSERT_TRUE(Ping("known", &known).ok());
  EXPECT_TRUE(known);
}

TEST_F(RpcTest, AServerRestartedOnThePortIsFoundByTheNextCall) {
  Start();
  bool known = false;
  ASSERT_TRUE(Ping("known", &known).ok());
  server_->Stop();
  Status s = Ping("known", &known);
  EXPECT_EQ(s.code(), Status::Code::kUnavailable) << s.ToString();
  server_ = std::make_unique<RpcServer>(RpcServer::Options{}, &Handle);
  ASSERT_TRUE(server_->Start("127.0.0.1", port_).ok());
  ASSERT_TRUE(Ping("known", &known).ok());  // no backoff
  EXPECT_TRUE(known);
  // Restarted between two calls: the pooled connection is dead, the call is sent again on a
  // new one and succeeds.
  server_->Stop();
  server_ = std::make_unique<RpcServer>(RpcServer::Options{}, &Handle);
  ASSERT_TRUE(server_->Start("127.0.0.1", port_).ok());
  Status again = Ping("known", &known);
  EXPECT_TRUE(again.ok()) << again.ToString();
}

TEST_F(RpcTest, NoServerIsAClearError) {
  RpcClient c("127.0.0.1:" + std::to_string(FreePort()));
  bool known;
  Status s = Ping("x", &known, &c);
  EXPECT_EQ(s.code(), Status::Code::kUnavailable);
  EXPECT_NE(s.message().find("is mooncake_master running there?"), std::string::npos)
      << s.message();
  RpcClient bad("no-port-here");
  s = Ping("x", &known, &bad);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("host:port"), std::string::npos) << s.message();
}

TEST_F(RpcTest, ForeignServerIsNamed) {
  // A server that answers like HTTP/1 (the master's metrics port, say).
  int port = 0;
  const int lfd = ListenLoopback(&port);
  ASSERT_GE(lfd, 0);
  std::thread srv([lfd] {
    int fd = ::accept(lfd, nullptr, nullptr);
    char buf[256];
    (void)!::recv(fd, buf, sizeof(buf), 0);
    const std::string reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
    (void)!::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
    ::close(fd);
  });
  RpcClient c("127.0.0.1:" + std::to_string(port));
  bool known;
  Status s = Ping("x", &known, &c);
  srv.join();
  ::close(lfd);
  EXPECT_EQ(s.code(), Status::Code::kInternal);
  EXPECT_NE(s.message().find("HTTP/1"), std::string::npos) << s.message();
}

// A master that sends the first byte of its reply late and then stalls cannot hold a call
// past its timeout (each wait is what is left of the call's time, not a whole timeout).
TEST_F(RpcTest, AStalledReplyEndsAtTheCallsTimeout) {
  int port = 0;
  const int lfd = ListenLoopback(&port);
  ASSERT_GE(lfd, 0);
  std::atomic<bool> stop{false};
  std::thread srv([&] {
    int fd = ::accept(lfd, nullptr, nullptr);
    std::string head = ReadUpTo(fd, kFrameHeaderBytes, milliseconds(1000));
    FrameHeader h;
    if (head.size() == kFrameHeaderBytes) DecodeHeader(head.data(), &h);
    const std::string reply = Frame(h.method, h.seq, std::string(1000, 'x'));
    std::this_thread::sleep_for(milliseconds(250));
    (void)!::send(fd, reply.data(), 1, MSG_NOSIGNAL);
    for (int i = 0; i < 100 && !stop; ++i) std::this_thread::sleep_for(milliseconds(10));
    ::close(fd);
  });
  RpcClient c("127.0.0.1:" + std::to_string(port));
  bool known;
  const auto t0 = Clock::now();
  Status s = Ping("x", &known, &c, milliseconds(300));
  const auto took = Clock::now() - t0;
  stop = true;
  srv.join();
  ::close(lfd);
  EXPECT_EQ(s.code(), Status::Code::kDeadlineExceeded) << s.ToString();
  EXPECT_LT(took, milliseconds(450));
}

TEST_F(RpcTest, BadFramesAreAnsweredOrClosedAndOthersAreServed) {
  Start();
  // Foreign bytes (an HTTP/2 preface): closed at once.
  int h2 = ConnectLoopback(port_);
  ASSERT_TRUE(SendAll(h2, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
  EXPECT_TRUE(ClosedWithin(h2, milliseconds(1000)));
  ::close(h2);
  // Over the size limit: a kTooLarge reply, then closed.
  int huge = ConnectLoopback(port_);
  ASSERT_TRUE(SendAll(huge, Frame(uint16_t(MasterMethod::kPing), 9, "", 0x7fffffffu)));
  auto r = ReadReply(huge, milliseconds(1000));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header.status, uint16_t(RpcStatus::kTooLarge));
  EXPECT_EQ(r->header.seq, 9u);
  EXPECT_NE(r->payload.find("over the limit"), std::string::npos);
  EXPECT_TRUE(ClosedWithin(huge, milliseconds(1000)));
  ::close(huge);
  // An unknown method and a payload that does not parse: replies, connection kept.
  int odd = ConnectLoopback(port_);
  ASSERT_TRUE(SendAll(odd, Frame(999, 1, "abc")));
  r = ReadReply(odd, milliseconds(1000));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header.status, uint16_t(RpcStatus::kUnknownMethod));
  ASSERT_TRUE(SendAll(odd, Frame(uint16_t(MasterMethod::kExistKey), 2, std::string("\xff\xff\xff", 3))));
  r = ReadReply(odd, milliseconds(1000));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header.status, uint16_t(RpcStatus::kBadRequest));
  EXPECT_EQ(r->header.seq, 2u);
  // Pipelined requests are answered in order.
  rpc::PingRequest q;
  q.set_client_id("known");
  std::string three;
  for (uint32_t seq = 10; seq < 13; ++seq) {
    three += Frame(uint16_t(MasterMethod::kPing), seq, q.SerializeAsString());
  }
  ASSERT_TRUE(SendAll(odd, three));
  for (uint32_t seq = 10; seq < 13; ++seq) {
    r = ReadReply(odd, milliseconds(1000));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->header.seq, seq);
    rpc::PingResponse resp;
    ASSERT_TRUE(resp.ParseFromString(r->payload));
    EXPECT_TRUE(resp.client_known());
  }
  ::close(odd);
  bool known = false;
  ASSERT_TRUE(Ping("known", &known).ok());
  EXPECT_GE(server_->dropped(), 2u);
}

TEST_F(RpcTest, TrickledAndStalledRequestsAreClosedAfterTheDeadline) {
  RpcServer::Options o;
  o.request_deadline = milliseconds(300);
  Start(o);
  // A header announcing 60 MiB, then nothing: holds no 60 MiB, closed after the deadline.
  int stall = ConnectLoopback(port_);
  ASSERT_TRUE(SendAll(stall, Frame(uint16_t(MasterMethod::kPing), 1, "", 60u << 20)));
  // An idle connection (no request begun) is kept.
  int idle = ConnectLoopback(port_);
  const auto t0 = Clock::now();
  bool known = false;
  ASSERT_TRUE(Ping("known", &known).ok());
  EXPECT_LT(Clock::now() - t0, milliseconds(100));
  EXPECT_TRUE(ClosedWithin(stall, milliseconds(2000)));
  EXPECT_GE(Clock::now() - t0, milliseconds(300));
  EXPECT_FALSE(ClosedWithin(idle, milliseconds(200)));
  ::close(stall);
  ::close(idle);
}

TEST_F(RpcTest, TheConnectionCapClosesTheLongestIdleOrRefuses) {
  RpcServer::Options o;
  o.threads = 1;  // one loop: the cap's room comes from that loop's connections
  o.max_connections = 4;
  Start(o);
  bool known = false;
  ASSERT_TRUE(Ping("known", &known).ok());  // the client's pooled connection: the oldest
  std::this_thread::sleep_for(milliseconds(20));
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) fds.push_back(ConnectLoopback(port_));
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(server_->open_connections(), 4u);
  // A fifth: the oldest idle one (the client's) goes; its next call is sent again on a new
  // connection, which closes the next oldest.
  fds.push_back(ConnectLoopback(port_));
  std::this_thread::sleep_for(milliseconds(100));
  Status s = Ping("known", &known);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(ClosedWithin(fds[0], milliseconds(1000)));
  EXPECT_EQ(server_->open_connections(), 4u);
  EXPECT_GE(server_->dropped(), 2u);
  for (int fd : fds) ::close(fd);
}

TEST_F(RpcTest, TheBufferBudgetBoundsIncompleteRequests) {
  RpcServer::Options o;
  o.max_buffered_bytes = 1 << 20;
  Start(o);
  // Two connections each send 700 KiB of a 60 MiB request: together (or each, on a loop of
  // its own: 512 KiB a loop) they pass the budget, and the one holding the most goes.
  int a = ConnectLoopback(port_), b = ConnectLoopback(port_);
  const std::string part(700 << 10, 'z');
  ASSERT_TRUE(SendAll(a, Frame(uint16_t(MasterMethod::kPing), 1, part, 60u << 20)));
  std::this_thread::sleep_for(milliseconds(100));
  (void)SendAll(b, Frame(uint16_t(MasterMethod::kPing), 1, part, 60u << 20));
  EXPECT_TRUE(ClosedWithin(b, milliseconds(2000)) || ClosedWithin(a, milliseconds(10)));
  EXPECT_LE(server_->buffered_bytes(), (1u << 20) + 2 * (64u << 10));
  bool known = false;
  ASSERT_TRUE(Ping("known", &known).ok());
  ::close(a);
  ::close(b);
}

TEST_F(RpcTest, ASlowMethodDoesNotHoldUpItsLoop) {
  RpcServer::Options o;
  o.threads = 1;
  Start(o);
  std::thread slow([this] {
    RpcClient other("127.0.0.1:" + std::to_string(port_));
    rpc::KeysRequest q;
    rpc::CountResponse r;
    Status s = other.Call(MasterMethod::kRemoveAll, q, &r, milliseconds(3000));
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(r.count(), 7u);
  });
  std::this_thread::sleep_for(milliseconds(100));
  const auto t0 = Clock::now();
  bool known = false;
  ASSERT_TRUE(Ping("known", &known).ok());
  EXPECT_LT(Clock::now() - t0, milliseconds(200)) << "the ping waited for RemoveAll";
  slow.join();
}

// `n` ExistKey frames of `q`, seq 1..n, to send back to back.
std::string PipelinedExistKeys(const rpc::KeysRequest& q, uint32_t n) {
  const std::string payload = q.SerializeAsString();
  std::string all;
  for (uint32_t seq = 1; seq <= n; ++seq) {
    all += Frame(uint16_t(MasterMethod::kExistKey), seq, payload);
  }
  return all;
}

// A connection that pipelines many requests takes turns with the others of its loop: a
// request of another client waits for a few of the backlog's, not for all of it; and every
// pipelined request is answered, in order.
TEST_F(RpcTest, APipeliningConnectionTakesTurnsWithTheOthersOfItsLoop) {
  RpcServer::Options o;
  o.threads = 1;
  Start(o);
  int greedy = ConnectLoopback(port_);
  ASSERT_GE(greedy, 0);
  rpc::KeysRequest slow_req;
  slow_req.add_keys("2ms");
  constexpr uint32_t kBacklog = 300;  // 600 ms of handler time
  ASSERT_TRUE(SendAll(greedy, PipelinedExistKeys(slow_req, kBacklog)));
  std::this_thread::sleep_for(milliseconds(20));  // the loop is into the backlog
  const auto t0 = Clock::now();
  bool known = false;
  ASSERT_TRUE(Ping("known", &known).ok());
  const auto waited_ms = std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
  EXPECT_LT(waited_ms, 250) << "a ping waited behind another connection's whole backlog";
  for (uint32_t seq = 1; seq <= kBacklog; ++seq) {
    auto r = ReadReply(greedy, milliseconds(5000));
    ASSERT_TRUE(r) << "reply " << seq << " of " << kBacklog << " never came";
    EXPECT_EQ(r->header.seq, seq);
    EXPECT_EQ(r->header.status, uint16_t(RpcStatus::kOk));
  }
  ::close(greedy);
}

// Pipelined requests whose replies together pass what the loop gathers before it writes
// (1 MiB) are all answered, also when each write goes out at once (the client reads as the
// replies come): none is left in the connection's buffer waiting for more bytes.
TEST_F(RpcTest, PipelinedRequestsWithMoreReplyBytesThanOneGatherAreAllAnswered) {
  RpcServer::Options o;
  o.threads = 1;
  Start(o);
  int fd = ConnectLoopback(port_);
  ASSERT_GE(fd, 0);
  rpc::KeysRequest big;
  for (int k = 0; k < 40000; ++k) big.add_keys("k");  // a reply of ~40 KB (a code per key)
  constexpr uint32_t kRequests = 64;                   // ~2.5 MB of replies
  const std::string all = PipelinedExistKeys(big, kRequests);
  std::thread writer([&] { EXPECT_TRUE(SendAll(fd, all)); });
  for (uint32_t seq = 1; seq <= kRequests; ++seq) {
    auto r = ReadReply(fd, milliseconds(3000));
    ASSERT_TRUE(r) << "reply " << seq << " of " << kRequests << " never came";
    EXPECT_EQ(r->header.seq, seq);
    rpc::CodesResponse codes;
    ASSERT_TRUE(codes.ParseFromString(r->payload));
    EXPECT_EQ(codes.codes_size(), 40000);
  }
  writer.join();
  ::close(fd);
}

double ProcessCpuMs() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

TEST_F(RpcTest, AClientResetDuringASlowMethodCostsNoSpin) {
  Start();
  int fd = ConnectLoopback(port_);
  rpc::KeysRequest q;
  ASSERT_TRUE(SendAll(fd, Frame(uint16_t(MasterMethod::kRemoveAll), 1, q.SerializeAsString())));
  std::this_thread::sleep_for(milliseconds(50));
  linger l{1, 0};  // close with a reset: the server's side sees the connection hung up
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  ::close(fd);
  const double cpu0 = ProcessCpuMs();
  std::this_thread::sleep_for(milliseconds(500));  // the worker finishes meanwhile
  EXPECT_LT(ProcessCpuMs() - cpu0, 150.0) << "a loop spun on the hung-up connection";
  bool known = false;
  ASSERT_TRUE(Ping("known", &known).ok());
}


// --- Issue 28, items 4-7: one client must not stop the others (each measured with a ping) ---

// Item 4: connections that each keep one byte of a header pending, completing a request now
// and then (so that the request deadline restarts), fill the cap. A new client and the
// legitimate clients' idle connections must not be the ones closed: these are.
}  // namespace
}  // namespace store
}  // namespace mooncake
