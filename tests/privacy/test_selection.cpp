// Private selection's analysis (privacy/selection.hpp, docs/math.md section 9):
// the trial-count distributions against their closed forms, draws against the
// pmf, Theorem 2 against its closed form for Gaussian trials (and a value
// worked out by hand), Theorem 6 against the formula with the Gaussian's exact
// delta, the limiting cases, and the search's (epsilon, delta) with its cap.
#include <cmath>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "engine/random.hpp"
#include "privacy/conversions.hpp"
#include "privacy/rdp.hpp"
#include "privacy/selection.hpp"

using namespace dpgrad;
using namespace dpgrad::privacy;

namespace {

double relative(double a, double b) { return std::abs(a - b) / std::abs(b); }

TrialCount tnb(double eta, double gamma) {
  TrialCount k;
  k.eta = eta;
  k.gamma = gamma;
  return k;
}

TrialCount poisson(double mu) {
  TrialCount k;
  k.kind = TrialCount::Kind::poisson;
  k.mu = mu;
  return k;
}

/// Theorem 2 for trials that are (l, l rho)-RDP at every order (Gaussian trials, rho = 1/(2 sigma^2)),
/// minimised over hat-lambda by hand: the minimum of (l^ - 1) rho + log(1/gamma) / l^ is at
/// l^ = sqrt(log(1/gamma) / rho), where it is 2 sqrt(rho log(1/gamma)) - rho.
double theorem2_gaussian(double eta, double gamma, double rho, double l) {
  const double L = std::log(1 / gamma);
  return l * rho + (1 + eta) * (2 * std::sqrt(rho * L) - rho) + std::log(tnb(eta, gamma).mean()) / (l - 1);
}

}  // namespace

TEST_CASE("selection: the truncated negative binomial's pmf sums to 1, has its closed-form mean, and is geometric at eta 1") {
  for (double eta : {-0.5, 0.0, 0.5, 1.0, 3.0})
    for (double gamma : {0.05, 0.3, 0.8}) {
      CAPTURE(eta);
      CAPTURE(gamma);
      const TrialCount k = tnb(eta, gamma);
      double total = 0, mean = 0;
      for (long j = 1; j < 20000; ++j) {
        total += k.pmf(j);
        mean += double(j) * k.pmf(j);
      }
      CHECK(std::abs(total - 1) < 1e-9);
      CHECK(relative(mean, k.mean()) < 1e-9);
      CHECK(k.pmf(0) == 0);
      if (eta == 1)
        for (long j = 1; j < 30; ++j) CHECK(relative(k.pmf(j), gamma * std::pow(1 - gamma, double(j - 1))) < 1e-12);
      if (eta == 0)  // logarithmic distribution
        for (long j = 1; j < 30; ++j)
          CHECK(relative(k.pmf(j), std::pow(1 - gamma, double(j)) / (double(j) * std::log(1 / gamma))) < 1e-12);
    }
  CHECK(relative(tnb(1, 0.1).mean(), 10) < 1e-12);
}

TEST_CASE("selection: Poisson's pmf and mean; tails are upper bounds close to 1 - cdf; quantiles") {
  const TrialCount p = poisson(3.5);
  double total = 0, mean = 0;
  for (long j = 0; j < 200; ++j) {
    total += p.pmf(j);
    mean += double(j) * p.pmf(j);
  }
  CHECK(std::abs(total - 1) < 1e-12);
  CHECK(relative(mean, 3.5) < 1e-12);
  CHECK(relative(p.pmf(2), std::exp(-3.5) * 3.5 * 3.5 / 2) < 1e-12);
  for (const TrialCount& k : {p, tnb(1, 0.2), tnb(-0.5, 0.1), tnb(3, 0.3)})
    for (long cap : {1L, 3L, 10L, 40L}) {
      double cdf = 0;
      for (long j = 0; j <= cap; ++j) cdf += k.pmf(j);
      const double t = k.tail(cap);
      CHECK(t >= 1 - cdf - 1e-15);
      if (1 - cdf > 1e-8) CHECK(relative(t, 1 - cdf) < 1e-6);
    }
  // geometric: P[K > k] = (1 - gamma)^k exactly
  CHECK(relative(tnb(1, 0.2).tail(25), std::pow(0.8, 25)) < 1e-8);
  for (double prob : {0.1, 1e-3, 1e-9}) {
    const long q = tnb(1, 0.2).quantile(prob);
    CHECK(tnb(1, 0.2).tail(q) <= prob);
    CHECK(tnb(1, 0.2).tail(q - 1) > prob);
  }
}

