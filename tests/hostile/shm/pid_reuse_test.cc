// Issue 14, point 2: the same-host target took the initiator's pid once (SO_PEERCRED) and
// used it with process_vm_readv/writev for the whole connection. When the initiator forked,
// handed the connection to its child and exited, and its pid went to an unrelated process,
// requests on that connection read from and wrote into that process. Now the target holds a
// pidfd of the process that opened the connection, proves in the hello that the pid names
// the process at the other end, and refuses every process_vm copy once that process has
// exited (status kPeerExited, then closes).
//
// Here: P (a child of this test) opens a connection to a ShmServer in this process, forks C,
// which keeps the connection, and exits. With pid reuse, a victim V is started with P's pid
// (via /proc/sys/kernel/ns_last_pid; skipped where that cannot be written). C then asks for a
// READ into and a WRITE from an address where V holds its own data: V's memory must stay
// untouched, none of its bytes may reach the target's buffer, and C must get kPeerExited.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>

#include <cstdio>

#include "shm_hostile.h"

namespace shm_hostile {
namespace {

constexpr size_t kVictim = 64 << 10;
constexpr uint8_t kVictimByte = 0x5a, kTargetByte = 0xc3;

struct Outcome {
  bool reply = false;         // C got a reply (else the connection failed before it)
  uint32_t status[2] = {99, 99};
  bool closed_after = false;  // the target closed the connection after refusing
};

// Reads n bytes from a pipe or socket within timeout_ms (ReadFull is for sockets only).
bool ReadExact(int fd, void* p, size_t n, int timeout_ms) {
  auto* b = static_cast<uint8_t*>(p);
  size_t got = 0;
  while (got < n) {
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, timeout_ms) <= 0) return false;
    ssize_t r = ::read(fd, b + got, n - got);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

// Waits for `pid` with a deadline; kills it first if it is still running then.
void Reap(pid_t pid) {
  for (int i = 0; i < 500; ++i) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return;
    ::usleep(10000);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

// Starts a process that sleeps until `release` is readable, with pid `want` if possible.
pid_t StartVictimWithPid(pid_t want, int release) {
  FILE* f = std::fopen("/proc/sys/kernel/ns_last_pid", "w");
  if (!f) return -1;
  std::fprintf(f, "%d", want - 1);
  if (std::fclose(f) != 0) return -1;
  pid_t v = ::fork();
  if (v == 0) {
    char c;
    (void)::read(release, &c, 1);
    ::_exit(0);
  }
  return v;
}

class ShmPidBinding : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);  // C comes back to us when P exits
    victim_ = std::make_unique<Pages>(kVictim);
    ASSERT_TRUE(victim_->data);
    std::memset(victim_->data, kVictimByte, kVictim);  // every child inherits this
    ASSERT_TRUE(t_.Start());
    std::memset(t_.buf.data, kTargetByte, t_.buf.size);
  }

  // P connects, forks C and exits; optionally a victim takes P's pid; then C sends one
  // request (READ into victim_+0, WRITE from victim_+4096) and reports what it got.
  // Returns false when the victim did not get P's pid (the caller retries).
  bool Run(bool reuse, Outcome* out, pid_t* victim) {
    int go[2], res[2], release[2], ready[2];
    if (::pipe(go) || ::pipe(res) || ::pipe(release) || ::pipe(ready)) return false;
    pid_t p = ::fork();
    if (p == 0) {
      auto conn = ConnectAndHello(t_.path, 3000, "");
      char ok = conn.ok() ? 1 : 0;
      pid_t c = ok ? ::fork() : 1;
      if (c == 0) {  // C: keeps the connection, waits for the go
        // Only the test holds the write end of `go`: when it gives up on this try (the
        // victim missed the pid) and closes it, C sees EOF and exits instead of waiting
        // forever with the test's stdout open (which kept ctest waiting past its timeout).
        for (int f : {ready[0], ready[1], go[1], res[0], release[0], release[1]}) ::close(f);
        char g;
        if (::read(go[0], &g, 1) != 1) ::_exit(1);
        uint64_t v = reinterpret_cast<uint64_t>(victim_->data);
        std::vector<Item> items = {{v, t_.buf.addr(), 4096, 0, 0},
                                   {v + 4096, t_.buf.addr() + 4096, 4096, 1, 0}};
        Outcome o;
        std::vector<uint32_t> st;
        o.reply = SendRequest(conn->get(), items, 7) && ReadReply(conn->get(), 2, 7, &st, 5000);
        if (o.reply) {
          o.status[0] = st[0];
          o.status[1] = st[1];
        }
        o.closed_after = PeerClosed(conn->get(), 3000);
        (void)!::write(res[1], &o, sizeof(o));
        ::_exit(0);
      }
      (void)!::write(ready[1], &ok, 1);
      (void)!::write(ready[1], &c, sizeof(c));
      ::_exit(0);  // P exits; C holds the connection
    }
    ::close(ready[1]);
    ::close(go[0]);  // C has its own copy; the test must hold only the write end
    char ok = 0;
    pid_t c = -1;
    bool started = ::read(ready[0], &ok, 1) == 1 && ok == 1 &&
                   ReadExact(ready[0], &c, sizeof(c), 3000) && c > 0;
    ::waitpid(p, nullptr, 0);  // P's pid is free from here on
    *victim = -1;
    bool got_pid = true;
    if (started && reuse) {
      *victim = StartVictimWithPid(p, release[0]);
      got_pid = *victim == p;
    }
    if (started && got_pid) {
      (void)!::write(go[1], "g", 1);
      started = ReadExact(res[0], out, sizeof(*out), 15000);
    }
    ::close(go[1]);  // C (if still waiting) exits
    // Check the victim's memory before it goes.
    if (*victim > 0 && got_pid) {
      std::vector<uint8_t> seen(kVictim);
      iovec mine{seen.data(), kVictim}, theirs{victim_->data, kVictim};
      if (::process_vm_readv(*victim, &mine, 1, &theirs, 1, 0) != static_cast<ssize_t>(kVictim)) {
        ADD_FAILURE() << "cannot read the victim's memory: " << std::strerror(errno);
        seen.assign(kVictim, kVictimByte);
      }
      size_t changed = 0;
      for (uint8_t b : seen) changed += b != kVictimByte;
      EXPECT_EQ(changed, 0u) << "the target wrote into an unrelated process that took the "
                                "initiator's pid";
    }
    (void)!::write(release[1], "r", 1);
    if (*victim > 0) Reap(*victim);
    // C was reparented to us (subreaper) and cannot be reaped by anyone else, so its pid
    // stays ours until we reap it: wait for it, and kill it if it outlives the deadline.
    if (c > 0) Reap(c);
    for (int f : {res[0], res[1], release[0], release[1], ready[0]}) ::close(f);
    EXPECT_TRUE(started) << "the peer did not start or report";
    return got_pid;
  }

