// Gaussian-DP accountant: the CLT mu of the ledger and the mu-GDP duality to
// (epsilon, delta). Every output of this file is an approximation (CLT).
#include "privacy/gdp.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "privacy/conversions.hpp"

namespace dpgrad::privacy {
namespace {

// q^2 T (e^{1/sigma^2} - 1): one ledger entry's contribution to mu^2.
double mu_squared(double q, double sigma, long steps) {
  return q * q * static_cast<double>(steps) * std::expm1(1.0 / (sigma * sigma));
}

}  // namespace

double gdp_clt_mu(double q, double sigma, long steps) {
  if (!(q > 0.0 && q <= 1.0)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", q);
    throw std::invalid_argument(std::string("gdp_clt_mu: sampling rate must be in (0, 1], got ") + buf);
  }
  if (!(sigma > 0.0)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", sigma);
    throw std::invalid_argument(std::string("gdp_clt_mu: noise multiplier must be > 0, got ") + buf);
  }
  if (steps < 1) throw std::invalid_argument("gdp_clt_mu: steps must be >= 1, got " + std::to_string(steps));
  return std::sqrt(mu_squared(q, sigma, steps));
}

double GdpAccountant::mu() const {
  // Bu, Dong, Long, Su 2019: mu^2 adds up over (heterogeneous) steps.
  double m2 = 0.0;
  for (const Step& s : ledger_) m2 += mu_squared(s.sampling_rate, s.noise_multiplier, s.count);
  return std::sqrt(m2);
}

double GdpAccountant::epsilon(double delta) const { return gaussian_dp_epsilon(mu(), delta); }

double GdpAccountant::delta(double epsilon) const { return gaussian_dp_delta(mu(), epsilon); }

nlohmann::json GdpAccountant::to_json() const {
  nlohmann::json j = Accountant::to_json();
  j["approximation"] = "CLT (Bu, Dong, Long, Su 2019): may under-state epsilon for few steps";
  const double m = mu();
  if (std::isfinite(m)) j["mu"] = m;
  else j["mu"] = "inf";
  return j;
}

std::unique_ptr<Accountant> GdpAccountant::clone() const { return std::make_unique<GdpAccountant>(*this); }

std::unique_ptr<GdpAccountant> GdpAccountant::from_json(const nlohmann::json& j) {
  auto a = std::make_unique<GdpAccountant>();
  replay_ledger(*a, j);
  return a;
}

}  // namespace dpgrad::privacy
