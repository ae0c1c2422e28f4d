// Test helpers: random arrays, and closeness checks that print the first
// mismatches and the largest difference when they fail.
#pragma once

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/array.hpp"
#include "engine/gradcheck.hpp"
#include "engine/random.hpp"

namespace dpgrad::test {

template <class T>
ArrayT<T> randn(const Shape& s, Rng& rng, double stddev = 1.0) {
  ArrayT<T> a = ArrayT<T>::from_shape(s);
  for (auto& v : a) v = T(stddev * rng.normal());
  return a;
}

/// Entries on a shuffled grid spaced by 0.1 (plus jitter far below the spacing):
/// every max-pooling window has a maximum distinct by a margin, away from kinks.
template <class T>
ArrayT<T> distinct_values(const Shape& s, Rng& rng) {
  std::size_t n = numel(s);
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  ArrayT<T> a = ArrayT<T>::from_shape(s);
  for (std::size_t i = 0; i < n; ++i) a.data()[i] = T(0.1 * (double(order[i]) - double(n) / 2) + 0.01 * rng.uniform());
  return a;
}

/// Runs f and expects an exception of type E whose message contains every fragment.
template <class E, class F>
void check_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    FAIL("expected an exception containing: " << (fragments.empty() ? std::string() : fragments[0]));
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& frag : fragments) {
      INFO("message: " << msg);
      CHECK(msg.find(frag) != std::string::npos);
    }
  }
}

/// Empty string when a and b agree to `rtol` relative to max(|a|,|b|, atol_floor); else a readable diff.
template <class A, class B>
std::string mismatch(const A& a, const B& b, double rtol, double floor = 1e-12) {
  std::ostringstream os;
  if (a.size() != b.size()) {
    os << "sizes differ: " << a.size() << " vs " << b.size();
    return os.str();
  }
  double worst = 0;
  int shown = 0;
  auto ia = a.begin();
  auto ib = b.begin();
  for (std::size_t i = 0; i < a.size(); ++i, ++ia, ++ib) {
    double x = double(*ia), y = double(*ib);
    double e = std::abs(x - y) / std::max({std::abs(x), std::abs(y), floor});
    if (!(e <= rtol)) {
      if (shown++ < 5) os << "  [" << i << "] " << x << " vs " << y << "\n";
      worst = std::max(worst, std::isnan(e) ? INFINITY : e);
    }
  }
  if (shown) os << "  " << shown << " mismatches, max relative difference " << worst << "\n";
  return os.str();
}

#define DPGRAD_CHECK_CLOSE(a, b, rtol)                               \
  do {                                                               \
    std::string dpgrad_diff_ = ::dpgrad::test::mismatch((a), (b), (rtol)); \
    INFO(dpgrad_diff_);                                              \
    CHECK(dpgrad_diff_.empty());                                     \
  } while (0)

#define DPGRAD_CHECK_GRADS(result)                                   \
  do {                                                               \
    const auto& dpgrad_r_ = (result);                                \
    INFO(dpgrad_r_.report);                                          \
    CHECK(dpgrad_r_.ok);                                             \
  } while (0)

}  // namespace dpgrad::test
