// What the disk folder's tests share: a temporary directory, values, configs, reads.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "store/disk/disk_store.h"

namespace mooncake {
namespace store {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char t[] = "/tmp/disk_test.XXXXXX";
    path_ = ::mkdtemp(t);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& s) const {
    fs::create_directories(path_ + "/" + s);
    return path_ + "/" + s;
  }

 private:
  std::string path_;
};

inline std::string Value(size_t n, uint32_t seed) {
  std::string v(n, '\0');
  std::mt19937 rng(seed);
  for (auto& c : v) c = static_cast<char>(rng());
  return v;
}

inline DiskConfig Config(std::vector<std::string> roots) {
  DiskConfig c;
  c.roots = std::move(roots);
  return c;
}

inline std::string ReadAll(DiskStore* s, const std::string& key, Status* st = nullptr) {
  auto n = s->Size(key);
  if (!n.ok()) {
    if (st) *st = n.status();
    return "<absent>";
  }
  std::string v(*n, '\0');
  Status r = s->Read(key, v.data(), v.size());
  if (st) *st = r;
  return r.ok() ? v : "<" + r.message() + ">";
}

inline std::vector<std::string> Buckets(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".bucket") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace store
}  // namespace mooncake
