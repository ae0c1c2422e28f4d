// The audit's statistics against closed forms.
#include <cmath>
#include <vector>

#include <doctest/doctest.h>

#include "privacy/audit_statistics.hpp"
#include "support/check.hpp"

using dpgrad::privacy::audit_epsilon;
using dpgrad::privacy::binomial_upper_bound;

TEST_CASE("audit: Clopper-Pearson upper bounds against closed forms") {
  // k = 0: P(X <= 0) = (1 - p)^n = alpha, so p = 1 - alpha^(1/n)
  for (long n : {1L, 10L, 1000L, 100000L})
    for (double alpha : {0.025, 0.05, 0.2}) {
      CAPTURE(n);
      CAPTURE(alpha);
      const double want = 1 - std::pow(alpha, 1.0 / double(n));
      CHECK(binomial_upper_bound(0, n, alpha) == doctest::Approx(want).epsilon(1e-9));
      CHECK(binomial_upper_bound(0, n, alpha) >= want);  // never below
    }
  // k = n - 1: P(X <= n - 1) = 1 - p^n = alpha, so p = (1 - alpha)^(1/n)
  for (long n : {2L, 7L, 500L})
    CHECK(binomial_upper_bound(n - 1, n, 0.05) == doctest::Approx(std::pow(0.95, 1.0 / double(n))).epsilon(1e-9));
  CHECK(binomial_upper_bound(5, 5, 0.05) == 1.0);
  // monotone in k and n, and above the point estimate
  CHECK(binomial_upper_bound(10, 100, 0.05) < binomial_upper_bound(11, 100, 0.05));
  CHECK(binomial_upper_bound(10, 100, 0.05) > binomial_upper_bound(10, 200, 0.05) * 1.5);
  CHECK(binomial_upper_bound(10, 100, 0.05) > 0.1);
  // a published value: k = 1 of n = 10 at one-sided 97.5% gives 0.4450
  CHECK(binomial_upper_bound(1, 10, 0.025) == doctest::Approx(0.4450).epsilon(1e-3));
  dpgrad::test::check_error<std::invalid_argument>([] { binomial_upper_bound(3, 2, 0.05); }, {"0 <= k <= n"});
  dpgrad::test::check_error<std::invalid_argument>([] { binomial_upper_bound(0, 2, 1.0); }, {"alpha"});
}

TEST_CASE("audit: the bound from a threshold test") {
  // perfectly separated scores: no errors on the held-out half of m per side, so
  // both rates are bounded by 1 - alpha^(1/m), alpha = (1 - confidence) / 2
  const long m = 1000;
  std::vector<double> neg(2 * m), pos(2 * m);
  for (long i = 0; i < 2 * m; ++i) {
    neg[std::size_t(i)] = -1.0 - 1e-3 * double(i % 7);
    pos[std::size_t(i)] = 1.0 + 1e-3 * double(i % 5);
  }
  const auto b = audit_epsilon(neg, pos, 1e-5, 0.95);
  const double u = 1 - std::pow(0.025, 1.0 / double(m));
  CHECK(b.false_positives == 0);
  CHECK(b.false_negatives == 0);
  CHECK(b.epsilon == doctest::Approx(std::log((1 - 1e-5 - u) / u)).epsilon(1e-6));
  CHECK(b.epsilon < std::log(double(m)));  // never more than the trials can show
  // identical distributions show nothing
  std::vector<double> same(2000);
  for (std::size_t i = 0; i < same.size(); ++i) same[i] = std::sin(double(i));
  CHECK(audit_epsilon(same, same, 1e-5, 0.95).epsilon == 0.0);
  // more confidence, smaller bound
  CHECK(audit_epsilon(neg, pos, 1e-5, 0.999).epsilon < b.epsilon);
  dpgrad::test::check_error<std::invalid_argument>([&] { audit_epsilon({1, 2}, pos, 1e-5, 0.95); }, {"at least 4"});
}

TEST_CASE("audit: one-run p-values and bounds") {
  using dpgrad::privacy::one_run_epsilon;
  using dpgrad::privacy::one_run_p_value;
  // epsilon 0, delta 0: guesses are fair coins; 10 right of 10 has p-value 2^-10
  CHECK(one_run_p_value(100, 10, 10, 0.0, 0.0) == doctest::Approx(std::pow(0.5, 10)).epsilon(1e-9));
  // all right under epsilon: q^r, q = e^eps / (1 + e^eps)
  const double q = 1 / (1 + std::exp(-1.0));
  CHECK(one_run_p_value(100, 10, 10, 1.0, 0.0) == doctest::Approx(std::pow(q, 10)).epsilon(1e-9));
  // delta only adds; more epsilon, larger p-value
  CHECK(one_run_p_value(100, 10, 8, 1.0, 1e-3) > one_run_p_value(100, 10, 8, 1.0, 0.0));
  CHECK(one_run_p_value(100, 10, 8, 2.0, 0.0) > one_run_p_value(100, 10, 8, 1.0, 0.0));
  // perfectly separated scores: the bound grows with the number of canaries, and random ones show nothing
  auto bound = [](std::size_t m, bool separated) {
    std::vector<double> scores(m);
    std::vector<bool> in(m);
    for (std::size_t i = 0; i < m; ++i) {
      in[i] = (i * 7919) % 2 == 1;
      scores[i] = separated ? (in[i] ? 1.0 : -1.0) + 1e-6 * double(i) : std::sin(double(i) * 12.9898);
    }
    return one_run_epsilon(scores, in, 1e-5, 0.95).epsilon;
  };
  CHECK(bound(1000, true) > 3);
  CHECK(bound(10000, true) > bound(1000, true));
  CHECK(bound(1000, false) < 0.5);
}