  void ExpectRefused(const Outcome& o) {
    size_t leaked = 0;
    for (size_t i = 4096; i < 8192; ++i) leaked += t_.buf.data[i] != kTargetByte;
    EXPECT_EQ(leaked, 0u) << "bytes of another process reached the target's buffer";
    if (o.reply) {
      EXPECT_EQ(o.status[0], kPeerExited);
      EXPECT_EQ(o.status[1], kPeerExited);
    }
    EXPECT_TRUE(o.reply || o.closed_after);
    EXPECT_TRUE(o.closed_after) << "the target kept serving a connection whose process exited";
  }

  Target t_;
  std::unique_ptr<Pages> victim_;
};

TEST_F(ShmPidBinding, ConnectionOfAnExitedParentRefusesCopies) {
  Outcome o;
  pid_t v;
  ASSERT_TRUE(Run(false, &o, &v));
  ExpectRefused(o);
}

TEST_F(ShmPidBinding, PidReusedByAVictimIsNeverTouched) {
  if (::access("/proc/sys/kernel/ns_last_pid", W_OK) != 0) {
    GTEST_SKIP() << "/proc/sys/kernel/ns_last_pid is not writable here: cannot force pid reuse";
  }
  Outcome o;
  pid_t v = -1;
  int tries = 0;
  while (tries < 20 && !Run(true, &o, &v)) ++tries;  // other processes may take the pid first
  ASSERT_LT(tries, 20) << "could not give the victim the initiator's pid in 20 tries";
  std::printf("[shm pid reuse] victim got the exited initiator's pid %d after %d retries; "
              "statuses %u %u\n", v, tries, o.status[0], o.status[1]);
  ExpectRefused(o);
}

// The hello binds the connection to the process at its other end: a process that was
// handed a socket another process opened cannot pass the proof (the nonce it writes lands
// in its own memory, not in the opener's).
TEST_F(ShmPidBinding, HelloFromAnotherProcessThanTheOpenerIsRefused) {
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(s, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, t_.path.data(), t_.path.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + t_.path.size());
  ASSERT_EQ(::connect(s, reinterpret_cast<sockaddr*>(&addr), len), 0);  // opened by us
  static volatile uint8_t proof[kNonceSize];
  pid_t x = ::fork();
  if (x == 0) {  // X says the hello on our socket
    HelloRequest hello;
    hello.proof_addr = reinterpret_cast<uint64_t>(&proof[0]);
    HelloReply r;
    uint8_t nonce[kNonceSize];
    HelloProof written;
    if (!SendAll(s, &hello, sizeof(hello)) || !ReadExact(s, &r, sizeof(r), 3000) ||
        r.status != kChallenge || !ReadExact(s, nonce, kNonceSize, 3000)) {
      ::_exit(2);
    }
    for (uint32_t i = 0; i < kNonceSize; ++i) proof[i] = nonce[i];
    if (!SendAll(s, &written, sizeof(written)) || !ReadExact(s, &r, sizeof(r), 3000)) ::_exit(3);
    ::_exit(r.status == kRefused && r.err == EBADMSG ? 0 : 4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(x, &status, 0), x);
  ::close(s);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2/3: hello broken; 4: the proof was not refused";
}

// A peer speaking another protocol version gets a clear refusal, not a hang.
TEST_F(ShmPidBinding, OtherProtocolVersionIsRefusedWithTheTargetsVersion) {
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, t_.path.data(), t_.path.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + t_.path.size());
  ASSERT_EQ(::connect(s, reinterpret_cast<sockaddr*>(&addr), len), 0);
  HelloRequest hello;
  hello.version = 1;
  HelloReply r;
  ASSERT_TRUE(SendAll(s, &hello, sizeof(hello)));
  ASSERT_TRUE(ReadExact(s, &r, sizeof(r), 3000));
  EXPECT_EQ(r.status, kBadVersion);
  EXPECT_EQ(r.version, kVersion);
  EXPECT_TRUE(PeerClosed(s, 3000));
  ::close(s);
}

}  // namespace
}  // namespace shm_hostile
