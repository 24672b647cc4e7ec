#include "store/client/huge_pages.h"

#include <glog/logging.h>
#include <strings.h>

#include <cstdlib>
#include <string>

namespace mooncake::store {
namespace {

constexpr size_t k2M = size_t{2} << 20;
constexpr size_t k1G = size_t{1} << 30;

bool Enabled(const char* v) {
  if (v == nullptr) return false;
  for (const char* off : {"", "0", "false", "no", "off"}) {
    if (::strcasecmp(v, off) == 0) return false;
  }
  return true;
}

}  // namespace

size_t HugePageSizeFromEnv() {
  if (!Enabled(std::getenv("MC_STORE_USE_HUGEPAGE"))) return 0;
  const char* size = std::getenv("MC_STORE_HUGEPAGE_SIZE");
  if (size == nullptr || *size == '\0') return k2M;
  for (const char* two : {"2MB", "2M", "2MiB", "2097152"}) {
    if (::strcasecmp(size, two) == 0) return k2M;
  }
  for (const char* one : {"1GB", "1G", "1GiB", "1073741824"}) {
    if (::strcasecmp(size, one) == 0) return k1G;
  }
  LOG(WARNING) << "MC_STORE_HUGEPAGE_SIZE='" << size << "' is neither 2MB nor 1GB; using 2MB";
  return k2M;
}

size_t RoundUpToPage(size_t n, size_t page) {
  if (page == 0 || n % page == 0) return n;
  return n + (page - n % page);
}

}  // namespace mooncake::store
