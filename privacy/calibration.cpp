// Bracketing + bisection for the noise multiplier that reaches a target
// epsilon. Only sigmas whose epsilon was actually computed and found <= the
// target are ever returned, so the result is as safe as the accountant.
#include "privacy/calibration.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

namespace dpgrad::privacy {
namespace {

constexpr double kSigmaMin = 1e-4, kSigmaMax = 1e7;

}  // namespace

Calibration calibrate_sigma(const std::function<double(double)>& epsilon_of, double target,
                            double sigma_rel_tol) {
  if (!(target > 0.0) || !std::isfinite(target))
    throw std::invalid_argument("calibration: target epsilon must be finite and > 0, got " + format_number(target, 6));
  if (!(sigma_rel_tol > 0.0 && sigma_rel_tol < 1.0))
    throw std::invalid_argument("calibration: relative tolerance must be in (0, 1), got " + format_number(sigma_rel_tol, 6));
  int evals = 0;
  auto eps = [&](double s) {
    ++evals;
    const double e = epsilon_of(s);
    return std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
  };
  // Bracket: lo has epsilon > target (or is 0), hi has epsilon <= target.
  double lo = 0.0, hi = 1.0;
  double eps_hi = eps(hi);
  if (eps_hi > target) {
    lo = hi;
    while (true) {
      hi *= 2.0;
      if (hi > kSigmaMax)
        throw std::invalid_argument("calibration: target epsilon " + format_number(target, 6) +
                                    " is not reached by any noise multiplier up to " + format_number(kSigmaMax, 6));
      eps_hi = eps(hi);
      if (eps_hi <= target) break;
      lo = hi;
    }
  } else {
    while (true) {
      const double s = hi / 2.0;
      if (s < kSigmaMin)
        throw std::invalid_argument("calibration: target epsilon " + format_number(target, 6) +
                                    " is met even at noise multiplier " + format_number(hi, 6) +
                                    "; no smallest sigma in range (is the target too large?)");
      const double e = eps(s);
      if (e > target) {
        lo = s;
        break;
      }
      hi = s;
      eps_hi = e;
    }
  }
  // Bisect; keep the upper (safe) end.
  for (int it = 0; it < 200; ++it) {
    if (hi - lo <= sigma_rel_tol * hi && eps_hi >= 0.99 * target) break;
    if (hi - lo <= 1e-15 * hi) break;  // epsilon jumps here: nothing closer exists
    const double mid = 0.5 * (lo + hi);
    const double e = eps(mid);
    if (e > target) lo = mid;
    else {
      hi = mid;
      eps_hi = e;
    }
  }
  return {hi, eps_hi, evals};
}

Calibration calibrate_noise_multiplier(const std::function<std::unique_ptr<Accountant>()>& make,
                                       double q, long steps, double target, double delta, int jl_dim) {
  if (!(delta > 0.0 && delta < 1.0))
    throw std::invalid_argument("calibration: delta must be in (0, 1), got " + format_number(delta, 6));
  if (steps < 1) throw std::invalid_argument("calibration: steps must be >= 1, got " + std::to_string(steps));
  // Validate q, jl_dim once up front so a bad input fails with the accountant's own message.
  auto probe = make();
  if (!probe->upper_bound())
    throw std::invalid_argument("calibration: the " + probe->name() +
                                " accountant (as configured) gives no upper bound on epsilon (" +
                                (probe->name() == "gdp" ? std::string("a CLT approximation")
                                                        : std::string("a comparison figure")) +
                                "); calibrate with an accountant that does, e.g. pld");
  probe->step(q, 1.0, steps, jl_dim);
  return calibrate_sigma(
      [&](double sigma) {
        auto a = make();
        a->step(q, sigma, steps, jl_dim);
        return a->epsilon(delta);
      },
      target);
}

Calibration calibrate_noise_multiplier(const std::string& accountant, const AccountantOptions& opts,
                                       double q, long steps, double target, double delta, int jl_dim) {
  return calibrate_noise_multiplier([&] { return make_accountant(accountant, opts); }, q, steps, target, delta,
                                    jl_dim);
}

}  // namespace dpgrad::privacy
