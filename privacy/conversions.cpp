// Conversions between privacy notions, composition theorems, the analytic
// Gaussian mechanism and the log-space helpers behind them. Every result that
// is a privacy cost is rounded towards the pessimistic side.
#include "privacy/accountant.hpp"
#include "privacy/conversions.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <string>

namespace dpgrad::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Relative margin added to computed epsilons/deltas: covers floating-point
// error of the closed forms (a few ulp of the summands) many times over.
constexpr double kUpMargin = 1e-12;

double round_up(double x) {
  if (!std::isfinite(x)) return x;
  return x + std::abs(x) * kUpMargin + 1e-300;
}

void check_delta(double delta, const char* what) {
  if (!(delta > 0.0 && delta < 1.0))
    throw std::invalid_argument(std::string(what) + ": delta must be in (0, 1), got " + format_number(delta));
}

void check_orders(const std::vector<double>& orders, const std::vector<double>& rdp) {
  if (orders.size() != rdp.size())
    throw std::invalid_argument("rdp conversion: " + std::to_string(orders.size()) +
                                " orders but " + std::to_string(rdp.size()) + " rdp values");
  for (double a : orders)
    if (!(a > 1.0) || !std::isfinite(a))
      throw std::invalid_argument("rdp conversion: orders must be finite and > 1, got " + format_number(a));
  for (double r : rdp)
    if (std::isnan(r) || r < 0.0)
      throw std::invalid_argument("rdp conversion: rdp values must be >= 0, got " + format_number(r));
}

}  // namespace

// ---- log-space numerics ---------------------------------------------------

double log_add_exp(double a, double b) {
  if (a == -kInf) return b;
  if (b == -kInf) return a;
  if (a == kInf || b == kInf) return kInf;
  const double m = std::max(a, b);
  return m + std::log1p(std::exp(-std::abs(a - b)));
}

double log_erfc(double x) {
  if (std::isnan(x)) return x;
  if (x < 26.0) return std::log(std::erfc(x));  // erfc(26) ~ 6e-296: still a normal double
  // Asymptotic series (Abramowitz & Stegun 7.1.23):
  // erfc(x) = e^{-x^2} / (x sqrt(pi)) * (1 + sum_k (-1)^k (2k-1)!! / (2x^2)^k);
  // at x >= 26 the terms fall below 1e-30 well before they start growing.
  const double z = 1.0 / (2.0 * x * x);
  double term = 1.0, sum = 1.0;
  for (int k = 1; k <= 12; ++k) {
    term *= -(2.0 * k - 1.0) * z;
    sum += term;
  }
  return -x * x - std::log(x) - 0.5 * std::log(std::numbers::pi) + std::log(sum);
}

double log_normal_cdf(double x) {
  // Phi(x) = erfc(-x / sqrt 2) / 2.
  return log_erfc(-x / std::numbers::sqrt2) - std::numbers::ln2;
}

double log_binomial(double n, double k) {
  return std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0);
}

// ---- RDP to (epsilon, delta) ----------------------------------------------

std::string to_string(RdpConversion c) {
  return c == RdpConversion::classic ? "classic (Mironov 2017)" : "tight (Balle et al. 2020)";
}

double rdp_to_epsilon_classic(double order, double rdp, double delta) {
  // Mironov 2017, Prop. 3.
  return rdp + std::log(1.0 / delta) / (order - 1.0);
}

double rdp_to_epsilon_tight(double order, double rdp, double delta) {
  // Balle et al. 2020, Thm. 21; Canonne, Kamath, Steinke 2020, Prop. 12.
  return rdp + std::log1p(-1.0 / order) - (std::log(delta) + std::log(order)) / (order - 1.0);
}

RdpEpsilon rdp_to_epsilon(const std::vector<double>& orders, const std::vector<double>& rdp,
                          double delta) {
  check_delta(delta, "rdp_to_epsilon");
  check_orders(orders, rdp);
  RdpEpsilon best{kInf, std::numeric_limits<double>::quiet_NaN(), RdpConversion::tight};
  for (std::size_t i = 0; i < orders.size(); ++i) {
    if (!std::isfinite(rdp[i])) continue;
    const double classic = rdp_to_epsilon_classic(orders[i], rdp[i], delta);
    const double tight = rdp_to_epsilon_tight(orders[i], rdp[i], delta);
    if (classic < best.epsilon) best = {classic, orders[i], RdpConversion::classic};
    if (tight < best.epsilon) best = {tight, orders[i], RdpConversion::tight};
  }
  // An (eps, delta) pair with eps < 0 says nothing more than eps = 0.
  best.epsilon = round_up(std::max(best.epsilon, 0.0));
  return best;
}

