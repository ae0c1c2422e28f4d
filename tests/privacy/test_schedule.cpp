// Tests of how runs meet accountants: the default (sound, tightest) accountant per
// sampler, epochs counted into steps, the sensitivity each neighbouring relation sees,
// and calibration refusing accountants that are not upper bounds.
#include <doctest/doctest.h>

#include <limits>
#include <stdexcept>

#include "privacy/accountant.hpp"
#include "privacy/calibration.hpp"
#include "privacy/gdp.hpp"
#include "privacy/pld.hpp"
#include "privacy/schedule.hpp"

using namespace dpgrad::privacy;

TEST_CASE("schedule: the default accountant is the tightest sound one for the sampler") {
  CHECK(default_accountant("poisson") == "pld");
  CHECK(default_accountant("fixed") == "wor");
  CHECK(default_accountant("shuffle") == "shuffle");
  CHECK_THROWS_AS(default_accountant("bernoulli"), std::invalid_argument);
  for (const char* s : {"poisson", "fixed"}) {
    AccountantOptions o;
    CHECK(make_accountant(default_accountant(s), o)->upper_bound());
  }
  CHECK(make_accountant("pld")->supports_jl());
}

TEST_CASE("schedule: epochs into steps") {
  // The demo: 60000 examples, batch 4096, 70 epochs: ceil(70 * 60000 / 4096) = ceil(1025.39) = 1026.
  CHECK(steps_for_epochs("poisson", 60000, 4096, 70) == 1026);
  CHECK(steps_for_epochs("fixed", 60000, 4096, 70) == 1026);
  CHECK(steps_for_epochs("poisson", 60000, 256, 60) == 14063);
  CHECK(steps_for_epochs("poisson", 2000, 100, 3) == 60);  // exact: no spurious extra step
  CHECK(steps_for_epochs("poisson", 2000, 100, 0.01) == 1);
  // shuffle: floor(0.5 * 1000 / 30) = 16 steps per pass.
  CHECK(steps_for_epochs("shuffle", 1000, 30, 2.5, 0.5) == 40);
  CHECK_THROWS_AS(steps_for_epochs("poisson", 100, 10, 0), std::invalid_argument);
  CHECK_THROWS_AS(steps_for_epochs("poisson", 100, 10, std::numeric_limits<double>::infinity()),
                  std::invalid_argument);
  CHECK_THROWS_AS(steps_for_epochs("poisson", 100, 200, 1), std::invalid_argument);
  CHECK_THROWS_AS(steps_for_epochs("poisson", 1L << 40, 1, 1e12), std::invalid_argument);  // beyond a long
  CHECK_THROWS_AS(steps_for_epochs("shuffle", 100, 60, 1, 0.5), std::invalid_argument);    // no whole batch
  CHECK_THROWS_AS(steps_for_epochs("magic", 100, 10, 1), std::invalid_argument);
}

TEST_CASE("schedule: the sensitivity each relation sees (microbatches: 2C under both)") {
  CHECK(accounted_sensitivity(1.0, Neighbouring::add_remove) == 1.0);
  CHECK(accounted_sensitivity(2.0, Neighbouring::add_remove) == 2.0);
  CHECK(accounted_sensitivity(1.0, Neighbouring::replace_one) == 1.0);  // 2C, inside wor/shuffle
  CHECK(accounted_sensitivity(2.0, Neighbouring::replace_one) == 1.0);  // still 2C, not 4C
  CHECK_THROWS_AS(accounted_sensitivity(0.0, Neighbouring::add_remove), std::invalid_argument);
}

TEST_CASE("calibration: refuses accountants that are not upper bounds") {
  // N = 60000, batch 256 (q = 256/60000), 15 epochs, delta 1e-5, target epsilon 1.
  const double q = 256.0 / 60000.0;
  const long steps = steps_for_epochs("poisson", 60000, 256, 15);
  GdpAccountant gdp;
  CHECK_FALSE(gdp.upper_bound());
  CHECK_THROWS_AS(calibrate_noise_multiplier("gdp", {}, q, steps, 1.0, 1e-5), std::invalid_argument);
  try {
    calibrate_noise_multiplier("gdp", {}, q, steps, 1.0, 1e-5);
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("gdp") != std::string::npos);
    CHECK(std::string(e.what()).find("upper bound") != std::string::npos);
  }
  // The sigma the CLT would pick is not enough by the sound account: that is why it is refused.
  const Calibration c = calibrate_sigma(
      [&](double sigma) {
        GdpAccountant g;
        g.step(q, sigma, steps);
        return g.epsilon(1e-5);
      },
      1.0);
  PldAccountant pld;
  pld.step(q, c.noise_multiplier, steps);
  MESSAGE("gdp's sigma " << c.noise_multiplier << " has pld epsilon " << pld.epsilon(1e-5));
  CHECK(pld.epsilon(1e-5) > 1.0);
  // The default (pld) calibrates, and its sigma meets the target by pld.
  const Calibration s = calibrate_noise_multiplier(default_accountant("poisson"), {}, q, steps, 1.0, 1e-5);
  CHECK(s.epsilon <= 1.0);
  CHECK(s.noise_multiplier > c.noise_multiplier);
}
