// Gaussian-DP accounting by the central limit theorem for Poisson-subsampled
// DP-SGD (Bu, Dong, Long, Su 2019). Cheap and often close, but an
// approximation that can under-state epsilon for few steps: always labelled so.
#pragma once

#include <memory>

#include <nlohmann/json_fwd.hpp>

#include "privacy/accountant.hpp"

namespace dpgrad::privacy {

/// The label every GDP result carries.
inline constexpr const char* kGdpLabel = "approximation (CLT)";

/// CLT mu of T steps at sampling rate q and noise multiplier sigma (Bu, Dong,
/// Long, Su 2019, §3, from Dong, Roth, Su 2019 §5): q sqrt(T (e^{1/sigma^2} - 1)).
double gdp_clt_mu(double sampling_rate, double noise_multiplier, long steps);

/// Gaussian-DP accounting of Poisson-subsampled steps, add/remove-one neighbours:
/// the ledger's CLT mu, converted to (epsilon, delta). An approximation, not a
/// proven upper bound (upper_bound() is false), so it never calibrates noise.
class GdpAccountant final : public Accountant {
 public:
  std::string name() const override { return "gdp"; }
  Neighbouring neighbouring() const override { return Neighbouring::add_remove; }
  bool upper_bound() const override { return false; }  // a CLT approximation

  /// mu of the whole ledger: mu^2 = sum_i q_i^2 T_i (e^{1/sigma_i^2} - 1).
  double mu() const;
  /// Smallest epsilon with gaussian_dp_delta(mu(), epsilon) <= delta; rounded up.
  double epsilon(double delta) const override;
  /// Dong, Roth, Su 2019 Cor. 2.13 at mu().
  double delta(double epsilon) const override;
  std::string label() const { return kGdpLabel; }

  nlohmann::json to_json() const override;  // adds "approximation" and "mu"
  std::unique_ptr<Accountant> clone() const override;
  /// Rebuilds the accountant from to_json() output, replaying its ledger through
  /// step() (replay_ledger), so every entry is validated again.
  static std::unique_ptr<GdpAccountant> from_json(const nlohmann::json& j);
};

}  // namespace dpgrad::privacy
