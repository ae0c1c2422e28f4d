// Gaussian, Laplace and vector-Laplace noise on top of dpgrad::Rng, with the
// input checks that keep a bad scale from silently releasing unprotected data.
#include "engine/grid_noise.hpp"
#include "privacy/accountant.hpp"
#include "privacy/mechanisms.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace dpgrad::privacy {
namespace {

void require_positive(double x, const char* fn, const char* what) {
  if (!(x > 0.0) || !std::isfinite(x))
    throw std::invalid_argument(std::string(fn) + ": " + what + " must be finite and > 0, got " + format_number(x));
}

void require_noise_std(double s, const char* fn) {
  if (!(s >= 0.0) || !std::isfinite(s))
    throw std::invalid_argument(std::string(fn) + ": noise std must be finite and >= 0, got " + format_number(s));
}

}  // namespace

double gaussian_mechanism(double value, double noise_std, Rng& rng) {
  require_noise_std(noise_std, "gaussian_mechanism");
  require_private_generator(rng, "gaussian_mechanism's noise");
  return value + noise_std * rng.normal();
}

void add_gaussian_noise(std::span<double> values, double noise_std, Rng& rng) {
  require_noise_std(noise_std, "add_gaussian_noise");
  require_private_generator(rng, "add_gaussian_noise's noise");
  for (double& v : values) v += noise_std * rng.normal();
}

std::vector<double> noisy_clipped_sum(std::span<const float> rows, std::size_t dim, double bound,
                                      double noise_multiplier, Rng& rng, Communicator* communicator) {
  if (dim < 1 || rows.size() % dim != 0)
    throw std::invalid_argument("noisy_clipped_sum: " + std::to_string(rows.size()) +
                                " values are not whole rows of dimension " + std::to_string(dim));
  require_positive(bound, "noisy_clipped_sum", "the norm bound");
  require_positive(noise_multiplier, "noisy_clipped_sum", "the noise multiplier");
  require_private_generator(rng, "noisy_clipped_sum's noise");
  // Rounding the sum to the noise grid moves it by up to grid / 2 a coordinate, so two
  // neighbouring sums' rounded values differ by up to A = grid (sqrt(dim) + 1) more than
  // the sums do (docs/noise.md section 3): rows are clipped to bound - A, and the
  // release's sensitivity stays `bound`. A factor 1 - 2^-40 covers the rounding of
  // each row's norm and scale in double.
  const NoiseGrid grid = noise_grid(noise_multiplier * bound);
  const double allowance = grid.grid * (std::sqrt(double(dim)) + 1.0);
  const double clip = (bound - allowance) * (1 - 0x1p-40);
  if (!(clip > 0.5 * bound))
    throw std::invalid_argument("noisy_clipped_sum: noise multiplier " + format_number(noise_multiplier) +
                                " is too large for the noise grid over " + std::to_string(dim) +
                                " values (its rounding allowance would take half of the bound; docs/noise.md)");
  std::vector<double> sum(dim, 0.0);
  for (std::size_t first = 0; first < rows.size(); first += dim) {
    const float* row = rows.data() + first;
    double sq = 0;
    for (std::size_t k = 0; k < dim; ++k) sq += double(row[k]) * double(row[k]);
    if (!std::isfinite(sq))
      throw std::invalid_argument("noisy_clipped_sum: row " + std::to_string(first / dim) + " is not finite");
    const double scale = sq > clip * clip ? clip / std::sqrt(sq) : 1.0;
    for (std::size_t k = 0; k < dim; ++k) sum[k] += scale * double(row[k]);
  }
  if (communicator && communicator->size() > 1) communicator->allreduce_sum(sum.data(), dim);
  add_grid_noise(rng, grid, sum.data(), dim);
  return sum;
}

