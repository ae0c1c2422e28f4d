// Tests of the noise mechanisms: sample moments and distribution functions of
// Gaussian, Laplace and vector-Laplace noise against their closed forms (fixed
// seeds, tolerances of about 5 standard errors), and input checks.
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "engine/random.hpp"
#include "privacy/accountant.hpp"
#include "privacy/mechanisms.hpp"

using namespace dpgrad;
using namespace dpgrad::privacy;

TEST_CASE("Laplace mechanism: centred, scale Delta / eps") {
  ReproducibleRng rng(12345);
  const int n = 200000;
  const double b = 2.0 / 0.5;  // Delta_1 = 2, eps = 0.5
  double sum = 0, sum_abs = 0, sum_sq = 0;
  int beyond = 0;
  for (int i = 0; i < n; ++i) {
    const double x = laplace_mechanism(3.0, 2.0, 0.5, rng) - 3.0;
    sum += x;
    sum_abs += std::abs(x);
    sum_sq += x * x;
    if (std::abs(x) > b * std::log(20.0)) ++beyond;
  }
  // Lap(b): mean 0 (se b sqrt(2/n) = 0.0126), E|X| = b (se b/sqrt(n) = 0.009),
  // Var = 2 b^2 = 32 (se sqrt((24 - 4) b^4 / n) = 0.16), P(|X| > b ln 20) = 0.05 (se 0.0005).
  CHECK(std::abs(sum / n) < 0.07);
  CHECK(sum_abs / n == doctest::Approx(b).epsilon(0.0125));
  CHECK(sum_sq / n == doctest::Approx(2 * b * b).epsilon(0.025));
  CHECK(static_cast<double>(beyond) / n == doctest::Approx(0.05).epsilon(0.05));

  std::vector<double> v(1000, 1.0);
  add_laplace_noise(v, 1.0, 1.0, rng);
  int changed = 0;
  for (double x : v) changed += x != 1.0;
  CHECK(changed == 1000);
  CHECK_THROWS_AS(laplace_mechanism(0.0, 0.0, 1.0, rng), std::invalid_argument);
  CHECK_THROWS_AS(laplace_mechanism(0.0, 1.0, 0.0, rng), std::invalid_argument);
  CHECK_THROWS_AS(laplace_mechanism(0.0, 1.0, -1.0, rng), std::invalid_argument);
  CHECK_THROWS_AS(add_laplace_noise(v, 1.0, std::nan(""), rng), std::invalid_argument);
}

TEST_CASE("Gaussian mechanism: centred, given std") {
  ReproducibleRng rng(777);
  const int n = 200000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < n; ++i) {
    const double x = gaussian_mechanism(-1.0, 3.0, rng) + 1.0;
    sum += x;
    sum_sq += x * x;
  }
  // mean se 3/sqrt(n) = 0.0067; variance 9, se 9 sqrt(2/n) = 0.028.
  CHECK(std::abs(sum / n) < 0.035);
  CHECK(sum_sq / n == doctest::Approx(9.0).epsilon(0.016));
  CHECK(gaussian_mechanism(4.0, 0.0, rng) == 4.0);  // zero noise is allowed, and exact
  std::vector<double> v(10, 0.0);
  CHECK_THROWS_AS(add_gaussian_noise(v, -1.0, rng), std::invalid_argument);
  CHECK_THROWS_AS(gaussian_mechanism(0.0, std::nan(""), rng), std::invalid_argument);
}

