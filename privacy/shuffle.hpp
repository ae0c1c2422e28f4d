// RDP accounting for shuffled (cyclic) SGD that stops each pass at a fraction
// f of the data (Berthier et al. 2019, seed 001, Thm. 3.1): step t of a pass is
// a without-replacement step at rate gamma_t = b / (n - (t-1) b). Replace-one.
#pragma once

#include <memory>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "privacy/rdp.hpp"

namespace dpgrad::privacy {

/// Shuffled passes of batches of b out of n examples, each pass stopped after a
/// fraction f: RDP at integer orders, replace-one neighbours. Every step is
/// recorded at sampling_rate b / n; its position in the pass sets the rate it is
/// analysed at (sampling_rate_at).
class ShuffleAccountant final : public RdpCurveAccountant {
 public:
  /// n >= 1 examples, batches of 1 <= b <= n, each pass stops after
  /// max(1, floor(f n / b)) steps, f in (0, 1). Orders: integers >= 2 (empty: default).
  ShuffleAccountant(long dataset_size, long batch_size, double epoch_fraction,
                    std::vector<double> orders = {});

  std::string name() const override { return "shuffle"; }
  Neighbouring neighbouring() const override { return Neighbouring::replace_one; }
  std::vector<double> rdp() const override;

  /// n, b, f, and the steps of each pass, max(1, floor(f n / b)).
  long dataset_size() const { return n_; }
  long batch_size() const { return b_; }
  double epoch_fraction() const { return f_; }
  long steps_per_epoch() const { return steps_per_epoch_; }
  /// gamma_t = b / (n - (t-1) b) for the t-th step (1-based) of a pass.
  double sampling_rate_at(long t) const;

  nlohmann::json to_json() const override;  // adds n, b, f
  std::unique_ptr<Accountant> clone() const override;
  /// Rebuilds the accountant from to_json() output: n, b, f and its orders, then
  /// its ledger replayed through step(), validated again.
  static std::unique_ptr<ShuffleAccountant> from_json(const nlohmann::json& j);

 protected:
  /// Also requires sampling_rate == b / n (the nominal rate of a pass).
  void validate(const Step& s) const override;

 private:
  long n_, b_;
  double f_;
  long steps_per_epoch_;
};

}  // namespace dpgrad::privacy
