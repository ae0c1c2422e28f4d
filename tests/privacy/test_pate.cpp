// Tests of PATE's aggregation and accounting (privacy/pate.hpp): the
// data-independent RDP against the Gaussian mechanism's closed form, Theorem 6
// against a direct evaluation of its formula, its limits and where it must fall
// back, the mechanisms' output frequencies against their Gaussian tails, and
// bad inputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/random.hpp"
#include "privacy/conversions.hpp"
#include "privacy/mechanisms.hpp"
#include "privacy/pate.hpp"
#include "privacy/rdp.hpp"

using namespace dpgrad;
using namespace dpgrad::privacy;

TEST_CASE("pate: data-independent RDP is the Gaussian's, with sensitivity sqrt(2) and 1") {
  for (double a : {1.5, 2.0, 10.0, 77.7})
    for (double s : {1.0, 40.0, 150.0}) {
      CHECK(gnmax_rdp(s, a) == doctest::Approx(a / (s * s)).epsilon(1e-15));
      CHECK(threshold_rdp(s, a) == doctest::Approx(a / (2 * s * s)).epsilon(1e-15));
      // GNMax at sigma is the Gaussian mechanism of sensitivity 1 at sigma / sqrt(2)
      CHECK(gnmax_rdp(s, a) == doctest::Approx(rdp_subsampled_gaussian(1.0, s / std::sqrt(2.0), a)).epsilon(1e-12));
    }
}

TEST_CASE("pate: the accountant equals an RDP accountant of the same Gaussian mechanisms, and composes with steps") {
  PateAccountant pate;
  pate.record({150, 40, 640, 286});
  pate.record({0, 100, 50, 50});
  RdpAccountant same;
  same.step(1.0, 150.0, 640);                    // threshold tests: sensitivity 1
  same.step(1.0, 40.0 / std::sqrt(2.0), 286);    // answers: sensitivity sqrt(2)
  same.step(1.0, 100.0 / std::sqrt(2.0), 50);
  for (double d : {1e-5, 1e-8}) CHECK(pate.epsilon(d) == doctest::Approx(same.epsilon(d)).epsilon(1e-9));
  CHECK(pate.total_queries() == 690);
  CHECK(pate.total_answers() == 336);

  pate.step(0.01, 1.1, 1000);  // a student trained by DP-SGD on top shares the ledger
  same.step(0.01, 1.1, 1000);
  CHECK(pate.epsilon(1e-5) == doctest::Approx(same.epsilon(1e-5)).epsilon(1e-9));
  CHECK(pate.epsilon(1e-5) > PateAccountant().epsilon(1e-5));

  // nothing recorded: (0, 0); queries alone: not 0
  PateAccountant empty;
  CHECK(empty.epsilon(1e-5) == 0.0);
  PateAccountant one;
  one.record({0, 10, 1, 1});
  CHECK(one.epsilon(1e-5) > 0.0);

  // a round trip through JSON keeps the ledger and the account
  const auto back = accountant_from_json(pate.to_json());
  CHECK(back->name() == "pate");
  CHECK(back->epsilon(1e-5) == doctest::Approx(pate.epsilon(1e-5)).epsilon(1e-12));
  CHECK(dynamic_cast<const PateAccountant&>(*back).total_answers() == 336);
}

