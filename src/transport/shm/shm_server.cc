// Target side of the same-host transport, and the host identity.
#include <fcntl.h>
#include <glog/logging.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>

#include "common/auth.h"
#include "transport/shm/shm_exports.h"
#include "transport/shm/shm_maps.h"
#include "transport/shm/shm_peer.h"
#include "transport/shm/shm_transport.h"
#include "transport/shm/shm_wire.h"

namespace mooncake::shm {
namespace {

// Copies one run of items with the same op in one call. Returns false if the call moved
// fewer bytes than asked (then the caller retries item by item to find the culprit).
bool CopyRun(pid_t pid, uint32_t op, const std::vector<const Item*>& run) {
  std::vector<iovec> mine(run.size()), theirs(run.size());
  size_t total = 0;
  for (size_t i = 0; i < run.size(); ++i) {
    mine[i] = {reinterpret_cast<void*>(run[i]->target_addr), run[i]->length};
    theirs[i] = {reinterpret_cast<void*>(run[i]->initiator_addr), run[i]->length};
    total += run[i]->length;
  }
  ssize_t n = op == TransferRequest::WRITE
                  ? ::process_vm_readv(pid, mine.data(), run.size(), theirs.data(), run.size(), 0)
                  : ::process_vm_writev(pid, mine.data(), run.size(), theirs.data(), run.size(), 0);
  return n >= 0 && static_cast<size_t>(n) == total;
}


// The hello after the secret's challenge: the version, the process behind the socket and its
// proof, and the reply. False: refused (logged, the reply sent where there is one).
bool Hello(int fd, pid_t pid, int timeout, PeerProcess* peer) {
  HelloRequest hello;
  if (!ReadFull(fd, &hello, sizeof(hello), timeout).ok() || hello.magic != kMagic) {
    return false;
  }
  HelloReply reply;
  if (hello.version != kVersion) {
    LOG(WARNING) << "ShmServer: pid " << pid << " speaks same-host protocol v" << hello.version
                 << ", this target v" << kVersion << "; refused (upgrade both ends)";
    reply.status = kBadVersion;
    (void)WriteFull(fd, &reply, sizeof(reply), timeout);
    return false;
  }
  Status opened = peer->Open(fd);
  if (!opened.ok()) {
    LOG(WARNING) << "ShmServer: refused pid " << pid << ": " << opened.ToString();
    reply.status = kRefused;
    reply.err = ESRCH;
    (void)WriteFull(fd, &reply, sizeof(reply), timeout);
    return false;
  }
  if (!peer->Prove(fd, hello.proof_addr, timeout, &reply).ok()) return false;
  if (!WriteFull(fd, &reply, sizeof(reply), timeout).ok() || reply.status != kOk) {
    if (reply.status != kOk) {
      LOG(WARNING) << "ShmServer: refused pid " << pid << ": " << ProofRefusalReason(reply.err)
                   << " (" << std::strerror(reply.err) << ")";
    }
    return false;
  }
  return true;
}

// One connection's buffers, reused from request to request.
struct Scratch {
  std::vector<Item> items;
  std::vector<uint32_t> statuses;
  std::vector<MemoryRegion*> pins;
  std::vector<const Item*> run;
  std::vector<uint8_t> copied;
};

// Copies the items not yet copied through the initiator's shared memory: runs of consecutive
// items with the same op, one syscall per run, only while the process that opened the
// connection lives (checked before and after: a copy that may have reached a process that
// took over its pid is reported failed). True when that process has exited.
bool CopyThroughSyscalls(pid_t pid, PeerProcess& peer, Scratch& s) {
  const uint32_t count = static_cast<uint32_t>(s.items.size());
  bool exited = !peer.Alive();
  for (uint32_t i = 0; i < count && !exited;) {
    if (s.statuses[i] != kOk || s.copied[i]) {
      ++i;
      continue;
    }
    s.run.clear();
    uint32_t j = i;
    for (; j < count && s.statuses[j] == kOk && !s.copied[j] && s.items[j].op == s.items[i].op;
         ++j) {
      s.run.push_back(&s.items[j]);
    }
    if (!CopyRun(pid, s.items[i].op, s.run)) {
      for (uint32_t k = i; k < j; ++k) {
        if (!CopyRun(pid, s.items[k].op, {&s.items[k]})) s.statuses[k] = kCopyFailed;
      }
    }
    i = j;
  }
  return exited || !peer.Alive();
}

// One transfer request of h.count items: reads them, copies, replies. False: the connection
// is to be closed (a failed read or reply, or its process gone).
bool Transfer(int fd, const RequestHeader& h, pid_t pid, int timeout, MemoryRegistry* registry,
              ConnMaps& maps, PeerProcess& peer, Scratch& s) {
  s.items.resize(h.count);
  if (!ReadFull(fd, s.items.data(), h.count * sizeof(Item), timeout).ok()) return false;
  s.statuses.assign(h.count, kOk);
  s.pins.assign(h.count, nullptr);
  for (uint32_t i = 0; i < h.count; ++i) {
    const Item& it = s.items[i];
    s.pins[i] = it.op <= 1 ? registry->Pin(it.target_addr, it.length, /*remote_only=*/true)
                           : nullptr;
    if (s.pins[i] == nullptr) s.statuses[i] = kRejected;
  }
  // Items in the initiator's shared memory: a plain memcpy through our mapping.
  s.copied.assign(h.count, 0);
  bool need_vm = false;
  for (uint32_t i = 0; i < h.count; ++i) {
    if (s.statuses[i] != kOk) continue;
    const Item& it = s.items[i];
    uint8_t* theirs = maps.empty() ? nullptr : maps.Translate(it.initiator_addr, it.length);
    if (theirs == nullptr) {
      need_vm = true;
      continue;
    }
    auto* mine = reinterpret_cast<uint8_t*>(it.target_addr);
    if (it.op == TransferRequest::WRITE) {
      std::memcpy(mine, theirs, it.length);
    } else {
      std::memcpy(theirs, mine, it.length);
    }
    s.copied[i] = 1;
  }
  const bool exited = need_vm && CopyThroughSyscalls(pid, peer, s);
  if (exited) {
    LOG(WARNING) << "ShmServer: pid " << pid << ", which opened this connection, has exited; "
                 << "refusing its copies (the pid may name another process now) and closing";
    for (uint32_t i = 0; i < h.count; ++i) {
      if (s.statuses[i] != kRejected && !s.copied[i]) s.statuses[i] = kPeerExited;
    }
  }
  for (MemoryRegion* r : s.pins) {
    if (r) MemoryRegistry::Unpin(r);
  }
  ReplyHeader rh;
  rh.count = h.count;
  rh.seq = h.seq;
  iovec out[2] = {{&rh, sizeof(rh)}, {s.statuses.data(), s.statuses.size() * sizeof(uint32_t)}};
  msghdr msg{};
  msg.msg_iov = out;
  msg.msg_iovlen = 2;
  size_t want = sizeof(rh) + s.statuses.size() * sizeof(uint32_t);
  ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  if (n < 0 || static_cast<size_t>(n) != want) return false;  // replies are tiny: one send
  return !exited;
}

}  // namespace

ShmServer::ShmServer(const EngineOptions& options, MemoryRegistry* registry,
                     std::string segment_name, std::string instance)
    : options_(options),
      registry_(registry),
      segment_name_(std::move(segment_name)),
      instance_(std::move(instance)),
      // Idle or slow sockets cannot lock peers out: a connection must finish its hello
      // within the first-frame deadline, and one user (uid) holds at most a quarter of the
      // slots (ConnServer's admission policy).
      server_("ShmServer",
              ConnLimits{kMaxConnections, kMaxConnections / 4, options.first_frame_timeout_ms},
              [this](int fd) { Serve(fd); }) {
  limits_.max_map_per_conn = options.shm_max_map_per_conn;
  limits_.max_map_total = options.shm_max_map_total;
}

ShmServer::~ShmServer() { Stop(); }

Status ShmServer::Start(std::string* path) {
  std::random_device rd;
  std::ostringstream name;
  name << "mooncake-shm-" << ::getpid() << "-" << std::hex << rd() << rd();
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("unix socket", errno);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string n = name.str();
  std::memcpy(addr.sun_path + 1, n.data(), n.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n.size());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return ErrnoStatus("bind unix socket @" + n, errno);
  }
  if (::listen(fd.get(), 256) != 0) return ErrnoStatus("listen @" + n, errno);
  // Descriptors of incomplete messages, all connections together: a quarter of ours.
  rlimit nofile{};
  size_t quarter = ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 ? nofile.rlim_cur / 4 : 1024;
  limits_.max_held_fds = std::max<size_t>(kMaxSharedRanges, quarter);
  MC_RETURN_IF_ERROR(server_.Start(std::move(fd)));
  *path = n;
  return Status::OK();
}

