// Small pieces of the Store's human- and Prometheus-readable text, shared by the master
// (master_metrics.cc, master_tenants.cc, master_http.cc) and the clients (client_metrics.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace mooncake {
namespace store {

// A label value in the Prometheus text format: backslash, double quote and newline escaped.
std::string PromLabelValue(std::string_view v);

// Bytes as upstream's summaries print them: "512 B", "1.50 KB", "2.00 MB" (powers of 1024,
// up to TB).
std::string ByteSizeString(uint64_t bytes);

// The same scaling for a rate: "12.00 B/s", "1.50 KB/s" ... "TB/s".
std::string ByteRateString(double bytes_per_s);

}  // namespace store
}  // namespace mooncake
