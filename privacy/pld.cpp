// PLD accountant: each ledger entry's pair (remove and add direction; DP-SGD-JL: a
// mixture of pairs over cells of its chi-square factor) is cut into cells at the loss
// grid levels, each cell's mass split onto the grid so that the result dominates the
// true pair (connect-the-dots), composed by FFT with tails truncated pessimistically,
// and delta/epsilon read off with all slack added.
#include "privacy/pld.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "privacy/fft.hpp"

namespace dpgrad::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kUlp = std::numeric_limits<double>::epsilon();

// ---------------------------------------------------------------- Gaussians

double phi_bar(double x) { return 0.5 * std::erfc(x * std::numbers::sqrt2 / 2); }  // P(N > x)
double phi_cdf(double x) { return 0.5 * std::erfc(-x * std::numbers::sqrt2 / 2); }  // P(N <= x)

/// P(a < N(0,1) <= b), computed from whichever tails avoid cancellation.
double gauss_mass(double a, double b) {
  if (!(b > a)) return 0.0;
  if (a >= 0) return std::max(0.0, phi_bar(a) - phi_bar(b));
  if (b <= 0) return std::max(0.0, phi_cdf(b) - phi_cdf(a));
  return std::max(0.0, 1.0 - phi_cdf(a) - phi_bar(b));
}

/// log(1 - q + q e^x) without overflow or cancellation.
double log_mix(double q, double x) {
  if (q >= 1) return x;
  if (x > 0) return x + std::log(q + (1 - q) * std::exp(-x));
  return std::log1p(q * std::expm1(x));
}

/// x with log_mix(q, x) = v (v > log(1-q)): x = log((e^v - 1 + q) / q).
double inverse_log_mix(double q, double v) {
  if (q >= 1) return v;
  if (v > 30) return v + std::log1p((q - 1) * std::exp(-v)) - std::log(q);
  return std::log(std::expm1(v) + q) - std::log(q);
}

double log_add_exp(double a, double b) {
  if (a < b) std::swap(a, b);
  if (b == -kInf) return a;
  return a + std::log1p(std::exp(b - a));
}

// ------------------------------------------------------- pairs of a single step
//
// Every pair (A, B) lives on the real line with log(dA/dB)(y) increasing in y
// (the add direction is reflected y -> -y to make it so). Noise has unit variance;
// the sensitivity is Z (1/sigma for exact norms).

class PairModel {
 public:
  virtual ~PairModel() = default;
  /// log(dA/dB)(y) and its derivative in y.
  virtual std::pair<double, double> log_lr(double y) const = 0;
  /// y in [lo, hi] with log_lr(y) = level (lo, hi finite, level within their range).
  virtual double threshold(double level, double lo, double hi, double tol) const {
    double y = 0.5 * (lo + hi);
    for (int it = 0; it < 200; ++it) {
      const auto [l, d] = log_lr(y);
      if (std::abs(l - level) <= tol) return y;
      if (l < level) lo = y; else hi = y;
      double next = (d > 0 && std::isfinite(d)) ? y + (level - l) / d : 0.5 * (lo + hi);
      if (!(next > lo && next < hi)) next = 0.5 * (lo + hi);
      if (hi - lo <= 4 * kUlp * (1 + std::abs(y))) return next;
      y = next;
    }
    return y;
  }
  /// A(y > t), B(y > t), A(y <= t).
  virtual double tail_a(double t) const = 0;
  virtual double tail_b(double t) const = 0;
  virtual double lower_tail_a(double t) const = 0;
  /// Masses of the cells (bounds[k], bounds[k+1]] under A and B; returns a bound on
  /// the total absolute error of all of them (quadrature), rounding excluded.
  virtual double cell_masses(const std::vector<double>& bounds, std::vector<double>& pa,
                             std::vector<double>& pb) const = 0;
  /// Same for the tails used at the ends: error bound of tail_a/tail_b/lower_tail_a.
  virtual double tail_error() const { return 0.0; }

  double loss_inf = -kInf;  // infimum and supremum of the loss
  double loss_sup = kInf;
  bool expensive = false;   // evaluations need quadrature (JL)
};