TEST_CASE("vector Laplace noise: Gamma(d, Delta/eps) norm, uniform direction") {
  ReproducibleRng rng(2024);
  const std::size_t d = 5;
  const double s = 1.0 / 2.0;  // Delta = 1, eps = 2
  const int n = 50000;
  double norm_sum = 0;
  std::vector<double> dir_sum(d, 0.0), dir_sq(d, 0.0);
  // Gamma(5, s) CDF at r (integer shape): 1 - e^{-r/s} sum_{k<5} (r/s)^k / k!.
  auto gamma_cdf = [&](double r) {
    double term = 1, acc = 0;
    for (int k = 0; k < 5; ++k) {
      acc += term;
      term *= (r / s) / (k + 1);
    }
    return 1 - std::exp(-r / s) * acc;
  };
  const double probes[] = {1.0, 2.5, 4.0};
  int below[3] = {0, 0, 0};
  for (int i = 0; i < n; ++i) {
    const std::vector<double> eta = vector_laplace_noise(d, 1.0, 2.0, rng);
    if (eta.size() != d) FAIL("vector_laplace_noise returned " << eta.size() << " entries, want " << d);
    double nn = 0;
    for (double x : eta) nn += x * x;
    const double r = std::sqrt(nn);
    norm_sum += r;
    for (int p = 0; p < 3; ++p) below[p] += r <= probes[p];
    for (std::size_t k = 0; k < d; ++k) {
      dir_sum[k] += eta[k] / r;
      dir_sq[k] += eta[k] * eta[k] / nn;
    }
  }
  // E||eta|| = d s = 2.5 (se sqrt(d s^2 / n) = 0.005).
  CHECK(norm_sum / n == doctest::Approx(2.5).epsilon(0.01));
  for (int p = 0; p < 3; ++p) {
    const double F = gamma_cdf(probes[p]);
    CHECK(std::abs(static_cast<double>(below[p]) / n - F) < 5 * std::sqrt(F * (1 - F) / n) + 1e-4);
  }
  // Uniform direction: E u_k = 0 (se sqrt(1/(d n)) = 0.002), E u_k^2 = 1/d (se < 0.0013).
  for (std::size_t k = 0; k < d; ++k) {
    CHECK(std::abs(dir_sum[k] / n) < 0.01);
    CHECK(dir_sq[k] / n == doctest::Approx(1.0 / d).epsilon(0.035));
  }
}