TEST_CASE("pate: the released epsilon adds the noise grid's slack and calibration reaches its target") {
  PateAccountant a;
  a.record({150, 40, 640, 286});
  const double plain = a.epsilon(1e-5), with_grid = pate_epsilons(a, 10, 1e-5).rdp;
  CHECK(with_grid >= plain);
  CHECK(with_grid < plain * 1.001);
  // sigma2 is calibrated on the RDP bound; the released epsilon, the tighter of two, meets the target too
  const double sigma2 = calibrate_pate_sigma(150, 2000, 500, 10, 3.0, 1e-5);
  PateAccountant c;
  c.record({150, sigma2, 2000, 500});
  CHECK(pate_epsilons(c, 10, 1e-5).rdp <= 3.0);
  CHECK(pate_epsilons(c, 10, 1e-5).rdp >= 2.97);
  CHECK(pate_epsilon(c, 10, 1e-5) <= 3.0);
  PateAccountant less;
  less.record({150, sigma2 * 0.98, 2000, 500});
  CHECK(pate_epsilons(less, 10, 1e-5).rdp > 3.0);
  // threshold tests that alone spend the target are refused by name
  CHECK_THROWS_WITH_AS(calibrate_pate_sigma(10, 100000, 10, 10, 1.0, 1e-5), doctest::Contains("threshold tests alone"),
                       std::invalid_argument);
}

TEST_CASE("pate: log q is the union bound of Gaussian tails, capped at 1 - 1/k") {
  const std::vector<double> votes{100, 20, 0, 100 - 7};
  const double sigma = 10;
  double q = 0;
  for (double v : {20.0, 0.0, 93.0}) q += 0.5 * std::erfc((100 - v) / (2 * sigma));
  CHECK(gnmax_log_q(votes, sigma) == doctest::Approx(std::log(q)).epsilon(1e-12));
  // a tie: the bound would exceed 1 - 1/k
  CHECK(gnmax_log_q(std::vector<double>{5, 5, 5}, 40) == doctest::Approx(std::log(2.0 / 3.0)));
  // far apart: tails many orders of magnitude down, without underflow
  const double deep = gnmax_log_q(std::vector<double>{250, 0}, 5);
  CHECK(deep == doctest::Approx(std::log(0.5) + log_erfc(25.0)).epsilon(1e-12));
  CHECK(deep < -600);
}

namespace {

/// Theorem 6 evaluated directly from its statement (not in log space), in long double.
long double theorem6_direct(long double q, long double s, long double order) {
  const long double mu2 = s * std::sqrt(-std::log(q)), mu1 = mu2 + 1;
  const long double e1 = mu1 / (s * s), e2 = mu2 / (s * s);
  const long double A = (1 - q) / (1 - std::pow(q * std::exp(e2), (mu2 - 1) / mu2));
  const long double B = std::exp(e1) / std::pow(q, 1 / (mu1 - 1));
  return std::log((1 - q) * std::pow(A, order - 1) + q * std::pow(B, order - 1)) / (order - 1);
}

}  // namespace

TEST_CASE("pate: Theorem 6 against its formula, its limits, and where it falls back to alpha / sigma^2") {
  // where its conditions hold, the log-space bound is the formula
  for (double log_q : {-50.0, -20.0, -8.0})
    for (double order : {2.0, 5.0, 20.0}) {
      CAPTURE(log_q);
      CAPTURE(order);
      const double s = 10;
      const double got = gnmax_rdp_data_dependent(log_q, s, order);
      const double direct = double(theorem6_direct(std::exp((long double)log_q), s, order));
      CHECK(got == doctest::Approx(std::min(direct, order / (s * s))).epsilon(1e-6));
      CHECK(got < order / (s * s));  // a strong peak: better than data-independent
    }
  // it never exceeds the data-independent bound, and is non-decreasing in q
  for (double s : {2.0, 10.0, 40.0})
    for (double order : {1.5, 3.0, 32.0, 200.0}) {
      double last = 0;
      for (double log_q = -400; log_q <= -0.01; log_q += 0.37) {
        const double b = gnmax_rdp_data_dependent(log_q, s, order);
        CHECK(b <= order / (s * s));
        CHECK(b >= 0);
        CHECK(b >= last - 1e-12 * order / (s * s));
        last = b;
      }
    }
  // q -> 0: nothing is revealed; q = 0: exactly 0
  CHECK(gnmax_rdp_data_dependent(-1e6, 10, 5) < 1e-12);
  CHECK(gnmax_rdp_data_dependent(-std::numeric_limits<double>::infinity(), 10, 5) == 0.0);
  // conditions that fail: the data-independent bound, exactly
  CHECK(gnmax_rdp_data_dependent(std::log(0.5), 1.0, 3.0) == 3.0);        // mu2 = sqrt(log 2) < 1
  CHECK(gnmax_rdp_data_dependent(-20, 10, 100) == doctest::Approx(1.0));  // order above mu2 = 44.7
  CHECK(gnmax_rdp_data_dependent(-0.05, 40, 5) == doctest::Approx(5.0 / 1600));  // q too large
  // the threshold test: the rarer of its two outcomes, at sigma1 sqrt(2)
  const double lp = threshold_log_pass(std::vector<double>{240, 5, 5}, 150, 20);  // passes almost surely
  CHECK(lp == doctest::Approx(log_normal_cdf(4.5)));
  CHECK(threshold_rdp_data_dependent(lp, 20, 4) == doctest::Approx(gnmax_rdp_data_dependent(log1p(-std::exp(lp)),
                                                                                              20 * std::sqrt(2.0), 4)));
  CHECK(threshold_rdp_data_dependent(lp, 20, 4) < threshold_rdp(20, 4));
  CHECK(threshold_rdp_data_dependent(std::log(0.5), 20, 4) == doctest::Approx(threshold_rdp(20, 4)));
}