double rdp_to_delta(const std::vector<double>& orders, const std::vector<double>& rdp,
                    double epsilon) {
  if (!(epsilon >= 0.0))
    throw std::invalid_argument("rdp_to_delta: epsilon must be >= 0, got " + format_number(epsilon));
  check_orders(orders, rdp);
  double log_delta = 0.0;  // delta <= 1 always
  for (std::size_t i = 0; i < orders.size(); ++i) {
    if (!std::isfinite(rdp[i])) continue;
    const double a = orders[i];
    // Inverse of the classic conversion: delta = exp((a-1)(rdp - eps)).
    const double classic = (a - 1.0) * (rdp[i] - epsilon);
    // Inverse of the tight one: log delta = (a-1)(rdp + log(1-1/a) - eps) - log a.
    const double tight = (a - 1.0) * (rdp[i] + std::log1p(-1.0 / a) - epsilon) - std::log(a);
    log_delta = std::min({log_delta, classic, tight});
  }
  return std::min(1.0, round_up(std::exp(log_delta + 1e-12)));
}

// ---- composition and amplification ----------------------------------------

DpGuarantee compose_basic(const std::vector<DpGuarantee>& parts) {
  DpGuarantee total{0.0, 0.0};
  for (const auto& p : parts) {
    if (!(p.epsilon >= 0.0) || !(p.delta >= 0.0 && p.delta <= 1.0))
      throw std::invalid_argument("compose_basic: each part needs epsilon >= 0 and delta in [0, 1], got (" +
                                  format_number(p.epsilon) + ", " + format_number(p.delta) + ")");
    total.epsilon += p.epsilon;
    total.delta += p.delta;
  }
  total.epsilon = round_up(total.epsilon);
  total.delta = std::min(1.0, round_up(total.delta));
  return total;
}

DpGuarantee compose_advanced(double epsilon, double delta, long k, double delta_prime) {
  if (!(epsilon >= 0.0))
    throw std::invalid_argument("compose_advanced: epsilon must be >= 0, got " + format_number(epsilon));
  if (!(delta >= 0.0 && delta <= 1.0))
    throw std::invalid_argument("compose_advanced: delta must be in [0, 1], got " + format_number(delta));
  if (k < 1) throw std::invalid_argument("compose_advanced: k must be >= 1, got " + std::to_string(k));
  check_delta(delta_prime, "compose_advanced (delta')");
  const double kd = static_cast<double>(k);
  // Dwork-Roth Thm. 3.20.
  const double eps = std::sqrt(2.0 * kd * std::log(1.0 / delta_prime)) * epsilon +
                     kd * epsilon * std::expm1(epsilon);
  return {round_up(eps), std::min(1.0, round_up(kd * delta + delta_prime))};
}

double amplify_by_subsampling(double epsilon, double sampling_rate) {
  if (!(epsilon >= 0.0))
    throw std::invalid_argument("amplify_by_subsampling: epsilon must be >= 0, got " + format_number(epsilon));
  if (!(sampling_rate > 0.0 && sampling_rate <= 1.0))
    throw std::invalid_argument("amplify_by_subsampling: sampling rate must be in (0, 1], got " +
                                format_number(sampling_rate));
  if (epsilon == kInf) return kInf;
  // log(1 + q (e^eps - 1)), in a form that neither overflows nor loses small eps.
  const double em1 = std::expm1(epsilon);
  double r;
  if (std::isfinite(em1)) r = std::log1p(sampling_rate * em1);
  else r = epsilon + std::log(sampling_rate);  // e^eps dominates the 1 - q term
  return round_up(std::min(r, epsilon));
}

// ---- Gaussian mechanism ---------------------------------------------------