/// Poisson-subsampled Gaussian with sensitivity mu = 1/sigma in units of the noise.
class GaussianPair final : public PairModel {
 public:
  GaussianPair(double q, double sigma, PldDirection dir) : q_(q), mu_(1.0 / sigma), dir_(dir) {
    if (q < 1) {
      if (dir == PldDirection::remove) loss_inf = std::log1p(-q);
      else loss_sup = -std::log1p(-q);
    }
  }
  std::pair<double, double> log_lr(double y) const override {
    if (dir_ == PldDirection::remove) {
      const double x = mu_ * y - 0.5 * mu_ * mu_;
      const double l = log_mix(q_, x);
      return {l, mu_ * std::exp(std::log(q_) + x - l)};
    }
    const double x = -mu_ * y - 0.5 * mu_ * mu_;
    const double l = log_mix(q_, x);
    return {-l, mu_ * std::exp(std::log(q_) + x - l)};
  }
  double threshold(double level, double lo, double hi, double) const override {
    double y;
    if (dir_ == PldDirection::remove) y = (inverse_log_mix(q_, level) + 0.5 * mu_ * mu_) / mu_;
    else y = -(inverse_log_mix(q_, -level) + 0.5 * mu_ * mu_) / mu_;
    return std::clamp(y, lo, hi);
  }
  double tail_a(double t) const override {
    if (dir_ == PldDirection::remove) return (1 - q_) * phi_bar(t) + q_ * phi_bar(t - mu_);
    return phi_bar(t);
  }
  double tail_b(double t) const override {
    if (dir_ == PldDirection::remove) return phi_bar(t);
    return (1 - q_) * phi_bar(t) + q_ * phi_bar(t + mu_);
  }
  double lower_tail_a(double t) const override {
    if (dir_ == PldDirection::remove) return (1 - q_) * phi_cdf(t) + q_ * phi_cdf(t - mu_);
    return phi_cdf(t);
  }
  double cell_masses(const std::vector<double>& bounds, std::vector<double>& pa,
                     std::vector<double>& pb) const override {
    const std::size_t n = bounds.size() - 1;
    pa.assign(n, 0.0);
    pb.assign(n, 0.0);
    const double s = dir_ == PldDirection::remove ? mu_ : -mu_;
    for (std::size_t k = 0; k < n; ++k) {
      const double a = bounds[k], b = bounds[k + 1];
      const double plain = gauss_mass(a, b);
      const double mixed = (1 - q_) * plain + q_ * gauss_mass(a - s, b - s);
      if (dir_ == PldDirection::remove) { pa[k] = mixed; pb[k] = plain; }
      else { pa[k] = plain; pb[k] = mixed; }
    }
    return 0.0;
  }

 private:
  double q_, mu_;
  PldDirection dir_;
};

/// The JL norm bound: Z = sqrt(K / X) / sigma with X ~ chi2_K (Bu et al. 2021,
/// Lemma 4.1/4.3). Expectations over X are integrals over u = log X, whose density
/// f(u) = exp(K u / 2 - e^u / 2) / (2^{K/2} Gamma(K/2)) is smooth on the whole
/// line, by the trapezoidal rule (exponentially accurate for smooth integrands
/// that vanish at both ends); its error is estimated by the rule at twice the step.
class ChiMixture {
 public:
  ChiMixture(int k, double sigma)
      : half_k_(0.5 * k), cz_(std::sqrt(static_cast<double>(k)) / sigma), z_mode_(1.0 / sigma) {
    log_norm_ = half_k_ * std::numbers::ln2 + std::lgamma(half_k_);
    u_mode_ = std::log(static_cast<double>(k));
    lf_max_ = log_f(u_mode_);
    du_bulk_ = std::min(0.3, 0.5 * std::sqrt(2.0 / k));
    u_left_ = left_level(120.0);
    u_right_ = right_level(120.0);
  }

  double log_f(double u) const { return half_k_ * u - 0.5 * std::exp(u) - log_norm_; }
  double z_of(double u) const { return cz_ * std::exp(-0.5 * u); }
  double u_of(double z) const { return 2.0 * std::log(cz_ / z); }

  /// log M(y) = log E[exp(Z y - Z^2/2)] and d log M / dy = E_tilted[Z].
  std::pair<double, double> log_m(double y) const {
    const double drop_left = 120.0 + (y > 0 ? 0.5 * y * y : 0.0);
    const double drop_right = 120.0 + (y < 0 ? -y * z_mode_ + 0.5 * z_mode_ * z_mode_ : 0.0);
    // Beyond Z = max(y, mode) + 14 the Gaussian factor is below e^{-98} of its peak.
    double u_lo = std::max(drop_left == 120.0 ? u_left_ : left_level(drop_left),
                           u_of(std::max(y, z_mode_) + 14.0));
    double u_hi = drop_right == 120.0 ? u_right_ : right_level(drop_right);
    if (!(u_hi > u_lo + 1e-9)) u_hi = u_lo + 1e-3;
    double du = std::min(du_bulk_, 0.6 / (1.0 + std::abs(y)));
    const long n = std::max<long>(16, static_cast<long>(std::ceil((u_hi - u_lo) / du)));
    du = (u_hi - u_lo) / static_cast<double>(n);
    double gmax = -kInf;
    for (long i = 0; i <= n; ++i) {
      const double u = u_lo + du * static_cast<double>(i), z = z_of(u);
      gmax = std::max(gmax, log_f(u) + z * y - 0.5 * z * z);
    }
    double s = 0, sz = 0;
    for (long i = 0; i <= n; ++i) {
      const double u = u_lo + du * static_cast<double>(i), z = z_of(u);
      const double w = (i == 0 || i == n ? 0.5 : 1.0) * std::exp(log_f(u) + z * y - 0.5 * z * z - gmax);
      s += w;
      sz += w * z;
    }
    return {gmax + std::log(du * s), sz / s};
  }

