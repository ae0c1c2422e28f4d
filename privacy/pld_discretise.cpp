// PLD accountant, part 2 (privacy/pld_discretise.hpp): discretisation.
#include "privacy/pld_discretise.hpp"

#include <array>

namespace dpgrad::privacy::pld_detail {

/// The point where a monotone predicate (false for small y, true for large y) turns true,
/// to 1e-10 relative (the returned y satisfies it unless the search gave up beyond 1e6).
template <class Pred>
double crossing(Pred pred, double start) {
  double lo, hi;
  if (pred(start)) {
    hi = start;
    double step = 1;
    lo = start - step;
    while (pred(lo)) {
      hi = lo;
      step *= 2;
      lo = start - step;
      if (step > 1e6) return lo;
    }
  } else {
    lo = start;
    double step = 1;
    hi = start + step;
    while (!pred(hi)) {
      lo = hi;
      step *= 2;
      hi = start + step;
      if (step > 1e6) return hi;
    }
  }
  for (int it = 0; it < 80 && hi - lo > 1e-10 * (1 + std::abs(hi)); ++it) {
    const double mid = 0.5 * (lo + hi);
    (pred(mid) ? hi : lo) = mid;
  }
  return hi;
}

/// y_hi: where the hockey-stick delta of one step at level log_lr(y) is <= tail
/// (that is what goes to +infinity) or the loss reaches max_loss; y_lo: where the
/// A-mass below is <= tail (moved up onto the grid, so it costs no delta).
StepRange find_range(const PairModel& m, double tail, double max_loss) {
  StepRange r;
  r.tail = tail;
  auto high_enough = [&](double y) {
    const double l = m.log_lr(y).first;
    if (l >= max_loss || l >= m.loss_sup) return true;
    const double tb = m.tail_b(y);
    const double d = m.tail_a(y) - (tb > 0 ? std::exp(l + std::log(tb)) : 0.0);
    return d <= tail;
  };
  r.y_hi = crossing(high_enough, 1.0);
  if (m.log_lr(r.y_hi).first > max_loss) {
    // exactly at max_loss
    double lo = r.y_hi - 1;
    while (m.log_lr(lo).first > max_loss) lo -= 2 * (r.y_hi - lo);
    r.y_hi = m.threshold(max_loss, lo, r.y_hi, 1e-9);
  }
  if (!std::isfinite(m.loss_inf)) {
    auto above_tail = [&](double y) { return m.lower_tail_a(y) > tail; };
    r.y_lo = std::min(crossing(above_tail, 0.0), r.y_hi - 1.0);
    r.loss_lo = m.log_lr(r.y_lo).first;
  } else {
    r.loss_lo = m.loss_inf;
  }
  r.loss_hi = m.log_lr(r.y_hi).first;
  return r;
}

void trim(DiscretePld& d) {
  std::size_t first = 0, last = d.mass.size();
  while (first < last && d.mass[first] <= 0) ++first;
  while (last > first && d.mass[last - 1] <= 0) --last;
  d.mass = std::vector<double>(d.mass.begin() + static_cast<long>(first),
                               d.mass.begin() + static_cast<long>(last));
  d.offset += static_cast<long>(first);
  if (d.mass.empty()) d.offset = 0;
}

StepPld discretise(const PairModel& m, const StepRange& r, double h, double rel_width,
                   bool with_lower) {
  constexpr long kFineLevels = 4000;
  const long j_first = static_cast<long>(std::floor(r.loss_lo / h)) + 1;
  const long j_last = static_cast<long>(std::ceil(r.loss_hi / h)) - 1;
  std::vector<long> levels;
  for (long j = j_first; j <= j_last;) {
    levels.push_back(j);
    long step = 1;
    if (m.expensive && std::abs(j) > kFineLevels)
      step = std::max<long>(1, static_cast<long>(std::floor(std::abs(static_cast<double>(j)) * rel_width)));
    j += step;
  }
  // Cell boundaries in y: the thresholds of the levels, between y_lo and y_hi.
  std::vector<double> bounds;
  bounds.reserve(levels.size() + 2);
  bounds.push_back(r.y_lo);
  double prev = r.y_lo;
  if (!std::isfinite(prev)) {  // loss bounded below: search a finite left end
    prev = std::min(0.0, r.y_hi) - 1.0;
    while (!levels.empty() && m.log_lr(prev).first >= static_cast<double>(levels[0]) * h)
      prev = 2 * prev - 1;
  }
  for (long j : levels) {
    const double level = static_cast<double>(j) * h;
    const double t = m.threshold(level, prev, r.y_hi, 1e-7 * h + 1e-13 * std::abs(level));
    bounds.push_back(std::clamp(t, prev, r.y_hi));
    prev = bounds.back();
  }
  bounds.push_back(r.y_hi);
  std::vector<double> pa, pb;
  double slack = m.cell_masses(bounds, pa, pb);
  const std::size_t ncell = pa.size();
  // Bracket [lo_k, hi_k] (grid indices) of each cell's loss range.
  std::vector<long> lo(ncell), hi(ncell);
  for (std::size_t k = 0; k < ncell; ++k) {
    lo[k] = k == 0 ? j_first - 1 : levels[k - 1];
    hi[k] = k + 1 == ncell ? j_last + 1 : levels[k];
  }
  // The region above y_hi: loss in [loss_hi, loss_sup].
  const long top_lo = static_cast<long>(std::floor(r.loss_hi / h));
  const bool top_bounded = std::isfinite(m.loss_sup);
  // unbounded above: the region's lowest grid step [top_lo, top_lo + 1] is a cell of its own (below)
  const long top_hi = top_bounded ? static_cast<long>(std::ceil(m.loss_sup / h)) : top_lo + 1;
  const double tail_a = m.tail_a(r.y_hi), tail_b = m.tail_b(r.y_hi);
  // The region below y_lo (loss unbounded below): A-mass only.
  const bool has_bottom = std::isfinite(r.y_lo);
  const double bottom_a = has_bottom ? m.lower_tail_a(r.y_lo) : 0.0;
  const long bottom_to = j_first;  // ceil(loss_lo / h) or above
  slack += 3 * m.tail_error();
  // Rounding: the masses are differences of erfc values (relative error ~1e-16), and the
  // split grid masses telescope back to those tails, so the step's delta curve is off by
  // a few 1e-16; 1e-14 per step covers it with room. (Threshold errors only move cell
  // boundaries, whose masses are computed at the moved boundaries: second order.)
  slack += 1e-14;

  long jmin = std::min(lo.empty() ? top_lo : lo[0], has_bottom ? bottom_to : top_lo);
  long jmax = std::max(top_hi, j_last + 1);
  jmin = std::min(jmin, top_lo);
  StepPld out;
  out.slack = slack;
  DiscretePld& up = out.upper;
  up.grid_spacing = h;
  up.offset = jmin;
  up.mass.assign(static_cast<std::size_t>(jmax - jmin + 1), 0.0);
  auto at = [&](DiscretePld& d, long j) -> double& { return d.mass[static_cast<std::size_t>(j - d.offset)]; };
  // Split A-mass pa (B-mass pb, loss range within [l_jl, l_ju]) onto l_jl and l_ju keeping
  // both masses: the part at l_ju is (pa - e^{l_jl} pb) / (1 - e^{l_jl - l_ju}).
  auto split = [&](long jl, long ju, double a, double b) {
    if (!(a > 0)) return;
    if (ju <= jl) { at(up, jl) += a; return; }
    double frac = 1.0;
    if (b > 0) {
      const double lc = std::log(a) - std::log(b);
      frac = -std::expm1(static_cast<double>(jl) * h - lc) / -std::expm1(-static_cast<double>(ju - jl) * h);
      frac = std::clamp(frac, 0.0, 1.0);
    }
    at(up, ju) += a * frac;
    at(up, jl) += a * (1 - frac);
  };
  for (std::size_t k = 0; k < ncell; ++k) split(lo[k], hi[k], pa[k], pb[k]);
  // The region above y_hi. Bounded above: cells at the grid's levels (each split between its two levels, both
  // masses kept) while more than the step's tail budget of A-mass is left, then one cell to the supremum.
  // Unbounded above: one cell to the next level, then the B-mass at that level and the rest of A at +infinity,
  // which is the step's hockey-stick delta there: at most that at y_hi (it decreases in y), which find_range
  // bounded by the budget. One coarse cell over the whole region would move about h A(y > y_hi) to +infinity
  // (unbounded), or all of A(y > y_hi) to the supremum (bounded): with a huge noise multiplier y_hi sits in
  // the bulk of A, and epsilon came out large or infinite where it is tiny.
  auto reaching = [&](double level, double from) {  // y >= from where the loss reaches `level` (inf: never)
    double y = from, step = 1;
    while (m.log_lr(y).first < level && (m.tail_a(y) > 0 || m.tail_b(y) > 0) && step < 1e300) {
      y = from + step;
      step *= 2;
    }
    if (!(m.log_lr(y).first >= level)) return kInf;
    y = m.threshold(level, from, y, 1e-7 * h + 1e-13 * std::abs(level));
    for (double nudge = 1e-15 * (1 + std::abs(y)); m.log_lr(y).first < level; nudge *= 2) y += nudge;
    return y;
  };
  double y_top = r.y_hi, a_top = tail_a, b_top = tail_b;  // the masses above y_top
  long j_top = top_lo;
  auto next_cell = [&] {
    const double y_next = reaching(static_cast<double>(j_top + 1) * h, y_top);
    const double a_next = std::isfinite(y_next) ? m.tail_a(y_next) : 0.0;
    const double b_next = std::isfinite(y_next) ? m.tail_b(y_next) : 0.0;
    split(j_top, j_top + 1, std::max(0.0, a_top - a_next), std::max(0.0, b_top - b_next));
    y_top = y_next;
    a_top = a_next;
    b_top = b_next;
    ++j_top;
  };
  if (top_bounded) {
    while (j_top + 1 < top_hi && a_top > r.tail) next_cell();
    split(j_top, top_hi, a_top, b_top);
  } else {
    if (a_top > 0) next_cell();
    if (a_top > 0) {
      const double at_top = std::min(a_top, b_top > 0 ? std::exp(static_cast<double>(j_top) * h + std::log(b_top)) : 0.0);
      at(up, j_top) += at_top;
      up.infinity_mass = a_top - at_top;
    }
  }
  if (has_bottom) at(up, bottom_to) += bottom_a;
  trim(up);

  if (with_lower) {
    DiscretePld& lw = out.lower;
    lw.grid_spacing = h;
    lw.offset = jmin;
    lw.mass.assign(static_cast<std::size_t>(jmax - jmin + 1), 0.0);
    for (std::size_t k = 0; k < ncell; ++k) {
      const double a = pa[k], b = pb[k];
      if (!(a > 0)) continue;
      if (hi[k] - lo[k] == 1) {
        const double lc = b > 0 ? std::log(a) - std::log(b) : kInf;
        const double frac = std::clamp((lc - static_cast<double>(lo[k]) * h) / h, 0.0, 1.0);
        at(lw, hi[k]) += a * frac;
        at(lw, lo[k]) += a * (1 - frac);
      } else {
        at(lw, lo[k]) += a;
      }
    }
    at(lw, top_lo) += tail_a;
    trim(lw);
  }
  return out;
}

// ------------------------------------------- DP-SGD-JL as a mixture over X (sound)
//
// The directions v_1..v_K are shared by the whole batch, so the target's norm factor is
// not independent of the others' contributions. Revealing X (a post-processing of what
// the adversary may be given) makes every other example's clipped gradient the same in
// both datasets; the target then adds a vector of norm at most Z(X) = sqrt(K / X) / sigma
// in noise units. One step is dominated by P' = (X, N(0,1)), Q' = (X, (1-q) N(0,1) +
// q N(Z(X),1)), whose loss distribution is the mixture over X of subsampled-Gaussian
// ones (docs/privacy-accounting.md). X is cut into cells; each cell uses Z at its
// small-X end (the larger Z dominates), so the mixture of discretised cells dominates.

/// Regularised incomplete gamma functions P(a, x) and Q(a, x) = 1 - P(a, x), each with
/// small relative error: the series (A&S 6.5.29) for x < a + 1, otherwise the continued
/// fraction for Q (A&S 6.5.31) by the modified Lentz method.
std::pair<double, double> gamma_pq(double a, double x) {
  if (!(x > 0)) return {0.0, 1.0};
  if (x == kInf) return {1.0, 0.0};
  const double log_pre = a * std::log(x) - x - std::lgamma(a);
  if (x < a + 1) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 100000; ++n) {
      term *= x / (a + n);
      sum += term;
      if (term < sum * 1e-17) break;
    }
    const double p = std::min(1.0, std::exp(log_pre) * sum);
    return {p, 1.0 - p};
  }
  constexpr double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, f = d;
  for (int i = 1; i < 100000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::abs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1 / d;
    const double del = d * c;
    f *= del;
    if (std::abs(del - 1) < 1e-16) break;
  }
  const double q = std::min(1.0, std::exp(log_pre) * f);
  return {1.0 - q, q};
}

