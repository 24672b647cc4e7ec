// Built instead of etcd_store.cc when configured with -DUSE_ETCD=OFF: asking for the etcd
// metadata store then fails with a message naming the option.
#include "metadata/stores/etcd_store.h"

namespace mooncake {

Result<std::unique_ptr<MetadataStore>> EtcdStore::Create(std::vector<HostPort>, const StoreOptions&) {
  return Status::Unimplemented(
      "the etcd metadata store is not in this build (configured with -DUSE_ETCD=OFF); "
      "rebuild with -DUSE_ETCD=ON, or use P2PHANDSHAKE");
}

}  // namespace mooncake
