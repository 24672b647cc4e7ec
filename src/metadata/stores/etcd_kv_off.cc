// Built instead of etcd_kv.cc when configured with -DUSE_ETCD=OFF: EtcdKv::Create fails with a
// message naming the option, so no EtcdKv exists and the other members are never reached
// (they are defined, failing the same way, so that users link).
#include "metadata/stores/etcd_kv.h"

namespace mooncake {
namespace {

Status Off() {
  return Status::Unimplemented(
      "the etcd client is not in this build (configured with -DUSE_ETCD=OFF); "
      "rebuild with -DUSE_ETCD=ON");
}

}  // namespace

struct EtcdKv::Impl {};

Result<std::unique_ptr<EtcdKv>> EtcdKv::Create(std::vector<HostPort>, const Options&) {
  return Off();
}
EtcdKv::EtcdKv(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdKv::~EtcdKv() = default;
std::string EtcdKv::Describe() const { return "etcd (not in this build)"; }
Result<EtcdRange> EtcdKv::Range(const std::string&, const std::string&, int64_t, bool, int) {
  return Off();
}
Result<int64_t> EtcdKv::Put(const std::string&, const std::string&, int64_t, int) {
  return Off();
}
Result<int64_t> EtcdKv::Delete(const std::string&, const std::string&, int) { return Off(); }
Result<EtcdTxnResult> EtcdKv::Txn(const std::vector<EtcdCompare>&, const std::vector<EtcdOp>&,
                                  const std::vector<EtcdOp>&, int) {
  return Off();
}
Result<int64_t> EtcdKv::LeaseGrant(int64_t, int) { return Off(); }
Result<int64_t> EtcdKv::LeaseKeepAlive(int64_t, int) { return Off(); }
Status EtcdKv::LeaseRevoke(int64_t, int) { return Off(); }
Status EtcdKv::Compact(int64_t, int) { return Off(); }
Result<EtcdKv::MemberStatus> EtcdKv::GetStatus(int) { return Off(); }

}  // namespace mooncake