  /// E[P(a < N + s Z <= b)] for s = +1 or -1, N ~ N(0,1) independent of Z, with an
  /// error estimate. a may be -inf and b +inf.
  std::pair<double, double> window(double a, double b, int s) const {
    double focus = 0;
    if (std::isfinite(a)) focus = std::max(focus, std::abs(a));
    if (std::isfinite(b)) focus = std::max(focus, std::abs(b));
    const bool heavy = (s > 0 && b == kInf) || (s < 0 && a == -kInf);
    // For Z > focus + 12 the window probability is within 1e-32 of its limit (1 if heavy, else 0).
    const double u_kernel = u_of(focus + 12.0);
    const double u_lo = std::max(u_left_, u_kernel);
    const double u_hi = std::max(u_right_, u_lo + 1e-3);
    // The step at which the rule is already accurate is used for the error estimate;
    // the value comes from half that step, so the estimate bounds its error many times over.
    double du = 0.5 * std::min(du_bulk_, 0.6 / (1.0 + focus));
    long n = std::max<long>(16, static_cast<long>(std::ceil((u_hi - u_lo) / du)));
    n += n % 2;
    du = (u_hi - u_lo) / static_cast<double>(n);
    double full = 0, half = 0;
    for (long i = 0; i <= n; ++i) {
      const double u = u_lo + du * static_cast<double>(i), z = z_of(u);
      const double g = std::exp(log_f(u)) * gauss_mass(a - s * z, b - s * z);
      const double w = (i == 0 || i == n) ? 0.5 : 1.0;
      full += w * g;
      if (i % 2 == 0) half += w * g;
    }
    full *= du;
    half *= 2 * du;
    double err = std::abs(full - half) + 64 * kUlp * full;
    if (heavy && u_kernel > u_left_) {
      // Below u_lo the integrand is f(u) itself: its integral is P(X <= e^{u_lo}), and the
      // cut-off end of the trapezoid rule gets the Euler-Maclaurin end corrections
      // (h^2/12) g'(u_lo) - (h^4/720) g'''(u_lo) (g vanishes with its derivatives at u_hi).
      const double e = std::exp(u_lo), f = std::exp(log_f(u_lo));
      const double a1 = half_k_ - 0.5 * e, a1p = -0.5 * e;
      const double g1 = f * a1, g3 = f * (a1 * a1 * a1 + 3 * a1 * a1p + a1p);
      const double corr = du * du / 12 * g1 - std::pow(du, 4) / 720 * g3;
      const double corr2 = 4 * du * du / 12 * g1 - 16 * std::pow(du, 4) / 720 * g3;
      full += corr;
      err = std::abs(full - (half + corr2)) + 64 * kUlp * full;
      full += chi2_cdf(e);
    }
    return {full, err};
  }

  /// P(X <= x), X ~ chi2_K, by the series of the regularised lower incomplete
  /// gamma function P(K/2, x/2) (Abramowitz & Stegun 6.5.29).
  double chi2_cdf(double x) const {
    if (x <= 0) return 0.0;
    const double a = half_k_, z = 0.5 * x;
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 100000; ++n) {
      term *= z / (a + n);
      sum += term;
      if (term < sum * 1e-17) break;
    }
    return std::min(1.0, std::exp(a * std::log(z) - z - std::lgamma(a)) * sum);
  }

 private:
  /// u < mode with log f(u) = max - drop (log f increases there).
  double left_level(double drop) const {
    const double target = lf_max_ - drop;
    double lo = u_mode_ - 1.0, span = 1.0;
    while (log_f(lo) > target) { span *= 2; lo = u_mode_ - span; }
    double hi = u_mode_;
    for (int it = 0; it < 200 && hi - lo > 1e-12 * (1 + std::abs(lo)); ++it) {
      const double mid = 0.5 * (lo + hi);
      (log_f(mid) > target ? hi : lo) = mid;
    }
    return lo;
  }
  /// u > mode with log f(u) = max - drop (log f decreases there).
  double right_level(double drop) const {
    const double target = lf_max_ - drop;
    double hi = u_mode_ + 1.0, span = 1.0;
    while (log_f(hi) > target) { span *= 2; hi = u_mode_ + span; }
    double lo = u_mode_;
    for (int it = 0; it < 200 && hi - lo > 1e-12 * (1 + std::abs(hi)); ++it) {
      const double mid = 0.5 * (lo + hi);
      (log_f(mid) > target ? lo : hi) = mid;
    }
    return hi;
  }

  double half_k_, cz_, z_mode_;
  double log_norm_ = 0, u_mode_ = 0, lf_max_ = 0, du_bulk_ = 0, u_left_ = 0, u_right_ = 0;
};

