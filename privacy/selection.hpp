// Private selection by repeated trials (Papernot and Steinke 2022): a search
// runs a random number K of private trials and releases only the best one.
// This file holds the analysis: the distributions of K, the Renyi-DP bound of
// the whole search from one trial's RDP curve (Theorem 2 for the truncated
// negative binomial, Theorem 6 for the Poisson distribution), and the search's
// (epsilon, delta) once K is capped and the noise is on the grid
// (docs/math.md section 9, docs/tuning.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dpgrad {
class Rng;
}

namespace dpgrad::privacy {

/// The distribution of the number of trials K.
struct TrialCount {
  /// Which of the two distributions the paper analyses.
  enum class Kind { negative_binomial, poisson };
  Kind kind = Kind::negative_binomial;
  /// Truncated negative binomial D_{eta, gamma} on {1, 2, ...}: eta > -1, 0 < gamma < 1
  /// (eta = 1: geometric with mean 1/gamma; eta = 0: logarithmic).
  double eta = 1, gamma = 0.2;
  /// Poisson(mu) on {0, 1, ...}, mu > 0 (K = 0: nothing is released).
  double mu = 5;

  /// Throws std::invalid_argument naming the bad parameter.
  void check() const;
  /// "negative binomial (eta 1, gamma 0.2)", "poisson (mu 5)".
  std::string describe() const;
  nlohmann::json to_json() const;
  /// From to_json() output, checked (untrusted input).
  static TrialCount from_json(const nlohmann::json& j);
  /// "tnb:ETA,GAMMA" or "poisson:MU"; throws std::invalid_argument saying what is accepted.
  static TrialCount parse(const std::string& text);

  /// P[K = k].
  double pmf(long k) const;
  /// E[K].
  double mean() const;
  /// P[K > k], an upper bound (the series is summed with its remainder bounded).
  double tail(long k) const;
  /// The smallest k >= 1 with tail(k) <= p (0 < p < 1).
  long quantile(double p) const;
  /// A draw of min(K, cap) by inversion of the distribution function from rng's uniforms.
  long draw(Rng& rng, long cap) const;
};

/// Theorem 2 of Papernot and Steinke 2022: a search whose trials are each
/// (lambda, trial_rdp(lambda))-RDP for every order, with K ~ D_{eta,gamma}, is
/// (lambda, R)-RDP with R = trial_rdp(lambda) + min over hat-lambda of
/// [(1 + eta)(1 - 1/hat-lambda) trial_rdp(hat-lambda) + (1 + eta) log(1/gamma) / hat-lambda]
/// + log(E[K]) / (lambda - 1). The minimum is taken over `inner_orders` (any
/// order gives a valid bound). Returns R at each of `orders`.
std::vector<double> selection_rdp_negative_binomial(const TrialCount& k, const std::vector<double>& orders,
                                                    const std::function<double(double)>& trial_rdp,
                                                    const std::vector<double>& inner_orders);

/// Theorem 6 of Papernot and Steinke 2022: with K ~ Poisson(mu), trials that are
/// (lambda, trial_rdp(lambda))-RDP and (hat-epsilon, hat-delta)-DP with
/// e^hat-epsilon <= 1 + 1/(lambda - 1) make a (lambda, R)-RDP search,
/// R = trial_rdp(lambda) + mu hat-delta + log(mu) / (lambda - 1).
/// `trial_delta(epsilon)` is an upper bound on a trial's delta at epsilon.
std::vector<double> selection_rdp_poisson(const TrialCount& k, const std::vector<double>& orders,
                                          const std::function<double(double)>& trial_rdp,
                                          const std::function<double(double)>& trial_delta);

/// The search's RDP at `orders` for trials with RDP curve `trial_rdp` (given at
/// `orders`, which serve as the inner orders too): Theorem 2 or 6 as `k` says.
std::vector<double> selection_rdp(const TrialCount& k, const std::vector<double>& orders,
                                  const std::vector<double>& trial_rdp);

/// What a search may claim.
struct SearchEpsilon {
  double epsilon = 0;     // at `delta`, rounded up; +infinity when none is proven
  long max_trials = 0;    // the cap: the search runs min(K, max_trials) trials
  double tail = 0;        // P[K > max_trials]
  double order = 0;       // the RDP order that gave epsilon
};

/// The (epsilon, delta) of a search that runs min(K, cap) trials, each a
/// Gaussian-noise mechanism with RDP curve `trial_rdp` at `orders` (the trials'
/// worst case) whose noise is on the grid (at most `draws_per_trial` noised
/// values a trial), after releases with RDP curve `prior_rdp` (zeros: none):
/// the RDP bound of selection_rdp plus prior_rdp converted at part of delta, the
/// cap's tail P[K > cap] (1 + e^epsilon) charged to delta, and the grid's slack
/// for cap x draws_per_trial draws (grid_noise_slack). The cap is the smallest
/// that keeps the tail's charge within its share of delta.
SearchEpsilon search_epsilon(const TrialCount& k, const std::vector<double>& orders,
                             const std::vector<double>& trial_rdp, const std::vector<double>& prior_rdp,
                             double delta, double draws_per_trial);

}  // namespace dpgrad::privacy
