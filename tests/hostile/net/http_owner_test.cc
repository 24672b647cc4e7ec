// Issue 28, item 2 (second half): "the http metadata server must let only the owner of an
// entry change or delete it". Engines with MC_AUTH_SECRET sign their entries, so a substituted
// entry is refused by readers (store_relay_test.cc); but a writer without the secret could
// still delete or spoil every entry (a denial of service), and the rpc_meta guard was bypassed
// by DELETE then PUT.
//
// Attacks, by a writer W that reaches mooncake_http_metadata_server but has no secret:
//  1. PUT over another engine's descriptor, DELETE it, DELETE then PUT its rpc_meta entry.
//  2. Replay a signed write (W recorded one on the wire): again, on another key, with another
//     body, as another method, or signed long ago.
//  3. A holder of the secret with another engine instance (a second engine started under a
//     name in use) PUTs over the live owner's descriptor.
// Before (the server took every PUT and DELETE): 1 and 2 succeeded (200: the descriptor
// replaced, the entries deleted, the replay applied), 3 too. After, with the secret in the
// server's environment (MC_AUTH_SECRET, or --auth_secret_file): 1 and 2 get 403 saying what
// is missing, 3 gets 409 while the owner holds its rpc_meta entry; the entries are intact and
// engines still find each other.
// Controls: engines with the secret register, update, take over a crashed predecessor's name
// and delete their own entries through the server; with no secret on the server nothing
// changed (unsigned writes accepted, the rpc_meta rule as before).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/auth.h"
#include "http_util.h"
#include "mooncake/transfer_engine.h"
#ifdef MC_HAVE_HTTP_METADATA_LIB
#include "metadata/http_server/metadata_http_server.h"
#endif