/// DP-SGD-JL step (Bu et al. 2021, Thm 4.1): remove = ((1-q) N(0,1) + q E N(Z,1), N(0,1)),
/// add = the reverse, reflected. log dA/dB = log(1 - q + q M(y)), M(y) = E[e^{Z y - Z^2/2}].
class JlPair final : public PairModel {
 public:
  JlPair(double q, double sigma, int k, PldDirection dir) : q_(q), dir_(dir), mix_(k, sigma) {
    expensive = true;
    if (q < 1) {
      if (dir == PldDirection::remove) loss_inf = std::log1p(-q);
      else loss_sup = -std::log1p(-q);
    }
  }
  std::pair<double, double> log_lr(double y) const override {
    const double sign = dir_ == PldDirection::remove ? 1.0 : -1.0;
    const auto [lm, zbar] = mix_.log_m(sign * y);
    const double lq = std::log(q_);
    const double l = q_ >= 1 ? lm : log_add_exp(std::log1p(-q_), lq + lm);
    const double share = std::exp(lq + lm - l);
    return {sign * l, share * zbar};
  }
  double tail_a(double t) const override {
    if (dir_ == PldDirection::remove) {
      const auto [w, e] = mix_.window(t, kInf, +1);
      note(q_ * e);
      return (1 - q_) * phi_bar(t) + q_ * w;
    }
    return phi_bar(t);
  }
  double tail_b(double t) const override {
    if (dir_ == PldDirection::remove) return phi_bar(t);
    const auto [w, e] = mix_.window(t, kInf, -1);
    note(q_ * e);
    return (1 - q_) * phi_bar(t) + q_ * w;
  }
  double lower_tail_a(double t) const override {
    if (dir_ == PldDirection::remove) {
      const auto [w, e] = mix_.window(-kInf, t, +1);
      note(q_ * e);
      return (1 - q_) * phi_cdf(t) + q_ * w;
    }
    return phi_cdf(t);
  }
  double cell_masses(const std::vector<double>& bounds, std::vector<double>& pa,
                     std::vector<double>& pb) const override {
    const std::size_t n = bounds.size() - 1;
    pa.assign(n, 0.0);
    pb.assign(n, 0.0);
    const int s = dir_ == PldDirection::remove ? +1 : -1;
    double err = 0;
    for (std::size_t k = 0; k < n; ++k) {
      const double a = bounds[k], b = bounds[k + 1];
      const double plain = gauss_mass(a, b);
      const auto [w, e] = mix_.window(a, b, s);
      err += q_ * e;
      const double mixed = (1 - q_) * plain + q_ * w;
      if (dir_ == PldDirection::remove) { pa[k] = mixed; pb[k] = plain; }
      else { pa[k] = plain; pb[k] = mixed; }
    }
    return err;
  }
  double tail_error() const override { return tail_error_; }

 private:
  void note(double e) const { tail_error_ = std::max(tail_error_, e); }
  double q_;
  PldDirection dir_;
  ChiMixture mix_;
  mutable double tail_error_ = 0;
};

// ------------------------------------------------------- one step, discretised

/// Where a single step's distribution is cut: below y_lo (only if the loss is
/// unbounded below) and above y_hi.
struct StepRange {
  double y_lo = -kInf, y_hi = kInf;
  double loss_lo = 0, loss_hi = 0;
};

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

