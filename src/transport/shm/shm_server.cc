// Target side of the same-host transport, and the host identity.
#include <fcntl.h>
#include <glog/logging.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>

#include "common/auth.h"
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

// One of the initiator's shareable ranges, mapped here.
struct Mapped {
  uint64_t addr;
  uint64_t length;
  uint8_t* ptr;
};

void UnmapAll(std::vector<Mapped>* maps) {
  for (const Mapped& m : *maps) ::munmap(m.ptr, m.length);
  maps->clear();
}

// Reads exactly `len` bytes, collecting file descriptors passed with SCM_RIGHTS. Waits
// without a deadline for the first byte when `idle`, else up to `timeout_ms`.
Status RecvWithFds(int fd, void* buf, size_t len, std::vector<int>* fds, bool idle,
                   int timeout_ms) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t got = 0;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 253)];
  while (got < len) {
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, idle && got == 0 ? -1 : timeout_ms);
    if (r == 0) return Status::DeadlineExceeded("no message from the initiator");
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("poll", errno);
    }
    iovec iov{p + got, len - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n == 0) return Status::Unavailable("connection closed by the initiator");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoStatus("recvmsg", errno);
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const int* in = reinterpret_cast<const int*>(CMSG_DATA(c));
        fds->insert(fds->end(), in, in + count);
      }
    }
    got += static_cast<size_t>(n);
  }
  return Status::OK();
}

// Replaces `maps` with the ranges announced in a Map message; takes ownership of `fds`.
Status MapRanges(int fd, uint32_t count, std::vector<int>& fds, std::vector<Mapped>* maps,
                 int timeout_ms) {
  std::vector<SharedRange> ranges(count);
  Status s = count ? ReadFull(fd, ranges.data(), count * sizeof(SharedRange), timeout_ms)
                   : Status::OK();
  if (s.ok() && fds.size() != count) {
    s = Status::DataLoss("map message announces " + std::to_string(count) + " ranges but carries " +
                         std::to_string(fds.size()) + " descriptors");
  }
  UnmapAll(maps);
  // A range longer than its memfd, or a memfd the peer could still shrink, would turn our
  // memcpy into a SIGBUS: such a set is refused whole (copies then use process_vm_*).
  for (uint32_t i = 0; s.ok() && i < count; ++i) {
    struct stat st {};
    int seals = ::fcntl(fds[i], F_GET_SEALS);
    if (::fstat(fds[i], &st) != 0 || ranges[i].length == 0 ||
        ranges[i].length > static_cast<uint64_t>(st.st_size) || seals < 0 ||
        !(seals & F_SEAL_SHRINK)) {
      s = Status::InvalidArgument("shared range " + std::to_string(i) +
                                  " is longer than its memfd or the memfd is not sealed "
                                  "against shrinking");
    }
  }
  for (uint32_t i = 0; s.ok() && i < count; ++i) {
    void* p = ::mmap(nullptr, ranges[i].length, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
    if (p == MAP_FAILED) {
      s = ErrnoStatus("mmap of the initiator's shared memory", errno);
      break;
    }
    maps->push_back({ranges[i].addr, ranges[i].length, static_cast<uint8_t*>(p)});
  }
  for (int f : fds) ::close(f);
  fds.clear();
  if (!s.ok()) UnmapAll(maps);
  return s;
}

// The local pointer for the initiator's [addr, addr+len), when it lies in a mapped range.
uint8_t* Translate(const std::vector<Mapped>& maps, uint64_t addr, uint64_t len) {
  for (const Mapped& m : maps) {
    if (addr >= m.addr && len <= m.length && addr - m.addr <= m.length - len) {
      return m.ptr + (addr - m.addr);
    }
  }
  return nullptr;
}

}  // namespace

