// Reading numbers from text the way the programs' number rule does
// (programs/cli.hpp): decimal only, read whole, finite.
#pragma once

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

namespace dpgrad {

/// `text` read whole as a finite decimal number: digits with an optional point,
/// sign and exponent. Hexadecimal, spaces, inf, nan and empty text give nullopt.
inline std::optional<double> decimal_number(const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789.eE+-") != std::string::npos ||
      text.find_first_of("0123456789") == std::string::npos)
    return std::nullopt;
  char* rest = nullptr;
  const double v = std::strtod(text.c_str(), &rest);
  if (!rest || *rest != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

}  // namespace dpgrad
