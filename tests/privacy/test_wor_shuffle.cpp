// Tests of the without-replacement (Wang, Balle, Kasiviswanathan 2019) and
// shuffled-passes (Berthier et al. 2019) accountants: reference values,
// monotonicity in gamma and f, the small-f and f -> 1 limits, composition.
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "privacy/shuffle.hpp"
#include "privacy/wor.hpp"

using namespace dpgrad::privacy;

TEST_CASE("wor: Thm. 9 values") {
  // mpmath (50 digits) of the same bound, written out independently:
  // min(log(1 + g^2 C(a,2) min(4 expm1(e2), 2 e^{e2}) + sum_j g^j C(a,j) 2 e^{(j-1) e(j)}) / (a-1), 2a/s^2),
  // e(j) = 2j/s^2.
  struct Ref { double gamma, sigma; int order; double rdp; };
  const Ref refs[] = {
      {0.01, 2.0, 2, 0.00054350863810943248598},  {0.01, 2.0, 3, 0.00083487268495441282335},
      {0.01, 2.0, 10, 0.067422384513373217292},   {0.001, 4.0, 32, 0.00001886011051196451346},
      {0.1, 0.8, 8, 22.467495205229651551},       {0.01, 1.0, 2, 0.01086044133599156427},
  };
  for (const Ref& r : refs) {
    CAPTURE(r.gamma);
    CAPTURE(r.sigma);
    CAPTURE(r.order);
    CHECK(rdp_wor_gaussian(r.gamma, r.sigma, r.order) == doctest::Approx(r.rdp).epsilon(1e-10));
  }
  // gamma = 1/2, order 2: 1 + (1/4) 4 (e^{e2} - 1) = e^{e2}: exactly the unamplified 4/sigma^2.
  CHECK(rdp_wor_gaussian(0.5, 5.0, 2) == doctest::Approx(4.0 / 25.0).epsilon(1e-14));
  // gamma = 1: never above the plain Gaussian with sensitivity 2C.
  for (int a : {2, 5, 64}) CHECK(rdp_wor_gaussian(1.0, 1.5, a) == doctest::Approx(2.0 * a / 2.25));
  // Small noise, high order: finite (log space), capped.
  CHECK(std::isfinite(rdp_wor_gaussian(0.3, 0.2, 256)));
  CHECK_THROWS_AS(rdp_wor_gaussian(0.0, 1.0, 2), std::invalid_argument);
  CHECK_THROWS_AS(rdp_wor_gaussian(0.1, 0.0, 2), std::invalid_argument);
  CHECK_THROWS_AS(rdp_wor_gaussian(0.1, 1.0, 1), std::invalid_argument);
}

TEST_CASE("wor: monotone in gamma, sigma and steps; replace-one") {
  for (int a : {2, 3, 16, 128}) {
    CAPTURE(a);
    CHECK(rdp_wor_gaussian(0.02, 2.0, a) > rdp_wor_gaussian(0.01, 2.0, a));
    CHECK(rdp_wor_gaussian(0.01, 1.5, a) > rdp_wor_gaussian(0.01, 2.0, a));
  }
  auto eps = [](double g, double s, long t) {
    WorAccountant w;
    w.step(g, s, t);
    return w.epsilon(1e-5);
  };
  CHECK(eps(0.02, 2.0, 1000) > eps(0.01, 2.0, 1000));
  CHECK(eps(0.01, 2.0, 2000) > eps(0.01, 2.0, 1000));
  CHECK(eps(0.01, 1.5, 1000) > eps(0.01, 2.0, 1000));
  CHECK(WorAccountant().neighbouring() == Neighbouring::replace_one);
  const WorAccountant defaults;
  for (double a : defaults.orders()) CHECK(a == std::floor(a));
}

