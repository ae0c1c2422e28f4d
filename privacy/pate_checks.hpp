// Checks and helpers shared by privacy/pate.cpp and privacy/pate_aggregate.cpp (not installed).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>

#include "engine/check.hpp"
#include "privacy/accountant.hpp"

namespace dpgrad::privacy::pate_detail {

constexpr double kInf = std::numeric_limits<double>::infinity();

inline void check_sigma(double sigma, const char* name) {
  require(sigma > 0 && std::isfinite(sigma), std::string("PATE: ") + name + " must be > 0 and finite, got " +
                                                  format_number(sigma));
}

inline void check_order(double order) {
  require(order > 1 && std::isfinite(order), "PATE: RDP order must be > 1, got " + format_number(order));
}

/// Votes are counts: whole, >= 0, and at least one class.
inline void check_votes(std::span<const double> votes) {
  require(!votes.empty(), "PATE: a vote histogram needs at least one class");
  for (double v : votes)
    require(v >= 0 && v <= 1e9 && v == std::floor(v), "PATE: votes must be whole counts in [0, 1e9], got " +
                                                          format_number(v));
}

inline std::size_t argmax(std::span<const double> v) {
  return std::size_t(std::max_element(v.begin(), v.end()) - v.begin());
}

/// log(1 - e^x) for x <= 0.
inline double log1mexp(double x) {
  if (x >= 0) return -kInf;
  return x < -0.6931471805599453 ? std::log1p(-std::exp(x)) : std::log(-std::expm1(x));
}

}  // namespace dpgrad::privacy::pate_detail