/// One step's PLD, both ways. `upper` dominates the true pair: every cell of y
/// whose loss lies in [l_j, l_k] is split onto the grid points l_j and l_k so that
/// both its A- and B-mass are kept (connect-the-dots, Doroshenko, Ghazi, Kamath,
/// Kumar, Manurangsi 2022, Alg. 1 generalised to cells); what lies beyond the
/// grid's top goes to +infinity. `lower` is dominated by it up to a mean-zero
/// rounding of width h (see Hoeffding in the accountant): each thin cell's coarse
/// loss log(pa/pb) (a post-processing of the pair, so dominated) is rounded to its
/// two grid neighbours with the probabilities that keep its mean; wide cells and
/// the top are rounded down, the bottom tail dropped.
struct StepPld {
  DiscretePld upper, lower;
  double slack = 0;  // bound on the total-variation error of the cell masses
};

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
  const long top_hi = top_bounded ? static_cast<long>(std::ceil(m.loss_sup / h)) : top_lo;
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
  if (top_bounded) {
    split(top_lo, top_hi, tail_a, tail_b);
  } else if (tail_a > 0) {
    // Loss >= l_top on the region: B-mass all at l_top, the rest of A at +infinity.
    const double at_top = std::min(tail_a, tail_b > 0 ? std::exp(static_cast<double>(top_lo) * h + std::log(tail_b)) : 0.0);
    at(up, top_lo) += at_top;
    up.infinity_mass = tail_a - at_top;
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

/// Cells [x_i, x_{i+1}) of X ~ chi2_K: the first is [0, x_0) (Z unbounded there), the last
/// [x_n, inf). Weights are the exact cell probabilities; z_worst (at x_i) and z_best (at
/// x_{i+1}) bracket Z on the cell. Above Z = 8 cells widen (their loss lies far beyond any
/// epsilon of interest, so their width costs nothing there).
struct JlCells {
  std::vector<double> weight, z_worst, z_best;  // z_worst = +inf for the first cell
  double weight_error = 0;                      // bound on sum |computed - true weight|
};

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

/// Sensitivities (noise units) above this are accounted as unbounded: the loss of such a
/// step exceeds ~kHugeZ^2 / 2 = 5e7 wherever the two distributions differ, far beyond any
/// epsilon, and Z^2 would overflow near 1e154.
constexpr double kHugeZ = 1e4;

/// What one ledger entry contributes in one direction: a single pair (exact norms, or
/// the paper's JL pair), or for DP-SGD-JL the mixture over the cells of X.
class StepModel {
 public:
  StepModel(const Step& s, PldDirection dir, double tail, const PldAccountant::Options& o)
      : q_(s.sampling_rate), dir_(dir) {
    if (s.jl_dim > 0 && !o.jl_paper_pair) {
      // Half the tail budget for the first cell (Z unbounded), half for the cells' ranges.
      const JlCells cells = jl_cells(s.jl_dim, s.noise_multiplier, 0.5 * tail, o.jl_cell_ratio);
      weight_error_ = cells.weight_error;
      for (std::size_t i = 0; i < cells.weight.size(); ++i)
        if (cells.weight[i] > 0) add_part(cells.weight[i], cells.z_worst[i], cells.z_best[i], 0.5 * tail, o);
    } else if (s.jl_dim == 0 && 1.0 / s.noise_multiplier > kHugeZ) {
      add_part(1.0, kInf, kInf, tail, o);  // (almost) no noise: as if none
    } else {
      Part p;
      p.weight = 1;
      p.worst = s.jl_dim == 0 ? std::unique_ptr<PairModel>(std::make_unique<GaussianPair>(q_, s.noise_multiplier, dir))
                              : std::make_unique<JlPair>(q_, s.noise_multiplier, s.jl_dim, dir);
      p.worst_range = find_range(*p.worst, tail, o.max_loss);
      single_ = true;
      parts_.push_back(std::move(p));
    }
    for (const Part& p : parts_) {
      if (p.worst) {
        loss_lo_ = std::min(loss_lo_, p.worst_range.loss_lo);
        loss_hi_ = std::max(loss_hi_, p.worst_range.loss_hi);
      }
    }
    if (!(loss_lo_ < loss_hi_)) {
      loss_lo_ = std::min({loss_lo_, 0.0, q_ < 1 ? std::log1p(-q_) : 0.0});
      loss_hi_ = std::max({loss_hi_, 1.0, q_ < 1 ? -std::log1p(-q_) : 0.0});
    }
  }

  double loss_lo() const { return loss_lo_; }
  double loss_hi() const { return loss_hi_; }

  StepPld discretise(double h, double rel_width, bool with_lower) const {
    if (single_) return dpgrad::privacy::discretise(*parts_[0].worst, parts_[0].worst_range, h, rel_width, with_lower);
    StepPld out;
    out.upper.grid_spacing = out.lower.grid_spacing = h;
    out.slack = weight_error_;
    for (const Part& p : parts_) {
      if (p.worst) {
        const StepPld one = dpgrad::privacy::discretise(*p.worst, p.worst_range, h, rel_width, false);
        add_scaled(out.upper, one.upper, p.weight);
        out.slack += p.weight * one.slack;
      } else {
        add_unbounded(out.upper, p.weight, h, true);
      }
      if (!with_lower) continue;
      if (p.best) {
        const StepPld one = dpgrad::privacy::discretise(*p.best, p.best_range, h, rel_width, true);
        add_scaled(out.lower, one.lower, p.weight);
      } else if (p.z_best == 0) {
        add_atom(out.lower, 0, p.weight);  // Z = 0: both distributions equal
      } else {
        add_unbounded(out.lower, p.weight, h, false);
      }
    }
    trim(out.upper);
    if (with_lower) trim(out.lower);
    return out;
  }

 private:
  struct Part {
    double weight = 0, z_best = 0;
    std::unique_ptr<PairModel> worst, best;  // null: Z unbounded (worst) / z_best in {0, unbounded} (best)
    StepRange worst_range, best_range;
  };

  void add_part(double weight, double z_worst, double z_best, double tail, const PldAccountant::Options& o) {
    Part p;
    p.weight = weight;
    p.z_best = z_best;
    if (z_worst <= kHugeZ) {
      p.worst = std::make_unique<GaussianPair>(q_, 1.0 / z_worst, dir_);
      p.worst->expensive = true;  // coarse cells far out: the mixture has many parts
      p.worst_range = find_range(*p.worst, tail, o.max_loss);
    }
    if (z_best > 0 && z_best <= kHugeZ) {
      p.best = std::make_unique<GaussianPair>(q_, 1.0 / z_best, dir_);
      p.best->expensive = true;
      p.best_range = find_range(*p.best, tail, o.max_loss);
    }
    parts_.push_back(std::move(p));
  }

  /// Z unbounded: remove: +inf with probability q, loss log(1-q) otherwise; add: loss
  /// -log(1-q), the supremum of that direction's loss for every Z (+inf when q = 1).
  /// Finite losses rounded up onto the grid (down for the optimistic companion).
  void add_unbounded(DiscretePld& d, double w, double h, bool up) const {
    auto index = [&](double loss) { return static_cast<long>(up ? std::ceil(loss / h) : std::floor(loss / h)); };
    if (dir_ == PldDirection::remove) {
      d.infinity_mass += w * q_;
      if (q_ < 1) add_atom(d, index(std::log1p(-q_)), w * (1 - q_));
    } else if (q_ < 1) {
      add_atom(d, index(-std::log1p(-q_)), w);
    } else {
      d.infinity_mass += w;
    }
  }

  double q_;
  PldDirection dir_;
  bool single_ = false;
  std::vector<Part> parts_;
  double weight_error_ = 0;
  double loss_lo_ = kInf, loss_hi_ = -kInf;
};

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

}  // namespace

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

