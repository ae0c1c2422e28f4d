// Renyi-DP accounting of the Poisson-subsampled Gaussian mechanism (Mironov,
// Talwar, Zhang 2019) over a grid of orders, and the shared base of every
// accountant that sums RDP curves and converts them to (epsilon, delta).
#pragma once

#include <memory>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "privacy/accountant.hpp"
#include "privacy/conversions.hpp"

namespace dpgrad::privacy {

/// {1.1, 1.25, ..., 4.5, 5, 6, ..., 64, 72, 80, 96, 112, 128, 160, 192, 224, 256}.
std::vector<double> default_rdp_orders();
/// The integer orders (>= 2) of default_rdp_orders().
std::vector<double> default_integer_rdp_orders();

/// RDP at `order` (> 1) of the Poisson-subsampled Gaussian with sampling rate q
/// in (0, 1] and noise multiplier sigma > 0, add/remove-one neighbours
/// (Mironov, Talwar, Zhang 2019): q = 1 exactly alpha / (2 sigma^2); integer
/// orders by the binomial sum of §3.2, fractional orders by the two series of
/// §3.3 (with the truncation error bounded and added). Never negative.
double rdp_subsampled_gaussian(double sampling_rate, double noise_multiplier, double order);

/// An accountant whose analysis is an RDP curve summed over its ledger.
class RdpCurveAccountant : public Accountant {
 public:
  /// The RDP orders of its grid, sorted, without duplicates.
  const std::vector<double>& orders() const { return orders_; }
  /// Total RDP of the ledger at each of orders().
  virtual std::vector<double> rdp() const = 0;

  double epsilon(double delta) const override;
  double delta(double epsilon) const override;
  /// epsilon(delta) with the order and the conversion that achieved it: the best
  /// order of the grid, then, where rdp_at() is available, a golden-section search
  /// over real orders between the best order's grid neighbours (every order gives a
  /// valid bound, so the search only ever improves it).
  RdpEpsilon epsilon_details(double delta) const;
  /// Total RDP of the ledger at any real order > 1; NaN where the accountant has
  /// no expression for non-grid orders (then no refinement).
  virtual double rdp_at(double order) const;

  nlohmann::json to_json() const override;

 protected:
  /// orders: sorted and de-duplicated here; `integer_only` refuses non-integers and orders < 2.
  RdpCurveAccountant(std::vector<double> orders, bool integer_only);
  /// Nothing recorded: (0, 0)-DP. The ledger of steps by default.
  virtual bool released_nothing() const { return ledger_.empty(); }
  std::vector<double> orders_;
};

/// Poisson subsampling, add/remove-one neighbours (pld is the default and tighter).
class RdpAccountant final : public RdpCurveAccountant {
 public:
  /// Empty orders: default_rdp_orders(), with the best order refined over real orders
  /// (epsilon_details). Given orders are used as they are. Orders must be finite and > 1.
  explicit RdpAccountant(std::vector<double> orders = {});

  std::string name() const override { return "rdp"; }
  Neighbouring neighbouring() const override { return Neighbouring::add_remove; }
  std::vector<double> rdp() const override;
  double rdp_at(double order) const override;  // fractional orders: MTZ 2019 §3.3; NaN if not refining

  nlohmann::json to_json() const override;  // adds "refine_order"
  std::unique_ptr<Accountant> clone() const override;
  /// Rebuilds the accountant from to_json() output: its orders (the default grid
  /// when it refined), then its ledger replayed through step(), validated again.
  static std::unique_ptr<RdpAccountant> from_json(const nlohmann::json& j);

 private:
  bool refine_ = false;
};

}  // namespace dpgrad::privacy
