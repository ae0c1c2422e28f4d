// The audit's statistics (privacy/audit_statistics.hpp, docs/audit.md).
#include "privacy/audit_statistics.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace dpgrad::privacy {
namespace {

/// The regularised incomplete beta function I_x(a, b), a, b > 0, by its continued
/// fraction (modified Lentz), on the side where it converges fast.
double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) +
                                b * std::log1p(-x));
  auto fraction = [](double a, double b, double x) {
    constexpr double tiny = 1e-300;
    double c = 1, d = 1 - (a + b) * x / (a + 1);
    if (std::fabs(d) < tiny) d = tiny;
    d = 1 / d;
    double h = d;
    for (int m = 1; m <= 10000; ++m) {
      const double m2 = 2.0 * m;
      double aa = m * (b - m) * x / ((a + m2 - 1) * (a + m2));
      d = 1 + aa * d;
      if (std::fabs(d) < tiny) d = tiny;
      c = 1 + aa / c;
      if (std::fabs(c) < tiny) c = tiny;
      d = 1 / d;
      h *= d * c;
      aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1));
      d = 1 + aa * d;
      if (std::fabs(d) < tiny) d = tiny;
      c = 1 + aa / c;
      if (std::fabs(c) < tiny) c = tiny;
      d = 1 / d;
      const double del = d * c;
      h *= del;
      if (std::fabs(del - 1) < 1e-15) break;
    }
    return h;
  };
  if (x < (a + 1) / (a + b + 2)) return front * fraction(a, b, x) / a;
  return 1 - front * fraction(b, a, 1 - x) / b;
}

/// P(Binomial(n, p) <= k) = I_{1-p}(n - k, k + 1), for k < n.
double binomial_cdf(long k, long n, double p) { return incomplete_beta(double(n - k), double(k + 1), 1 - p); }

struct Rates {
  long fp = 0, fn = 0;
};

/// Errors of "canary when score > t".
Rates count(const std::vector<double>& neg, const std::vector<double>& pos, double t) {
  Rates r;
  for (double s : neg) r.fp += s > t;
  for (double s : pos) r.fn += !(s > t);
  return r;
}

double bound_from(long fp, long n_neg, long fn, long n_pos, double delta, double alpha, double& fpr_up,
                  double& fnr_up) {
  fpr_up = binomial_upper_bound(fp, n_neg, alpha);
  fnr_up = binomial_upper_bound(fn, n_pos, alpha);
  double eps = 0;
  if (fpr_up > 0 && 1 - delta - fnr_up > 0) eps = std::max(eps, std::log((1 - delta - fnr_up) / fpr_up));
  if (fnr_up > 0 && 1 - delta - fpr_up > 0) eps = std::max(eps, std::log((1 - delta - fpr_up) / fnr_up));
  return eps;
}

}  // namespace

double binomial_upper_bound(long k, long n, double alpha) {
  if (!(n >= 1 && k >= 0 && k <= n))
    throw std::invalid_argument("binomial_upper_bound: need 0 <= k <= n and n >= 1, got k " + std::to_string(k) +
                                ", n " + std::to_string(n));
  if (!(alpha > 0 && alpha < 1)) throw std::invalid_argument("binomial_upper_bound: alpha must be in (0, 1)");
  if (k == n) return 1.0;
  double lo = double(k) / double(n), hi = 1.0;  // the CDF falls from about 1/2 (or 1 at k = 0) to 0
  for (int it = 0; it < 100 && hi - lo > 1e-13 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    (binomial_cdf(k, n, mid) > alpha ? lo : hi) = mid;
  }
  // the upper end of the bracket, widened past the CDF's rounding: an upper bound
  return std::min(1.0, hi * (1 + 1e-9) + 1e-300);
}

