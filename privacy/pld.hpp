// Tight numerical accounting with privacy loss distributions (PLD) for the
// Poisson-subsampled Gaussian and for DP-SGD-JL (as a mixture over the revealed
// chi-square factor, docs/privacy-accounting.md): each step's loss is discretised
// pessimistically on a uniform grid (connect-the-dots, Doroshenko et al. 2022) and the
// steps are composed by FFT (Koskela, Jalko, Honkela 2020; Gopi, Lee, Wutschitz 2021).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "privacy/accountant.hpp"

namespace dpgrad::privacy {

/// A privacy loss distribution on the grid {i h}: mass[k] at loss (offset + k) h,
/// plus an atom at +infinity. Masses under the first distribution of the pair.
struct DiscretePld {
  /// h, the index of mass[0], the masses, and the mass of the atom at +infinity.
  double grid_spacing = 1.0;
  long offset = 0;
  std::vector<double> mass;
  double infinity_mass = 0;
};

/// delta(eps) = sum_i mass_i (1 - e^{eps - l_i})_+ + infinity_mass: the hockey-stick
/// divergence of the pair the PLD describes (Koskela et al. 2020, eq. (5)).
double pld_delta(const DiscretePld& pld, double epsilon);
/// Smallest eps (possibly negative, -inf if every eps works) with
/// pld_delta(pld, eps) + extra <= delta; +inf if there is none.
double pld_epsilon(const DiscretePld& pld, double delta, double extra = 0);

/// The pair whose PLD a step contributes. add/remove neighbours give two pairs
/// (Zhu, Dong, Wang 2022, Prop. 30): remove = (mixture, N(0,1)), add = (N(0,1), mixture),
/// mixture = (1-q) N(0,1) + q N(Z,1), Z = 1/sigma (jl_dim 0). DP-SGD-JL (jl_dim K): the
/// pair (X, N(0,1)) against (X, mixture with Z = sqrt(K/X)/sigma), X ~ chi2_K revealed.
enum class PldDirection { remove, add };

/// Tight numerical accounting of Poisson-subsampled steps and DP-SGD-JL steps,
/// add/remove-one neighbours: each ledger entry's PLD, both directions, composed
/// by FFT; epsilon() and delta() take the larger direction of the pessimistic PLDs.
class PldAccountant final : public Accountant {
 public:
  /// Numerical settings; the constructor throws std::invalid_argument for one
  /// out of its range (e.g. grid_spacing in (0, 1], tail_fraction in (0, 0.5]).
  struct Options {
    /// Loss grid spacing h (the finest used; coarsened automatically when the
    /// composed distribution would need more than max_grid_points).
    double grid_spacing = 5e-5;
    /// Share of the target delta that truncating distributions may spend: the
    /// mass cut off (into the +infinity atom) is at most this times delta.
    double tail_fraction = 1e-3;
    /// Longest distribution array kept during composition (FFTs are twice that).
    long max_grid_points = 1L << 19;
    /// Single-step losses above this go to the +infinity atom (JL with small K).
    double max_loss = 1e4;
    /// JL only: beyond the first 4000 grid levels either side of 0, loss cells are
    /// this wide relative to |loss| (each split pessimistically onto the grid).
    double relative_cell_width = 2e-3;
    /// JL only: cells of X are cut so that Z varies by at most this ratio - 1 inside a
    /// cell (below Z = 8 noise units; wider above). Any value is sound; smaller is tighter.
    double jl_cell_ratio = 2e-3;
    /// JL only: account the pair (N(0,1), E_X N(Z,1)) of Bu et al. 2021 (Thm 4.1) instead.
    /// That pair treats the target's factor as independent of the batch: it is NOT an
    /// upper bound for DP-SGD-JL (docs/privacy-accounting.md) and is kept for comparison
    /// only; upper_bound() is false with it, so it never calibrates sigma.
    bool jl_paper_pair = false;
  };

  /// Default Options, or the given ones (throws std::invalid_argument for an option
  /// out of range); a copy shares the cached composition of the ledger.
  PldAccountant();
  explicit PldAccountant(Options options);
  PldAccountant(const PldAccountant& other);
  PldAccountant& operator=(const PldAccountant&) = delete;

  std::string name() const override;            // "pld"
  Neighbouring neighbouring() const override;   // add_remove
  bool supports_jl() const override;            // true
  bool upper_bound() const override;            // false only with jl_paper_pair
  double epsilon(double delta) const override;  // upper bound, +inf if none
  double delta(double epsilon) const override;  // upper bound
  /// (optimistic lower, pessimistic upper) bounds on the epsilon of the exact
  /// analysis at `delta`; their gap is the discretisation error.
  std::pair<double, double> epsilon_bounds(double delta) const;
  /// Grid spacing actually used by the last evaluation (0 before any).
  double last_grid_spacing() const;

  /// The settings it was built with.
  const Options& options() const { return options_; }
  nlohmann::json to_json() const override;
  /// Rebuilds the accountant from to_json() output: its options, then its ledger
  /// replayed through step(). Throws std::invalid_argument for another accountant's
  /// JSON, an option of the wrong type or out of range, or a bad ledger.
  static std::unique_ptr<PldAccountant> from_json(const nlohmann::json& j);
  std::unique_ptr<Accountant> clone() const override;

 private:
  struct Composed;  // cached composition of the ledger (defined in pld.cpp)
  std::shared_ptr<const Composed> composed(double budget, bool with_lower) const;

  Options options_;
  mutable std::mutex mutex_;
  mutable std::shared_ptr<const Composed> cache_;
};

}  // namespace dpgrad::privacy