// ------------------------------------------------------------------ accountant

struct PldAccountant::Composed {
  std::vector<Step> ledger;
  double budget = 0;  // truncation budget the composition was built with
  bool has_lower = false;
  double grid_spacing = 0;
  long total_steps = 0;
  std::array<DiscretePld, 2> upper, lower;
  std::array<double, 2> extra_upper{0, 0};  // FFT error bound + cell-mass slack
  std::array<double, 2> extra_lower{0, 0};
};

namespace {

bool same_ledger(const std::vector<Step>& a, const std::vector<Step>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].sampling_rate != b[i].sampling_rate || a[i].noise_multiplier != b[i].noise_multiplier ||
        a[i].count != b[i].count || a[i].jl_dim != b[i].jl_dim)
      return false;
  return true;
}

void check_options(const PldAccountant::Options& o) {
  auto bad = [](const std::string& what, double v, const std::string& need) {
    throw std::invalid_argument("PldAccountant: " + what + " must be " + need + ", got " + format_number(v));
  };
  if (!(o.grid_spacing > 0 && o.grid_spacing <= 1)) bad("grid_spacing", o.grid_spacing, "in (0, 1]");
  if (!(o.tail_fraction > 0 && o.tail_fraction <= 0.5)) bad("tail_fraction", o.tail_fraction, "in (0, 0.5]");
  if (!(o.max_grid_points >= 1024 && o.max_grid_points <= (1L << 26)))
    bad("max_grid_points", static_cast<double>(o.max_grid_points), "in [1024, 2^26]");
  if (!(o.max_loss >= 1 && o.max_loss <= 1e6)) bad("max_loss", o.max_loss, "in [1, 1e6]");
  if (!(o.relative_cell_width > 0 && o.relative_cell_width <= 0.1))
    bad("relative_cell_width", o.relative_cell_width, "in (0, 0.1]");
  if (!(o.jl_cell_ratio >= 1e-5 && o.jl_cell_ratio <= 0.5)) bad("jl_cell_ratio", o.jl_cell_ratio, "in [1e-5, 0.5]");
}

/// Mean and variance of the finite part of a PLD.
std::pair<double, double> moments(const DiscretePld& d) {
  double m0 = 0, m1 = 0, m2 = 0;
  for (std::size_t k = 0; k < d.mass.size(); ++k) {
    const double l = static_cast<double>(d.offset + static_cast<long>(k)) * d.grid_spacing;
    m0 += d.mass[k];
    m1 += d.mass[k] * l;
  }
  if (!(m0 > 0)) return {0, 0};
  const double mean = m1 / m0;
  for (std::size_t k = 0; k < d.mass.size(); ++k) {
    const double l = static_cast<double>(d.offset + static_cast<long>(k)) * d.grid_spacing - mean;
    m2 += d.mass[k] * l * l;
  }
  return {mean, m2 / m0};
}

}  // namespace

PldAccountant::PldAccountant() : PldAccountant(Options{}) {}

PldAccountant::PldAccountant(Options options) : options_(options) { check_options(options_); }

PldAccountant::PldAccountant(const PldAccountant& other) : Accountant(other), options_(other.options_) {
  std::lock_guard<std::mutex> lock(other.mutex_);
  cache_ = other.cache_;
}

std::string PldAccountant::name() const { return "pld"; }
Neighbouring PldAccountant::neighbouring() const { return Neighbouring::add_remove; }
bool PldAccountant::supports_jl() const { return true; }
bool PldAccountant::upper_bound() const { return !options_.jl_paper_pair; }

std::unique_ptr<Accountant> PldAccountant::clone() const { return std::make_unique<PldAccountant>(*this); }

