// Built instead of http_store.cc when configured with -DUSE_HTTP=OFF: asking for the http
// metadata store then fails with a message naming the option.
#include "metadata/stores/http_store.h"

namespace mooncake {

Result<std::unique_ptr<MetadataStore>> HttpStore::Create(const std::string&, const StoreOptions&) {
  return Status::Unimplemented(
      "the http metadata store is not in this build (configured with -DUSE_HTTP=OFF); "
      "rebuild with -DUSE_HTTP=ON, or use P2PHANDSHAKE");
}

}  // namespace mooncake
