// store_lease_child <conn> <lease_ttl_s> <key> <value>
// Opens the store, puts <key>=<value> (under a lease of <lease_ttl_s> for etcd), prints
// "ready" and then waits to be killed. Used to show that a crashed process's keys expire.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "metadata/metadata_store.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s <conn> <lease_ttl_s> <key> <value>\n", argv[0]);
    return 2;
  }
  mooncake::StoreOptions options;
  options.lease_ttl_s = std::atoi(argv[2]);
  auto store = mooncake::CreateMetadataStore(argv[1], options);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  mooncake::Status s = (*store)->Put(argv[3], argv[4]);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) pause();
}
