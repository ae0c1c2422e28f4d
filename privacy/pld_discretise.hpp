// PLD accountant, part 2: one step's pair cut into cells at the loss grid and
// each cell's mass split onto the grid so that the discrete result dominates the
// pair (connect-the-dots); for DP-SGD-JL, the mixture over cells of its
// chi-square factor (docs/privacy-accounting.md). Internal to privacy/.
#pragma once

#include "privacy/pld.hpp"
#include "privacy/pld_pairs.hpp"

namespace dpgrad::privacy::pld_detail {

// ------------------------------------------------------- one step, discretised

/// Where a single step's distribution is cut: below y_lo (only if the loss is
/// unbounded below) and above y_hi.
struct StepRange {
  double y_lo = -kInf, y_hi = kInf;  // the cuts in y (y_lo stays -infinity when the loss is bounded below)
  double loss_lo = 0, loss_hi = 0;   // the loss at y_lo (or its infimum, when bounded below) and at y_hi
  double tail = 0;  // the budget the range was found for
};

/// y_hi: where the hockey-stick delta of one step at level log_lr(y) is <= tail
/// (that is what goes to +infinity) or the loss reaches max_loss; y_lo: where the
/// A-mass below is <= tail (moved up onto the grid, so it costs no delta).
StepRange find_range(const PairModel& m, double tail, double max_loss);

/// One step's PLD, both ways. `upper` dominates the true pair: every cell of y
/// whose loss lies in [l_j, l_k] is split onto the grid points l_j and l_k so that
/// both its A- and B-mass are kept (connect-the-dots, Doroshenko, Ghazi, Kamath,
/// Kumar, Manurangsi 2022, Alg. 1 generalised to cells); what lies beyond the
/// grid's top goes to +infinity. `lower` is dominated by it up to a mean-zero
/// rounding of width h (see Hoeffding in the accountant): each thin cell's coarse
/// loss log(pa/pb) (a post-processing of the pair, so dominated) is rounded to its
/// two grid neighbours with the probabilities that keep its mean; wide cells and
/// the top are rounded down, the bottom tail dropped.
struct StepPld {
  DiscretePld upper, lower;  // the dominating PLD, and the optimistic one (only when asked for)
  double slack = 0;  // bound on the total-variation error of the cell masses
};

void trim(DiscretePld& d);

StepPld discretise(const PairModel& m, const StepRange& r, double h, double rel_width,
                   bool with_lower);



// ------------------------------------------- DP-SGD-JL as a mixture over X (sound)
//
// The directions v_1..v_K are shared by the whole batch, so the target's norm factor is
// not independent of the others' contributions. Revealing X (a post-processing of what
// the adversary may be given) makes every other example's clipped gradient the same in
// both datasets; the target then adds a vector of norm at most Z(X) = sqrt(K / X) / sigma
// in noise units. One step is dominated by P' = (X, N(0,1)), Q' = (X, (1-q) N(0,1) +
// q N(Z(X),1)), whose loss distribution is the mixture over X of subsampled-Gaussian
// ones (docs/privacy-accounting.md). X is cut into cells; each cell uses Z at its
// small-X end (the larger Z dominates), so the mixture of discretised cells dominates.

/// Regularised incomplete gamma functions P(a, x) and Q(a, x) = 1 - P(a, x), each with
/// small relative error: the series (A&S 6.5.29) for x < a + 1, otherwise the continued
/// fraction for Q (A&S 6.5.31) by the modified Lentz method.
std::pair<double, double> gamma_pq(double a, double x);

/// Cells [x_i, x_{i+1}) of X ~ chi2_K: the first is [0, x_0) (Z unbounded there), the last
/// [x_n, inf). Weights are the exact cell probabilities; z_worst (at x_i) and z_best (at
/// x_{i+1}) bracket Z on the cell. Above Z = 8 cells widen (their loss lies far beyond any
/// epsilon of interest, so their width costs nothing there).
struct JlCells {
  std::vector<double> weight, z_worst, z_best;  // z_worst = +inf for the first cell
  double weight_error = 0;                      // bound on sum |computed - true weight|
};

JlCells jl_cells(int k, double sigma, double first_cell_mass, double ratio);

void add_scaled(DiscretePld& acc, const DiscretePld& x, double w);

void add_atom(DiscretePld& acc, long j, double m);

/// Sensitivities (noise units) above this are accounted as unbounded: the loss of such a
/// step exceeds ~kHugeZ^2 / 2 = 5e7 wherever the two distributions differ, far beyond any
/// epsilon, and Z^2 would overflow near 1e154.
constexpr double kHugeZ = 1e4;

/// What one ledger entry contributes in one direction: a single pair (exact norms, or
/// the paper's JL pair), or for DP-SGD-JL the mixture over the cells of X.
class StepModel {
 public:
  /// Ledger entry `s` in direction `dir`, its ranges found for truncation budget `tail`:
  /// for DP-SGD-JL (without jl_paper_pair) one part per cell of X; with 1/sigma above
  /// kHugeZ one unbounded part; otherwise a single GaussianPair or JlPair.
  StepModel(const Step& s, PldDirection dir, double tail, const PldAccountant::Options& o)
      : q_(s.sampling_rate), dir_(dir) {
    if (s.jl_dim > 0 && !o.jl_paper_pair) {
      // Half the tail budget for the first cell (Z unbounded), half for the cells' ranges.
      const JlCells cells = jl_cells(s.jl_dim, s.noise_multiplier, 0.5 * tail, o.jl_cell_ratio);
      weight_error_ = cells.weight_error;
      for (std::size_t i = 0; i < cells.weight.size(); ++i)
        if (cells.weight[i] > 0) add_part(cells.weight[i], cells.z_worst[i], cells.z_best[i], 0.5 * tail, o);
    } else if (s.jl_dim == 0 && 1.0 / s.noise_multiplier > kHugeZ) {
      add_part(1.0, kInf, kInf, tail, o);  // (almost) no noise: as if none
    } else {
      Part p;
      p.weight = 1;
      p.worst = s.jl_dim == 0 ? std::unique_ptr<PairModel>(std::make_unique<GaussianPair>(q_, s.noise_multiplier, dir))
                              : std::make_unique<JlPair>(q_, s.noise_multiplier, s.jl_dim, dir);
      p.worst_range = find_range(*p.worst, tail, o.max_loss);
      single_ = true;
      parts_.push_back(std::move(p));
    }
    for (const Part& p : parts_) {
      if (p.worst) {
        loss_lo_ = std::min(loss_lo_, p.worst_range.loss_lo);
        loss_hi_ = std::max(loss_hi_, p.worst_range.loss_hi);
      }
    }
    if (!(loss_lo_ < loss_hi_)) {
      loss_lo_ = std::min({loss_lo_, 0.0, q_ < 1 ? std::log1p(-q_) : 0.0});
      loss_hi_ = std::max({loss_hi_, 1.0, q_ < 1 ? -std::log1p(-q_) : 0.0});
    }
  }

