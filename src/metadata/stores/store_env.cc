#include "metadata/stores/store_env.h"

#include <glog/logging.h>

#include <cstdlib>
#include <string>

namespace mooncake {

StoreOptions StoreOptionsFromEnvironment(StoreOptions base) {
  StoreOptions o = std::move(base);
  if (const char* v = std::getenv("MC_REDIS_USERNAME"); v && *v) o.redis_username = v;
  if (const char* v = std::getenv("MC_REDIS_PASSWORD"); v && *v) o.redis_password = v;
  if (const char* v = std::getenv("MC_ETCD_LEASE_TTL"); v && *v) {
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 1 || n > 3600) {
      LOG(WARNING) << "MC_ETCD_LEASE_TTL=" << v << " is not an integer in [1, 3600]; using "
                   << o.lease_ttl_s;
    } else {
      o.lease_ttl_s = static_cast<int>(n);
    }
  }
  if (const char* v = std::getenv("MC_REDIS_DB_INDEX"); v && *v) {
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 0 || n > 255) {
      LOG(WARNING) << "MC_REDIS_DB_INDEX=" << v << " is not an integer in [0, 255]; using "
                   << o.redis_db_index;
    } else {
      o.redis_db_index = static_cast<int>(n);
    }
  }
  return o;
}

}  // namespace mooncake
