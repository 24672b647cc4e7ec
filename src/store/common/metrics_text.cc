#include "store/common/metrics_text.h"

#include <cstdio>

namespace mooncake {
namespace store {

namespace {

const char* const kUnits[] = {"B", "KB", "MB", "GB", "TB"};

// v scaled down by 1024 while it is at least 1024 (up to TB); *unit: which.
double Scaled(double v, int* unit) {
  *unit = 0;
  while (v >= 1024.0 && *unit < 4) {
    v /= 1024.0;
    ++*unit;
  }
  return v;
}

}  // namespace

std::string PromLabelValue(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '\\' || c == '"') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

std::string ByteSizeString(uint64_t bytes) {
  int u = 0;
  const double v = Scaled(static_cast<double>(bytes), &u);
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[u]);
  }
  return buf;
}

std::string ByteRateString(double bytes_per_s) {
  int u = 0;
  const double v = Scaled(bytes_per_s, &u);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %s/s", v, kUnits[u]);
  return buf;
}

}  // namespace store
}  // namespace mooncake