  /// The lowest and highest loss of its parts' ranges (when these give no range,
  /// widened to at most 0 and at least 1).
  double loss_lo() const { return loss_lo_; }
  double loss_hi() const { return loss_hi_; }

  /// The step's PLD on the grid of spacing h (rel_width as in discretise() above):
  /// for a mixture, the parts' PLDs weighted by their cells' probabilities, slack
  /// including the cells' weight error; `lower` only when with_lower.
  StepPld discretise(double h, double rel_width, bool with_lower) const {
    if (single_) return pld_detail::discretise(*parts_[0].worst, parts_[0].worst_range, h, rel_width, with_lower);
    StepPld out;
    out.upper.grid_spacing = out.lower.grid_spacing = h;
    out.slack = weight_error_;
    for (const Part& p : parts_) {
      if (p.worst) {
        const StepPld one = pld_detail::discretise(*p.worst, p.worst_range, h, rel_width, false);
        add_scaled(out.upper, one.upper, p.weight);
        out.slack += p.weight * one.slack;
      } else {
        add_unbounded(out.upper, p.weight, h, true);
      }
      if (!with_lower) continue;
      if (p.best) {
        const StepPld one = pld_detail::discretise(*p.best, p.best_range, h, rel_width, true);
        add_scaled(out.lower, one.lower, p.weight);
      } else if (p.z_best == 0) {
        add_atom(out.lower, 0, p.weight);  // Z = 0: both distributions equal
      } else {
        add_unbounded(out.lower, p.weight, h, false);
      }
    }
    trim(out.upper);
    if (with_lower) trim(out.lower);
    return out;
  }

 private:
  struct Part {
    double weight = 0, z_best = 0;  // the part's weight (its cell's probability), and Z at the cell's large-X end
    std::unique_ptr<PairModel> worst, best;  // null: Z unbounded (worst) / z_best in {0, unbounded} (best)
    StepRange worst_range, best_range;
  };

  void add_part(double weight, double z_worst, double z_best, double tail, const PldAccountant::Options& o) {
    Part p;
    p.weight = weight;
    p.z_best = z_best;
    if (z_worst <= kHugeZ) {
      p.worst = std::make_unique<GaussianPair>(q_, 1.0 / z_worst, dir_);
      p.worst->expensive = true;  // coarse cells far out: the mixture has many parts
      p.worst_range = find_range(*p.worst, tail, o.max_loss);
    }
    if (z_best > 0 && z_best <= kHugeZ) {
      p.best = std::make_unique<GaussianPair>(q_, 1.0 / z_best, dir_);
      p.best->expensive = true;
      p.best_range = find_range(*p.best, tail, o.max_loss);
    }
    parts_.push_back(std::move(p));
  }

  /// Z unbounded: remove: +inf with probability q, loss log(1-q) otherwise; add: loss
  /// -log(1-q), the supremum of that direction's loss for every Z (+inf when q = 1).
  /// Finite losses rounded up onto the grid (down for the optimistic companion).
  void add_unbounded(DiscretePld& d, double w, double h, bool up) const {
    auto index = [&](double loss) { return static_cast<long>(up ? std::ceil(loss / h) : std::floor(loss / h)); };
    if (dir_ == PldDirection::remove) {
      d.infinity_mass += w * q_;
      if (q_ < 1) add_atom(d, index(std::log1p(-q_)), w * (1 - q_));
    } else if (q_ < 1) {
      add_atom(d, index(-std::log1p(-q_)), w);
    } else {
      d.infinity_mass += w;
    }
  }

  double q_;
  PldDirection dir_;
  bool single_ = false;
  std::vector<Part> parts_;
  double weight_error_ = 0;
  double loss_lo_ = kInf, loss_hi_ = -kInf;
};



}  // namespace dpgrad::privacy::pld_detail