TEST_CASE("selection: draws follow the pmf and stop at the cap") {
  FastRng rng(5);
  for (const TrialCount& k : {tnb(1, 0.25), tnb(0, 0.1), poisson(2)}) {
    const int n = 40000;
    double sum = 0;
    int ones = 0;
    for (int i = 0; i < n; ++i) {
      const long d = k.draw(rng, 1000);
      sum += double(d);
      ones += d == 1;
    }
    double var = 0;
    for (long j = 0; j < 2000; ++j) var += k.pmf(j) * (double(j) - k.mean()) * (double(j) - k.mean());
    CHECK(std::abs(sum / n - k.mean()) < 5 * std::sqrt(var / n));
    const double p1 = k.pmf(1);
    CHECK(std::abs(ones / double(n) - p1) < 5 * std::sqrt(p1 * (1 - p1) / n));
  }
  for (int i = 0; i < 100; ++i) CHECK(tnb(1, 0.01).draw(rng, 3) <= 3);
}

TEST_CASE("selection: Theorem 2 against its closed form for Gaussian trials, and a value worked out by hand") {
  // (1) rho 0.1, eta 1, gamma 0.1, order 8, by hand: 0.8 + 2 (2 sqrt(0.1 ln 10) - 0.1) + ln(10) / 7 = 2.848351...
  std::vector<double> inner;
  for (double l = 1.0; l < 200; l *= 1.0005) inner.push_back(l);
  const auto gauss = [](double rho) { return [rho](double l) { return l * rho; }; };
  const double r = selection_rdp_negative_binomial(tnb(1, 0.1), {8.0}, gauss(0.1), inner)[0];
  CHECK(r >= 2.8483510924458106);
  CHECK(relative(r, 2.8483510924458106) < 1e-6);
  // (2) the closed form over eta, gamma, rho and the order: never below it, and close with a fine inner grid
  for (double eta : {0.0, 1.0, 2.0})
    for (double gamma : {0.05, 0.3})
      for (double rho : {0.01, 0.2})
        for (double l : {2.0, 5.5, 32.0}) {
          CAPTURE(eta);
          CAPTURE(gamma);
          CAPTURE(rho);
          CAPTURE(l);
          const double ours = selection_rdp_negative_binomial(tnb(eta, gamma), {l}, gauss(rho), inner)[0];
          const double closed = theorem2_gaussian(eta, gamma, rho, l);
          CHECK(ours >= closed);
          CHECK(relative(ours, closed) < 1e-5);
        }
  // (3) the coarse default grid as inner orders gives a bound at or above the exact minimum
  const auto orders = default_rdp_orders();
  for (double l : {2.0, 8.0}) {
    const double coarse = selection_rdp_negative_binomial(tnb(1, 0.1), {l}, gauss(0.1), orders)[0];
    CHECK(coarse >= theorem2_gaussian(1, 0.1, 0.1, l));
    CHECK(relative(coarse, theorem2_gaussian(1, 0.1, 0.1, l)) < 0.02);
  }
}

TEST_CASE("selection: Theorem 6 (Poisson) against the formula with the Gaussian's exact delta") {
  // sigma sqrt(5) (rho 0.1), mu 5, order 8: hat-epsilon = log(8/7), the Gaussian's exact delta there
  // (Balle and Wang) 0.126380715..., so R = 0.8 + 5 * 0.126380715 + ln(5)/7 = 1.661823...
  const double sigma = std::sqrt(5.0);
  const auto exact_delta = [&](double eps) { return analytic_gaussian_delta(1.0, sigma, eps); };
  const double r = selection_rdp_poisson(poisson(5), {8.0}, [](double l) { return 0.1 * l; }, exact_delta)[0];
  CHECK(r >= 1.6618232787006741);
  CHECK(relative(r, 1.6618232787006741) < 1e-6);
  // through the RDP curve alone (its delta bound is above the exact one): never below
  const auto orders = default_rdp_orders();
  std::vector<double> curve;
  for (double l : orders) curve.push_back(0.1 * l);
  const auto from_curve = selection_rdp(poisson(5), orders, curve);
  for (std::size_t i = 0; i < orders.size(); ++i) {
    const double exact = selection_rdp_poisson(poisson(5), {orders[i]}, [](double l) { return 0.1 * l; }, exact_delta)[0];
    CHECK(from_curve[i] >= exact);
  }
}

