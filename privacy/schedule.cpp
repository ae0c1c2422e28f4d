// Default accountant per sampler and the epochs-to-steps count shared by the
// programs, so that a run's steps and its calculator's steps are the same number.
#include "privacy/schedule.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "privacy/accountant.hpp"

namespace dpgrad::privacy {

std::string default_accountant(const std::string& sampler) {
  if (sampler == "poisson") return "pld";
  if (sampler == "fixed") return "wor";
  if (sampler == "shuffle") return "shuffle";
  throw std::invalid_argument("unknown sampler '" + sampler + "' (expected poisson, fixed or shuffle)");
}

std::string analysed_sampler(const std::string& accountant) {
  if (accountant == "wor") return "fixed";
  if (accountant == "shuffle") return "shuffle";
  return "poisson";
}

long steps_for_epochs(const std::string& sampler, long n, long batch, double epochs, double fraction) {
  if (n < 1) throw std::invalid_argument("dataset size must be >= 1, got " + std::to_string(n));
  if (batch < 1 || batch > n)
    throw std::invalid_argument("batch size must be in [1, " + std::to_string(n) + "], got " + std::to_string(batch));
  if (!(epochs > 0) || !std::isfinite(epochs))
    throw std::invalid_argument("epochs must be finite and > 0, got " + format_number(epochs));
  double exact;
  if (sampler == "poisson" || sampler == "fixed") {
    exact = epochs * static_cast<double>(n) / static_cast<double>(batch);
  } else if (sampler == "shuffle") {
    if (!(fraction > 0 && fraction <= 1))
      throw std::invalid_argument("epoch fraction must be in (0, 1], got " + format_number(fraction));
    const double per_pass = std::floor(fraction * static_cast<double>(n) / static_cast<double>(batch));
    if (per_pass < 1)
      throw std::invalid_argument("epoch fraction " + format_number(fraction) + " leaves no whole batch of " +
                                  std::to_string(batch) + " in a pass over " + std::to_string(n) + " examples");
    exact = epochs * per_pass;
  } else {
    throw std::invalid_argument("unknown sampler '" + sampler + "' (expected poisson, fixed or shuffle)");
  }
  // Relative slack so that e.g. 3 epochs of N / L = 10.000000000000002 steps stay 30.
  const double up = std::ceil(exact * (1 - 4 * std::numeric_limits<double>::epsilon()));
  if (!(up < 9.2e18))
    throw std::invalid_argument("epochs " + format_number(epochs) + " make too many steps (" +
                                format_number(exact) + ")");
  return std::max(1L, static_cast<long>(up));
}

}  // namespace dpgrad::privacy
