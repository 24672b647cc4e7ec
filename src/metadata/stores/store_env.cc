#include "metadata/stores/store_env.h"

#include <glog/logging.h>

#include <cstdlib>
#include <string>

namespace mooncake {

StoreOptions StoreOptionsFromEnvironment(StoreOptions base) {
  StoreOptions o = std::move(base);
  if (const char* v = std::getenv("MC_REDIS_USERNAME"); v && *v) o.redis_username = v;
  if (const char* v = std::getenv("MC_REDIS_PASSWORD"); v && *v) o.redis_password = v;
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
