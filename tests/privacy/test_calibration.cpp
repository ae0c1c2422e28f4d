// Tests of noise calibration: the generic bisection on closed forms, and round
// trips for every accountant (epsilon(calibrated sigma) <= target, within 1%,
// and a slightly smaller sigma overshoots).
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "privacy/accountant.hpp"
#include "privacy/calibration.hpp"
#include "privacy/conversions.hpp"

using namespace dpgrad::privacy;

TEST_CASE("calibrate_sigma on closed forms") {
  // epsilon(sigma) = 10 / sigma: target 2 at sigma = 5 exactly.
  const Calibration c = calibrate_sigma([](double s) { return 10.0 / s; }, 2.0);
  CHECK(c.noise_multiplier >= 5.0);
  CHECK(c.noise_multiplier == doctest::Approx(5.0).epsilon(1e-4));
  CHECK(c.epsilon <= 2.0);
  CHECK(c.epsilon >= 0.99 * 2.0);
  // Targets needing tiny or huge sigma are bracketed too.
  CHECK(calibrate_sigma([](double s) { return 1e-2 / s; }, 1.0).noise_multiplier ==
        doctest::Approx(1e-2).epsilon(1e-4));
  CHECK(calibrate_sigma([](double s) { return 1e4 / s; }, 1.0).noise_multiplier ==
        doctest::Approx(1e4).epsilon(1e-4));
  // A jump: nothing gets within 1% of the target; the result is the smallest
  // sigma past the jump, and still safe.
  const Calibration j = calibrate_sigma([](double s) { return s < 3.0 ? 10.0 : 1.0; }, 2.0);
  CHECK(j.noise_multiplier >= 3.0);
  CHECK(j.noise_multiplier < 3.0 * (1 + 1e-9));
  CHECK(j.epsilon == 1.0);
  CHECK_THROWS_AS(calibrate_sigma([](double s) { return 10.0 / s; }, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(calibrate_sigma([](double) { return 5.0; }, 1.0), std::invalid_argument);  // never reached
  CHECK_THROWS_AS(calibrate_sigma([](double) { return 0.0; }, 1.0), std::invalid_argument);  // no smallest
}

TEST_CASE("calibration round trips for every accountant") {
  AccountantOptions opts;
  opts.dataset_size = 25000;
  opts.batch_size = 256;
  opts.epoch_fraction = 0.5;
  const double q = 256.0 / 25000.0, delta = 1e-5;
  // gdp is an approximation, not an upper bound: it never calibrates.
  CHECK_THROWS_AS(calibrate_noise_multiplier("gdp", opts, q, 1954, 3.0, delta), std::invalid_argument);
  for (const std::string name : {"rdp", "wor", "shuffle"}) {
    for (double target : {0.5, 3.0, 8.0}) {
      CAPTURE(name);
      CAPTURE(target);
      const long steps = 1954;  // 20 epochs of 25000 / 256, rounded up
      const Calibration c = calibrate_noise_multiplier(name, opts, q, steps, target, delta);
      auto eps_at = [&](double sigma) {
        auto a = make_accountant(name, opts);
        a->step(q, sigma, steps);
        return a->epsilon(delta);
      };
      const double e = eps_at(c.noise_multiplier);
      CHECK(e == c.epsilon);
      CHECK(e <= target);
      CHECK(e >= 0.99 * target);
      CHECK(eps_at(c.noise_multiplier * (1 - 1e-3)) > target);  // the smallest sigma, to 1e-3
    }
  }
}

TEST_CASE("calibration: q = 1, one step, gdp is the analytic Gaussian") {
  // One full-batch step is exactly mu-GDP with mu = 1/sigma (the CLT formula
  // gives sqrt(e^{1/s^2} - 1) instead, so use the analytic calibration directly):
  // sigma for (1, 1e-5) = 3.7306316348159418322 (mpmath findroot).
  const Calibration c = calibrate_sigma([](double s) { return gaussian_dp_epsilon(1.0 / s, 1e-5); }, 1.0);
  CHECK(c.noise_multiplier == doctest::Approx(3.7306316348159418322).epsilon(2e-4));
  CHECK(c.noise_multiplier >= 3.7306316348159418322 * (1 - 1e-9));
}

TEST_CASE("calibration: bad inputs") {
  AccountantOptions opts;
  CHECK_THROWS_AS(calibrate_noise_multiplier("rdp", opts, 0.01, 100, 1.0, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(calibrate_noise_multiplier("rdp", opts, 0.01, 100, -1.0, 1e-5), std::invalid_argument);
  CHECK_THROWS_AS(calibrate_noise_multiplier("rdp", opts, 1.5, 100, 1.0, 1e-5), std::invalid_argument);
  CHECK_THROWS_AS(calibrate_noise_multiplier("rdp", opts, 0.01, 0, 1.0, 1e-5), std::invalid_argument);
  CHECK_THROWS_AS(calibrate_noise_multiplier("rdp", opts, 0.01, 100, 1.0, 1e-5, 4), std::invalid_argument);
  CHECK_THROWS_AS(calibrate_noise_multiplier("nope", opts, 0.01, 100, 1.0, 1e-5), std::invalid_argument);
  // Below what the rdp conversion can certify with the grid's orders <= 256 refined up to
  // 512: log(511/512) - (log 1e-5 + log 512) / 511 = 0.0084 at 1e-5.
  CHECK_THROWS_AS(calibrate_noise_multiplier("rdp", opts, 0.01, 100, 0.005, 1e-5), std::invalid_argument);
}
