// StoreOptions from the environment, the way upstream reads its metadata-store variables:
//   MC_REDIS_USERNAME, MC_REDIS_PASSWORD   redis AUTH (username optional)
//   MC_REDIS_DB_INDEX                      redis SELECT, an integer in 0..255
// A variable that is set but invalid is ignored with a warning (as options.cc does), so a typo
// cannot silently select another database: the default 0 is used and the warning says so.
#pragma once

#include "metadata/metadata_store.h"

namespace mooncake {

// Starts from `base` and overrides what the environment sets.
StoreOptions StoreOptionsFromEnvironment(StoreOptions base = StoreOptions());

}  // namespace mooncake