TEST_CASE("shuffle: the rates of a pass and its composition") {
  ShuffleAccountant s(1000, 10, 0.5);
  CHECK(s.steps_per_epoch() == 50);
  CHECK(s.sampling_rate_at(1) == doctest::Approx(0.01));
  CHECK(s.sampling_rate_at(50) == doctest::Approx(10.0 / (1000 - 49 * 10)));
  CHECK_THROWS_AS(s.sampling_rate_at(51), std::invalid_argument);
  // Heterogeneous ledger: 30 steps at sigma 2, then 100 at sigma 3: positions
  // 1..30 | 31..50, 1..50, 1..30. Independent sum over positions:
  s.step(0.01, 2.0, 30);
  s.step(0.01, 3.0, 100);
  const std::vector<double> r = s.rdp();
  for (std::size_t i = 0; i < s.orders().size(); i += 7) {
    const int a = static_cast<int>(s.orders()[i]);
    double expected = 0.0;
    for (long t = 1; t <= 30; ++t) expected += rdp_wor_gaussian(s.sampling_rate_at(t), 2.0, a);
    for (long t = 31; t <= 50; ++t) expected += rdp_wor_gaussian(s.sampling_rate_at(t), 3.0, a);
    for (long t = 1; t <= 50; ++t) expected += rdp_wor_gaussian(s.sampling_rate_at(t), 3.0, a);
    for (long t = 1; t <= 30; ++t) expected += rdp_wor_gaussian(s.sampling_rate_at(t), 3.0, a);
    CHECK(r[i] == doctest::Approx(expected).epsilon(1e-12));
  }
  // At least one step per pass even when f n / b < 1; its rate is b / n.
  ShuffleAccountant one(100, 30, 0.2);
  CHECK(one.steps_per_epoch() == 1);
}

TEST_CASE("shuffle: small f is close to wor; monotone in f; f -> 1 loses amplification") {
  // n = 100000, b = 100, f = 0.01: 10 steps per pass, gamma_t in [1e-3, 1.0091e-3].
  const long steps = 2000;
  ShuffleAccountant s(100000, 100, 0.01);
  s.step(1e-3, 1.5, steps);
  WorAccountant w;
  w.step(1e-3, 1.5, steps);
  const double es = s.epsilon(1e-5), ew = w.epsilon(1e-5);
  CHECK(es >= ew);
  CHECK(es == doctest::Approx(ew).epsilon(0.01));
  // Monotone in f for the same number of steps (later positions have larger gamma_t).
  double prev = 0.0;
  for (double f : {0.05, 0.2, 0.5, 0.9}) {
    ShuffleAccountant a(1000, 10, f);
    a.step(0.01, 2.0, 500);
    const double e = a.epsilon(1e-5);
    CHECK(e > prev);
    prev = e;
  }
  // f -> 1: the last step of a pass (gamma = 10 / (1000 - 98 * 10) = 1/2) costs
  // as much as the unamplified Gaussian at order 2 (4 / sigma^2), while the first costs ~gamma^2 of it.
  ShuffleAccountant late(1000, 10, 0.999);
  REQUIRE(late.steps_per_epoch() == 99);
  CHECK(late.sampling_rate_at(99) == doctest::Approx(0.5));
  CHECK(rdp_wor_gaussian(late.sampling_rate_at(99), 5.0, 2) == doctest::Approx(4.0 / 25.0));
  CHECK(rdp_wor_gaussian(late.sampling_rate_at(1), 5.0, 2) < 1e-3 * 4.0 / 25.0);
}

TEST_CASE("shuffle: bad settings") {
  CHECK_THROWS_AS(ShuffleAccountant(1000, 10, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(ShuffleAccountant(1000, 10, 1.0), std::invalid_argument);
  CHECK_THROWS_AS(ShuffleAccountant(1000, 10, -0.5), std::invalid_argument);
  CHECK_THROWS_AS(ShuffleAccountant(0, 1, 0.5), std::invalid_argument);
  CHECK_THROWS_AS(ShuffleAccountant(10, 11, 0.5), std::invalid_argument);
  CHECK_THROWS_AS(ShuffleAccountant(10, 0, 0.5), std::invalid_argument);
  CHECK_THROWS_AS(ShuffleAccountant(1000, 10, 0.5, {2.5}), std::invalid_argument);
  ShuffleAccountant s(1000, 10, 0.5);
  CHECK_THROWS_AS(s.step(0.02, 1.0), std::invalid_argument);  // q must be b/n
  CHECK_THROWS_AS(s.step(0.01, 0.0), std::invalid_argument);
  CHECK(s.ledger().empty());
}
