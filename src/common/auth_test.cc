// The MCAUTHv2 exchange (common/auth.h) over socket pairs, against honest and crafted peers.
#include "common/auth.h"

#include <gtest/gtest.h>
#include <openssl/rand.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>

#include "common/net.h"

namespace mooncake {
namespace {

struct Pair {
  UniqueFd client, server;
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    client = UniqueFd(fds[0]);
    server = UniqueFd(fds[1]);
  }
};

struct Outcome {
  Status client, server;
};

// An honest client and an honest server, each with its own view of the world.
Outcome Exchange(const std::string& client_secret, const char* client_purpose,
            const std::string& intended, const std::string& server_secret,
            const char* server_purpose, const std::vector<std::string>& own) {
  Pair p;
  auto server = std::async(std::launch::async, [&] {
    return Authenticator(server_secret).Challenge(p.server.get(), server_purpose, own, 2000);
  });
  Status c = Authenticator(client_secret).Answer(p.client.get(), client_purpose, intended, 2000);
  Status s = server.get();
  return {c, s};
}

bool Has(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

TEST(Auth, SameSecretNameAndPurposeSucceedOnBothSides) {
  Outcome o = Exchange("k", "handshake", "10.0.0.1:15001", "k", "handshake", {"10.0.0.1:15001"});
  EXPECT_TRUE(o.client.ok()) << o.client.ToString();
  EXPECT_TRUE(o.server.ok()) << o.server.ToString();
}

TEST(Auth, DisabledIsANoOp) {
  Pair p;
  EXPECT_TRUE(Authenticator("").Challenge(p.server.get(), "shm", {"x"}, 100).ok());
  EXPECT_TRUE(Authenticator("").Answer(p.client.get(), "shm", "x", 100).ok());
}

TEST(Auth, ClientMeaningAnotherSegmentIsRefused) {
  Outcome o = Exchange("k", "tcp-data", "attacker:15001", "k", "tcp-data", {"victim:15001"});
  EXPECT_EQ(o.server.code(), Status::Code::kPermissionDenied);
  EXPECT_TRUE(Has(o.server, "attacker:15001")) << o.server.ToString();
  EXPECT_EQ(o.client.code(), Status::Code::kPermissionDenied);
  EXPECT_TRUE(Has(o.client, "not the segment we asked for")) << o.client.ToString();
}

TEST(Auth, WrongSecretIsRefusedOnBothSides) {
  Outcome o = Exchange("a", "handshake", "s", "b", "handshake", {"s"});
  EXPECT_EQ(o.server.code(), Status::Code::kPermissionDenied);
  EXPECT_TRUE(Has(o.server, "wrong shared secret")) << o.server.ToString();
  EXPECT_EQ(o.client.code(), Status::Code::kPermissionDenied);
}

TEST(Auth, WrongPurposeIsRefused) {
  // An answer made for a handshake connection does not open a data connection.
  Outcome o = Exchange("k", "handshake", "s", "k", "tcp-data", {"s"});
  EXPECT_EQ(o.server.code(), Status::Code::kPermissionDenied);
  EXPECT_FALSE(o.client.ok());
}

// A crafted client: reads the challenge, then sends `make(ns)`.
Status ServerAgainst(const std::function<std::string(const unsigned char* ns)>& make) {
  Pair p;
  auto server = std::async(std::launch::async, [&] {
    return Authenticator("k").Challenge(p.server.get(), "tcp-data", {"s"}, 1000);
  });
  unsigned char challenge[40];
  EXPECT_TRUE(ReadFull(p.client.get(), challenge, 40, 1000).ok());
  std::string hello = make(challenge + 8);
  (void)WriteFull(p.client.get(), hello.data(), hello.size(), 1000);
  return server.get();
}

std::string HelloWith(const unsigned char* nc, const std::string& name, const std::string& mac) {
  std::string h("MCAUTHv2", 8);
  h.append(reinterpret_cast<const char*>(nc), 32);
  h.push_back(static_cast<char>(name.size() & 0xff));
  h.push_back(static_cast<char>(name.size() >> 8));
  return h + name + mac;
}

TEST(Auth, ServerRefusesSwappedNoncesAndAReplayedChallenge) {
  Authenticator a("k");
  unsigned char nc[32];
  ASSERT_EQ(RAND_bytes(nc, 32), 1);
  Status swapped = ServerAgainst([&](const unsigned char* ns) {
    return HelloWith(nc, "s", a.Mac("client", "tcp-data", "s", nc, ns));  // Nc, Ns swapped
  });
  EXPECT_EQ(swapped.code(), Status::Code::kPermissionDenied) << swapped.ToString();
  // Echoing the server's own nonce as the client nonce, with the "right" MAC for it.
  Status echoed = ServerAgainst([&](const unsigned char* ns) {
    return HelloWith(ns, "s", a.Mac("client", "tcp-data", "s", ns, ns));
  });
  EXPECT_EQ(echoed.code(), Status::Code::kPermissionDenied) << echoed.ToString();
  // The control: the same crafted client with the right MAC passes.
  Status right = ServerAgainst([&](const unsigned char* ns) {
    return HelloWith(nc, "s", a.Mac("client", "tcp-data", "s", ns, nc));
  });
  EXPECT_TRUE(right.ok()) << right.ToString();
}

TEST(Auth, ServerRefusesAnOldV1ClientAndOversizedNames) {
  Status v1 = ServerAgainst([](const unsigned char*) { return std::string(32, 'x'); });
  EXPECT_EQ(v1.code(), Status::Code::kPermissionDenied);
  EXPECT_TRUE(Has(v1, "MCAUTHv1")) << v1.ToString();
  unsigned char nc[32] = {1};
  Status big = ServerAgainst([&](const unsigned char*) {
    return HelloWith(nc, std::string(5000, 'n'), std::string(32, 'm'));
  });
  EXPECT_TRUE(Has(big, "limit 1024")) << big.ToString();
}

TEST(Auth, ServerGivesUpOnASilentClientAtItsDeadline) {
  Pair p;
  auto t0 = std::chrono::steady_clock::now();
  Status s = Authenticator("k").Challenge(p.server.get(), "shm", {"s"}, 300);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_LT(ms, 1000);
}

// A crafted server: sends a challenge, reads the client's hello, then answers `reply(...)`.
Status ClientAgainst(const std::function<std::string(const unsigned char* ns,
                                                     const Authenticator::Hello& h)>& reply,
                     const char* magic = "MCAUTHv2") {
  Pair p;
  auto client = std::async(std::launch::async, [&] {
    return Authenticator("k").Answer(p.client.get(), "shm", "s", 1000);
  });
  unsigned char challenge[40];
  std::memcpy(challenge, magic, 8);
  EXPECT_EQ(RAND_bytes(challenge + 8, 32), 1);
  EXPECT_TRUE(WriteFull(p.server.get(), challenge, 40, 1000).ok());
  if (std::strcmp(magic, "MCAUTHv2") == 0) {
    char buf[8 + 32 + 2 + 1 + 32];  // the hello for the one-byte name "s"
    EXPECT_TRUE(ReadFull(p.server.get(), buf, sizeof(buf), 1000).ok());
    auto hello = Authenticator::ParseHello(std::string_view(buf + 8, sizeof(buf) - 8));
    EXPECT_TRUE(hello.ok()) << hello.status().ToString();
    std::string r = reply(challenge + 8, *hello);
    (void)WriteFull(p.server.get(), r.data(), r.size(), 1000);
  }
  return client.get();
}

TEST(Auth, ClientRefusesAServerThatCannotProveTheSecret) {
  Authenticator a("k");
  // Reflecting the client's own MAC back as the server's proof.
  Status reflected = ClientAgainst([](const unsigned char*, const Authenticator::Hello& h) {
    return std::string(1, '\0') + h.mac;
  });
  EXPECT_EQ(reflected.code(), Status::Code::kPermissionDenied);
  EXPECT_TRUE(Has(reflected, "did not prove")) << reflected.ToString();
  // A server MAC over swapped nonces.
  Status swapped = ClientAgainst([&](const unsigned char* ns, const Authenticator::Hello& h) {
    auto nc = reinterpret_cast<const unsigned char*>(h.client_nonce.data());
    return std::string(1, '\0') + a.Mac("server", "shm", "s", nc, ns);
  });
  EXPECT_EQ(swapped.code(), Status::Code::kPermissionDenied);
  // "ok" and nothing else (a relay that has no proof to give).
  Status bare = ClientAgainst([](const unsigned char*, const Authenticator::Hello&) {
    return std::string(1, '\0');
  });
  EXPECT_EQ(bare.code(), Status::Code::kPermissionDenied);
  // The control: the right proof passes.
  Status right = ClientAgainst([&](const unsigned char* ns, const Authenticator::Hello& h) {
    auto nc = reinterpret_cast<const unsigned char*>(h.client_nonce.data());
    return std::string(1, '\0') + a.Mac("server", "shm", "s", ns, nc);
  });
  EXPECT_TRUE(right.ok()) << right.ToString();
}

TEST(Auth, ClientNamesAnOldV1Server) {
  Status s = ClientAgainst({}, "MCAUTHv1");
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_TRUE(Has(s, "MCAUTHv1")) << s.ToString();
}

// The relay of issue 14: M forwards bytes between a client that means to reach M and the
// real server S. Neither side accepts.
TEST(Auth, ARelayGainsNothing) {
  Pair c_m, m_s;
  std::thread relay([&] {  // client <-> server, byte for byte, until either side closes
    auto pump = [](int from, int to) {
      char buf[4096];
      for (;;) {
        ssize_t n = ::recv(from, buf, sizeof(buf), 0);
        if (n <= 0 || !WriteFull(to, buf, static_cast<size_t>(n), 1000).ok()) break;
      }
      ::shutdown(to, SHUT_WR);
    };
    std::thread a(pump, c_m.server.get(), m_s.client.get());
    pump(m_s.client.get(), c_m.server.get());
    a.join();
  });
  auto server = std::async(std::launch::async, [&] {
    return Authenticator("k").Challenge(m_s.server.get(), "tcp-data", {"S:15001"}, 1000);
  });
  Status client = Authenticator("k").Answer(c_m.client.get(), "tcp-data", "M:15001", 1000);
  Status s = server.get();
  ::shutdown(c_m.client.get(), SHUT_RDWR);
  ::shutdown(m_s.server.get(), SHUT_RDWR);
  relay.join();
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied) << s.ToString();
  EXPECT_TRUE(Has(s, "M:15001")) << s.ToString();
  EXPECT_EQ(client.code(), Status::Code::kPermissionDenied) << client.ToString();
}

TEST(Auth, ParseHelloBounds) {
  EXPECT_FALSE(Authenticator::ParseHello("").ok());
  std::string ok(32, 'n');
  ok += std::string("\x01\x00", 2) + "s" + std::string(32, 'm');
  auto h = Authenticator::ParseHello(ok);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->name, "s");
  EXPECT_FALSE(Authenticator::ParseHello(ok.substr(0, ok.size() - 1)).ok());
  EXPECT_FALSE(Authenticator::ParseHello(ok + "x").ok());
}