AuditBound audit_epsilon(const std::vector<double>& negatives, const std::vector<double>& positives, double delta,
                         double confidence) {
  if (negatives.size() < 4 || positives.size() < 4)
    throw std::invalid_argument("audit_epsilon: need at least 4 trials with and 4 without the canary");
  if (!(delta >= 0 && delta < 1)) throw std::invalid_argument("audit_epsilon: delta must be in [0, 1)");
  if (!(confidence > 0 && confidence < 1)) throw std::invalid_argument("audit_epsilon: confidence must be in (0, 1)");
  // the two rates are bounded at 1 - (1 - confidence) / 2 each: both hold with `confidence` (union bound)
  const double alpha = (1 - confidence) / 2;
  const std::size_t hn = negatives.size() / 2, hp = positives.size() / 2;
  const std::vector<double> sel_neg(negatives.begin(), negatives.begin() + std::ptrdiff_t(hn)),
      sel_pos(positives.begin(), positives.begin() + std::ptrdiff_t(hp));
  const std::vector<double> ev_neg(negatives.begin() + std::ptrdiff_t(hn), negatives.end()),
      ev_pos(positives.begin() + std::ptrdiff_t(hp), positives.end());
  // the threshold: the best bound on the selection half, over its scores
  std::vector<double> candidates = sel_neg;
  candidates.insert(candidates.end(), sel_pos.begin(), sel_pos.end());
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  // at most 200 candidates (quantiles): each evaluation costs a few Clopper-Pearson bisections
  if (candidates.size() > 200) {
    std::vector<double> q;
    for (std::size_t i = 0; i < 200; ++i) q.push_back(candidates[i * (candidates.size() - 1) / 199]);
    candidates = q;
  }
  double best_t = candidates.front(), best = -1;
  for (double t : candidates) {
    const Rates r = count(sel_neg, sel_pos, t);
    double fu = 0, nu = 0;
    const double e = bound_from(r.fp, long(sel_neg.size()), r.fn, long(sel_pos.size()), delta, alpha, fu, nu);
    if (e > best) {
      best = e;
      best_t = t;
    }
  }
  AuditBound b;
  b.confidence = confidence;
  b.threshold = best_t;
  const Rates r = count(ev_neg, ev_pos, best_t);
  b.false_positives = r.fp;
  b.false_negatives = r.fn;
  b.negatives = long(ev_neg.size());
  b.positives = long(ev_pos.size());
  b.epsilon = bound_from(r.fp, b.negatives, r.fn, b.positives, delta, alpha, b.fpr_upper, b.fnr_upper);
  return b;
}

double one_run_p_value(long m, long guesses, long correct, double epsilon, double delta) {
  if (!(0 <= correct && correct <= guesses && guesses <= m))
    throw std::invalid_argument("one_run_p_value: need 0 <= correct <= guesses <= m");
  if (!(epsilon >= 0) || !(delta >= 0 && delta <= 1)) throw std::invalid_argument("one_run_p_value: bad epsilon or delta");
  if (guesses == 0) return 1.0;
  const double q = 1 / (1 + std::exp(-epsilon));
  // P[Bin(r, q) >= v] = 1 - P[Bin <= v - 1]; the pmf terms below v, summed from v - 1 down
  auto log_pmf = [&](long j) {
    return std::lgamma(double(guesses) + 1) - std::lgamma(double(j) + 1) - std::lgamma(double(guesses - j) + 1) +
           double(j) * std::log(q) + double(guesses - j) * std::log1p(-q);
  };
  const double tail = correct == 0 ? 1.0 : 1 - binomial_cdf(correct - 1, guesses, q);
  double worst = 0, below = 0;
  for (long i = 1; i <= correct; ++i) {
    below += std::exp(log_pmf(correct - i));
    worst = std::max(worst, below / double(i));
  }
  return std::min(1.0, tail + 2 * double(m) * delta * worst);
}

OneRunBound one_run_epsilon(const std::vector<double>& scores, const std::vector<bool>& included, double delta,
                            double confidence) {
  const long m = long(scores.size());
  if (m < 20 || included.size() != scores.size())
    throw std::invalid_argument("one_run_epsilon: need at least 20 canaries, each with its inclusion");
  if (!(confidence > 0 && confidence < 1)) throw std::invalid_argument("one_run_epsilon: confidence must be in (0, 1)");
  std::vector<long> order(static_cast<std::size_t>(m));
  for (long i = 0; i < m; ++i) order[std::size_t(i)] = i;
  std::sort(order.begin(), order.end(), [&](long a, long b) { return scores[std::size_t(a)] > scores[std::size_t(b)]; });
  const long ks[] = {std::max(1L, m / 100), std::max(1L, m / 20), std::max(1L, m / 10), std::max(1L, m / 4)};
  const double level = (1 - confidence) / 4;  // union bound over the four choices of k
  OneRunBound best;
  best.confidence = confidence;
  best.canaries = m;
  for (long k : ks) {
    long correct = 0;
    for (long i = 0; i < k; ++i) correct += included[std::size_t(order[std::size_t(i)])];
    for (long i = m - k; i < m; ++i) correct += !included[std::size_t(order[std::size_t(i)])];
    const long guesses = 2 * k;
    // the largest epsilon at which this many right guesses is still too unlikely
    if (one_run_p_value(m, guesses, correct, 0.0, delta) >= level) continue;
    double lo = 0, hi = 1;
    while (hi < 100 && one_run_p_value(m, guesses, correct, hi, delta) < level) hi *= 2;
    for (int it = 0; it < 60; ++it) {
      const double mid = 0.5 * (lo + hi);
      (one_run_p_value(m, guesses, correct, mid, delta) < level ? lo : hi) = mid;
    }
    if (lo > best.epsilon) {
      best.epsilon = lo;
      best.guesses = guesses;
      best.correct = correct;
    }
  }
  return best;
}

}  // namespace dpgrad::privacy
