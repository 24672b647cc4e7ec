// PeerProcess: pidfd of a same-host initiator and the proof of memory of the hello.
#include "transport/shm/shm_peer.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  // Linux 6.5
#endif

namespace mooncake::shm {

Status PeerProcess::Open(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus("SO_PEERCRED", errno);
  }
  pid_ = cred.pid;
  int pidfd = -1;
  len = sizeof(pidfd);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) != 0 || pidfd < 0) {
    int err = errno;
    if (err != ENOPROTOOPT && err != EINVAL) {
      return ErrnoStatus("SO_PEERPIDFD of the initiator (pid " + std::to_string(pid_) + ")", err);
    }
    pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd < 0) {
      return ErrnoStatus("pidfd_open of the initiator (pid " + std::to_string(pid_) + ")", errno);
    }
  }
  pidfd_ = UniqueFd(pidfd);
  ::fcntl(pidfd, F_SETFD, FD_CLOEXEC);
  return Status::OK();
}

bool PeerProcess::Alive() const {
  for (;;) {
    pollfd p{pidfd_.get(), POLLIN, 0};
    int r = ::poll(&p, 1, 0);
    if (r == 0) return true;
    if (r > 0 || errno != EINTR) return false;  // readable: the process has exited
  }
}

Status PeerProcess::Prove(int sock, uint64_t proof_addr, int timeout_ms, HelloReply* reply) {
  uint8_t nonce[kNonceSize];
  if (::getrandom(nonce, sizeof(nonce), 0) != static_cast<ssize_t>(sizeof(nonce))) {
    std::random_device rd;
    for (uint8_t& b : nonce) b = static_cast<uint8_t>(rd());
  }
  HelloReply challenge;
  challenge.status = kChallenge;
  uint8_t out[sizeof(challenge) + kNonceSize];
  std::memcpy(out, &challenge, sizeof(challenge));
  std::memcpy(out + sizeof(challenge), nonce, kNonceSize);
  MC_RETURN_IF_ERROR(WriteFull(sock, out, sizeof(out), timeout_ms));
  HelloProof proof;
  MC_RETURN_IF_ERROR(ReadFull(sock, &proof, sizeof(proof), timeout_ms));
  if (proof.magic != kMagic) return Status::DataLoss("malformed hello proof");
  uint8_t seen[kNonceSize];
  iovec mine{seen, kNonceSize}, theirs{reinterpret_cast<void*>(proof_addr), kNonceSize};
  ssize_t n = ::process_vm_readv(pid_, &mine, 1, &theirs, 1, 0);
  int err = 0;
  if (n != static_cast<ssize_t>(kNonceSize)) {
    err = n < 0 ? errno : EFAULT;
  } else if (std::memcmp(seen, nonce, kNonceSize) != 0) {
    err = EBADMSG;  // pid `pid_` is not the process that holds the socket's other end
  } else if (!Alive()) {
    err = ESRCH;  // exited before the read: the read may have reached another process
  }
  reply->status = err ? kRefused : kOk;
  reply->err = err;
  return Status::OK();
}

const char* ProofRefusalReason(int err) {
  switch (err) {
    case EBADMSG:
      return "the target found another value than its nonce at our proof address: the "
             "socket's peer process is not this one (socket passed on, or pid reused)";
    case ESRCH:
      return "the process that opened the connection has exited";
    case EPERM:
    case EACCES:
      return "the target may not access this process's memory (ptrace policy or container)";
    default:
      return "the target could not read our proof word with process_vm_readv";
  }
}

}  // namespace mooncake::shm
