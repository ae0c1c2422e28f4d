// The classic noise mechanisms: Gaussian, Laplace, and the vector Laplace noise
// of output perturbation (density proportional to exp(-(eps/Delta) ||eta||_2)).
// All draw from a dpgrad::Rng, which must be SecureRng, or ReproducibleRng for
// results anyone can recompute (NOT private): others are refused.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "engine/communicator.hpp"
#include "engine/random.hpp"

namespace dpgrad::privacy {

/// Gaussian mechanism: value + N(0, noise_std^2). For (eps, delta) at L2
/// sensitivity Delta take noise_std = analytic_gaussian_noise_std(eps, delta, Delta)
/// (conversions.hpp; Balle and Wang 2018).
double gaussian_mechanism(double value, double noise_std, Rng& rng);
/// Adds independent N(0, noise_std^2) to every entry.
void add_gaussian_noise(std::span<double> values, double noise_std, Rng& rng);

/// A run's (epsilon, delta), computed by any accountant for Gaussian noise
/// N(0, s^2 grid^2) per coordinate, made to hold for the discrete Gaussian
/// grid * N_Z(0, s^2) that the DP optimizer adds instead (docs/noise.md section 4):
/// with n = `draws` (noised coordinates over the whole run: steps x parameters),
/// a = n (-log(1 - 1/(24 s^2)) + eta), b = n (R^2 / (8 s^2) + 3 exp(-2 pi^2 s^2) + eta),
/// R = 12, tau = n exp(-(R - 1/(2 s))^2 / 2), eta = GridNoiseSampler::kPmfBound
/// (how far the sampler's pmf may be from the discrete Gaussian's, section 5):
///   epsilon' = epsilon + a + b,   delta' = e^a (delta + e^epsilon tau).
/// scale: s >= 1 as the sampler uses it (NoiseGrid::scale); draws >= 0.
struct GridNoiseBound {
  double epsilon = 0;  // epsilon' = epsilon + a + b
  double delta = 0;    // delta' = e^a (delta + e^epsilon tau), at most 1
};
GridNoiseBound grid_noise_bound(double epsilon, double delta, double draws, double scale);

/// What to ask a Gaussian accountant for so that grid_noise_bound's result holds
/// at `delta`: its epsilon at `inner_delta`, plus `epsilon_slack`, for any
/// epsilon up to `max_epsilon` (the truncation R grows with it; docs/noise.md);
/// epsilon_slack is +infinity past the sampler's coverage (max_epsilon in the hundreds).
struct GridNoiseSlack {
  double inner_delta = 0;    // the delta to ask the Gaussian accountant's epsilon at
  double epsilon_slack = 0;  // what to add to that epsilon (+infinity: none can be claimed)
};
GridNoiseSlack grid_noise_slack(double delta, double draws, double scale, double max_epsilon);

class Accountant;
/// The epsilon a run whose noise is on the grid may claim at `delta`:
/// `accountant`'s epsilon for the Gaussian at the slack's inner delta, plus the
/// slack; draws = accountant.total_steps() x `coordinates`. +infinity when the
/// accountant proves none. `scale`: the smallest NoiseGrid::scale (2^24) bounds every grid.
double grid_noise_epsilon(const Accountant& accountant, double delta, double coordinates, double scale = 0x1p24);
/// The same for mechanisms that count their own draws (PATE: one per threshold
/// test, one per class and answer).
double grid_noise_epsilon_of_draws(const Accountant& accountant, double delta, double draws, double scale = 0x1p24);

/// The Gaussian mechanism on a sum of vectors: each of the n rows of `rows`
/// (n x dim, row-major) scaled down to L2 norm at most `bound` less the noise
/// grid's rounding allowance grid (sqrt(dim) + 1) (so that the rounded sum moves
/// by at most `bound` when a row is added or removed), the rows summed in
/// double, and grid noise (add_grid_noise) of standard deviation
/// noise_multiplier * bound added to each of the dim sums. Its privacy is one
/// Gaussian step (q = 1) at noise_multiplier under add/remove-one neighbours (at
/// noise_multiplier / 2 under replace-one: a replaced row moves the sum by 2 bound),
/// with dim noise draws. Throws std::invalid_argument on a bad size, bound or
/// multiplier (0 is refused: never a sum without noise) and on non-finite rows.
/// With a communicator of more than one process (a data-parallel run), every rank
/// passes its own rows: the ranks' sums are added, then noised once with `rng`,
/// which must be the same stream on every rank (share_generator), so that every
/// rank returns the same release. Every rank must call it.
std::vector<double> noisy_clipped_sum(std::span<const float> rows, std::size_t dim, double bound,
                                      double noise_multiplier, Rng& rng, Communicator* communicator = nullptr);

/// Laplace mechanism (Dwork, McSherry, Nissim, Smith 2006; Dwork-Roth Thm. 3.6):
/// value + Lap(Delta_1 / eps) is eps-DP for a query of L1 sensitivity Delta_1.
double laplace_mechanism(double value, double l1_sensitivity, double epsilon, Rng& rng);
/// Adds independent Lap(Delta_1 / eps) to every entry (Delta_1: L1 sensitivity of the whole vector).
void add_laplace_noise(std::span<double> values, double l1_sensitivity, double epsilon, Rng& rng);

/// Noise eta in R^dim with density proportional to exp(-(eps / Delta) ||eta||_2)
/// (Chaudhuri, Monteleoni, Sarwate 2011, Alg. 1): ||eta|| ~ Gamma(shape dim,
/// scale Delta / eps), direction uniform on the sphere. eps-DP for L2 sensitivity Delta.
std::vector<double> vector_laplace_noise(std::size_t dim, double l2_sensitivity, double epsilon, Rng& rng);
/// Output perturbation: w + vector_laplace_noise(w.size(), Delta, eps).
std::vector<double> output_perturbation(std::span<const double> w, double l2_sensitivity, double epsilon,
                                        Rng& rng);
/// L2 sensitivity of the minimiser of L2-regularised logistic regression with
/// ||x|| <= 1 (Chaudhuri, Monteleoni, Sarwate 2011, §3, output perturbation): 2 / (N lambda).
double logistic_regression_sensitivity(long dataset_size, double lambda);

}  // namespace dpgrad::privacy