void ShmServer::Stop() { server_.Stop(); }

void ShmServer::Serve(int fd) {
  const int timeout = options_.slice_timeout_ms;
  // Returning closes our end (ConnServer shuts the socket down), which tells the initiator we
  // touch none of its memory any more.
  ucred cred{};
  socklen_t clen = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) return;
  const pid_t pid = cred.pid;
  Status auth = Authenticator(options_.auth_secret).Challenge(
      fd, "shm", Authenticator::OwnNames(segment_name_, instance_), timeout);
  if (!auth.ok()) {
    LOG(WARNING) << "ShmServer: refused a connection from pid " << pid << ": " << auth.ToString();
    return;
  }
  PeerProcess peer;
  if (!Hello(fd, pid, timeout, &peer)) return;
  ConnServer::MarkEstablished();

  Scratch scratch;
  ConnMaps maps(&limits_);
  for (;;) {
    RequestHeader h;
    Status rs = maps.RecvHeader(fd, &h, timeout);
    if (!rs.ok()) {
      if (!rs.IsUnavailable()) LOG(WARNING) << "ShmServer: pid " << pid << ": " << rs.ToString();
      break;
    }
    if (h.magic == kMapMagic && h.count <= kMaxSharedRanges) {
      MapReply mr;
      mr.seq = h.seq;
      std::string refusal;
      if (!maps.Map(fd, h.count, timeout, &mr, &refusal).ok()) break;
      if (!refusal.empty()) LOG(WARNING) << "ShmServer: pid " << pid << ": " << refusal;
      if (!WriteFull(fd, &mr, sizeof(mr), timeout).ok()) break;
      continue;
    }
    if (h.magic == kExportMagic && h.count == 0) {
      if (!ServeExport(fd, h.seq, registry_, timeout).ok()) break;
      continue;
    }
    if (h.magic != kMagic || h.count == 0 || h.count > kMaxItems) {
      LOG(WARNING) << "ShmServer: malformed request from pid " << pid << "; closing";
      break;
    }
    if (!Transfer(fd, h, pid, timeout, registry_, maps, peer, scratch)) break;
  }
}

}  // namespace mooncake::shm
