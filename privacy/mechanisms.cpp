// Gaussian, Laplace and vector-Laplace noise on top of dpgrad::Rng, with the
// input checks that keep a bad scale from silently releasing unprotected data.
#include "privacy/accountant.hpp"
#include "privacy/mechanisms.hpp"

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

}  // namespace dpgrad::privacy
