// Sampling-without-replacement RDP (Wang, Balle, Kasiviswanathan 2019, Thm. 9)
// for the Gaussian mechanism under replace-one neighbours, in log space.
#include "privacy/accountant.hpp"
#include "privacy/wor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace dpgrad::privacy {
namespace {

// log(e^x - 1) for x > 0 without overflow.
double log_expm1(double x) { return x > 50.0 ? x + std::log1p(-std::exp(-x)) : std::log(std::expm1(x)); }

}  // namespace

double rdp_wor_gaussian(double gamma, double sigma, int order) {
  if (!(gamma > 0.0 && gamma <= 1.0))
    throw std::invalid_argument("rdp_wor_gaussian: gamma must be in (0, 1], got " + format_number(gamma));
  if (!(sigma > 0.0) || std::isnan(sigma))
    throw std::invalid_argument("rdp_wor_gaussian: noise multiplier must be > 0, got " + format_number(sigma));
  if (order < 2) throw std::invalid_argument("rdp_wor_gaussian: order must be an integer >= 2, got " +
                                             std::to_string(order));
  if (std::isinf(sigma)) return 0.0;
  const double a = order;
  // Base mechanism: Gaussian with sensitivity 2C, noise std sigma C (Mironov 2017 Prop. 7).
  auto eps = [sigma](double j) { return 2.0 * j / (sigma * sigma); };
  const double base = eps(a);
  const double log_g = std::log(gamma);
  // Wang, Balle, Kasiviswanathan 2019 Thm. 9 (Gaussian: eps(inf) = inf, so each min{2, .} is 2):
  // (a-1) eps'(a) <= log(1 + g^2 C(a,2) min{4(e^{eps(2)} - 1), 2 e^{eps(2)}}
  //                      + sum_{j=3}^{a} g^j C(a,j) 2 e^{(j-1) eps(j)}).
  const double e2 = eps(2.0);
  double log_sum = log_add_exp(0.0, 2.0 * log_g + log_binomial(a, 2.0) +
                                         std::min(std::log(4.0) + log_expm1(e2), std::numbers::ln2 + e2));
  for (int j = 3; j <= order; ++j) {
    const double jd = j;
    log_sum = log_add_exp(log_sum, jd * log_g + log_binomial(a, jd) + std::numbers::ln2 + (jd - 1.0) * eps(jd));
  }
  // Subsampling never hurts (joint convexity), so the plain Gaussian's RDP caps the bound.
  return std::clamp(log_sum / (a - 1.0), 0.0, base);
}

WorAccountant::WorAccountant(std::vector<double> orders)
    : RdpCurveAccountant(orders.empty() ? default_integer_rdp_orders() : std::move(orders), true) {}

std::vector<double> WorAccountant::rdp() const {
  std::vector<double> total(orders_.size(), 0.0);
  for (const Step& s : ledger_)
    for (std::size_t i = 0; i < orders_.size(); ++i)
      total[i] += static_cast<double>(s.count) *
                  rdp_wor_gaussian(s.sampling_rate, s.noise_multiplier, static_cast<int>(orders_[i]));
  return total;
}

std::unique_ptr<Accountant> WorAccountant::clone() const { return std::make_unique<WorAccountant>(*this); }

std::unique_ptr<WorAccountant> WorAccountant::from_json(const nlohmann::json& j) {
  std::vector<double> orders;
  if (j.contains("orders")) orders = j.at("orders").get<std::vector<double>>();
  auto a = std::make_unique<WorAccountant>(std::move(orders));
  replay_ledger(*a, j);
  return a;
}

}  // namespace dpgrad::privacy
