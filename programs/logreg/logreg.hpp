// Private L2-regularised logistic regression by output perturbation (Chaudhuri,
// Monteleoni, Sarwate 2011; docs/math.md section 6): a Newton solver for the strongly convex
// objective, the feature map that keeps every row in the unit ball (the
// sensitivity bound needs it), the two-class data sets, and the eps-DP release.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/random.hpp"
#include "data/idx.hpp"

namespace dpgrad::logreg {

/// A binary problem whose rows already lie in the unit ball.
struct Problem {
  std::vector<double> x;   // (n, d) row-major, ||x_i||_2 <= 1
  std::vector<double> y;   // (n), each -1 or +1
  std::size_t n = 0, d = 0;
};

/// Scales every row of x by 1 / max(1, ||x_i||): the Euclidean projection onto
/// the unit ball. x: (n, d) row-major.
void project_rows_to_unit_ball(std::span<double> x, std::size_t n, std::size_t d);

/// The feature map phi(x) = P([scale * x, bias]), P the projection onto the unit
/// ball; bias = 0 drops the constant feature (d = p, else d = p + 1). P scales a
/// row by a positive factor, which never changes sign(w . phi(x)): the
/// classifier is still affine in the raw features, with the weight of the
/// constant feature as its offset. phi acts on one example at a time and does not
/// look at the data set, so it costs no privacy. raw: (n, p); labels: (n) in {-1, +1}.
Problem make_problem(std::span<const double> raw, std::size_t n, std::size_t p, std::span<const double> labels,
                     double scale, double bias);

/// J(w) = (1/n) sum_i log(1 + exp(-y_i w . x_i)) + lambda/2 ||w||^2 (docs/math.md section 6). w: (d)
double objective(const Problem& prob, std::span<const double> w, double lambda);
/// grad J(w) = -(1/n) sum_i y_i sigma(-y_i w . x_i) x_i + lambda w. w: (d); returns (d)
std::vector<double> gradient(const Problem& prob, std::span<const double> w, double lambda);
/// Fraction of rows with sign(w . x_i) = y_i (w . x_i = 0 counts as +1). w: (d)
double accuracy(const Problem& prob, std::span<const double> w);

struct SolverOptions {
  double grad_tol = 1e-9;   // stop when ||grad J(w)||_2 < grad_tol
  int max_iterations = 100;
};

struct Solution {
  std::vector<double> w;    // (d)
  double objective = 0.0;
  double grad_norm = 0.0;
  int iterations = 0;
};

/// Damped Newton's method (Armijo backtracking on J, Cholesky solve of
/// H = (1/n) X^T diag(s_i (1 - s_i)) X + lambda I) from w = 0. J is
/// lambda-strongly convex, so ||w - w*|| <= ||grad J(w)|| / lambda < grad_tol / lambda.
/// Throws std::invalid_argument for lambda <= 0 or an empty problem,
/// std::runtime_error if grad_tol is not reached within max_iterations.
Solution train(const Problem& prob, double lambda, const SolverOptions& opts = {});

/// L2 sensitivity of the released solver output: 2 / (n lambda) for the exact
/// minimiser (Chaudhuri et al. 2011, §3; replace-one neighbours, ||x|| <= 1)
/// plus 2 grad_tol / lambda, since each of the two neighbouring runs stops within
/// grad_tol / lambda of its own minimiser. grad_tol is fixed before seeing data.
double release_sensitivity(std::size_t n, double lambda, double grad_tol);

/// w + eta, density of eta proportional to exp(-(eps / Delta) ||eta||):
/// eps-DP (pure, delta = 0) for L2 sensitivity Delta (Chaudhuri et al. 2011, Alg. 1).
std::vector<double> privatize(std::span<const double> w, double sensitivity, double epsilon, Rng& rng);

/// Train and test problems with a description for the program's output.
struct Split {
  Problem train, test;
  std::string description;
};

/// Images of classes a (label +1) and b (label -1) from train and test, with
/// features phi(pixels / sqrt(pixels per image), bias): pixels in [0, 1], so the
/// scaled row has norm <= 1 before the constant feature is appended.
/// Throws std::invalid_argument if a or b is outside [0, classes), a == b, or a
/// split holds no image of a or of b.
Split two_class_subset(const data::ImageDataset& train, const data::ImageDataset& test, int class_a, int class_b,
                       double bias = 1.0);
/// two_class_subset of Fashion-MNIST (data::load_fashion_mnist; throws data::DataError if missing).
Split fashion_mnist_pair(int class_a, int class_b, double bias = 1.0);

/// Two Gaussians in R^dim: y = +-1 with probability 1/2, x = y mu + z, z ~ N(0, I),
/// mu a fixed random direction of norm `separation` (Bayes accuracy Phi(separation)).
/// Features phi(x / sqrt(dim + separation^2), bias). Data from
/// FastRng(seed XOR 0x9e3779b97f4a7c15), so a noise generator seeded with `seed` does not replay it.
/// Throws std::invalid_argument for dim, train_size or test_size 0 or separation < 0.
Split synthetic(std::size_t dim, std::size_t train_size, std::size_t test_size, double separation, double bias,
                std::uint64_t seed);

struct ExperimentOptions {
  double lambda = 1e-2;
  std::vector<double> epsilons{0.1, 0.5, 1, 2, 5, 10};
  int repeats = 10;         // noise draws per epsilon
  SolverOptions solver;
};

struct EpsilonResult {
  double epsilon = 0.0;
  double sensitivity = 0.0;          // Delta of release_sensitivity
  double expected_noise_norm = 0.0;  // E||eta|| = d Delta / eps (Gamma(d, Delta/eps))
  double mean_noise_norm = 0.0;      // over the repeats
  double accuracy_mean = 0.0, accuracy_std = 0.0;  // test accuracy; std with 1/(R-1), 0 for R = 1
};

struct ExperimentResult {
  Solution solution;                                 // w* itself: NOT private, never to be shown as it is
  double train_accuracy = 0.0, test_accuracy = 0.0;  // of w*: NOT private
  double solve_seconds = 0.0;
  std::vector<EpsilonResult> results;   // one per epsilon, in the given order
  /// Every release perturbs the same w*, so the run's guarantee is their
  /// composition: pure DP adds up, epsilon_total = repeats * sum of the epsilons
  /// over `releases` = repeats * (number of epsilons) releases.
  double epsilon_total = 0.0;
  long releases = 0;
};

/// The expected norm of the noise at the smallest epsilon, d Delta / epsilon
/// (Delta of release_sensitivity for n training rows of d features). Throws
/// std::invalid_argument (naming lambda) when it is beyond 1e150, where its square
/// and the released weights no longer compute in double precision.
double checked_noise_norm(std::size_t n, std::size_t d, const ExperimentOptions& opts);

/// Solves once, then releases `repeats` private copies per epsilon with noise
/// from rng and scores each on the test set. Throws std::invalid_argument for
/// lambda <= 0, an epsilon <= 0 (or not finite), no epsilon, repeats < 1, or
/// noise too large to compute with (checked_noise_norm), all before solving.
ExperimentResult run_experiment(const Split& split, const ExperimentOptions& opts, Rng& rng);

}  // namespace dpgrad::logreg