JlCells jl_cells(int k, double sigma, double first_cell_mass, double ratio) {
  const double a = 0.5 * k, cz = std::sqrt(static_cast<double>(k)) / sigma;
  auto lower = [&](double x) { return gamma_pq(a, 0.5 * x).first; };
  auto upper = [&](double x) { return gamma_pq(a, 0.5 * x).second; };
  // x_0: P(X < x_0) <= first_cell_mass, by bisection in log x from the small-x asymptote.
  const double guess = std::numbers::ln2 + (std::log(first_cell_mass) + std::lgamma(a + 1)) / a;
  double lo = guess - 10, hi = guess + 10;
  while (lower(std::exp(lo)) > first_cell_mass) lo -= 10;
  while (lower(std::exp(hi)) <= first_cell_mass && hi < 50) hi += 10;
  for (int it = 0; it < 200 && hi - lo > 1e-12; ++it) {
    const double mid = 0.5 * (lo + hi);
    (lower(std::exp(mid)) <= first_cell_mass ? lo : hi) = mid;
  }
  const double u0 = lo;
  // x_max: P(X > x_max) <= 1e-17; the last cell reaches to infinity anyway.
  double x_max = k + 20 * std::sqrt(2.0 * k) + 50;
  while (upper(x_max) > 1e-17) x_max *= 1.5;
  const double u_max = std::log(x_max);
  std::vector<double> u{u0};
  while (u.back() < u_max) {
    const double z = cz * std::exp(-0.5 * u.back());
    const double r = std::min(1.0, ratio * std::max(1.0, (z / 8.0) * (z / 8.0)));
    u.push_back(u.back() + 2 * std::log1p(r));
  }
  JlCells c;
  auto mass = [&](double x1, double x2) {  // P(x1 <= X < x2) from whichever tail avoids cancellation
    if (0.5 * x2 < a + 1) return std::max(0.0, lower(x2) - lower(x1));
    return std::max(0.0, upper(x1) - upper(x2));
  };
  c.weight.push_back(lower(std::exp(u0)));
  c.z_worst.push_back(kInf);
  c.z_best.push_back(cz * std::exp(-0.5 * u0));
  for (std::size_t i = 0; i < u.size(); ++i) {
    const double x1 = std::exp(u[i]), x2 = i + 1 < u.size() ? std::exp(u[i + 1]) : kInf;
    c.weight.push_back(mass(x1, x2));
    c.z_worst.push_back(cz * std::exp(-0.5 * u[i]));
    c.z_best.push_back(i + 1 < u.size() ? cz * std::exp(-0.5 * u[i + 1]) : 0.0);
  }
  // Each weight is a difference of two values with relative error ~1e-15.
  c.weight_error = 4e-15 * static_cast<double>(c.weight.size());
  return c;
}