ShmServer::ShmServer(const EngineOptions& options, MemoryRegistry* registry,
                     std::string segment_name)
    : options_(options),
      registry_(registry),
      segment_name_(std::move(segment_name)),
      server_("ShmServer", kMaxConnections, [this](int fd) { Serve(fd); }) {}

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
  Status auth = Authenticator(options_.auth_secret).Challenge(fd, "shm", {segment_name_}, timeout);
  if (!auth.ok()) {
    LOG(WARNING) << "ShmServer: refused a connection from pid " << pid << ": " << auth.ToString();
    return;
  }

  HelloRequest hello;
  if (!ReadFull(fd, &hello, sizeof(hello), timeout).ok() || hello.magic != kMagic) {
    return;
  }
  HelloReply reply;
  uint64_t seen = 0;
  iovec mine{&seen, sizeof(seen)}, theirs{reinterpret_cast<void*>(hello.probe_addr), 8};
  if (::process_vm_readv(pid, &mine, 1, &theirs, 1, 0) != 8 || seen != hello.probe_value) {
    reply.status = kRefused;
    reply.err = errno;
  }
  if (!WriteFull(fd, &reply, sizeof(reply), timeout).ok() || reply.status != kOk) return;

  std::vector<Item> items;
  std::vector<uint32_t> statuses;
  std::vector<MemoryRegion*> pins;
  std::vector<const Item*> run;
  std::vector<int> fds;
  std::vector<Mapped> maps;
  for (;;) {
    RequestHeader h;
    for (int f : fds) ::close(f);
    fds.clear();
    if (!RecvWithFds(fd, &h, sizeof(h), &fds, /*idle=*/true, timeout).ok()) break;
    if (h.magic == kMapMagic && h.count <= kMaxSharedRanges) {
      Status m = MapRanges(fd, h.count, fds, &maps, timeout);
      if (!m.ok()) LOG(WARNING) << "ShmServer: pid " << pid << ": " << m.ToString();
      ReplyHeader rh;
      rh.magic = kMapMagic;
      rh.count = static_cast<uint32_t>(maps.size());
      rh.seq = h.seq;
      if (!WriteFull(fd, &rh, sizeof(rh), timeout).ok()) break;
      continue;
    }
    if (h.magic != kMagic || h.count == 0 || h.count > kMaxItems) {
      LOG(WARNING) << "ShmServer: malformed request from pid " << pid << "; closing";
      break;
    }
    items.resize(h.count);
    if (!ReadFull(fd, items.data(), h.count * sizeof(Item), timeout).ok()) break;
    statuses.assign(h.count, kOk);
    pins.assign(h.count, nullptr);
    for (uint32_t i = 0; i < h.count; ++i) {
      const Item& it = items[i];
      pins[i] = it.op <= 1 ? registry_->Pin(it.target_addr, it.length, /*remote_only=*/true)
                           : nullptr;
      if (pins[i] == nullptr) statuses[i] = kRejected;
    }
    // Items in the initiator's shared memory: a plain memcpy through our mapping.
    std::vector<bool> copied(h.count, false);
    for (uint32_t i = 0; i < h.count && !maps.empty(); ++i) {
      if (statuses[i] != kOk) continue;
      const Item& it = items[i];
      uint8_t* theirs = Translate(maps, it.initiator_addr, it.length);
      if (theirs == nullptr) continue;
      auto* mine = reinterpret_cast<uint8_t*>(it.target_addr);
      if (it.op == TransferRequest::WRITE) {
        std::memcpy(mine, theirs, it.length);
      } else {
        std::memcpy(theirs, mine, it.length);
      }
      copied[i] = true;
    }
    // The rest: runs of consecutive items with the same op, one syscall per run.
    for (uint32_t i = 0; i < h.count;) {
      if (statuses[i] != kOk || copied[i]) {
        ++i;
        continue;
      }
      run.clear();
      uint32_t j = i;
      for (; j < h.count && statuses[j] == kOk && !copied[j] && items[j].op == items[i].op; ++j) {
        run.push_back(&items[j]);
      }
      if (!CopyRun(pid, items[i].op, run)) {
        for (uint32_t k = i; k < j; ++k) {
          if (!CopyRun(pid, items[k].op, {&items[k]})) statuses[k] = kCopyFailed;
        }
      }
      i = j;
    }
    for (MemoryRegion* r : pins) {
      if (r) MemoryRegistry::Unpin(r);
    }
    ReplyHeader rh;
    rh.count = h.count;
    rh.seq = h.seq;
    iovec out[2] = {{&rh, sizeof(rh)}, {statuses.data(), statuses.size() * sizeof(uint32_t)}};
    msghdr msg{};
    msg.msg_iov = out;
    msg.msg_iovlen = 2;
    size_t want = sizeof(rh) + statuses.size() * sizeof(uint32_t);
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0 || static_cast<size_t>(n) != want) break;  // replies are tiny: one send
  }
  for (int f : fds) ::close(f);
  UnmapAll(&maps);
}

}  // namespace mooncake::shm
