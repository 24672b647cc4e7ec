// The initiator process a same-host connection belongs to: a pidfd taken at accept, bound
// to the connection by a proof of memory in the hello (shm_wire.h), and checked around
// every process_vm_readv/writev so that a copy never reaches another process that was
// given the pid after the initiator exited. See README.md in this folder.
#pragma once

#include <sys/types.h>

#include "common/net.h"
#include "mooncake/status.h"
#include "transport/shm/shm_wire.h"

namespace mooncake::shm {

class PeerProcess {
 public:
  // Takes the connecting process of unix socket `sock`: its pidfd (SO_PEERPIDFD, else
  // pidfd_open of the SO_PEERCRED pid; the proof covers that fallback's race).
  Status Open(int sock);
  pid_t pid() const { return pid_; }
  // The pidfd's process has not exited (so `pid` still names it).
  bool Alive() const;
  // Hello steps 2-4 after the HelloRequest was read: sends the nonce, waits for the proof
  // and checks it; *reply is kOk or kRefused (err says why). Non-OK: the socket failed.
  Status Prove(int sock, uint64_t proof_addr, int timeout_ms, HelloReply* reply);

 private:
  pid_t pid_ = -1;
  UniqueFd pidfd_;
};

// The initiator's explanation of a refused proof (HelloReply.err).
const char* ProofRefusalReason(int err);

}  // namespace mooncake::shm
