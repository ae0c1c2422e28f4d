// Tests of the Gaussian-DP (CLT) accountant: the closed-form mu, composition of
// mu^2 over heterogeneous ledgers, the delta(eps) curve and its inverse, labels.
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "privacy/conversions.hpp"
#include "privacy/gdp.hpp"
#include "privacy/rdp.hpp"

using namespace dpgrad::privacy;

TEST_CASE("gdp: mu is q sqrt(T (e^{1/sigma^2} - 1))") {
  // Tutorial point: q = 256/60000, sigma = 1.1, T = 14063.
  // mpmath (40 digits): mu = 0.57360147039228347412, epsilon(1e-5) = 2.3243616628354374079 (findroot).
  GdpAccountant a;
  a.step(256.0 / 60000.0, 1.1, 14063);
  CHECK(a.mu() == doctest::Approx(0.57360147039228347412).epsilon(1e-12));
  CHECK(gdp_clt_mu(256.0 / 60000.0, 1.1, 14063) == doctest::Approx(a.mu()).epsilon(1e-15));
  const double e = a.epsilon(1e-5);
  CHECK(e == doctest::Approx(2.3243616628354374079).epsilon(1e-9));
  CHECK(e >= 2.3243616628354374079);
  CHECK(a.delta(e) <= 1e-5 * (1 + 1e-9));
  // The CLT is below the RDP upper bound here (an approximation, not a bound).
  RdpAccountant r;
  r.step(256.0 / 60000.0, 1.1, 14063);
  CHECK(e < r.epsilon(1e-5));
}

TEST_CASE("gdp: heterogeneous steps add mu^2") {
  GdpAccountant a;
  a.step(0.01, 1.0, 1000);
  a.step(0.02, 2.0, 500);
  const double m1 = gdp_clt_mu(0.01, 1.0, 1000), m2 = gdp_clt_mu(0.02, 2.0, 500);
  CHECK(a.mu() == doctest::Approx(std::sqrt(m1 * m1 + m2 * m2)).epsilon(1e-14));
  // Splitting a run into pieces changes nothing.
  GdpAccountant b;
  b.step(0.01, 1.0, 400);
  b.step(0.02, 2.0, 500);
  b.step(0.01, 1.0, 600);
  CHECK(b.mu() == doctest::Approx(a.mu()).epsilon(1e-14));
}

TEST_CASE("gdp: monotone, limits and labels") {
  auto eps = [](double q, double sigma, long t) {
    GdpAccountant a;
    a.step(q, sigma, t);
    return a.epsilon(1e-5);
  };
  CHECK(eps(0.01, 1.0, 2000) > eps(0.01, 1.0, 1000));
  CHECK(eps(0.02, 1.0, 1000) > eps(0.01, 1.0, 1000));
  CHECK(eps(0.01, 0.8, 1000) > eps(0.01, 1.0, 1000));
  CHECK(eps(1e-7, 1.0, 10) == 0.0);  // mu tiny: TV distance below delta
  // Tiny sigma: mu overflows to infinity, epsilon is +inf, no crash.
  CHECK(std::isinf(eps(0.5, 0.01, 10)));
  GdpAccountant a;
  CHECK(a.epsilon(1e-5) == 0.0);  // empty ledger
  CHECK(a.label() == "approximation (CLT)");
  CHECK(a.to_json().at("approximation").get<std::string>().find("CLT") != std::string::npos);
  CHECK_THROWS_AS(gdp_clt_mu(0.0, 1.0, 1), std::invalid_argument);
  CHECK_THROWS_AS(gdp_clt_mu(0.1, 0.0, 1), std::invalid_argument);
  CHECK_THROWS_AS(gdp_clt_mu(0.1, 1.0, 0), std::invalid_argument);
  CHECK_THROWS_AS(a.epsilon(0.0), std::invalid_argument);
  CHECK_THROWS_AS(a.delta(-1.0), std::invalid_argument);
}
