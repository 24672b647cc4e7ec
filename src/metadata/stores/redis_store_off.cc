// Built instead of redis_store.cc when configured with -DUSE_REDIS=OFF: asking for the redis
// metadata store then fails with a message naming the option.
#include "metadata/stores/redis_store.h"

namespace mooncake {

Result<std::unique_ptr<MetadataStore>> RedisStore::Create(const HostPort&, const StoreOptions&) {
  return Status::Unimplemented(
      "the redis metadata store is not in this build (configured with -DUSE_REDIS=OFF); "
      "rebuild with -DUSE_REDIS=ON, or use P2PHANDSHAKE");
}

}  // namespace mooncake
