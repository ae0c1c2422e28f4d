// The analysis of private selection (selection.hpp, docs/math.md section 9).
#include "privacy/selection.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "engine/numbers.hpp"
#include "engine/random.hpp"
#include "privacy/accountant.hpp"
#include "privacy/conversions.hpp"
#include "privacy/mechanisms.hpp"

namespace dpgrad::privacy {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kUp = 1 + 1e-9;  // rounding allowance of the few operations below

std::string num(double x) { return format_number(x, 6); }

/// log P[K = k] for k in the support (-inf outside it).
double log_pmf(const TrialCount& c, long k) {
  if (c.kind == TrialCount::Kind::poisson) {
    if (k < 0) return -kInf;
    return double(k) * std::log(c.mu) - c.mu - std::lgamma(double(k) + 1);
  }
  if (k < 1) return -kInf;
  const double log1mg = std::log1p(-c.gamma);
  if (c.eta == 0) return double(k) * log1mg - std::log(double(k)) - std::log(-std::log(c.gamma));
  // (1 - gamma)^k / (gamma^-eta - 1) * Gamma(k + eta) / (Gamma(eta) Gamma(k + 1)); for eta in (-1, 0)
  // Gamma(eta) and gamma^-eta - 1 are both negative, so their absolute values give the same ratio
  return double(k) * log1mg + std::lgamma(double(k) + c.eta) - std::lgamma(c.eta) - std::lgamma(double(k) + 1) -
         std::log(std::abs(std::expm1(-c.eta * std::log(c.gamma))));
}

/// A bound r < 1 on the ratio P[K = j + 1] / P[K = j] for every j >= J (or 2 when none below 1 holds yet).
double ratio_bound(const TrialCount& c, long J) {
  if (c.kind == TrialCount::Kind::poisson) return c.mu / (double(J) + 1);
  // (1 - gamma)(j + eta)/(j + 1), and (j + eta)/(j + 1) moves monotonically towards 1
  return (1 - c.gamma) * std::max(1.0, (double(J) + c.eta) / (double(J) + 1));
}

}  // namespace

void TrialCount::check() const {
  if (kind == Kind::poisson) {
    if (!(mu > 0 && mu <= 1e4 && std::isfinite(mu)))
      throw std::invalid_argument("trials: the Poisson mean mu must be in (0, 10000], got " + num(mu));
    return;
  }
  if (!(eta > -1 && eta <= 100 && std::isfinite(eta)))
    throw std::invalid_argument("trials: the negative binomial's eta must be in (-1, 100], got " + num(eta));
  if (!(gamma > 0 && gamma < 1))
    throw std::invalid_argument("trials: the negative binomial's gamma must be in (0, 1), got " + num(gamma));
  if (!(gamma >= 1e-3))
    throw std::invalid_argument("trials: gamma " + num(gamma) + " would run thousands of trials (at least 1e-3)");
}

std::string TrialCount::describe() const {
  if (kind == Kind::poisson) return "poisson (mu " + num(mu) + ", mean " + num(mean()) + " trials)";
  return "truncated negative binomial (eta " + num(eta) + ", gamma " + num(gamma) + ", mean " + num(mean()) + " trials)";
}

nlohmann::json TrialCount::to_json() const {
  if (kind == Kind::poisson) return {{"distribution", "poisson"}, {"mu", mu}};
  return {{"distribution", "negative_binomial"}, {"eta", eta}, {"gamma", gamma}};
}

TrialCount TrialCount::from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("distribution") || !j["distribution"].is_string())
    throw std::invalid_argument("trials: expected an object with a \"distribution\"");
  auto number = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_number()) throw std::invalid_argument(std::string("trials: \"") + key + "\" must be a number");
    return j[key].get<double>();
  };
  TrialCount c;
  const std::string d = j["distribution"].get<std::string>();
  if (d == "poisson") {
    c.kind = Kind::poisson;
    c.mu = number("mu");
  } else if (d == "negative_binomial") {
    c.eta = number("eta");
    c.gamma = number("gamma");
  } else {
    throw std::invalid_argument("trials: unknown distribution \"" + d + "\" (poisson, negative_binomial)");
  }
  c.check();
  return c;
}