TEST_CASE("pate: the data-dependent account is never above the data-independent one and drops with agreement") {
  auto run = [](double top) {
    PateDataDependent d;
    for (int i = 0; i < 500; ++i) d.add(std::vector<double>{top, 250 - top}, 150, 100, 40, true);
    return d.epsilon(1e-5);
  };
  PateAccountant indep(default_rdp_orders());  // the same orders, not refined between them
  indep.record({100, 40, 500, 500});
  CHECK(run(125) <= indep.epsilon(1e-5) * (1 + 1e-12));
  CHECK(run(125) == doctest::Approx(indep.epsilon(1e-5)).epsilon(1e-6));  // a tie: no peak, no gain
  CHECK(run(250) < run(200));
  CHECK(run(250) < 0.5 * indep.epsilon(1e-5));
}

TEST_CASE("pate: GNMax answers and Confident-GNMax abstains at the rates of their Gaussian tails") {
  ReproducibleRng rng(7);
  const int n = 20000;
  // two classes 5 votes apart at sigma 5: the runner-up wins with P[N(0, 50) > 5] = erfc(0.5) / 2
  const std::vector<double> votes{50, 45};
  int second = 0;
  for (int i = 0; i < n; ++i) second += gnmax(votes, 5.0, rng) == 1;
  const double p = 0.5 * std::erfc(0.5), se = std::sqrt(p * (1 - p) / n);
  CHECK(std::abs(double(second) / n - p) < 4 * se);
  // threshold 110, top count 100, sigma1 10: passes with Phi(-1)
  const std::vector<double> v{100, 60, 40};
  int passed = 0;
  for (int i = 0; i < n; ++i) passed += confident_gnmax(v, 110, 10, 20, rng).has_value();
  const double pass = 0.5 * std::erfc(1 / std::sqrt(2.0)), se2 = std::sqrt(pass * (1 - pass) / n);
  CHECK(std::abs(double(passed) / n - pass) < 4 * se2);
  CHECK(std::exp(threshold_log_pass(v, 110, 10)) == doctest::Approx(pass).epsilon(1e-12));
  // sigma1 = 0: plain GNMax, always an answer
  CHECK(confident_gnmax(v, 1e9, 0, 20, rng).has_value());
}

