// store_peer: one engine in its own process, in a metadata-store mode (etcd, redis, http),
// driven over stdin/stdout by tests/store_engine. Speaks the line protocol of tests/mp_peer.cc
// (READY / CHECK / FILL) plus by-name transfers, so that a test can drive several engines that
// find each other through the store.
//
//   store_peer serve --metadata <conn> --name <segment name> [--size N] [--seed S]
//                    [--transport auto|tcp|shm] [--block B]
//     Init(<conn>, <name>, <transport>); on failure prints "FAIL <status>" and exits 1.
//     Registers N bytes (default 4 MiB) filled with pattern(seed S, default 7), prints
//       READY <segment name> <buffer addr> <size> <rpc port> <rpc ip:port>
//     then serves one command per line, one reply line each:
//       PING                         -> PONG
//       CHECK <off> <len> <seed>     -> OK | BAD <first mismatching offset>
//       FILL <off> <len> <seed>      -> OK
//       OPEN <segment>               -> OK <id> <transport> <buffers> <addr0> <len0> | ERR <status>
//       PUT <segment> <off> <len> <seed>
//           fills local [off, off+len) with pattern(seed) and writes it to the remote segment's
//           first buffer at the same offset (its address as the cached descriptor says now),
//           in B-byte requests (default 256 KiB), one TransferSync -> OK | ERR <status>
//       GET <segment> <off> <len> <seed>
//           zeroes local [off, off+len), reads the same range of the remote first buffer, and
//           checks every byte against pattern(seed) -> OK | BAD <offset> | ERR <status>
//       RETRYPUT <segment> <off> <len> <seed>
//           PUT, and if it fails, PUT again at once (as an application retrying would):
//           "<first: OK|ERR> <second: OK|ERR|BAD|-> <first reply>"
//       PUTAT <segment> <remote addr> <len> <seed>
//           writes pattern(seed) bytes [0, len) to <remote addr> (e.g. a second buffer)
//       REG2 <size>                  -> OK <addr>: registers a second buffer (pattern seed 9)
//       CHECK2 <off> <len> <seed>    -> OK | BAD <offset> (the second buffer)
//       UNREG2                       -> OK | ERR <status>
//       QUIT                         -> destroys the engine (clean shutdown), prints BYE, exit 0
//     EOF on stdin is QUIT.
//   store_peer storeget --metadata <conn> --key <key>
//     Reads one key with the store client (no lease): prints "VALUE <value>" (exit 0),
//     "NOTFOUND" (exit 3) or "ERR <status>" (exit 1). For tests whose store the test process
//     cannot reach (network namespaces).
//
// Safety: refuses to start an engine unless MC_TCP_BIND_ADDRESS is set, so that no test engine
// ever publishes an address picked from the host's interfaces.
// pattern(seed)[i] = (i * 131 + seed) & 0xff, i being the offset from the buffer start.
#include <glog/logging.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "metadata/metadata_store.h"
#include "mooncake/transfer_engine.h"

using namespace mooncake;

namespace {

uint8_t Pattern(uint64_t i, uint64_t seed) { return static_cast<uint8_t>(i * 131 + seed); }

std::map<std::string, std::string> Flags(int argc, char** argv) {
  std::map<std::string, std::string> f;
  for (int i = 2; i + 1 < argc; i += 2) f[argv[i]] = argv[i + 1];
  return f;
}

std::string Flag(const std::map<std::string, std::string>& f, const std::string& k,
                 const std::string& def = "") {
  auto it = f.find(k);
  return it == f.end() ? def : it->second;
}

uint64_t Num(const std::map<std::string, std::string>& f, const std::string& k, uint64_t def) {
  auto it = f.find(k);
  return it == f.end() ? def : std::stoull(it->second, nullptr, 0);
}

uint8_t* Alloc(size_t n) {
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(2);
  }
  return static_cast<uint8_t*>(p);
}

// One line, with newlines flattened, so a status message cannot break the protocol.
std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

void Reply(const std::string& s) {
  std::printf("%s\n", OneLine(s).c_str());
  std::fflush(stdout);
}

int64_t FirstMismatch(const uint8_t* buf, uint64_t off, uint64_t len, uint64_t seed) {
  for (uint64_t i = off; i < off + len; ++i) {
    if (buf[i] != Pattern(i, seed)) return static_cast<int64_t>(i);
  }
  return -1;
}

class Server {
 public:
  Server(TransferEngine* engine, uint8_t* buf, size_t size, size_t block)
      : engine_(engine), buf_(buf), size_(size), block_(block) {}