double gaussian_dp_delta(double mu, double epsilon) {
  if (!(mu >= 0.0)) throw std::invalid_argument("gaussian_dp_delta: mu must be >= 0, got " + format_number(mu));
  if (!(epsilon >= 0.0))
    throw std::invalid_argument("gaussian_dp_delta: epsilon must be >= 0, got " + format_number(epsilon));
  if (mu == 0.0) return 0.0;
  if (mu == kInf) return 1.0;
  if (epsilon == kInf) return 0.0;
  // Dong, Roth, Su 2019, Cor. 2.13; written as Phi(a) (1 - exp(eps + log Phi(b) - log Phi(a))).
  const double a = -epsilon / mu + mu / 2.0;
  const double b = -epsilon / mu - mu / 2.0;
  const double log_pa = log_normal_cdf(a);
  const double log_pb = log_normal_cdf(b);
  const double x = std::min(0.0, epsilon + log_pb - log_pa);  // <= 0 mathematically
  const double d = std::exp(log_pa) * (-std::expm1(x));
  return std::min(1.0, d * (1.0 + 1e-10) + 1e-300);
}

double analytic_gaussian_delta(double sensitivity, double noise_std, double epsilon) {
  if (!(sensitivity > 0.0) || !std::isfinite(sensitivity))
    throw std::invalid_argument("analytic_gaussian_delta: sensitivity must be > 0, got " + format_number(sensitivity));
  if (!(noise_std >= 0.0))
    throw std::invalid_argument("analytic_gaussian_delta: noise std must be >= 0, got " + format_number(noise_std));
  if (noise_std == 0.0) return 1.0;
  // Balle and Wang 2018, Thm. 8: the same curve as mu-GDP with mu = Delta / s.
  return gaussian_dp_delta(sensitivity / noise_std, epsilon);
}

double gaussian_dp_epsilon(double mu, double delta) {
  check_delta(delta, "gaussian_dp_epsilon");
  if (!(mu >= 0.0)) throw std::invalid_argument("gaussian_dp_epsilon: mu must be >= 0, got " + format_number(mu));
  if (mu == kInf) return kInf;
  if (gaussian_dp_delta(mu, 0.0) <= delta) return 0.0;
  // delta(eps) is decreasing in eps: bracket, then bisect keeping the upper end.
  double lo = 0.0, hi = 1.0;
  while (gaussian_dp_delta(mu, hi) > delta) {
    lo = hi;
    hi *= 2.0;
    if (hi > 1e12) return kInf;
  }
  for (int it = 0; it < 200 && hi - lo > 1e-13 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (gaussian_dp_delta(mu, mid) > delta) lo = mid;
    else hi = mid;
  }
  return round_up(hi);
}

double analytic_gaussian_noise_std(double epsilon, double delta, double sensitivity) {
  if (!(epsilon >= 0.0) || !std::isfinite(epsilon))
    throw std::invalid_argument("analytic_gaussian_noise_std: epsilon must be finite and >= 0, got " +
                                format_number(epsilon));
  check_delta(delta, "analytic_gaussian_noise_std");
  if (!(sensitivity > 0.0) || !std::isfinite(sensitivity))
    throw std::invalid_argument("analytic_gaussian_noise_std: sensitivity must be > 0, got " +
                                format_number(sensitivity));
  // delta is decreasing in s; find the smallest s with delta(s) <= target, keep the upper end.
  double lo = 0.0, hi = sensitivity;
  while (analytic_gaussian_delta(sensitivity, hi, epsilon) > delta) {
    lo = hi;
    hi *= 2.0;
    if (hi > 1e300) throw std::invalid_argument("analytic_gaussian_noise_std: no finite noise reaches delta " + format_number(delta));
  }
  if (lo == 0.0) {
    // Shrink the bracket from above until it straddles the boundary.
    lo = hi / 2.0;
    while (lo > 1e-300 && analytic_gaussian_delta(sensitivity, lo, epsilon) <= delta) {
      hi = lo;
      lo /= 2.0;
    }
  }
  for (int it = 0; it < 200 && hi - lo > 1e-12 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (analytic_gaussian_delta(sensitivity, mid, epsilon) > delta) lo = mid;
    else hi = mid;
  }
  return hi * (1.0 + 1e-12);
}

}  // namespace dpgrad::privacy
