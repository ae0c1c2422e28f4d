// RDP accounting for fixed-size batches drawn without replacement, replace-one
// neighbours (Wang, Balle, Kasiviswanathan 2019, Thm. 9) with the Gaussian
// mechanism as base; integer orders only, as the theorem requires.
#pragma once

#include <memory>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "privacy/rdp.hpp"

namespace dpgrad::privacy {

/// RDP at integer `order` >= 2 of one step: a batch of gamma n out of n drawn
/// without replacement, Gaussian noise multiplier sigma on a sum clipped to C,
/// replace-one neighbours (sensitivity 2C, so eps(j) = 2 j / sigma^2). Wang,
/// Balle, Kasiviswanathan 2019 Thm. 9, capped by the unsubsampled 2 alpha / sigma^2.
double rdp_wor_gaussian(double gamma, double noise_multiplier, int order);

/// Sampling without replacement; the ledger's sampling_rate is gamma = b / n.
class WorAccountant final : public RdpCurveAccountant {
 public:
  /// Empty orders: default_integer_rdp_orders(). Orders must be integers >= 2.
  explicit WorAccountant(std::vector<double> orders = {});

  std::string name() const override { return "wor"; }
  Neighbouring neighbouring() const override { return Neighbouring::replace_one; }
  std::vector<double> rdp() const override;

  std::unique_ptr<Accountant> clone() const override;
  /// Rebuilds the accountant from to_json() output: its orders, then its ledger
  /// replayed through step(), validated again.
  static std::unique_ptr<WorAccountant> from_json(const nlohmann::json& j);
};

}  // namespace dpgrad::privacy