  // Returns false on QUIT.
  bool Handle(const std::string& line) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd.empty()) return true;
    if (cmd == "QUIT") return false;
    if (cmd == "PING") {
      Reply("PONG");
    } else if (cmd == "CHECK" || cmd == "FILL" || cmd == "CHECK2") {
      uint64_t off = 0, len = 0, seed = 0;
      in >> off >> len >> seed;
      uint8_t* b = cmd == "CHECK2" ? buf2_ : buf_;
      size_t n = cmd == "CHECK2" ? size2_ : size_;
      if (!b || off > n || len > n - off) return Reply("ERR range outside the buffer"), true;
      if (cmd == "FILL") {
        for (uint64_t i = off; i < off + len; ++i) b[i] = Pattern(i, seed);
        Reply("OK");
      } else {
        int64_t bad = FirstMismatch(b, off, len, seed);
        Reply(bad < 0 ? "OK" : "BAD " + std::to_string(bad));
      }
    } else if (cmd == "OPEN") {
      std::string seg;
      in >> seg;
      auto id = engine_->OpenSegment(seg);
      if (!id.ok()) return Reply("ERR " + id.status().ToString()), true;
      auto info = engine_->GetSegmentInfo(*id);
      if (!info.ok()) return Reply("ERR " + info.status().ToString()), true;
      std::ostringstream out;
      out << "OK " << *id << " " << (info->transport.empty() ? "-" : info->transport) << " "
          << info->buffers.size();
      if (!info->buffers.empty()) {
        out << " " << info->buffers[0].addr << " " << info->buffers[0].length;
      }
      Reply(out.str());
    } else if (cmd == "PUT" || cmd == "GET") {
      std::string seg;
      uint64_t off = 0, len = 0, seed = 0;
      in >> seg >> off >> len >> seed;
      if (off > size_ || len > size_ - off || len == 0) return Reply("ERR bad range"), true;
      Reply(Move(cmd == "PUT", seg, off, len, seed));
    } else if (cmd == "RETRYPUT") {
      std::string seg;
      uint64_t off = 0, len = 0, seed = 0;
      in >> seg >> off >> len >> seed;
      if (off > size_ || len > size_ - off || len == 0) return Reply("ERR bad range"), true;
      std::string first = Move(true, seg, off, len, seed);
      std::string second = first == "OK" ? "-" : Move(true, seg, off, len, seed);
      Reply(first.substr(0, first.find(' ')) + " " + second.substr(0, second.find(' ')) + " " +
            first);
    } else if (cmd == "PUTAT") {
      std::string seg;
      uint64_t addr = 0, len = 0, seed = 0;
      in >> seg >> addr >> len >> seed;
      if (len == 0 || len > size_) return Reply("ERR bad length"), true;
      for (uint64_t i = 0; i < len; ++i) buf_[i] = Pattern(i, seed);
      auto id = engine_->OpenSegment(seg);
      if (!id.ok()) return Reply("ERR " + id.status().ToString()), true;
      Status s = engine_->TransferSync(
          {{TransferRequest::WRITE, buf_, *id, addr, len}}, std::chrono::seconds(10));
      Reply(s.ok() ? "OK" : "ERR " + s.ToString());
    } else if (cmd == "REG2") {
      uint64_t n = 0;
      in >> n;
      if (buf2_ || n == 0) return Reply("ERR already registered or zero size"), true;
      buf2_ = Alloc(n);
      size2_ = n;
      for (uint64_t i = 0; i < n; ++i) buf2_[i] = Pattern(i, 9);
      Status s = engine_->RegisterLocalMemory(buf2_, n, "cpu:0");
      if (!s.ok()) {
        ::munmap(buf2_, n);
        buf2_ = nullptr;
        return Reply("ERR " + s.ToString()), true;
      }
      Reply("OK " + std::to_string(reinterpret_cast<uint64_t>(buf2_)));
    } else if (cmd == "UNREG2") {
      if (!buf2_) return Reply("ERR no second buffer"), true;
      Status s = engine_->UnregisterLocalMemory(buf2_);
      if (!s.ok()) return Reply("ERR " + s.ToString()), true;
      ::munmap(buf2_, size2_);
      buf2_ = nullptr;
      size2_ = 0;
      Reply("OK");
    } else {
      Reply("ERR unknown command " + cmd);
    }
    return true;
  }

 private:
  std::string Move(bool write, const std::string& seg, uint64_t off, uint64_t len,
                   uint64_t seed) {
    auto id = engine_->OpenSegment(seg);
    if (!id.ok()) return "ERR " + id.status().ToString();
    // The remote address as the engine knows it now: after a peer restart, this is the stale
    // descriptor until a failed transfer drops it.
    auto info = engine_->GetSegmentInfo(*id);
    if (!info.ok()) return "ERR " + info.status().ToString();
    if (info->buffers.empty()) return "ERR segment " + seg + " has no buffer";
    const uint64_t remote = info->buffers[0].addr;
    if (off + len > info->buffers[0].length) return "ERR range outside the remote buffer";
    if (write) {
      for (uint64_t i = off; i < off + len; ++i) buf_[i] = Pattern(i, seed);
    } else {
      std::memset(buf_ + off, 0, len);
    }
    std::vector<TransferRequest> reqs;
    for (uint64_t o = off; o < off + len; o += block_) {
      reqs.push_back({write ? TransferRequest::WRITE : TransferRequest::READ, buf_ + o, *id,
                      remote + o, std::min<uint64_t>(block_, off + len - o)});
    }
    Status s = engine_->TransferSync(reqs, std::chrono::seconds(10));
    if (!s.ok()) return "ERR " + s.ToString();
    if (!write) {
      int64_t bad = FirstMismatch(buf_, off, len, seed);
      if (bad >= 0) return "BAD " + std::to_string(bad);
    }
    return "OK";
  }

  TransferEngine* engine_;
  uint8_t* buf_;
  size_t size_;
  size_t block_;
  uint8_t* buf2_ = nullptr;
  size_t size2_ = 0;
};

