// RDP of the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019) in log
// space, integer and fractional orders, and the RDP-curve accountants' shared
// conversion to (epsilon, delta) and serialisation.
#include "privacy/rdp.hpp"

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

constexpr double kInf = std::numeric_limits<double>::infinity();

bool is_integer(double a) { return std::floor(a) == a; }

// log(e^x - 1) for x > 0.
double log_expm1(double x) { return x > 50.0 ? x + std::log1p(-std::exp(-x)) : std::log(std::expm1(x)); }

// Mironov, Talwar, Zhang 2019, §3.2: for integer alpha,
// A_alpha = sum_k binom(alpha,k) (1-q)^{alpha-k} q^k exp((k^2-k)/(2 sigma^2)).
// The binomial weights sum to 1, so A - 1 = sum_{k>=2} binom(alpha,k) (1-q)^{alpha-k} q^k
// (e^{(k^2-k)/(2 sigma^2)} - 1): all terms positive, no cancellation even when
// A - 1 is far below machine epsilon. Returns log A, rounded up by a few ulp per term.
double log_a_integer(double q, double sigma, long alpha) {
  const double log_q = std::log(q);
  const double log_1mq = std::log1p(-q);
  const double inv_2s2 = 1.0 / (2.0 * sigma * sigma);
  double log_am1 = -kInf;  // log(A - 1)
  double mag = 0.0;         // largest magnitude of the pieces of a term's log
  for (long k = 2; k <= alpha; ++k) {
    const double kd = static_cast<double>(k);
    const double p1 = log_binomial(static_cast<double>(alpha), kd);
    const double p2 = static_cast<double>(alpha - k) * log_1mq;
    const double p3 = kd * log_q;
    const double p4 = log_expm1((kd * kd - kd) * inv_2s2);
    log_am1 = log_add_exp(log_am1, p1 + p2 + p3 + p4);
    mag = std::max(mag, std::abs(p1) + std::abs(p2) + std::abs(p3) + std::abs(p4));
  }
  // Floating-point margin: each piece errs by a few ulp of its magnitude, and
  // log-sum-exp adds a few ulp per term; (alpha + 10) * 2^-50 (1 + mag) in log
  // space covers both many times over.
  log_am1 += static_cast<double>(alpha + 10) * 0x1p-50 * (1.0 + mag);
  return log_am1 < -30.0 ? std::exp(log_am1) * (1.0 + 1e-15) : log_add_exp(0.0, log_am1);
}

// Mironov, Talwar, Zhang 2019, §3.3: for fractional alpha, split the integral
// at z0 = sigma^2 log(1/q - 1) + 1/2 and expand (1 - q + q r)^alpha on each side:
//   A = sum_i binom(alpha,i) (1-q)^{alpha-i} q^i e^{(i^2-i)/(2s^2)} erfc((i - z0)/(sqrt2 s))/2
//     + sum_i binom(alpha,i) (1-q)^i q^{alpha-i} e^{((alpha-i)^2-(alpha-i))/(2s^2)}
//                                                 erfc((z0 - (alpha-i))/(sqrt2 s))/2.
// The ratio of consecutive term magnitudes is |alpha-i|/(i+1) times a ratio of
// erfcx values (the exponentials cancel exactly), so for i > alpha both series
// alternate with decreasing magnitudes: the remainder after stopping is at most
// the first omitted term, which we add (upper bound).
double log_a_fractional(double q, double sigma, double alpha) {
  const double log_q = std::log(q);
  const double log_1mq = std::log1p(-q);
  const double inv_2s2 = 1.0 / (2.0 * sigma * sigma);
  const double z0 = sigma * sigma * (std::log(1.0 / q - 1.0)) + 0.5;
  const double scale = 1.0 / (std::numbers::sqrt2 * sigma);
  constexpr long kMaxTerms = 2'000'000;
  constexpr double kRelStop = -28.0;  // e^-28 ~ 7e-13, relative to the positive part (>= 1)
  struct Term { double log_abs; int sign; double mag; };
  std::vector<Term> terms;
  double log_pos = -kInf;  // running log of the positive part, for the stopping rule
  double log_binom = 0.0;  // log |binom(alpha, i)|
  int sign = 1;
  for (long i = 0;; ++i) {
    const double id = static_cast<double>(i);
    const double m = alpha - id;
    const double pa = m * log_1mq, pb = id * log_q, pc = (id * id - id) * inv_2s2;
    const double pd = id * log_1mq, pe = m * log_q, pf = (m * m - m) * inv_2s2;
    const double e1 = log_erfc((id - z0) * scale), e2 = log_erfc((z0 - m) * scale);
    const double t1 = log_binom + pa + pb + pc + e1 - std::numbers::ln2;
    const double t2 = log_binom + pd + pe + pf + e2 - std::numbers::ln2;
    // Absolute error of t1, t2 is a few ulp of the magnitude of their pieces.
    const double mag1 = std::abs(log_binom) + std::abs(pa) + std::abs(pb) + std::abs(pc) + std::abs(e1) + 1.0;
    const double mag2 = std::abs(log_binom) + std::abs(pd) + std::abs(pe) + std::abs(pf) + std::abs(e2) + 1.0;
    const bool tail = id > alpha + 1.0;
    if (tail && ((std::max(t1, t2) < log_pos + kRelStop) || i >= kMaxTerms)) {
      // Remainder bound: |first omitted term| of each series, counted as positive.
      terms.push_back({t1, 1, mag1});
      terms.push_back({t2, 1, mag2});
      break;
    }
    terms.push_back({t1, sign, mag1});
    terms.push_back({t2, sign, mag2});
    if (sign > 0) log_pos = log_add_exp(log_pos, log_add_exp(t1, t2));
    // binom(alpha, i+1) = binom(alpha, i) (alpha - i) / (i + 1).
    log_binom += std::log(std::abs(m)) - std::log(id + 1.0);
    if (m < 0.0) sign = -sign;
  }
  // Compensated (Neumaier) sum of sign * e^{t - top}: its error is a couple of
  // ulp of sum |x|, independent of the number of terms; each x also carries
  // the error of its exponent. Add a bound on both (upper bound on A).
  double top = -kInf;
  for (const Term& t : terms) top = std::max(top, t.log_abs);
  double sum = 0.0, comp = 0.0, err = 0.0;
  for (const Term& t : terms) {
    const double x = t.sign * std::exp(t.log_abs - top);
    const double y = sum + x;
    comp += std::abs(sum) >= std::abs(x) ? (sum - y) + x : (x - y) + sum;
    sum = y;
    err += std::abs(x) * (4.0 + 4.0 * t.mag) * 0x1p-53;
  }
  sum += comp;
  if (!(sum > 0.0)) return kInf;  // cannot happen mathematically (A >= 1); refuse to guess
  return top + std::log(sum + err);
}

}  // namespace

