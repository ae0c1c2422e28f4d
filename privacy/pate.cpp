// PATE's accounting (privacy/pate.hpp, docs/pate.md): the RDP of its mechanisms,
// data-independent and data-dependent, and its accountant. The mechanisms
// themselves are in pate_aggregate.cpp.
#include "privacy/pate.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "privacy/conversions.hpp"
#include "privacy/pate_checks.hpp"

namespace dpgrad::privacy {

namespace {

using namespace pate_detail;

/// Theorem 6 of Papernot et al. 2018 for a mechanism that is (mu, mu / s^2)-RDP
/// at every mu and whose likeliest outcome has probability >= 1 - e^log_q.
double theorem6(double log_q, double s, double order) {
  const double independent = order / (s * s);
  if (log_q == -kInf) return 0.0;  // the outcome is certain: nothing is revealed
  const double mu2 = s * std::sqrt(-log_q), mu1 = mu2 + 1;
  const double eps1 = mu1 / (s * s), eps2 = mu2 / (s * s);
  if (!(mu2 > 1) || !(order <= mu2) || !(-log_q > eps2)) return independent;
  // q small enough that the bound's A is positive and increasing in q
  const double q_limit = (mu2 - 1) * eps2 - mu2 * (std::log(mu1 / (mu1 - 1)) + std::log(mu2 / (mu2 - 1)));
  if (!(log_q <= q_limit)) return independent;
  const double log_1q = log1mexp(log_q);
  const double log_a = (order - 1) * (log_1q - log1mexp((log_q + eps2) * (1 - 1 / mu2)));
  const double log_b = (order - 1) * (eps1 - log_q / (mu1 - 1));
  const double bound = log_add_exp(log_1q + log_a, log_q + log_b) / (order - 1);
  return std::isfinite(bound) ? std::clamp(bound, 0.0, independent) : independent;
}

}  // namespace

// ---- RDP --------------------------------------------------------------------------

double gnmax_rdp(double sigma, double order) {
  check_sigma(sigma, "sigma2");
  check_order(order);
  return order / (sigma * sigma);
}

double threshold_rdp(double sigma1, double order) {
  check_sigma(sigma1, "sigma1");
  check_order(order);
  return order / (2 * sigma1 * sigma1);
}

double gnmax_log_q(std::span<const double> votes, double sigma) {
  check_votes(votes);
  check_sigma(sigma, "sigma2");
  if (votes.size() == 1) return -kInf;
  const std::size_t top = argmax(votes);
  double log_q = -kInf;
  for (std::size_t j = 0; j < votes.size(); ++j)
    if (j != top)  // P[N(0, 2 sigma^2) >= gap] = erfc(gap / (2 sigma)) / 2
      log_q = log_add_exp(log_q, log_erfc((votes[top] - votes[j]) / (2 * sigma)) - std::log(2.0));
  return std::min(log_q, std::log1p(-1.0 / double(votes.size())));
}

double gnmax_rdp_data_dependent(double log_q, double sigma, double order) {
  check_sigma(sigma, "sigma2");
  check_order(order);
  require(log_q <= 0, "PATE: log q must be <= 0, got " + format_number(log_q));
  return theorem6(log_q, sigma, order);
}

double threshold_log_pass(std::span<const double> votes, double threshold, double sigma1) {
  check_votes(votes);
  check_sigma(sigma1, "sigma1");
  return log_normal_cdf((votes[argmax(votes)] - threshold) / sigma1);
}

double threshold_rdp_data_dependent(double log_pass, double sigma1, double order) {
  check_sigma(sigma1, "sigma1");
  check_order(order);
  require(log_pass <= 0, "PATE: log P[pass] must be <= 0, got " + format_number(log_pass));
  const double log_q = std::min(log_pass, log1mexp(log_pass));
  return theorem6(log_q, std::sqrt(2.0) * sigma1, order);
}

// ---- PateAccountant --------------------------------------------------------------

PateAccountant::PateAccountant(std::vector<double> orders)
    : RdpCurveAccountant(orders.empty() ? default_rdp_orders() : orders, false), refine_(orders.empty()) {}

void PateAccountant::record(const PateQueries& q) {
  check_sigma(q.sigma2, "sigma2");
  require(q.sigma1 >= 0 && std::isfinite(q.sigma1), "PATE: sigma1 must be >= 0 and finite, got " +
                                                         format_number(q.sigma1));
  require(q.queries >= 0, "PATE: queries must be >= 0, got " + std::to_string(q.queries));
  require(q.answers >= 0 && q.answers <= q.queries, "PATE: answers must be in [0, queries = " +
                                                        std::to_string(q.queries) + "], got " +
                                                        std::to_string(q.answers));
  require(q.sigma1 > 0 || q.answers == q.queries, "PATE: without a threshold test (sigma1 = 0) every query is answered");
  if (q.queries == 0) return;
  queries_.push_back(q);
}

long PateAccountant::total_queries() const {
  long n = 0;
  for (const auto& q : queries_) n += q.queries;
  return n;
}

long PateAccountant::total_answers() const {
  long n = 0;
  for (const auto& q : queries_) n += q.answers;
  return n;
}

double PateAccountant::rdp_at(double order) const {
  if (!refine_) return std::numeric_limits<double>::quiet_NaN();
  double total = 0;
  for (const Step& s : ledger_)
    total += double(s.count) * rdp_subsampled_gaussian(s.sampling_rate, s.noise_multiplier, order);
  for (const auto& q : queries_) {
    if (q.sigma1 > 0) total += double(q.queries) * threshold_rdp(q.sigma1, order);
    total += double(q.answers) * gnmax_rdp(q.sigma2, order);
  }
  return total;
}

std::vector<double> PateAccountant::rdp() const {
  std::vector<double> total(orders_.size());
  for (std::size_t i = 0; i < orders_.size(); ++i) {
    double t = 0;
    for (const Step& s : ledger_)
      t += double(s.count) * rdp_subsampled_gaussian(s.sampling_rate, s.noise_multiplier, orders_[i]);
    for (const auto& q : queries_) {
      if (q.sigma1 > 0) t += double(q.queries) * threshold_rdp(q.sigma1, orders_[i]);
      t += double(q.answers) * gnmax_rdp(q.sigma2, orders_[i]);
    }
    total[i] = t;
  }
  return total;
}

bool PateAccountant::released_nothing() const { return ledger_.empty() && queries_.empty(); }

nlohmann::json PateAccountant::to_json() const {
  nlohmann::json j = RdpCurveAccountant::to_json();
  j["refine_order"] = refine_;
  nlohmann::json qs = nlohmann::json::array();
  for (const auto& q : queries_)
    qs.push_back({{"sigma1", q.sigma1}, {"sigma2", q.sigma2}, {"queries", q.queries}, {"answers", q.answers}});
  j["queries"] = qs;
  return j;
}

std::unique_ptr<Accountant> PateAccountant::clone() const { return std::make_unique<PateAccountant>(*this); }

std::unique_ptr<PateAccountant> PateAccountant::from_json(const nlohmann::json& j) {
  std::vector<double> orders;
  const bool refine = j.contains("refine_order") && j.at("refine_order").get<bool>();
  if (j.contains("orders") && !refine) orders = j.at("orders").get<std::vector<double>>();
  auto a = std::make_unique<PateAccountant>(std::move(orders));
  replay_ledger(*a, j);
  if (j.contains("queries")) {
    require(j.at("queries").is_array(), "accountant JSON: \"queries\" must be an array");
    for (const auto& e : j.at("queries")) {
      require(e.is_object(), "accountant JSON: query entries must be objects");
      const long limit = std::numeric_limits<long>::max();
      a->record({e.at("sigma1").get<double>(), e.at("sigma2").get<double>(), json_whole_number(e, "queries", 0, limit),
                 json_whole_number(e, "answers", 0, limit)});
    }
  }
  return a;
}

// ---- PateDataDependent -------------------------------------------------------------

PateDataDependent::PateDataDependent() : orders_(default_rdp_orders()), rdp_(orders_.size(), 0.0) {}

void PateDataDependent::add(std::span<const double> votes, double threshold, double sigma1, double sigma2,
                            bool answered) {
  if (sigma1 > 0) {
    const double log_pass = threshold_log_pass(votes, threshold, sigma1);
    for (std::size_t i = 0; i < orders_.size(); ++i)
      rdp_[i] += threshold_rdp_data_dependent(log_pass, sigma1, orders_[i]);
  }
  if (answered) {
    const double log_q = gnmax_log_q(votes, sigma2);
    for (std::size_t i = 0; i < orders_.size(); ++i) rdp_[i] += gnmax_rdp_data_dependent(log_q, sigma2, orders_[i]);
  }
}

double PateDataDependent::epsilon(double delta) const { return rdp_to_epsilon(orders_, rdp_, delta).epsilon; }

}  // namespace dpgrad::privacy