TEST_CASE("pate: bad inputs are refused by name") {
  ReproducibleRng rng(1);
  FastRng fast(1);
  const std::vector<double> v{3, 1};
  CHECK_THROWS_WITH_AS(gnmax(v, 0.0, rng), doctest::Contains("sigma2 must be > 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(gnmax(v, -1.0, rng), doctest::Contains("sigma2 must be > 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(confident_gnmax(v, 2, -1, 1, rng), doctest::Contains("sigma1 must be >= 0"), std::invalid_argument);
  CHECK_THROWS_AS(gnmax(v, 1.0, fast), std::invalid_argument);  // not a generator for privacy noise
  CHECK_THROWS_WITH_AS(gnmax(std::vector<double>{1.5, 2}, 1.0, rng), doctest::Contains("whole counts"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(gnmax(std::vector<double>{}, 1.0, rng), doctest::Contains("at least one class"),
                       std::invalid_argument);
  PateAccountant a;
  CHECK_THROWS_WITH_AS(a.record({1, 0, 5, 5}), doctest::Contains("sigma2"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(a.record({1, 1, 5, 6}), doctest::Contains("answers must be in [0, queries = 5]"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(a.record({0, 1, 5, 4}), doctest::Contains("without a threshold test"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(gnmax_rdp(1, 1.0), doctest::Contains("order must be > 1"), std::invalid_argument);
  CHECK_THROWS_AS(gnmax_rdp_data_dependent(0.1, 1, 2), std::invalid_argument);
}

namespace {

/// The exact epsilon at `delta` of the Gaussian mechanism of sensitivity-to-noise
/// ratio mu (k Gaussians composed: mu = sqrt(sum of their ratios squared)):
/// delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Balle and Wang
/// 2018), decreasing in eps, solved by bisection.
double exact_gaussian_epsilon(double mu, double delta) {
  auto phi = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  auto delta_at = [&](double eps) { return phi(-eps / mu + mu / 2) - std::exp(eps) * phi(-eps / mu - mu / 2); };
  double lo = 0, hi = 1;
  while (delta_at(hi) > delta) hi *= 2;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (delta_at(mid) > delta ? lo : hi) = mid;
  }
  return hi;
}

}  // namespace

TEST_CASE("pate: the released epsilon is the tighter of RDP and PLD, labelled, and never below the exact value") {
  struct Plan {
    double sigma1, sigma2;
    long queries, answers;
  };
  for (const Plan p : {Plan{150, 40, 640, 286}, Plan{0, 20, 100, 100}, Plan{50, 30, 2000, 500}, Plan{0, 200, 5, 5}}) {
    CAPTURE(p.sigma1);
    CAPTURE(p.sigma2);
    PateAccountant a;
    a.record({p.sigma1, p.sigma2, p.queries, p.answers});
    // every query a Gaussian of sensitivity 1 at sigma1, every answer one of sensitivity sqrt(2) at sigma2
    const double mu = std::sqrt((p.sigma1 > 0 ? double(p.queries) / (p.sigma1 * p.sigma1) : 0.0) +
                                2.0 * double(p.answers) / (p.sigma2 * p.sigma2));
    const double exact = exact_gaussian_epsilon(mu, 1e-5);
    const PateEpsilon e = pate_epsilons(a, 10, 1e-5);
    CAPTURE(exact);
    CAPTURE(e.rdp);
    CAPTURE(e.pld);
    CHECK(e.epsilon == std::min(e.rdp, e.pld));
    CHECK(e.epsilon == pate_epsilon(a, 10, 1e-5));
    CHECK(e.by == std::string(e.pld < e.rdp ? "PLD" : "RDP"));
    CHECK(e.epsilon <= e.rdp);
    CHECK(e.rdp == doctest::Approx(grid_noise_epsilon_of_draws(a, 1e-5, (p.sigma1 > 0 ? double(p.queries) : 0.0) +
                                                                       10.0 * double(p.answers))));
    CHECK(e.epsilon >= exact);  // both are upper bounds
    // for composed Gaussians the PLD is within a percent of the exact value, where RDP is 5-9% above it
    CHECK(e.pld <= exact * 1.01);
    CHECK(e.epsilon < 0.97 * e.rdp);
    CHECK(e.by == std::string("PLD"));
  }
}
