// Tests of privacy/conversions: RDP to (epsilon, delta), composition,
// amplification by subsampling, the analytic Gaussian mechanism and the
// log-space helpers, against closed forms and high-precision reference values.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "privacy/conversions.hpp"

using namespace dpgrad::privacy;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}

TEST_CASE("log-space helpers") {
  CHECK(log_add_exp(std::log(2.0), std::log(3.0)) == doctest::Approx(std::log(5.0)).epsilon(1e-15));
  CHECK(log_add_exp(-kInf, 1.5) == 1.5);
  CHECK(log_add_exp(1000.0, 1000.0) == doctest::Approx(1000.0 + std::log(2.0)).epsilon(1e-15));
  // Below 26 log_erfc is log(erfc); above, the asymptotic series must join it smoothly.
  CHECK(log_erfc(1.0) == doctest::Approx(std::log(std::erfc(1.0))).epsilon(1e-14));
  CHECK(log_erfc(25.999) == doctest::Approx(std::log(std::erfc(25.999))).epsilon(1e-12));
  // log erfc(30) = -903.974117..., mpmath: log(erfc(mpf(30))) at 40 digits.
  CHECK(log_erfc(30.0) == doctest::Approx(-903.97411711064387808).epsilon(1e-14));
  CHECK(std::isfinite(log_erfc(1e5)));
  CHECK(log_normal_cdf(0.0) == doctest::Approx(std::log(0.5)).epsilon(1e-15));
  CHECK(log_binomial(10, 3) == doctest::Approx(std::log(120.0)).epsilon(1e-13));
}

TEST_CASE("RDP to (epsilon, delta): both conversions and the best of them") {
  const double delta = 1e-5;
  // Closed forms written out: Mironov 2017 Prop. 3 and Balle et al. 2020 Thm. 21.
  CHECK(rdp_to_epsilon_classic(10.0, 0.5, delta) == doctest::Approx(0.5 + std::log(1e5) / 9.0));
  CHECK(rdp_to_epsilon_tight(10.0, 0.5, delta) ==
        doctest::Approx(0.5 + std::log(0.9) - (std::log(delta) + std::log(10.0)) / 9.0));
  // tight - classic = log(1 - 1/a) - log(a)/(a-1) < 0: tight wins at every order.
  for (double a : {1.5, 2.0, 8.0, 64.0})
    CHECK(rdp_to_epsilon_tight(a, 0.3, delta) < rdp_to_epsilon_classic(a, 0.3, delta));

  // Plain Gaussian sigma = 2 (rdp = a / 8): the best order for the classic conversion
  // is near 1 + sqrt(8 log(1/delta)) = 10.6; over integer orders the minimum of
  // a/8 + log(1e5)/(a-1) is at a = 11: 11/8 + log(1e5)/10 = 2.52629...
  std::vector<double> orders, rdp;
  for (int a = 2; a <= 64; ++a) {
    orders.push_back(a);
    rdp.push_back(a / 8.0);
  }
  const RdpEpsilon best = rdp_to_epsilon(orders, rdp, delta);
  double tight_min = kInf, tight_order = 0;
  for (std::size_t i = 0; i < orders.size(); ++i) {
    const double e = rdp_to_epsilon_tight(orders[i], rdp[i], delta);
    if (e < tight_min) { tight_min = e; tight_order = orders[i]; }
  }
  CHECK(best.conversion == RdpConversion::tight);
  CHECK(best.order == tight_order);
  CHECK(best.epsilon >= tight_min);  // rounded upwards...
  CHECK(best.epsilon == doctest::Approx(tight_min).epsilon(1e-10));  // ...by a hair
  CHECK(best.epsilon < 11.0 / 8.0 + std::log(1e5) / 10.0);

  // delta(epsilon) inverts epsilon(delta): at the epsilon reported for delta,
  // the delta bound is at most delta (and not far below).
  const double d = rdp_to_delta(orders, rdp, best.epsilon);
  CHECK(d <= delta * (1 + 1e-9));
  CHECK(d > 0.5 * delta);
  // Monotone: more epsilon, less delta.
  CHECK(rdp_to_delta(orders, rdp, best.epsilon + 1.0) < d);

  // No finite RDP at any order: epsilon is +infinity, never a crash.
  const RdpEpsilon none = rdp_to_epsilon({2.0, 3.0}, {kInf, kInf}, delta);
  CHECK(none.epsilon == kInf);
  CHECK(rdp_to_delta({2.0, 3.0}, {kInf, kInf}, 5.0) == 1.0);
}

