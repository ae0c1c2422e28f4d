// PLD accountant, part 1: the pair of distributions (P, Q) one step is
// dominated by, as models with the loss's distribution under each: the
// subsampled Gaussian, and DP-SGD-JL's mixture over its chi-square factor.
// Internal to privacy/ (not installed).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <utility>
#include <vector>

#include "privacy/conversions.hpp"

namespace dpgrad::privacy::pld_detail {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kUlp = std::numeric_limits<double>::epsilon();

// ---------------------------------------------------------------- Gaussians

inline double phi_bar(double x) { return 0.5 * std::erfc(x * std::numbers::sqrt2 / 2); }  // P(N > x)
inline double phi_cdf(double x) { return 0.5 * std::erfc(-x * std::numbers::sqrt2 / 2); }  // P(N <= x)

/// P(a < N(0,1) <= b), computed from whichever tails avoid cancellation.
inline double gauss_mass(double a, double b) {
  if (!(b > a)) return 0.0;
  if (a >= 0) return std::max(0.0, phi_bar(a) - phi_bar(b));
  if (b <= 0) return std::max(0.0, phi_cdf(b) - phi_cdf(a));
  return std::max(0.0, 1.0 - phi_cdf(a) - phi_bar(b));
}

/// log(1 - q + q e^x) without overflow or cancellation.
inline double log_mix(double q, double x) {
  if (q >= 1) return x;
  if (x > 0) return x + std::log(q + (1 - q) * std::exp(-x));
  return std::log1p(q * std::expm1(x));
}

/// x with log_mix(q, x) = v (v > log(1-q)): x = log((e^v - 1 + q) / q).
inline double inverse_log_mix(double q, double v) {
  if (q >= 1) return v;
  if (v > 30) return v + std::log1p((q - 1) * std::exp(-v)) - std::log(q);
  return std::log(std::expm1(v) + q) - std::log(q);
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
  /// Sampling rate q, noise multiplier sigma and direction; for q < 1 the loss is
  /// bounded: below by log(1 - q) (remove), above by -log(1 - q) (add).
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
  /// X ~ chi2_k and Z = sqrt(k / X) / sigma (noise multiplier sigma).
  ChiMixture(int k, double sigma)
      : half_k_(0.5 * k), cz_(std::sqrt(static_cast<double>(k)) / sigma), z_mode_(1.0 / sigma) {
    log_norm_ = half_k_ * std::numbers::ln2 + std::lgamma(half_k_);
    u_mode_ = std::log(static_cast<double>(k));
    lf_max_ = log_f(u_mode_);
    du_bulk_ = std::min(0.3, 0.5 * std::sqrt(2.0 / k));
    u_left_ = left_level(120.0);
    u_right_ = right_level(120.0);
  }

  /// log f(u), the log density of u = log X; Z at u; the u where Z = z.
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
  /// Sampling rate q, noise multiplier sigma, k projections and direction; the loss
  /// is bounded for q < 1 as for GaussianPair.
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

}  // namespace dpgrad::privacy::pld_detail
