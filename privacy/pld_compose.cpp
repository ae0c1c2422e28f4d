// PLD accountant, part 3 (privacy/pld_compose.hpp): composition, and the
// queries delta(epsilon) and epsilon(delta) of a discretised distribution.
#include "privacy/pld_compose.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "privacy/fft.hpp"
#include "privacy/pld_pairs.hpp"

namespace dpgrad::privacy {
namespace pld_detail {

// ---------------------------------------------------------------- composition

/// Convolution of two PLDs on the same grid; infinity atoms compose as
/// 1 - (1 - m_a)(1 - m_b). Then the tails: each side's outermost mass up to `tail`
/// is moved inwards (pessimistic: the top into +infinity, the bottom up onto the
/// first kept point; optimistic: the top down onto the last kept point, the bottom
/// dropped), and arrays longer than max_points are cut the same way.
DiscretePld compose(const DiscretePld& a, const DiscretePld& b, bool pessimistic, double tail,
                    long max_points, double& error) {
  DiscretePld c;
  c.grid_spacing = a.grid_spacing;
  c.infinity_mass = a.infinity_mass + b.infinity_mass - a.infinity_mass * b.infinity_mass;
  if (a.mass.empty() || b.mass.empty()) return c;
  double err = 0;
  c.mass = (&a == &b) ? convolve(a.mass, a.mass, &err) : convolve(a.mass, b.mass, &err);
  c.offset = a.offset + b.offset;
  error += err;
  for (double& x : c.mass) x = std::max(x, 0.0);
  const std::size_t n = c.mass.size();
  // top
  std::size_t last = n;  // one past the last kept
  double acc = 0;
  while (last > 1 && acc + c.mass[last - 1] <= tail) acc += c.mass[--last];
  // bottom
  std::size_t first = 0;
  double acc_bottom = 0;
  while (first + 1 < last && acc_bottom + c.mass[first] <= tail) acc_bottom += c.mass[first++];
  // length cap: cut from the top
  if (last - first > static_cast<std::size_t>(max_points)) {
    while (last - first > static_cast<std::size_t>(max_points)) acc += c.mass[--last];
  }
  if (pessimistic) {
    c.infinity_mass += acc;
    c.mass[first] += acc_bottom;
  } else {
    c.mass[last - 1] += acc;
  }
  c.mass = std::vector<double>(c.mass.begin() + static_cast<long>(first), c.mass.begin() + static_cast<long>(last));
  c.offset += static_cast<long>(first);
  return c;
}

DiscretePld power(const DiscretePld& a, long count, bool pessimistic, double tail, long max_points,
                  double& error) {
  DiscretePld result;
  bool have = false;
  DiscretePld base = a;
  while (count > 0) {
    if (count & 1) {
      result = have ? compose(result, base, pessimistic, tail, max_points, error) : base;
      have = true;
    }
    count >>= 1;
    if (count > 0) base = compose(base, base, pessimistic, tail, max_points, error);
  }
  return result;
}

}  // namespace pld_detail

using pld_detail::kInf;

// ------------------------------------------------------------------ queries

double pld_delta(const DiscretePld& pld, double epsilon) {
  if (std::isnan(epsilon)) throw std::invalid_argument("pld_delta: epsilon is NaN");
  double s = 0;
  for (std::size_t k = pld.mass.size(); k-- > 0;) {
    const double l = static_cast<double>(pld.offset + static_cast<long>(k)) * pld.grid_spacing;
    if (l <= epsilon) break;
    s += pld.mass[k] * -std::expm1(epsilon - l);
  }
  return s + pld.infinity_mass;
}

double pld_epsilon(const DiscretePld& pld, double delta, double extra) {
  const double fixed = pld.infinity_mass + extra;
  if (!(fixed < delta)) return kInf;
  const double h = pld.grid_spacing;
  const long n = static_cast<long>(pld.mass.size());
  if (n == 0) return -kInf;
  const double em = -std::expm1(-h), decay = std::exp(-h);
  // Walking down from the top, D = delta(j h) - fixed and E = sum_{i > j} p_i e^{-(i-j) h};
  // delta((j-1) h) = D + (1 - e^{-h}) (p_j + E), and on ((j-1) h, j h] with x = j h - eps,
  // delta(eps) = D + (1 - e^{-x}) (p_j + E).
  double D = 0, E = 0, total = 0;
  for (long k = n - 1; k >= 0; --k) {
    const double p = pld.mass[static_cast<std::size_t>(k)];
    total += p;
    const double s2 = p + E;
    const double d_prev = D + em * s2;
    if (d_prev + fixed > delta) {
      const double r = std::clamp((delta - fixed - D) / s2, 0.0, em);
      const double x = -std::log1p(-r);
      return static_cast<double>(pld.offset + k) * h - x;
    }
    D = d_prev;
    E = decay * s2;
  }
  // Below every loss: delta(eps) = total - e^{eps - offset h} (p_offset + E') with E' = E e^{h}.
  const double s2 = E / decay;
  const double num = total - (delta - fixed);
  if (!(num > 0)) return -kInf;
  return static_cast<double>(pld.offset) * h + std::log(num / s2);
}

}  // namespace dpgrad::privacy