double PldAccountant::last_grid_spacing() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_ ? cache_->grid_spacing : 0.0;
}

std::shared_ptr<const PldAccountant::Composed> PldAccountant::composed(double budget,
                                                                       bool with_lower) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cache_ && same_ledger(cache_->ledger, ledger_) && cache_->budget <= budget &&
      (cache_->has_lower || !with_lower))
    return cache_;
  auto c = std::make_shared<Composed>();
  c->ledger = ledger_;
  c->budget = budget;
  c->has_lower = with_lower;
  long total = 0;
  for (const Step& s : ledger_) total += s.count;
  c->total_steps = total;
  // Half the budget for the single steps' +infinity atoms (composed: <= their sum), half
  // for the truncations during composition. Mass cut from a distribution of m steps is
  // carried into the +infinity atom of every later composition, so it counts about T/m
  // times: over the squarings and products of all entries that is <= (2T + entries) times.
  const double tail_step = 0.5 * budget / static_cast<double>(std::max<long>(total, 1));
  const double tail_conv =
      0.5 * budget / static_cast<double>(2 * std::max<long>(total, 1) + static_cast<long>(ledger_.size()));
  const Options& o = options_;

  // Each entry's single step, both directions.
  std::vector<std::array<std::unique_ptr<StepModel>, 2>> models(ledger_.size());
  for (std::size_t i = 0; i < ledger_.size(); ++i)
    for (int d = 0; d < 2; ++d)
      models[i][d] = std::make_unique<StepModel>(ledger_[i], d == 0 ? PldDirection::remove : PldDirection::add,
                                                 tail_step, o);
  // Grid spacing: the composed distribution must fit in max_grid_points. Its extent is
  // estimated from a coarse discretisation (mean and spread of the sum) plus the
  // widest single-step range (heavy tails reach that far).
  double extent = 0;
  for (int d = 0; d < 2; ++d) {
    double mean = 0, var = 0, lo = kInf, hi = -kInf;
    for (std::size_t i = 0; i < ledger_.size(); ++i) {
      const StepModel& sm = *models[i][d];
      const double h0 = std::max(o.grid_spacing, (sm.loss_hi() - sm.loss_lo()) / 1000.0);
      const StepPld coarse = sm.discretise(h0, std::max(o.relative_cell_width, 0.02), false);
      const auto [m, v] = moments(coarse.upper);
      mean += static_cast<double>(ledger_[i].count) * m;
      var += static_cast<double>(ledger_[i].count) * v;
      lo = std::min(lo, sm.loss_lo());
      hi = std::max(hi, sm.loss_hi());
    }
    extent = std::max(extent, (hi - lo) + std::abs(mean) + 16.0 * std::sqrt(var));
  }
  const double h = std::max(o.grid_spacing, extent / (0.45 * static_cast<double>(o.max_grid_points)));
  c->grid_spacing = h;

  for (int d = 0; d < 2; ++d) {
    DiscretePld up, lw;
    bool first = true;
    double err_up = 0, err_lw = 0, slack = 0;
    for (std::size_t i = 0; i < ledger_.size(); ++i) {
      const StepPld one = models[i][d]->discretise(h, o.relative_cell_width, with_lower);
      slack += static_cast<double>(ledger_[i].count) * one.slack;
      DiscretePld pu = power(one.upper, ledger_[i].count, true, tail_conv, o.max_grid_points, err_up);
      up = first ? std::move(pu) : compose(up, pu, true, tail_conv, o.max_grid_points, err_up);
      if (with_lower) {
        DiscretePld pl = power(one.lower, ledger_[i].count, false, tail_conv, o.max_grid_points, err_lw);
        lw = first ? std::move(pl) : compose(lw, pl, false, tail_conv, o.max_grid_points, err_lw);
      }
      first = false;
    }
    c->upper[d] = std::move(up);
    c->extra_upper[d] = err_up + slack;
    if (with_lower) {
      c->lower[d] = std::move(lw);
      c->extra_lower[d] = err_lw + slack;
    }
  }
  cache_ = c;
  return c;
}

namespace {
void check_delta(double delta) {
  if (!(delta > 0 && delta < 1))
    throw std::invalid_argument("PldAccountant: delta must be in (0, 1), got " + format_number(delta));
}
/// A few ulps upwards, so that rounding in the last arithmetic never under-reports.
double round_up(double eps) {
  if (!std::isfinite(eps)) return eps;
  return std::max(0.0, eps + 1e-12 * (1 + std::abs(eps)));
}
}  // namespace

double PldAccountant::epsilon(double delta) const {
  check_delta(delta);
  if (ledger_.empty()) return 0.0;
  const auto c = composed(options_.tail_fraction * delta, false);
  double eps = 0;
  for (int d = 0; d < 2; ++d) eps = std::max(eps, pld_epsilon(c->upper[d], delta, c->extra_upper[d]));
  return round_up(eps);
}

