// Noise calibration: the smallest noise multiplier sigma whose epsilon reaches
// a target, for any accountant, by bracketing and bisection. Generic over a
// callable so that every accountant (and future ones) calibrates the same way.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "privacy/accountant.hpp"

namespace dpgrad::privacy {

/// The result of a noise calibration (calibrate_sigma, calibrate_noise_multiplier).
struct Calibration {
  double noise_multiplier;  // smallest sigma found with epsilon <= target
  double epsilon;           // epsilon at that sigma: <= target, and >= 0.99 target when reachable
  int evaluations;          // how many epsilons were computed
};

/// Smallest sigma (to relative precision `sigma_rel_tol`) with
/// epsilon_of_sigma(sigma) <= target_epsilon, for epsilon non-increasing in sigma.
/// Brackets from sigma = 1 by doubling/halving within [1e-4, 1e7], then bisects,
/// always returning a sigma whose epsilon was computed and is <= the target; it
/// stops once the bracket is narrow and that epsilon is within 1% of the target.
/// Throws std::invalid_argument if target_epsilon <= 0 or no sigma in range reaches it.
Calibration calibrate_sigma(const std::function<double(double)>& epsilon_of_sigma, double target_epsilon,
                            double sigma_rel_tol = 1e-4);

/// Calibration for an accountant: each trial builds a fresh accountant with
/// make_accountant(), records `steps` steps at (sampling_rate, sigma, jl_dim)
/// and asks its epsilon(delta). Refuses (std::invalid_argument) an accountant whose
/// upper_bound() is false: an approximation never sets the noise of a run.
Calibration calibrate_noise_multiplier(const std::function<std::unique_ptr<Accountant>()>& make_accountant,
                                       double sampling_rate, long steps, double target_epsilon, double delta,
                                       int jl_dim = 0);

/// The same by accountant name and options (see make_accountant()).
Calibration calibrate_noise_multiplier(const std::string& accountant, const AccountantOptions& opts,
                                       double sampling_rate, long steps, double target_epsilon, double delta,
                                       int jl_dim = 0);

}  // namespace dpgrad::privacy
