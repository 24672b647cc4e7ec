// Defensive JSON helpers for text that arrived from the network.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "mooncake/status.h"

namespace mooncake {

constexpr int kMaxJsonDepth = 32;

// Parses `text` (what names it for messages). DataLoss when it is not JSON or nests deeper
// than kMaxJsonDepth. Never throws.
Result<nlohmann::json> ParseJsonBounded(std::string_view text, const char* what);

// Field readers: a missing optional field leaves *out unchanged; a wrong type or a value
// above `max` is DataLoss naming the field.
Status GetString(const nlohmann::json& obj, const char* key, bool required, std::string* out);
Status GetUint(const nlohmann::json& obj, const char* key, uint64_t max, uint64_t* out);

}  // namespace mooncake
