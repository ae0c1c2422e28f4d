// The law of jl:K's norm estimates, checked on any model: M_i^2 / ||g_i||^2 ~
// chi2_K / K (Bu et al. 2021, Prop. 2.1), here for K = 3.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "optim/clipping/clipping.hpp"

namespace dpgrad::test {

/// The Kolmogorov-Smirnov distance between 3 M_i^2 / ||g_i||^2 over `reps`
/// jl:3 runs on `batch` and the chi2_3 CDF, and its 1% critical value.
struct JlLaw {
  double ks = 0, critical = 0, mean = 0;  // mean: of the ratios M_i^2 / ||g_i||^2 (1 in expectation)
};

inline JlLaw jl3_law(ModelT<double>& model, const BatchT<double>& batch, Rng& rng, int reps = 60) {
  const auto exact = make_clip_strategy<double>("naive")->clipped_sum(model, batch, 1e12, rng);
  auto jl = make_clip_strategy<double>("jl:3");
  std::vector<double> ratios;
  for (int rep = 0; rep < reps; ++rep) {
    const auto r = jl->clipped_sum(model, batch, 1e12, rng);
    for (std::size_t i = 0; i < batch.size(); ++i) ratios.push_back(3.0 * std::pow(r.norms(i) / exact.norms(i), 2));
  }
  std::sort(ratios.begin(), ratios.end());
  // chi2_3 CDF: erf(sqrt(x/2)) - sqrt(2x/pi) exp(-x/2)
  auto cdf = [](double x) { return std::erf(std::sqrt(x / 2)) - std::sqrt(2 * x / M_PI) * std::exp(-x / 2); };
  const double n = double(ratios.size());
  JlLaw law;
  for (std::size_t i = 0; i < ratios.size(); ++i) {
    const double f = cdf(ratios[i]);
    law.ks = std::max({law.ks, std::abs(f - double(i) / n), std::abs(double(i + 1) / n - f)});
    law.mean += ratios[i] / 3 / n;
  }
  law.critical = 1.628 / std::sqrt(n);
  return law;
}

}  // namespace dpgrad::test