TEST_CASE("output perturbation and logistic regression sensitivity") {
  ReproducibleRng a(99), b(99);
  const std::vector<double> w = {0.5, -1.0, 2.0};
  const std::vector<double> r1 = output_perturbation(w, 0.1, 1.0, a);
  const std::vector<double> r2 = output_perturbation(w, 0.1, 1.0, b);
  CHECK(r1 == r2);  // same seed, same release
  REQUIRE(r1.size() == 3);
  CHECK(r1 != w);
  // Mean of many releases is w (noise norm mean d Delta/eps = 0.3).
  ReproducibleRng rng(5);
  std::vector<double> mean(3, 0.0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const std::vector<double> r = output_perturbation(w, 0.1, 1.0, rng);
    for (int k = 0; k < 3; ++k) mean[k] += r[k] / n;
  }
  for (int k = 0; k < 3; ++k) CHECK(mean[k] == doctest::Approx(w[k]).epsilon(0.005 / std::abs(w[k])));
  // Chaudhuri et al.: 2 / (N lambda).
  CHECK(logistic_regression_sensitivity(1000, 0.01) == doctest::Approx(0.2));
  CHECK_THROWS_AS(logistic_regression_sensitivity(0, 0.01), std::invalid_argument);
  CHECK_THROWS_AS(logistic_regression_sensitivity(10, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(vector_laplace_noise(0, 1.0, 1.0, rng), std::invalid_argument);
  CHECK_THROWS_AS(vector_laplace_noise(3, 1.0, 0.0, rng), std::invalid_argument);
  CHECK_THROWS_AS(output_perturbation(w, -0.1, 1.0, rng), std::invalid_argument);
}

TEST_CASE("grid noise bound: epsilon and delta grow by the derived slack of the discrete Gaussian") {
  // 10^9 draws at s = 2^24 (values worked out to 30 digits by hand from docs/noise.md
  // sections 4 and 5), eta = 2^-44:
  // a = 10^9 (-log(1 - 1/(24 s^2)) + eta) = 1.4802973661668755e-7 + 5.6843418860808015e-5,
  // b = 10^9 (18 / s^2 + eta) = 6.3948846218409017e-5 + 5.6843418860808015e-5,
  // tau = 10^9 exp(-(12 - 2^-25)^2 / 2) = 5.38e-23, delta' = e^a (1e-5 + e tau) = 1.0000569930726409e-5
  const GridNoiseBound r = grid_noise_bound(1.0, 1e-5, 1e9, 0x1.0p24);
  CHECK(r.epsilon - 1.0 == doctest::Approx(1.7778371367664173e-4).epsilon(1e-8));
  CHECK(r.epsilon > 1.0 + 1.7778371367664173e-4);  // rounded up, never down
  CHECK(r.delta == doctest::Approx(1.0000569930726409e-5).epsilon(1e-8));
  CHECK(r.delta > 1.0000569930726409e-5 * (1 - 1e-15));
  // no draws: nothing changes; small scales: the discrete Gaussian's normaliser term counts
  const GridNoiseBound none = grid_noise_bound(2.0, 1e-6, 0, 0x1.0p24);
  CHECK(none.epsilon == 2.0);
  CHECK(none.delta == 1e-6);
  const GridNoiseBound small = grid_noise_bound(0.5, 1e-6, 1, 1.0);
  CHECK(small.epsilon - 0.5 ==
        doctest::Approx(-std::log1p(-1.0 / 24) + 18 + 3 * std::exp(-2 * M_PI * M_PI) + 0x1p-43).epsilon(1e-8));
  CHECK_THROWS_AS(grid_noise_bound(-1, 1e-5, 10, 1e6), std::invalid_argument);
  CHECK_THROWS_AS(grid_noise_bound(1, 2, 10, 1e6), std::invalid_argument);
  CHECK_THROWS_AS(grid_noise_bound(1, 1e-5, -1, 1e6), std::invalid_argument);
  CHECK_THROWS_AS(grid_noise_bound(1, 1e-5, 10, 0.5), std::invalid_argument);
}

TEST_CASE("grid noise epsilon: the accountant asked at the inner delta, plus the slack, holds at delta") {
  auto acc = dpgrad::privacy::make_accountant("pld");
  acc->step(256.0 / 60000, 1.1, 2000);
  const double delta = 1e-5, coordinates = 26010;
  const double gaussian = acc->epsilon(delta);
  const double eps = dpgrad::privacy::grid_noise_epsilon(*acc, delta, coordinates);
  // never below the Gaussian figure, and the slack is small for 5.2e7 draws at scale 2^24
  CHECK(eps > gaussian);
  CHECK(eps < gaussian + 1e-3);
  // grid_noise_bound applied to the accountant's figure at the inner delta gives (eps, <= delta)
  const auto slack = dpgrad::privacy::grid_noise_slack(delta, 2000 * coordinates, 0x1p24, gaussian);
  CHECK(slack.inner_delta < delta);
  CHECK(slack.inner_delta > delta * (1 - 0x1p-9));
  const auto bound = dpgrad::privacy::grid_noise_bound(acc->epsilon(slack.inner_delta), slack.inner_delta,
                                                       2000 * coordinates, 0x1p24);
  CHECK(bound.epsilon == doctest::Approx(eps).epsilon(1e-12));
  CHECK(bound.delta <= delta);
  // so many draws at a small scale that e^(n a) swallows delta: no finite claim
  CHECK(std::isinf(dpgrad::privacy::grid_noise_epsilon(*acc, delta, 1e60, 1.0)));
  // a large epsilon (here, few coordinates but little noise) still gets a finite bound: R grows with it
  auto loud = dpgrad::privacy::make_accountant("pld");
  loud->step(0.5, 0.3, 50);
  const double big = loud->epsilon(delta);
  REQUIRE(big > 40);
  const double claimed = dpgrad::privacy::grid_noise_epsilon(*loud, delta, 6e5);
  CHECK(claimed > big);
  CHECK(claimed < big * 1.001);
}

TEST_CASE("noisy clipped sum: rows scaled to the bound, summed, with noise of std sigma * bound per coordinate") {
  // 3 rows of dimension 2: (3, 4) has norm 5 and is scaled to (0.6, 0.8); the others are within the bound
  const std::vector<float> rows{3, 4, 0.5f, 0, 0, -0.25f};
  const double sigma = 1e-6;  // so small that the sum shows through: (1.1, 0.55)
  ReproducibleRng rng(31);
  const std::vector<double> s = noisy_clipped_sum(rows, 2, 1.0, sigma, rng);
  REQUIRE(s.size() == 2);
  CHECK(s[0] == doctest::Approx(1.1).epsilon(1e-4));
  CHECK(s[1] == doctest::Approx(0.55).epsilon(1e-4));
  // the noise: zero rows, 200,000 coordinates, std sigma * bound = 2 x 3 = 6 (variance se 36 sqrt(2/n) = 0.11)
  const std::size_t d = 200000;
  const std::vector<float> zeros(2 * d, 0.0f);
  const std::vector<double> noise = noisy_clipped_sum(zeros, d, 2.0, 3.0, rng);
  double sum = 0, sum_sq = 0;
  for (double x : noise) {
    sum += x;
    sum_sq += x * x;
  }
  CHECK(std::abs(sum / double(d)) < 0.07);  // se 6 / sqrt(n) = 0.013
  CHECK(sum_sq / double(d) == doctest::Approx(36.0).epsilon(0.016));
  // refused: rows that do not fill the dimension, a bad bound or multiplier, non-finite rows, a predictable generator
  CHECK_THROWS_AS(noisy_clipped_sum(rows, 4, 1.0, 1.0, rng), std::invalid_argument);
  CHECK_THROWS_AS(noisy_clipped_sum(rows, 2, 0.0, 1.0, rng), std::invalid_argument);
  CHECK_THROWS_AS(noisy_clipped_sum(rows, 2, 1.0, 0.0, rng), std::invalid_argument);
  const std::vector<float> bad{1, std::nanf("")};
  CHECK_THROWS_AS(noisy_clipped_sum(bad, 2, 1.0, 1.0, rng), std::invalid_argument);
  FastRng fast(1);
  CHECK_THROWS_AS(noisy_clipped_sum(rows, 2, 1.0, 1.0, fast), std::invalid_argument);
}

TEST_CASE("noisy clipped sum: neighbouring data sets' releases differ by at most the bound, grid rounding included") {
  // The same noise on both (one seed): the releases differ by what the rounded sums do. At sigma 1e4 the
  // grid is coarse (about 6e-4 of the bound), and a row of norm >> bound added to data that rounds to
  // another grid point moved the release by 1.0005 bound when rows were clipped to the bound itself.
  const std::size_t d = 3;
  for (const double sigma : {1e4, 1e3, 10.0}) {
    double worst = 0;
    for (std::uint64_t trial = 0; trial < 200; ++trial) {
      FastRng data(trial);
      std::vector<float> rows;
      for (int i = 0; i < 5; ++i)
        for (std::size_t k = 0; k < d; ++k) rows.push_back(float(data.uniform() - 0.5) * 0.3f);
      std::vector<float> more = rows;
      for (std::size_t k = 0; k < d; ++k) more.push_back(k == trial % d ? 1e6f : float(data.uniform()));
      ReproducibleRng a(trial), b(trial);
      const std::vector<double> x = noisy_clipped_sum(rows, d, 1.0, sigma, a);
      const std::vector<double> y = noisy_clipped_sum(more, d, 1.0, sigma, b);
      double sq = 0;
      for (std::size_t k = 0; k < d; ++k) sq += (y[k] - x[k]) * (y[k] - x[k]);
      worst = std::max(worst, std::sqrt(sq));
    }
    INFO("sigma " << sigma);
    CHECK(worst <= 1.0);
    CHECK(worst > 0.99);  // the clip is tight, not a wide margin
  }
}