TEST(Auth, SignedEntriesBindKindScopeBodyAndSecret) {
  Authenticator a("s3cret"), b("other"), off("");
  const std::string sig = a.SignEntry("segment", "", "body");
  EXPECT_EQ(sig.size(), 64u);
  EXPECT_EQ(sig, a.SignEntry("segment", "", "body"));
  EXPECT_TRUE(a.VerifyEntry("segment", "", "body", sig));
  EXPECT_FALSE(a.VerifyEntry("rpc_meta", "", "body", sig));
  EXPECT_FALSE(a.VerifyEntry("segment", "cluster", "body", sig));
  EXPECT_FALSE(a.VerifyEntry("segment", "", "body2", sig));
  EXPECT_FALSE(a.VerifyEntry("segment", "", "body", sig.substr(0, 63)));
  EXPECT_FALSE(a.VerifyEntry("segment", "", "body", ""));
  EXPECT_FALSE(b.VerifyEntry("segment", "", "body", sig));
  EXPECT_TRUE(off.SignEntry("segment", "", "body").empty());
  EXPECT_FALSE(off.VerifyEntry("segment", "", "body", sig));
}

TEST(Auth, InstanceNames) {
  auto i = Authenticator::NewInstanceId();
  ASSERT_TRUE(i.ok());
  EXPECT_EQ(i->size(), 32u);
  EXPECT_NE(*i, *Authenticator::NewInstanceId());
  EXPECT_EQ(Authenticator::AuthName("seg", ""), "seg");
  EXPECT_EQ(Authenticator::AuthName("seg", "ab"), "seg (instance ab)");
  EXPECT_EQ(Authenticator::OwnNames("seg", "").size(), 1u);
  auto names = Authenticator::OwnNames("seg", "ab");
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[1], "seg (instance ab)");
}

}  // namespace
}  // namespace mooncake
