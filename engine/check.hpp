// The one check helper of the library and its programs: a condition that must
// hold, or std::invalid_argument with a message that names the problem.
#pragma once

#include <stdexcept>
#include <string>

namespace dpgrad {

/// Throws std::invalid_argument(message) unless `ok`.
inline void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

}  // namespace dpgrad