TEST_CASE("selection: limiting cases: one trial almost surely costs one trial; more trials cost more") {
  const auto orders = default_rdp_orders();
  std::vector<double> curve;
  for (double l : orders) curve.push_back(0.05 * l);
  // gamma -> 1: K = 1 almost surely, and the bound tends to the trial's own RDP
  double previous = INFINITY;
  for (double gamma : {0.5, 0.9, 0.99, 0.999999}) {
    const auto r = selection_rdp(tnb(1, gamma), orders, curve);
    const double excess = r[10] - curve[10];
    CHECK(excess >= 0);
    CHECK(excess < previous);
    previous = excess;
  }
  CHECK(previous < 0.02);
  // the search never claims less than one trial's RDP (eta >= 0), and a smaller gamma (more trials) costs more
  const auto few = selection_rdp(tnb(1, 0.5), orders, curve), many = selection_rdp(tnb(1, 0.05), orders, curve);
  for (std::size_t i = 0; i < orders.size(); ++i) {
    CHECK(few[i] >= curve[i]);
    CHECK(many[i] > few[i]);
  }
  // Poisson: a larger mean costs more at every order
  const auto p2 = selection_rdp(poisson(2), orders, curve), p20 = selection_rdp(poisson(20), orders, curve);
  for (std::size_t i = 0; i < orders.size(); ++i) CHECK(p20[i] > p2[i]);
}

TEST_CASE("selection: the search's epsilon includes the conversion, the cap's tail and the grid, and grows with the trials") {
  const auto orders = default_rdp_orders();
  std::vector<double> curve, none(orders.size(), 0.0);
  for (double l : orders) curve.push_back(rdp_subsampled_gaussian(0.01, 1.0, l) * 1000);
  const double delta = 1e-5;
  const SearchEpsilon s = search_epsilon(tnb(1, 0.2), orders, curve, none, delta, 1e6);
  const double plain = rdp_to_epsilon(orders, selection_rdp(tnb(1, 0.2), orders, curve), delta).epsilon;
  CHECK(s.epsilon > plain);
  CHECK(s.epsilon < plain * 1.05);
  CHECK(s.max_trials >= 1);
  CHECK(s.tail * (1 + std::exp(s.epsilon)) <= delta / 2);
  CHECK(s.tail == tnb(1, 0.2).tail(s.max_trials));
  // releases before the search add to it; more trials (smaller gamma) cost more
  std::vector<double> prior;
  for (double l : orders) prior.push_back(l / (2 * 25.0));
  CHECK(search_epsilon(tnb(1, 0.2), orders, curve, prior, delta, 1e6).epsilon > s.epsilon);
  CHECK(search_epsilon(tnb(1, 0.02), orders, curve, none, delta, 1e6).epsilon > s.epsilon);
}

TEST_CASE("selection: trial counts are parsed and checked") {
  CHECK(TrialCount::parse("tnb:1,0.2").mean() == doctest::Approx(5));
  CHECK(TrialCount::parse("poisson:4").mu == 4);
  for (const char* bad : {"tnb:1", "tnb:1,0", "tnb:-1,0.5", "tnb:1,1", "poisson:0", "poisson:x", "poisson:", "geometric:3",
                          "tnb:1,0.2x", "poisson:nan", "tnb:1,1e-9", "tnb:1,0x0.2p0", "poisson: 4"})
    CHECK_THROWS_AS(TrialCount::parse(bad), std::invalid_argument);
  const TrialCount k = TrialCount::from_json(tnb(0.5, 0.3).to_json());
  CHECK(k.eta == 0.5);
  CHECK(k.gamma == 0.3);
  CHECK_THROWS_AS(TrialCount::from_json(nlohmann::json{{"distribution", "poisson"}, {"mu", -1}}), std::invalid_argument);
}
