// JSON read from files a user may edit (checkpoints, key files), parsed within
// bounds: a size and a nesting depth checked on the text before the parser
// builds anything, so that a deep or huge document is an error that names it,
// not a stack overflow or an allocation that fails somewhere else.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dpgrad {

/// The bounds parse_json checks on the text before parsing it.
struct JsonLimits {
  std::size_t max_bytes = std::size_t(64) << 20;  // 64 MiB
  std::size_t max_depth = 64;                     // arrays and objects nested
};

/// Parses `text`, refusing more than limits.max_bytes, nesting deeper than
/// limits.max_depth, and anything that is not valid JSON. Throws
/// std::invalid_argument naming `what` (a file name, say) and the problem.
nlohmann::json parse_json(std::string_view text, const std::string& what, JsonLimits limits = {});

}  // namespace dpgrad