TEST_CASE("RDP conversion rejects bad input") {
  CHECK_THROWS_AS(rdp_to_epsilon({2.0}, {0.1}, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(rdp_to_epsilon({2.0}, {0.1}, 1.0), std::invalid_argument);
  CHECK_THROWS_AS(rdp_to_epsilon({1.0}, {0.1}, 1e-5), std::invalid_argument);
  CHECK_THROWS_AS(rdp_to_epsilon({2.0, 3.0}, {0.1}, 1e-5), std::invalid_argument);
  CHECK_THROWS_AS(rdp_to_epsilon({2.0}, {-0.1}, 1e-5), std::invalid_argument);
  CHECK_THROWS_AS(rdp_to_delta({2.0}, {0.1}, -1.0), std::invalid_argument);
}

TEST_CASE("basic and advanced composition") {
  const DpGuarantee b = compose_basic({{0.5, 1e-6}, {0.25, 2e-6}, {1.0, 0.0}});
  CHECK(b.epsilon == doctest::Approx(1.75));
  CHECK(b.epsilon >= 1.75);
  CHECK(b.delta == doctest::Approx(3e-6));
  CHECK_THROWS_AS(compose_basic({{-0.1, 0.0}}), std::invalid_argument);

  // Dwork-Roth Thm. 3.20 at eps = 0.1, k = 100, delta' = 1e-5:
  // sqrt(200 ln 1e5) 0.1 + 100 0.1 (e^0.1 - 1) = 5.85023509294455745... (mpmath, 40 digits).
  const DpGuarantee a = compose_advanced(0.1, 1e-7, 100, 1e-5);
  CHECK(a.epsilon == doctest::Approx(5.8502350929445574557).epsilon(1e-10));
  CHECK(a.epsilon >= 5.8502350929445574557);
  CHECK(a.delta == doctest::Approx(100 * 1e-7 + 1e-5));
  // For many small steps advanced composition beats basic composition (k eps = 10 here).
  CHECK(compose_advanced(0.01, 0.0, 1000, 1e-5).epsilon < 10.0);
  CHECK_THROWS_AS(compose_advanced(0.1, 0.0, 0, 1e-5), std::invalid_argument);
  CHECK_THROWS_AS(compose_advanced(0.1, 0.0, 10, 0.0), std::invalid_argument);
}

TEST_CASE("amplification of pure DP by subsampling") {
  // q = 1: no amplification.
  CHECK(amplify_by_subsampling(2.0, 1.0) == doctest::Approx(2.0));
  // log(1 + q(e - 1)) at eps = 1, q = 0.1: 0.158529...
  CHECK(amplify_by_subsampling(1.0, 0.1) == doctest::Approx(std::log(1.0 + 0.1 * (std::exp(1.0) - 1.0))));
  // Small eps: about q eps.
  CHECK(amplify_by_subsampling(1e-8, 0.01) == doctest::Approx(1e-10).epsilon(1e-6));
  // Large eps: about eps + log q, and never more than eps.
  CHECK(amplify_by_subsampling(1000.0, 0.01) == doctest::Approx(1000.0 + std::log(0.01)));
  CHECK(amplify_by_subsampling(0.5, 0.3) < 0.5);
  CHECK_THROWS_AS(amplify_by_subsampling(1.0, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(amplify_by_subsampling(1.0, 1.5), std::invalid_argument);
  CHECK_THROWS_AS(amplify_by_subsampling(-1.0, 0.5), std::invalid_argument);
}

TEST_CASE("Gaussian DP delta(epsilon) and its inverse") {
  // mpmath (40 digits): ncdf(-e/mu + mu/2) - exp(e) ncdf(-e/mu - mu/2).
  CHECK(gaussian_dp_delta(1.0, 1.0) == doctest::Approx(0.1269367375066439458).epsilon(1e-9));
  CHECK(gaussian_dp_delta(2.0, 3.0) == doctest::Approx(0.18381307654447215597).epsilon(1e-9));
  // eps = 0: total variation distance 2 Phi(mu/2) - 1.
  CHECK(gaussian_dp_delta(1.0, 0.0) == doctest::Approx(0.38292492254802620728).epsilon(1e-9));
  CHECK(gaussian_dp_delta(0.0, 1.0) == 0.0);
  CHECK(gaussian_dp_delta(kInf, 1.0) == 1.0);
  // Deep tail: both terms are tiny and nearly equal, yet the difference keeps
  // full relative accuracy (mpmath at 60 digits on the same formula).
  CHECK(gaussian_dp_delta(1.0, 20.0) == doctest::Approx(2.6647067053654976526e-86).epsilon(1e-8));
  CHECK(gaussian_dp_delta(1.0, 25.0) == doctest::Approx(2.8873367755476544195e-134).epsilon(1e-8));
  CHECK(gaussian_dp_delta(0.1, 2.0) == doctest::Approx(3.7194507268046404412e-91).epsilon(1e-8));
  // epsilon at delta = 1e-5 (mpmath findroot on the same curve).
  CHECK(gaussian_dp_epsilon(0.5, 1e-5) == doctest::Approx(1.9930914044151196311).epsilon(1e-9));
  CHECK(gaussian_dp_epsilon(1.0, 1e-5) == doctest::Approx(4.3771780956812246277).epsilon(1e-9));
  CHECK(gaussian_dp_epsilon(2.0, 1e-5) == doctest::Approx(9.9972561464343003965).epsilon(1e-9));
  CHECK(gaussian_dp_epsilon(1.0, 1e-5) >= 4.3771780956812246277);
  CHECK(gaussian_dp_epsilon(1e-9, 1e-5) == 0.0);  // TV distance below delta already
  CHECK_THROWS_AS(gaussian_dp_epsilon(1.0, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(gaussian_dp_delta(-1.0, 0.0), std::invalid_argument);
}

TEST_CASE("analytic Gaussian mechanism (Balle and Wang 2018)") {
  // Smallest sigma for (1, 1e-5) at sensitivity 1: mpmath findroot gives 3.73063163...
  const double s = analytic_gaussian_noise_std(1.0, 1e-5);
  CHECK(s == doctest::Approx(3.7306316348159418322).epsilon(1e-9));
  CHECK(s >= 3.7306316348159418322 * (1 - 1e-12));
  CHECK(analytic_gaussian_delta(1.0, s, 1.0) <= 1e-5);
  // Below the classical calibration sqrt(2 ln(1.25/delta)) / eps = 4.8448 (Dwork-Roth Thm. A.1).
  CHECK(s < 4.8448052626053894213);
  // Scales linearly with the sensitivity.
  CHECK(analytic_gaussian_noise_std(1.0, 1e-5, 3.0) == doctest::Approx(3.0 * s).epsilon(1e-9));
  // eps = 0 has a closed form: delta = 2 Phi(1/(2s)) - 1, s = 1/(2 sqrt2 erfinv(delta)) = 398.942176 at 1e-3.
  CHECK(analytic_gaussian_noise_std(0.0, 1e-3) == doctest::Approx(398.94217595855782425).epsilon(1e-9));
  // Small epsilon (mpmath): 36.3046904...
  CHECK(analytic_gaussian_noise_std(0.1, 1e-6) == doctest::Approx(36.304690426195784939).epsilon(1e-9));
  CHECK_THROWS_AS(analytic_gaussian_noise_std(1.0, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(analytic_gaussian_noise_std(1.0, 1e-5, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(analytic_gaussian_noise_std(-1.0, 1e-5), std::invalid_argument);
  CHECK(analytic_gaussian_delta(1.0, 0.0, 1.0) == 1.0);
}