std::vector<double> default_rdp_orders() {
  std::vector<double> o = {1.1, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75, 4.0, 4.5};
  for (int a = 5; a <= 64; ++a) o.push_back(a);
  for (double a : {72.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 224.0, 256.0}) o.push_back(a);
  return o;
}

std::vector<double> default_integer_rdp_orders() {
  std::vector<double> o;
  for (double a : default_rdp_orders())
    if (a >= 2.0 && is_integer(a)) o.push_back(a);
  return o;
}

double rdp_subsampled_gaussian(double q, double sigma, double order) {
  if (!(q > 0.0 && q <= 1.0))
    throw std::invalid_argument("rdp_subsampled_gaussian: sampling rate must be in (0, 1], got " + format_number(q));
  if (!(sigma > 0.0) || std::isnan(sigma))
    throw std::invalid_argument("rdp_subsampled_gaussian: noise multiplier must be > 0, got " + format_number(sigma));
  if (!(order > 1.0) || !std::isfinite(order))
    throw std::invalid_argument("rdp_subsampled_gaussian: order must be finite and > 1, got " + format_number(order));
  if (sigma == kInf) return 0.0;
  // Plain Gaussian, Mironov 2017 Prop. 7: alpha Delta^2 / (2 s^2) with Delta = 1, s = sigma.
  if (q == 1.0) return order / (2.0 * sigma * sigma);
  double log_a;
  if (is_integer(order) && order <= 1e6) log_a = log_a_integer(q, sigma, static_cast<long>(order));
  else log_a = log_a_fractional(q, sigma, order);
  const double r = log_a / (order - 1.0);
  if (std::isnan(r)) return kInf;
  // Subsampling never costs more than the plain Gaussian; RDP is never negative.
  return std::clamp(r, 0.0, order / (2.0 * sigma * sigma));
}

// ---- RdpCurveAccountant ---------------------------------------------------

RdpCurveAccountant::RdpCurveAccountant(std::vector<double> orders, bool integer_only)
    : orders_(std::move(orders)) {
  if (orders_.empty()) throw std::invalid_argument("rdp orders: the list is empty");
  // an order costs work (and memory) in proportion to its size: the same bound for all
  if (orders_.size() > 10000) throw std::invalid_argument("rdp orders: at most 10000, got " + std::to_string(orders_.size()));
  for (double a : orders_) {
    if (!(a > 1.0) || !(a <= 1e6))
      throw std::invalid_argument("rdp orders must be in (1, 1e6], got " + format_number(a));
    if (integer_only && (!is_integer(a) || a < 2.0 || a > 1e6))
      throw std::invalid_argument("this accountant needs integer rdp orders in [2, 1e6], got " + format_number(a));
  }
  std::sort(orders_.begin(), orders_.end());
  orders_.erase(std::unique(orders_.begin(), orders_.end()), orders_.end());
}