int Serve(const std::map<std::string, std::string>& f) {
  const char* bind = std::getenv("MC_TCP_BIND_ADDRESS");
  if (!bind || !*bind) {
    Reply("FAIL MC_TCP_BIND_ADDRESS is not set; test engines must never publish an address "
          "picked from the host's interfaces");
    return 2;
  }
  const std::string metadata = Flag(f, "--metadata");
  const std::string name = Flag(f, "--name");
  const size_t size = Num(f, "--size", 4 << 20);
  const uint64_t seed = Num(f, "--seed", 7);
  if (metadata.empty() || name.empty() || size == 0) {
    Reply("FAIL need --metadata and --name");
    return 2;
  }
  auto engine = std::make_unique<TransferEngine>();
  const auto t0 = std::chrono::steady_clock::now();
  Status s = engine->Init(metadata, name, Flag(f, "--transport", "auto"));
  if (!s.ok()) {
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Reply("FAIL " + s.ToString() + " (after " + std::to_string(secs) + " s)");
    return 1;
  }
  uint8_t* buf = Alloc(size);
  for (size_t i = 0; i < size; ++i) buf[i] = Pattern(i, seed);
  s = engine->RegisterLocalMemory(buf, size, "cpu:0");
  if (!s.ok()) {
    Reply("FAIL " + s.ToString());
    return 1;
  }
  Reply("READY " + engine->GetLocalSegmentName() + " " +
        std::to_string(reinterpret_cast<uint64_t>(buf)) + " " + std::to_string(size) + " " +
        std::to_string(engine->GetRpcPort()) + " " + engine->GetLocalIpAndPort());
  Server server(engine.get(), buf, size, Num(f, "--block", 256 << 10));
  std::string line;
  while (std::getline(std::cin, line) && server.Handle(line)) {
  }
  engine.reset();  // clean shutdown: removes our keys from the store
  Reply("BYE");
  return 0;
}

int StoreGet(const std::map<std::string, std::string>& f) {
  StoreOptions o;
  o.lease_ttl_s = 0;  // a reader: no lease, nothing written
  o.connect_timeout_ms = 1000;
  o.request_timeout_ms = 2000;
  auto store = CreateMetadataStore(Flag(f, "--metadata"), o);
  if (!store.ok()) return Reply("ERR " + store.status().ToString()), 1;
  auto v = (*store)->Get(Flag(f, "--key"));
  if (v.ok()) return Reply("VALUE " + *v), 0;
  if (v.status().IsNotFound()) return Reply("NOTFOUND"), 3;
  return Reply("ERR " + v.status().ToString()), 1;
}

}  // namespace

int main(int argc, char** argv) {
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  const std::string role = argc > 1 ? argv[1] : "";
  auto f = Flags(argc, argv);
  if (role == "serve") return Serve(f);
  if (role == "storeget") return StoreGet(f);
  std::fprintf(stderr, "usage: store_peer serve|storeget --flag value ...\n");
  return 2;
}