double laplace_mechanism(double value, double l1_sensitivity, double epsilon, Rng& rng) {
  require_positive(l1_sensitivity, "laplace_mechanism", "L1 sensitivity");
  require_positive(epsilon, "laplace_mechanism", "epsilon");
  require_private_generator(rng, "laplace_mechanism's noise");
  // Dwork-Roth Thm. 3.6: scale Delta_1 / eps.
  return value + rng.laplace(l1_sensitivity / epsilon);
}

void add_laplace_noise(std::span<double> values, double l1_sensitivity, double epsilon, Rng& rng) {
  require_positive(l1_sensitivity, "add_laplace_noise", "L1 sensitivity");
  require_positive(epsilon, "add_laplace_noise", "epsilon");
  require_private_generator(rng, "add_laplace_noise's noise");
  const double scale = l1_sensitivity / epsilon;
  for (double& v : values) v += rng.laplace(scale);
}

std::vector<double> vector_laplace_noise(std::size_t dim, double l2_sensitivity, double epsilon, Rng& rng) {
  if (dim < 1) throw std::invalid_argument("vector_laplace_noise: dimension must be >= 1, got 0");
  require_positive(l2_sensitivity, "vector_laplace_noise", "L2 sensitivity");
  require_positive(epsilon, "vector_laplace_noise", "epsilon");
  require_private_generator(rng, "vector_laplace_noise's noise");
  // Chaudhuri, Monteleoni, Sarwate 2011, Alg. 1: in polar coordinates the
  // density exp(-(eps/Delta) r) r^{d-1} of the norm is Gamma(d, Delta/eps).
  std::vector<double> eta(dim);
  double norm2 = 0.0;
  while (!(norm2 > 0.0)) {  // a normal vector is a uniform direction once normalised
    norm2 = 0.0;
    for (double& x : eta) {
      x = rng.normal();
      norm2 += x * x;
    }
  }
  const double radius = rng.gamma(static_cast<double>(dim), l2_sensitivity / epsilon);
  const double f = radius / std::sqrt(norm2);
  for (double& x : eta) x *= f;
  return eta;
}

std::vector<double> output_perturbation(std::span<const double> w, double l2_sensitivity, double epsilon,
                                        Rng& rng) {
  std::vector<double> out = vector_laplace_noise(w.size(), l2_sensitivity, epsilon, rng);
  for (std::size_t i = 0; i < w.size(); ++i) out[i] += w[i];
  return out;
}

double logistic_regression_sensitivity(long n, double lambda) {
  if (n < 1) throw std::invalid_argument("logistic_regression_sensitivity: dataset size must be >= 1, got " +
                                         std::to_string(n));
  require_positive(lambda, "logistic_regression_sensitivity", "lambda");
  return 2.0 / (static_cast<double>(n) * lambda);
}

namespace {

/// grid_noise_bound's terms a, b and tau for `draws` coordinates at `scale`, each
/// rounded up by a relative 1e-9, far above the rounding of these few operations.
/// a and b include the sampler's pmf bound eta (GridNoiseSampler::kPmfBound,
/// docs/noise.md section 5), which holds on |k| <= kCoverage s: R may not exceed it.
struct GridTerms {
  double a, b, tail;
};
constexpr double kUp = 1 + 1e-9;
constexpr double kEta = GridNoiseSampler::kPmfBound;

GridTerms grid_terms(double draws, double scale, double R = 12.0) {
  if (!(std::isfinite(draws) && draws >= 0))
    throw std::invalid_argument("grid_noise_bound: draws must be finite and >= 0, got " + std::to_string(draws));
  if (!(std::isfinite(scale) && scale >= 1))
    throw std::invalid_argument("grid_noise_bound: scale must be >= 1, got " + std::to_string(scale));
  if (!(R > 0 && R <= GridNoiseSampler::kCoverage))
    throw std::logic_error("grid_noise_bound: truncation beyond the sampler's coverage");
  constexpr double kPi = 3.14159265358979323846;
  const double s2 = scale * scale;
  return {draws * (-std::log1p(-1.0 / (24 * s2)) + kEta) * kUp,
          draws * (R * R / (8 * s2) + 3 * std::exp(-2 * kPi * kPi * s2) + kEta) * kUp,
          draws * std::exp(-0.5 * (R - 0.5 / scale) * (R - 0.5 / scale)) * kUp};
}

/// The truncation R (any R in (0, kCoverage] is valid, docs/noise.md section 4)
/// at which the tail term e^a e^epsilon tau stays below 2^-11 delta: 12, or more
/// for large epsilon; +infinity when even kCoverage is not enough (epsilon in the
/// hundreds: the run then claims none). (The other 2^-11 of the reserve covers
/// jl:K's steps whose chi-square factor exceeds 1024 K, where the grid's allowance
/// is not proven: e^-508 a step.)
double grid_truncation(double epsilon, double delta, double draws, double scale, double ea) {
  const double need = epsilon + std::log(draws * ea * 2048 * kUp * kUp / delta);
  const double R = std::max(12.0, (0.5 / scale + std::sqrt(2 * std::max(need, 0.0))) * kUp);
  return R <= GridNoiseSampler::kCoverage ? R : INFINITY;
}

}  // namespace