TrialCount TrialCount::parse(const std::string& text) {
  const std::string usage = " (expected tnb:ETA,GAMMA, e.g. tnb:1,0.2, or poisson:MU, e.g. poisson:5)";
  auto number = [&](const std::string& s) {
    const std::optional<double> v = decimal_number(s);
    if (!v) throw std::invalid_argument("trials '" + text + "': '" + s + "' is not a decimal number" + usage);
    return *v;
  };
  TrialCount c;
  if (text.rfind("poisson:", 0) == 0) {
    c.kind = Kind::poisson;
    c.mu = number(text.substr(8));
  } else if (text.rfind("tnb:", 0) == 0 && text.find(',') != std::string::npos) {
    const std::string rest = text.substr(4);
    c.eta = number(rest.substr(0, rest.find(',')));
    c.gamma = number(rest.substr(rest.find(',') + 1));
  } else {
    throw std::invalid_argument("trials '" + text + "'" + usage);
  }
  c.check();
  return c;
}

double TrialCount::pmf(long k) const { return std::exp(log_pmf(*this, k)); }

double TrialCount::mean() const {
  if (kind == Kind::poisson) return mu;
  if (eta == 0) return (1 / gamma - 1) / std::log(1 / gamma);
  // eta (1 - gamma) / (gamma (1 - gamma^eta)); eta < 0 makes both factors negative
  return eta * (1 - gamma) / (gamma * -std::expm1(eta * std::log(gamma)));
}

double TrialCount::tail(long k) const {
  // sum_{j > k} P[K = j], term by term, until the geometric bound on the rest is below 1e-9 of the sum;
  // the rest's bound is added, so the result never falls below the truth
  double sum = 0;
  for (long j = std::max(k + 1, kind == Kind::poisson ? 0L : 1L), n = 0; n < 100000000; ++j, ++n) {
    const double t = pmf(j), r = ratio_bound(*this, j);
    sum += t;
    if (r < 1) {
      const double rest = t * r / (1 - r);
      if (rest <= 1e-9 * sum) return std::min(1.0, (sum + rest) * kUp);
    }
  }
  return 1.0;  // not reached for checked parameters; 1 is always an upper bound
}

long TrialCount::quantile(double p) const {
  if (!(p > 0 && p < 1)) throw std::invalid_argument("trials: quantile needs p in (0, 1), got " + num(p));
  long hi = 1;
  while (tail(hi) > p) {
    if (hi > (1L << 40)) throw std::invalid_argument("trials: no cap up to 2^40 trials keeps P[K > cap] below " + num(p));
    hi *= 2;
  }
  long lo = hi / 2;  // tail(lo) > p unless lo == 0
  if (lo < 1) return 1;
  while (hi - lo > 1) {
    const long mid = lo + (hi - lo) / 2;
    (tail(mid) <= p ? hi : lo) = mid;
  }
  return hi;
}

long TrialCount::draw(Rng& rng, long cap) const {
  check();
  const double u = rng.uniform_open();
  double cum = 0;
  long k = kind == Kind::poisson ? 0 : 1;
  for (; k < cap; ++k) {
    cum += pmf(k);
    if (cum >= u) return k;
  }
  return cap;
}

std::vector<double> selection_rdp_negative_binomial(const TrialCount& k, const std::vector<double>& orders,
                                                    const std::function<double(double)>& trial_rdp,
                                                    const std::vector<double>& inner_orders) {
  k.check();
  if (k.kind != TrialCount::Kind::negative_binomial)
    throw std::invalid_argument("selection_rdp_negative_binomial: the trial count is not negative binomial");
  const double log_inv_gamma = -std::log(k.gamma);
  double inner = kInf;  // min over hat-lambda of (1 + eta)[(1 - 1/hl) eps(hl) + log(1/gamma)/hl]
  for (double hl : inner_orders) {
    if (!(hl >= 1)) throw std::invalid_argument("selection: inner orders must be >= 1, got " + num(hl));
    const double e = trial_rdp(hl);
    if (!(e >= 0)) continue;  // NaN or negative: no bound from this order
    inner = std::min(inner, (1 + k.eta) * ((1 - 1 / hl) * e + log_inv_gamma / hl));
  }
  const double log_mean = std::log(k.mean());
  std::vector<double> out;
  for (double l : orders) {
    if (!(l > 1)) throw std::invalid_argument("selection: orders must be > 1, got " + num(l));
    const double e = trial_rdp(l);
    out.push_back(e >= 0 && std::isfinite(inner) ? (e + inner + std::max(0.0, log_mean) / (l - 1)) * kUp : kInf);
  }
  return out;
}