RdpEpsilon RdpCurveAccountant::epsilon_details(double delta) const {
  if (released_nothing()) {
    // Nothing released: (0, 0)-DP (checked through the conversion for its input validation).
    rdp_to_epsilon(orders_, std::vector<double>(orders_.size(), 0.0), delta);
    return {0.0, std::numeric_limits<double>::quiet_NaN(), RdpConversion::tight};
  }
  RdpEpsilon best = rdp_to_epsilon(orders_, rdp(), delta);
  if (!std::isfinite(best.epsilon) || std::isnan(rdp_at(best.order))) return best;
  // Golden-section search for the best real order between the grid neighbours of the winner.
  const auto it = std::lower_bound(orders_.begin(), orders_.end(), best.order);
  double lo = it == orders_.begin() ? 1.0 + 0.5 * (best.order - 1.0) : *(it - 1);
  double hi = it + 1 == orders_.end() ? 2.0 * best.order : *(it + 1);
  auto at = [&](double a) { return rdp_to_epsilon({a}, {rdp_at(a)}, delta); };
  constexpr double kInvPhi = 0.6180339887498949;
  double a1 = hi - kInvPhi * (hi - lo), a2 = lo + kInvPhi * (hi - lo);
  RdpEpsilon e1 = at(a1), e2 = at(a2);
  for (int it2 = 0; it2 < 40 && hi - lo > 1e-6 * best.order; ++it2) {
    if (e1.epsilon <= e2.epsilon) {
      hi = a2;
      a2 = a1;
      e2 = e1;
      a1 = hi - kInvPhi * (hi - lo);
      e1 = at(a1);
    } else {
      lo = a1;
      a1 = a2;
      e1 = e2;
      a2 = lo + kInvPhi * (hi - lo);
      e2 = at(a2);
    }
    if (e1.epsilon < best.epsilon) best = e1;
    if (e2.epsilon < best.epsilon) best = e2;
  }
  return best;
}

double RdpCurveAccountant::rdp_at(double) const { return std::numeric_limits<double>::quiet_NaN(); }

double RdpCurveAccountant::epsilon(double delta) const { return epsilon_details(delta).epsilon; }

double RdpCurveAccountant::delta(double epsilon) const {
  const double d = rdp_to_delta(orders_, rdp(), epsilon);
  return released_nothing() ? 0.0 : d;
}

nlohmann::json RdpCurveAccountant::to_json() const {
  nlohmann::json j = Accountant::to_json();
  j["orders"] = orders_;
  return j;
}

// ---- RdpAccountant --------------------------------------------------------

RdpAccountant::RdpAccountant(std::vector<double> orders)
    : RdpCurveAccountant(orders.empty() ? default_rdp_orders() : orders, false), refine_(orders.empty()) {}

std::vector<double> RdpAccountant::rdp() const {
  std::vector<double> total(orders_.size(), 0.0);
  for (const Step& s : ledger_)
    for (std::size_t i = 0; i < orders_.size(); ++i)
      total[i] += static_cast<double>(s.count) *
                  rdp_subsampled_gaussian(s.sampling_rate, s.noise_multiplier, orders_[i]);
  return total;
}

double RdpAccountant::rdp_at(double order) const {
  if (!refine_) return std::numeric_limits<double>::quiet_NaN();
  double total = 0.0;
  for (const Step& s : ledger_)
    total += static_cast<double>(s.count) * rdp_subsampled_gaussian(s.sampling_rate, s.noise_multiplier, order);
  return total;
}

std::unique_ptr<Accountant> RdpAccountant::clone() const { return std::make_unique<RdpAccountant>(*this); }

nlohmann::json RdpAccountant::to_json() const {
  nlohmann::json j = RdpCurveAccountant::to_json();
  j["refine_order"] = refine_;
  return j;
}

std::unique_ptr<RdpAccountant> RdpAccountant::from_json(const nlohmann::json& j) {
  std::vector<double> orders;
  const bool refine = j.contains("refine_order") && j.at("refine_order").get<bool>();
  if (j.contains("orders") && !refine) orders = j.at("orders").get<std::vector<double>>();
  auto a = std::make_unique<RdpAccountant>(std::move(orders));
  replay_ledger(*a, j);
  return a;
}

}  // namespace dpgrad::privacy
