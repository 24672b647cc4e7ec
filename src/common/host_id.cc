#include "common/host_id.h"

#include <unistd.h>

#include <fstream>

namespace mooncake {
namespace {

std::string ReadFirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string Link(const char* path) {
  char buf[256];
  ssize_t n = ::readlink(path, buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

}  // namespace

std::string LocalHostId(const EngineOptions& options) {
  if (!options.host_id_override.empty()) return options.host_id_override;
  return ReadFirstLine("/proc/sys/kernel/random/boot_id") + "/" + Link("/proc/self/ns/pid") + "/" +
         Link("/proc/self/ns/net");
}

}  // namespace mooncake