#ifdef MC_HTTP_METADATA_SERVER_PATH
namespace mooncake {
namespace {

constexpr char kSecret[] = "owner-s3cret";

// MC_HTTP_METADATA_SERVER_UNDER_TEST runs another build of the server (e.g. an older one, to
// see the attacks succeed there).
std::string ServerPath() {
  const char* v = std::getenv("MC_HTTP_METADATA_SERVER_UNDER_TEST");
  return v && *v ? v : MC_HTTP_METADATA_SERVER_PATH;
}

// The test process's MC_AUTH_SECRET (which the server child and the engines' http store client
// read) for one scope.
class SecretEnv {
 public:
  explicit SecretEnv(const char* secret) {
    if (secret) {
      ::setenv("MC_AUTH_SECRET", secret, 1);
    } else {
      ::unsetenv("MC_AUTH_SECRET");
    }
  }
  ~SecretEnv() { ::unsetenv("MC_AUTH_SECRET"); }
};

struct Server {
  std::unique_ptr<Child> proc;
  uint16_t port = 0;
  std::string store;
  // `secret` null: none in the server's environment.
  explicit Server(const char* secret, std::vector<std::string> extra = {}) {
    SecretEnv env(secret);
    std::vector<std::string> args{ServerPath(), "--port", "0", "--host",
                                  "127.0.0.1"};
    args.insert(args.end(), extra.begin(), extra.end());
    proc = std::make_unique<Child>(args);
    port = PortOf(*proc);
    store = "http://127.0.0.1:" + std::to_string(port) + "/metadata";
  }
};

EngineOptions Options(const char* secret) {
  EngineOptions o;
  if (secret) o.auth_secret = secret;
  o.enable_shm = false;
  o.tcp_bind_address = "127.0.0.1";
  o.handshake_io_timeout_ms = 2000;
  o.slice_timeout_ms = 2000;
  return o;
}

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One request's bytes: `proof` adds the X-MC-Auth-* headers made with `secret`, signed for
// (sign_method, sign_key, sign_body) at Unix time `t`.
struct Signed {
  std::string secret = kSecret;
  int64_t t = 0;  // 0: now
  std::string nonce;  // "": fresh
};
std::string Request(const std::string& method, const std::string& key, const std::string& body,
                    const Signed* proof, const std::string* sign_key = nullptr,
                    const std::string* sign_body = nullptr, const std::string* sign_method = nullptr) {
  std::string req = method + " /metadata?key=" + key + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n";
  if (method == "PUT") {
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  if (proof) {
    const std::string time = std::to_string(proof->t ? proof->t : Now());
    std::string nonce = proof->nonce;
    if (nonce.empty()) nonce = *Authenticator::NewInstanceId();
    Authenticator auth(proof->secret);
    req += "X-MC-Auth-Time: " + time + "\r\nX-MC-Auth-Nonce: " + nonce + "\r\nX-MC-Auth-Sig: " +
           auth.SignStoreRequest(sign_method ? *sign_method : method, sign_key ? *sign_key : key,
                                 sign_body ? *sign_body : body, time, nonce) +
           "\r\n";
  }
  return req + "\r\n" + body;
}

// Sends raw request bytes on a connection of their own: the status (-1: no reply), *body.
int Send(uint16_t port, const std::string& req, std::string* body = nullptr) {
  return SendHttp(port, req, body);
}

std::string Get(uint16_t port, const std::string& key, int* status = nullptr) {
  std::string body;
  int s = Http(port, "GET", key, "", "", &body);
  if (status) *status = s;
  return s == 200 ? body : "";
}

const std::string kDesc = "mooncake/ram/seg-s";
const std::string kRpc = "mooncake/rpc_meta/seg-s";

// 1. A writer without the secret: every PUT and DELETE refused with 403; the entries intact,
// and a peer still opens and writes the target.
TEST(HostileHttpOwner, AWriterWithoutTheSecretCannotReplaceOrDeleteEntries) {
  Server srv(kSecret);
  ASSERT_NE(srv.port, 0);
  SecretEnv env(kSecret);
  TransferEngine target(Options(kSecret));
  ASSERT_TRUE(target.Init(srv.store, "seg-s", "tcp").ok());
  std::vector<uint8_t> buf(65536, 0x5A);
  ASSERT_TRUE(target.RegisterLocalMemory(buf.data(), buf.size()).ok());
  const std::string desc = Get(srv.port, kDesc), rpc = Get(srv.port, kRpc);
  ASSERT_FALSE(desc.empty());
  ASSERT_FALSE(rpc.empty());

  auto spoiled = nlohmann::json::parse(desc);
  spoiled["tcp_data_port"] = 1;
  std::string why;
  const int put = Send(srv.port, Request("PUT", kDesc, spoiled.dump(), nullptr), &why);
  std::printf("no secret: PUT over the descriptor -> %d %s\n", put, why.c_str());
  EXPECT_EQ(put, 403);
  EXPECT_NE(why.find("MC_AUTH_SECRET"), std::string::npos) << why;
  const int del_desc = Send(srv.port, Request("DELETE", kDesc, "", nullptr), &why);
  EXPECT_EQ(del_desc, 403) << why;
  const int del_rpc = Send(srv.port, Request("DELETE", kRpc, "", nullptr), &why);
  EXPECT_EQ(del_rpc, 403) << why;
  nlohmann::json relay = {{"ip_or_host_name", "127.0.0.1"}, {"rpc_port", 1}};
  const int put_rpc = Send(srv.port, Request("PUT", kRpc, relay.dump(), nullptr), &why);
  EXPECT_NE(put_rpc, 200) << why;
  // Someone with another secret is refused the same way.
  Signed other;
  other.secret = "not-the-secret";
  const int wrong = Send(srv.port, Request("PUT", kDesc, spoiled.dump(), &other), &why);
  std::printf("other secret: PUT -> %d %s\n", wrong, why.c_str());
  EXPECT_EQ(wrong, 403);
  EXPECT_NE(why.find("does not verify"), std::string::npos) << why;
  const int new_key = Send(srv.port, Request("PUT", "mooncake/ram/junk", "{}", nullptr), &why);
  EXPECT_EQ(new_key, 403) << why;
  std::printf("no secret: DELETE descriptor %d, DELETE rpc_meta %d, then PUT rpc_meta %d, "
              "PUT a new key %d\n", del_desc, del_rpc, put_rpc, new_key);

  EXPECT_EQ(Get(srv.port, kDesc), desc) << "the descriptor was spoiled";
  EXPECT_EQ(Get(srv.port, kRpc), rpc) << "the rpc_meta entry was replaced";
  int st = 0;
  Get(srv.port, "mooncake/ram/junk", &st);
  EXPECT_EQ(st, 404);

  TransferEngine peer(Options(kSecret));
  ASSERT_TRUE(peer.Init(srv.store, "seg-c", "tcp").ok());
  std::vector<uint8_t> local(4096, 0x42);
  ASSERT_TRUE(peer.RegisterLocalMemory(local.data(), local.size()).ok());
  auto seg = peer.OpenSegment("seg-s");
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_TRUE(peer.TransferSync({{TransferRequest::WRITE, local.data(), *seg,
                                  reinterpret_cast<uint64_t>(buf.data()), 4096}},
                                std::chrono::seconds(5))
                  .ok());
  EXPECT_EQ(buf[4095], 0x42);
}

// 2. A recorded signed write cannot be used again, elsewhere, or late.
TEST(HostileHttpOwner, ASignedWriteCannotBeReplayedOrRebound) {
  Server srv(kSecret);
  ASSERT_NE(srv.port, 0);
  const std::string key = "mooncake/ram/seg-r";
  const std::string value = R"({"name":"seg-r","v":1})";
  Signed proof;
  proof.nonce = *Authenticator::NewInstanceId();
  const std::string recorded = Request("PUT", key, value, &proof);
  std::string why;
  ASSERT_EQ(Send(srv.port, recorded, &why), 200) << why;
  const int again = Send(srv.port, recorded, &why);
  std::printf("replayed signed PUT -> %d %s\n", again, why.c_str());
  EXPECT_EQ(again, 403);
  EXPECT_NE(why.find("replayed"), std::string::npos) << why;

  // The same proof (time, nonce, signature) moved: to another key, another body, DELETE.
  Signed fresh;
  const std::string other_key = "mooncake/ram/seg-x", other_body = R"({"name":"seg-r","v":2})";
  const int moved_key = Send(srv.port, Request("PUT", other_key, value, &fresh, &key), &why);
  EXPECT_EQ(moved_key, 403) << why;
  const int moved_body = Send(srv.port, Request("PUT", key, other_body, &fresh, nullptr, &value), &why);
  EXPECT_EQ(moved_body, 403) << why;
  const std::string put = "PUT", empty;
  const int as_delete =
      Send(srv.port, Request("DELETE", key, "", &fresh, nullptr, &empty, &put), &why);
  EXPECT_EQ(as_delete, 403) << why;
  // Signed two minutes ago (a recording replayed later), or far in the future.
  Signed old;
  old.t = Now() - 120;
  const int late = Send(srv.port, Request("DELETE", key, "", &old), &why);
  std::printf("moved to another key %d, another body %d, as DELETE %d; signed 120 s ago %d %s\n",
              moved_key, moved_body, as_delete, late, why.c_str());
  EXPECT_EQ(late, 403);
  EXPECT_NE(why.find("clock"), std::string::npos) << why;
  Signed future;
  future.t = Now() + 3600;
  EXPECT_EQ(Send(srv.port, Request("DELETE", key, "", &future), &why), 403) << why;
  EXPECT_EQ(Get(srv.port, key), value);
  // A fresh signature by a holder of the secret goes through.
  Signed ok;
  EXPECT_EQ(Send(srv.port, Request("DELETE", key, "", &ok), &why), 200) << why;
  const int after_delete = Send(srv.port, recorded, &why);
  EXPECT_EQ(after_delete, 403) << "the recorded PUT brought a deleted entry back: " << why;
}

// 3. The owner rule: a holder of the secret with another engine instance cannot replace a
// live engine's descriptor; the owner can; once the owner is gone, anyone with the secret can.
TEST(HostileHttpOwner, OnlyTheOwnerInstanceReplacesALiveEnginesEntry) {
  Server srv(kSecret);
  ASSERT_NE(srv.port, 0);
  SecretEnv env(kSecret);
  std::string owner;
  std::vector<uint8_t> buf(65536, 0x5A), buf2(8192, 0x11);
  {
    TransferEngine target(Options(kSecret));
    ASSERT_TRUE(target.Init(srv.store, "seg-s", "tcp").ok());
    ASSERT_TRUE(target.RegisterLocalMemory(buf.data(), buf.size()).ok());
    auto d = nlohmann::json::parse(Get(srv.port, kDesc));
    owner = d.value("mc_auth_instance", "");
    ASSERT_FALSE(owner.empty());
    auto other = d;
    other["mc_auth_instance"] = std::string(32, 'e');
    other["tcp_data_port"] = 1;
    Signed proof;
    std::string why;
    const int s1 = Send(srv.port, Request("PUT", kDesc, other.dump(), &proof), &why);
    std::printf("signed PUT by another instance over a live owner's descriptor -> %d %s\n", s1,
                why.c_str());
    EXPECT_EQ(s1, 409);
    EXPECT_NE(why.find(owner), std::string::npos) << why;
    other.erase("mc_auth_instance");
    EXPECT_EQ(Send(srv.port, Request("PUT", kDesc, other.dump(), &proof), &why), 409) << why;
    EXPECT_EQ(nlohmann::json::parse(Get(srv.port, kDesc))["tcp_data_port"], d["tcp_data_port"]);
    // A second engine under the name in use is refused at Init, as before.
    TransferEngine twin(Options(kSecret));
    Status twin_init = twin.Init(srv.store, "seg-s", "tcp");
    EXPECT_FALSE(twin_init.ok());
    // The owner updates its own entry.
    ASSERT_TRUE(target.RegisterLocalMemory(buf2.data(), buf2.size()).ok());
    EXPECT_EQ(nlohmann::json::parse(Get(srv.port, kDesc))["buffers"].size(), 2u);
  }
  // The owner shut down: it deleted its own entries; the name is free.
  int st = 0;
  Get(srv.port, kDesc, &st);
  EXPECT_EQ(st, 404);
  Get(srv.port, kRpc, &st);
  EXPECT_EQ(st, 404);
  Signed proof;
  std::string why;
  EXPECT_EQ(Send(srv.port, Request("PUT", kDesc, R"({"name":"seg-s"})", &proof), &why), 200) << why;
}

#ifdef MC_HAVE_HTTP_METADATA_LIB
// The nonces remembered are bounded; what is forgotten cannot be replayed (requests no newer
// than the oldest forgotten one are refused), and fresh writes still go through.
TEST(HostileHttpOwner, NonceMemoryIsBoundedAndForgetsNothingReplayable) {
  http::MetadataServerOptions o;
  o.auth_secret = kSecret;
  o.auth_max_nonces = 4;
  http::MetadataHttpServer server(o);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  const uint16_t port = static_cast<uint16_t>(server.port());
  std::vector<std::string> recorded;
  std::string why;
  const int64_t now = Now();
  for (int i = 0; i < 8; ++i) {
    Signed p;
    p.t = now - 50 + i;
    recorded.push_back(Request("PUT", "k" + std::to_string(i), "{}", &p));
    ASSERT_EQ(Send(port, recorded.back(), &why), 200) << i << ": " << why;
  }
  for (size_t i = 0; i < recorded.size(); ++i) {
    EXPECT_EQ(Send(port, recorded[i], &why), 403) << "replay " << i << " accepted";
  }
  Signed fresh;
  EXPECT_EQ(Send(port, Request("PUT", "k0", "{}", &fresh), &why), 200) << why;
}
#endif

// Control: an engine that crashed (its entries left behind) is taken over by its next start:
// it finds the old one dead, deletes the stale rpc_meta entry and replaces the descriptor.
TEST(HostileHttpOwner, ACrashedEngineIsTakenOverByItsNextStart) {
  Server srv(kSecret);
  ASSERT_NE(srv.port, 0);
  SecretEnv env(kSecret);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(ready[0]);
    static std::vector<uint8_t> b(4096, 1);
    auto* e = new TransferEngine(Options(kSecret));  // never destroyed: a crash
    char ok = e->Init(srv.store, "seg-s", "tcp").ok() &&
              e->RegisterLocalMemory(b.data(), b.size()).ok();
    (void)!::write(ready[1], &ok, 1);
    ::_exit(0);
  }
  ::close(ready[1]);
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(ok, 1);
  ::waitpid(pid, nullptr, 0);
  const std::string old_owner =
      nlohmann::json::parse(Get(srv.port, kDesc)).value("mc_auth_instance", "");
  ASSERT_FALSE(old_owner.empty());

  TransferEngine next(Options(kSecret));
  Status s = next.Init(srv.store, "seg-s", "tcp");
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<uint8_t> buf(65536, 0x5A);
  ASSERT_TRUE(next.RegisterLocalMemory(buf.data(), buf.size()).ok());
  const std::string new_owner =
      nlohmann::json::parse(Get(srv.port, kDesc)).value("mc_auth_instance", "");
  EXPECT_FALSE(new_owner.empty());
  EXPECT_NE(new_owner, old_owner) << "the crashed start's descriptor was not replaced";
  TransferEngine peer(Options(kSecret));
  ASSERT_TRUE(peer.Init(srv.store, "seg-c", "tcp").ok());
  std::vector<uint8_t> local(4096, 0x42);
  ASSERT_TRUE(peer.RegisterLocalMemory(local.data(), local.size()).ok());
  auto seg = peer.OpenSegment("seg-s");
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_TRUE(peer.TransferSync({{TransferRequest::WRITE, local.data(), *seg,
                                  reinterpret_cast<uint64_t>(buf.data()), 4096}},
                                std::chrono::seconds(5))
                  .ok());
  EXPECT_EQ(buf[0], 0x42);
}

// Control: engines with the secret register, update, notify and delete their own entries;
// an engine without the secret is told why it cannot register.
TEST(HostileHttpOwner, EnginesWithTheSecretRegisterUpdateAndDelete) {
  Server srv(kSecret);
  ASSERT_NE(srv.port, 0);
  {
    SecretEnv env(kSecret);
    std::vector<uint8_t> a(65536, 1), b(65536, 2);
    TransferEngine s(Options(kSecret)), c(Options(kSecret));
    ASSERT_TRUE(s.Init(srv.store, "seg-s", "tcp").ok());
    ASSERT_TRUE(c.Init(srv.store, "seg-c", "tcp").ok());
    ASSERT_TRUE(s.RegisterLocalMemory(a.data(), a.size()).ok());
    ASSERT_TRUE(c.RegisterLocalMemory(b.data(), b.size()).ok());
    ASSERT_TRUE(s.UnregisterLocalMemory(a.data()).ok());
    ASSERT_TRUE(s.RegisterLocalMemory(a.data(), a.size()).ok());
    auto seg = c.OpenSegment("seg-s");
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    EXPECT_TRUE(c.TransferSync({{TransferRequest::WRITE, b.data(), *seg,
                                 reinterpret_cast<uint64_t>(a.data()), 4096}},
                               std::chrono::seconds(5))
                    .ok());
    EXPECT_EQ(a[100], 2);
    EXPECT_TRUE(c.SendNotifyByName("seg-s", {"seg-c", "hi"}).ok());
  }
  for (const std::string& k : {kDesc, kRpc, std::string("mooncake/ram/seg-c"),
                               std::string("mooncake/rpc_meta/seg-c")}) {
    int st = 0;
    Get(srv.port, k, &st);
    EXPECT_EQ(st, 404) << k << " was not deleted by its engine";
  }
  SecretEnv none(nullptr);
  TransferEngine plain(Options(nullptr));
  Status s = plain.Init(srv.store, "seg-p", "tcp");
  std::printf("engine without the secret: %s\n", s.ToString().c_str());
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find("MC_AUTH_SECRET"), std::string::npos) << s.ToString();
}

// Control: the secret from --auth_secret_file; never from the command line.
TEST(HostileHttpOwner, TheSecretComesFromAFileNotTheCommandLine) {
  char path[] = "/tmp/mc_http_owner_secretXXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string line = std::string(kSecret) + "\n";
  ASSERT_EQ(::write(fd, line.data(), line.size()), static_cast<ssize_t>(line.size()));
  ::close(fd);
  {
    Server srv(nullptr, {"--auth_secret_file", path});
    ASSERT_NE(srv.port, 0);
    std::string why;
    EXPECT_EQ(Send(srv.port, Request("PUT", "k", "{}", nullptr), &why), 403) << why;
    Signed proof;
    EXPECT_EQ(Send(srv.port, Request("PUT", "k", "{}", &proof), &why), 200) << why;
  }
  ::unlink(path);
  Child refused({ServerPath(), "--port", "0", "--auth_secret", "x"});
  EXPECT_EQ(refused.Wait(), 2);
}

// Control: with no secret on the server nothing changed (upstream's engines and the Store's
// tests rely on it): unsigned writes accepted, proofs ignored, the rpc_meta rule as before.
TEST(HostileHttpOwner, WithoutASecretOnTheServerNothingChanged) {
  Server srv(nullptr);
  ASSERT_NE(srv.port, 0);
  std::string why;
  EXPECT_EQ(Send(srv.port, Request("PUT", kDesc, R"({"a":1})", nullptr), &why), 200) << why;
  EXPECT_EQ(Send(srv.port, Request("PUT", kDesc, R"({"a":2})", nullptr), &why), 200) << why;
  EXPECT_EQ(Get(srv.port, kDesc), R"({"a":2})");
  Signed proof;
  proof.secret = "whatever";
  EXPECT_EQ(Send(srv.port, Request("PUT", kDesc, R"({"a":3})", &proof), &why), 200) << why;
  EXPECT_EQ(Send(srv.port, Request("DELETE", kDesc, "", nullptr), &why), 200) << why;
  EXPECT_EQ(Send(srv.port, Request("PUT", kRpc, R"({"rpc_port":1})", nullptr), &why), 200);
  EXPECT_EQ(Send(srv.port, Request("PUT", kRpc, R"({"rpc_port":1})", nullptr), &why), 200);
  EXPECT_EQ(Send(srv.port, Request("PUT", kRpc, R"({"rpc_port":2})", nullptr), &why), 400);
  EXPECT_EQ(Send(srv.port, Request("DELETE", kRpc, "", nullptr), &why), 200);
  // Engines without a secret, and engines with one (their entries signed; the store open to
  // anyone, as the docs say), work as before.
  for (const char* secret : {static_cast<const char*>(nullptr), kSecret}) {
    SecretEnv env(secret);
    std::vector<uint8_t> a(65536, 1), b(4096, 2);
    TransferEngine s(Options(secret)), c(Options(secret));
    ASSERT_TRUE(s.Init(srv.store, "seg-s", "tcp").ok());
    ASSERT_TRUE(c.Init(srv.store, "seg-c", "tcp").ok());
    ASSERT_TRUE(s.RegisterLocalMemory(a.data(), a.size()).ok());
    ASSERT_TRUE(c.RegisterLocalMemory(b.data(), b.size()).ok());
    auto seg = c.OpenSegment("seg-s");
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    EXPECT_TRUE(c.TransferSync({{TransferRequest::WRITE, b.data(), *seg,
                                 reinterpret_cast<uint64_t>(a.data()), 4096}},
                               std::chrono::seconds(5))
                    .ok());
    EXPECT_EQ(a[0], 2);
  }
}

}  // namespace
}  // namespace mooncake
#endif  // MC_HTTP_METADATA_SERVER_PATH