GridNoiseBound grid_noise_bound(double epsilon, double delta, double draws, double scale) {
  if (!(std::isfinite(epsilon) && epsilon >= 0) || !(delta >= 0 && delta <= 1))
    throw std::invalid_argument("grid_noise_bound: epsilon must be finite and >= 0 and delta in [0, 1], got " +
                                std::to_string(epsilon) + ", " + std::to_string(delta));
  const GridTerms t = grid_terms(draws, scale);
  GridNoiseBound r;
  r.epsilon = epsilon + t.a + t.b;
  // e^a (delta + e^eps tau) = delta + (e^a - 1)(delta + e^eps tau) + e^eps tau, each added term rounded up
  const double extra = std::exp(epsilon) * t.tail * kUp;
  r.delta = std::min(1.0, delta + (std::expm1(t.a) * (delta + extra) + extra) * kUp);
  return r;
}

GridNoiseSlack grid_noise_slack(double delta, double draws, double scale, double max_epsilon) {
  if (!(delta > 0 && delta < 1)) throw std::invalid_argument("grid_noise_slack: delta must be in (0, 1)");
  if (!(max_epsilon >= 0 && std::isfinite(max_epsilon)))
    throw std::invalid_argument("grid_noise_slack: max_epsilon must be finite and >= 0");
  // e^a (inner + e^eps tau) + jl tail <= delta: inner takes delta (1 - 2^-10) e^-a,
  // the tail term 2^-11 by the choice of R for epsilons up to max_epsilon, and
  // jl:K's rare unproven steps (below e^-508 each) the last 2^-11
  const double a = grid_terms(draws, scale).a, ea = std::exp(a) * kUp;
  GridNoiseSlack s;
  s.inner_delta = delta * (1 - 0x1p-10) / ea;
  const double R = grid_truncation(max_epsilon, delta, draws, scale, ea);
  s.epsilon_slack = std::isfinite(R) ? a + grid_terms(draws, scale, R).b : INFINITY;
  return s;
}

double grid_noise_epsilon(const Accountant& accountant, double delta, double coordinates, double scale) {
  return grid_noise_epsilon_of_draws(accountant, delta, double(accountant.total_steps()) * coordinates, scale);
}

double grid_noise_epsilon_of_draws(const Accountant& accountant, double delta, double draws, double scale) {
  const double a = grid_terms(draws, scale).a, ea = std::exp(a) * kUp;
  const double inner_delta = delta * (1 - 0x1p-10) / ea;
  if (!(inner_delta > 0)) return INFINITY;
  const double eps = accountant.epsilon(inner_delta);
  if (!std::isfinite(eps)) return INFINITY;
  return eps + grid_noise_slack(delta, draws, scale, eps).epsilon_slack;
}

}  // namespace dpgrad::privacy
