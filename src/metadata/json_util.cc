#include "metadata/json_util.h"

namespace mooncake {

using nlohmann::json;

namespace {

// Maximum nesting of [ and { outside strings.
int NestingDepth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

}  // namespace

Result<json> ParseJsonBounded(std::string_view text, const char* what) {
  if (NestingDepth(text) > kMaxJsonDepth) {
    return Status::DataLoss(std::string(what) + ": JSON nests deeper than " +
                            std::to_string(kMaxJsonDepth));
  }
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::DataLoss(std::string(what) + ": not valid JSON");
  return j;
}

Status GetString(const json& obj, const char* key, bool required, std::string* out) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) return Status::DataLoss(std::string("missing field '") + key + "'");
    return Status::OK();
  }
  if (!it->is_string()) return Status::DataLoss(std::string("field '") + key + "' is not a string");
  *out = it->get<std::string>();
  return Status::OK();
}

Status GetUint(const json& obj, const char* key, uint64_t max, uint64_t* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return Status::OK();
  uint64_t v = 0;
  if (it->is_number_unsigned()) {
    v = it->get<uint64_t>();
  } else if (it->is_number_integer() && it->get<int64_t>() >= 0) {
    v = static_cast<uint64_t>(it->get<int64_t>());
  } else {
    return Status::DataLoss(std::string("field '") + key + "' is not a non-negative integer");
  }
  if (v > max) return Status::DataLoss(std::string("field '") + key + "' is out of range");
  *out = v;
  return Status::OK();
}

}  // namespace mooncake
