// parse_json (engine/json.hpp): the bounds are checked on the text first.
#include "engine/json.hpp"

#include <stdexcept>

namespace dpgrad {

nlohmann::json parse_json(std::string_view text, const std::string& what, JsonLimits limits) {
  if (text.size() > limits.max_bytes)
    throw std::invalid_argument(what + " has " + std::to_string(text.size()) + " bytes of JSON, more than the " +
                                std::to_string(limits.max_bytes) + " allowed");
  // nesting depth outside strings (an escaped quote does not end a string)
  std::size_t depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limits.max_depth)
        throw std::invalid_argument(what + " nests JSON arrays and objects deeper than " +
                                    std::to_string(limits.max_depth) + " levels (at byte " + std::to_string(i) + ")");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(what + " is not valid JSON (" + e.what() + ")");
  }
}

}  // namespace dpgrad