std::vector<double> selection_rdp_poisson(const TrialCount& k, const std::vector<double>& orders,
                                          const std::function<double(double)>& trial_rdp,
                                          const std::function<double(double)>& trial_delta) {
  k.check();
  if (k.kind != TrialCount::Kind::poisson) throw std::invalid_argument("selection_rdp_poisson: the trial count is not Poisson");
  std::vector<double> out;
  for (double l : orders) {
    if (!(l > 1)) throw std::invalid_argument("selection: orders must be > 1, got " + num(l));
    const double e = trial_rdp(l), hat_delta = trial_delta(std::log1p(1 / (l - 1)));
    const double r = e + k.mu * hat_delta + std::log(k.mu) / (l - 1);
    // a Renyi divergence is never negative: rounding the bound up to 0 keeps it valid
    out.push_back(e >= 0 && hat_delta >= 0 ? std::max(0.0, r * (r > 0 ? kUp : 1 / kUp)) : kInf);
  }
  return out;
}

std::vector<double> selection_rdp(const TrialCount& k, const std::vector<double>& orders,
                                  const std::vector<double>& trial_rdp) {
  if (orders.size() != trial_rdp.size() || orders.empty())
    throw std::invalid_argument("selection_rdp: one RDP value per order is needed");
  auto at = [&](double order) {
    const auto it = std::find(orders.begin(), orders.end(), order);
    return it == orders.end() ? kInf : trial_rdp[std::size_t(it - orders.begin())];
  };
  if (k.kind == TrialCount::Kind::poisson)
    return selection_rdp_poisson(k, orders, at, [&](double eps) { return rdp_to_delta(orders, trial_rdp, eps); });
  return selection_rdp_negative_binomial(k, orders, at, orders);
}

SearchEpsilon search_epsilon(const TrialCount& k, const std::vector<double>& orders,
                             const std::vector<double>& trial_rdp, const std::vector<double>& prior_rdp,
                             double delta, double draws_per_trial) {
  k.check();
  if (!(delta > 0 && delta < 1)) throw std::invalid_argument("search_epsilon: delta must be in (0, 1), got " + num(delta));
  if (!(draws_per_trial >= 0 && std::isfinite(draws_per_trial)))
    throw std::invalid_argument("search_epsilon: draws_per_trial must be finite and >= 0");
  if (prior_rdp.size() != orders.size()) throw std::invalid_argument("search_epsilon: one prior RDP value per order is needed");
  std::vector<double> total = selection_rdp(k, orders, trial_rdp);
  for (std::size_t i = 0; i < total.size(); ++i) total[i] += prior_rdp[i];
  // The Gaussian search capped at `cap` trials is (eps, d + (1 + e^eps) P[K > cap])-DP when the uncapped one is
  // (eps, d)-DP (they differ only when K > cap, an event independent of the data). The RDP conversion and the
  // tail share the grid's inner delta half and half; the grid's slack covers cap x draws_per_trial draws.
  SearchEpsilon s;
  s.max_trials = k.quantile(std::min(0.5, delta * 0x1p-14));
  for (int round = 0; round < 64; ++round) {
    const double draws = double(s.max_trials) * draws_per_trial;
    const double inner = grid_noise_slack(delta, draws, 0x1p24, 0).inner_delta;
    const RdpEpsilon e = rdp_to_epsilon(orders, total, inner / 2);
    if (!std::isfinite(e.epsilon) || e.epsilon > 700) return {kInf, s.max_trials, k.tail(s.max_trials), e.order};
    const double charge = (1 + std::exp(e.epsilon)) * kUp;
    s.tail = k.tail(s.max_trials);
    if (charge * s.tail <= inner / 2) {
      const GridNoiseSlack g = grid_noise_slack(delta, draws, 0x1p24, e.epsilon);
      s.epsilon = std::isfinite(g.epsilon_slack) ? (e.epsilon + g.epsilon_slack) * kUp : kInf;
      s.order = e.order;
      return s;
    }
    s.max_trials = std::max(s.max_trials + 1, k.quantile(inner / 2 / charge));
  }
  return {kInf, s.max_trials, s.tail, 0};
}

}  // namespace dpgrad::privacy