void add_scaled(DiscretePld& acc, const DiscretePld& x, double w) {
  acc.infinity_mass += w * x.infinity_mass;
  if (x.mass.empty() || !(w > 0)) return;
  const long x_end = x.offset + static_cast<long>(x.mass.size());
  if (acc.mass.empty()) {
    acc.offset = x.offset;
    acc.mass.assign(x.mass.size(), 0.0);
  }
  const long acc_end = acc.offset + static_cast<long>(acc.mass.size());
  if (x.offset < acc.offset || x_end > acc_end) {
    const long lo = std::min(acc.offset, x.offset), hi = std::max(acc_end, x_end);
    std::vector<double> m(static_cast<std::size_t>(hi - lo), 0.0);
    std::copy(acc.mass.begin(), acc.mass.end(), m.begin() + (acc.offset - lo));
    acc.mass = std::move(m);
    acc.offset = lo;
  }
  for (std::size_t k = 0; k < x.mass.size(); ++k)
    acc.mass[static_cast<std::size_t>(x.offset - acc.offset) + k] += w * x.mass[k];
}

void add_atom(DiscretePld& acc, long j, double m) {
  DiscretePld one;
  one.offset = j;
  one.mass = {1.0};
  add_scaled(acc, one, m);
}

}  // namespace dpgrad::privacy::pld_detail