std::pair<double, double> PldAccountant::epsilon_bounds(double delta) const {
  check_delta(delta);
  if (ledger_.empty()) return {0.0, 0.0};
  const auto c = composed(options_.tail_fraction * delta, true);
  double upper = 0, lower = 0;
  // Hoeffding: each step's rounding error is mean zero given its coarse loss and lies in an
  // interval of width h, so the sum exceeds s with probability <= eta = exp(-2 s^2 / (T h^2));
  // hence delta_true(eps) >= delta_lower(eps + s) - eta (Gopi, Lee, Wutschitz 2021, §5).
  const double eta = 1e-3 * delta;
  const double s = c->grid_spacing * std::sqrt(0.5 * static_cast<double>(c->total_steps) * std::log(1 / eta));
  for (int d = 0; d < 2; ++d) {
    upper = std::max(upper, pld_epsilon(c->upper[d], delta, c->extra_upper[d]));
    lower = std::max(lower, pld_epsilon(c->lower[d], delta + eta + c->extra_lower[d], 0.0) - s);
  }
  return {std::max(0.0, lower), round_up(upper)};
}

double PldAccountant::delta(double epsilon) const {
  if (!(epsilon >= 0)) throw std::invalid_argument("PldAccountant: epsilon must be >= 0, got " + format_number(epsilon));
  if (ledger_.empty()) return 0.0;
  double budget = 1e-10;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cache_ && same_ledger(cache_->ledger, ledger_)) budget = cache_->budget;
  }
  double result = 1.0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const auto c = composed(budget, false);
    result = 0;
    for (int d = 0; d < 2; ++d)
      result = std::max(result, pld_delta(c->upper[d], epsilon) + c->extra_upper[d]);
    // The truncation budget must be small against the answer.
    if (budget <= options_.tail_fraction * result || budget <= 1e-20) break;
    budget = std::max(1e-20, options_.tail_fraction * result);
  }
  return std::min(1.0, result);
}

nlohmann::json PldAccountant::to_json() const {
  nlohmann::json j = Accountant::to_json();
  j["options"] = {{"grid_spacing", options_.grid_spacing},
                  {"tail_fraction", options_.tail_fraction},
                  {"max_grid_points", options_.max_grid_points},
                  {"max_loss", options_.max_loss},
                  {"relative_cell_width", options_.relative_cell_width},
                  {"jl_cell_ratio", options_.jl_cell_ratio},
                  {"jl_paper_pair", options_.jl_paper_pair}};
  if (options_.jl_paper_pair) j["not_an_upper_bound"] = "DP-SGD-JL accounted with the paper pair (comparison only)";
  return j;
}

std::unique_ptr<PldAccountant> PldAccountant::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("PldAccountant::from_json: expected an object");
  if (j.contains("accountant") && j["accountant"] != "pld")
    throw std::invalid_argument("PldAccountant::from_json: accountant is " + j["accountant"].dump() +
                                ", expected \"pld\"");
  Options o;
  if (j.contains("options")) {
    const auto& jo = j["options"];
    auto get = [&](const char* key, auto& field) {
      if (!jo.contains(key)) return;
      if (!jo[key].is_number())
        throw std::invalid_argument(std::string("PldAccountant::from_json: option ") + key +
                                    " is not a number: " + jo[key].dump());
      field = jo[key].get<std::decay_t<decltype(field)>>();
    };
    get("grid_spacing", o.grid_spacing);
    get("tail_fraction", o.tail_fraction);
    get("max_grid_points", o.max_grid_points);
    get("max_loss", o.max_loss);
    get("relative_cell_width", o.relative_cell_width);
    get("jl_cell_ratio", o.jl_cell_ratio);
    if (jo.contains("jl_paper_pair")) {
      if (!jo["jl_paper_pair"].is_boolean())
        throw std::invalid_argument("PldAccountant::from_json: option jl_paper_pair is not a boolean: " +
                                    jo["jl_paper_pair"].dump());
      o.jl_paper_pair = jo["jl_paper_pair"].get<bool>();
    }
  }
  auto acc = std::make_unique<PldAccountant>(o);
  if (j.contains("ledger")) {
    if (!j["ledger"].is_array())
      throw std::invalid_argument("PldAccountant::from_json: \"ledger\" must be an array, got " + j["ledger"].dump());
    for (const auto& e : j.at("ledger")) {
      try {
        acc->step(e.at("sampling_rate").get<double>(), e.at("noise_multiplier").get<double>(),
                  e.contains("count") ? e["count"].get<long>() : 1L,
                  e.contains("jl_dim") ? e["jl_dim"].get<int>() : 0);
      } catch (const nlohmann::json::exception& ex) {
        throw std::invalid_argument(std::string("PldAccountant::from_json: bad ledger entry ") +
                                    e.dump() + ": " + ex.what());
      }
    }
  }
  return acc;
}

}  // namespace dpgrad::privacy
