// PATE (Papernot et al. 2017; scalable PATE, Papernot et al. 2018): noisy
// aggregation of teachers' votes, and its Renyi-DP accounting (docs/pate.md).
//
// Neighbours are add/remove-one record. Each record belongs to exactly one
// teacher's part (optim/pate/teachers.hpp), so one record changes at most one teacher's
// vote on any query: the vote histogram moves by -1 in one class and +1 in
// another (L2 sensitivity sqrt(2)), and its largest count by at most 1.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "privacy/rdp.hpp"

namespace dpgrad {
class Rng;
}

namespace dpgrad::privacy {

// ---- mechanisms ---------------------------------------------------------------

/// GNMax: the class with the most votes after N(0, sigma^2) is added to each
/// count (ties to the lowest class). sigma > 0; votes non-empty, finite.
/// Noise on the grid of add_grid_noise (engine/random.hpp), from `rng`, which
/// must be the secure generator or the reproducible opt-in.
int gnmax(std::span<const double> votes, double sigma, Rng& rng);

/// Confident-GNMax's threshold test: max(votes) + N(0, sigma1^2) >= threshold.
bool confident(std::span<const double> votes, double threshold, double sigma1, Rng& rng);

/// Confident-GNMax: GNMax with sigma2 if the threshold test passes, else
/// nothing (an abstention). sigma1 = 0 skips the test (plain GNMax).
std::optional<int> confident_gnmax(std::span<const double> votes, double threshold, double sigma1, double sigma2,
                                   Rng& rng);

// ---- data-independent RDP -------------------------------------------------------

/// GNMax at order alpha > 1: alpha / sigma^2 (Gaussian of L2 sensitivity sqrt(2)).
double gnmax_rdp(double sigma, double order);
/// The threshold test at order alpha > 1: alpha / (2 sigma1^2) (sensitivity 1).
double threshold_rdp(double sigma1, double order);

// ---- data-dependent RDP (Papernot et al. 2018, Theorem 6) -------------------------
// These bounds are functions of the votes, that is of the private data: they
// are NOT releasable as they are (releasing them needs the smooth-sensitivity
// analysis of that paper, not implemented here). dpgrad reports them beside
// the data-independent epsilon, labelled, and never uses them to calibrate.

/// Upper bound on log P[GNMax(votes) != argmax votes]: the union bound
/// log sum_{j != j*} P[N(0, 2 sigma^2) >= n_j* - n_j], capped at log(1 - 1/k).
double gnmax_log_q(std::span<const double> votes, double sigma);

/// The RDP at `order` of a mechanism that is (mu, mu / sigma^2)-RDP for all
/// mu and outputs its most likely answer with probability >= 1 - q, q =
/// exp(log_q): Theorem 6 with mu2 = sigma sqrt(-log q), mu1 = mu2 + 1, where
/// its conditions hold (order < mu1, mu2 > 1, q small enough, -log q > mu2 /
/// sigma^2); elsewhere, and whenever it is larger, the data-independent
/// order / sigma^2. Never above gnmax_rdp(sigma, order).
double gnmax_rdp_data_dependent(double log_q, double sigma, double order);

/// log P[the threshold test passes] for these votes.
double threshold_log_pass(std::span<const double> votes, double threshold, double sigma1);
/// The threshold test's data-dependent RDP: Theorem 6 on its two outcomes,
/// q = min(P[pass], P[fail]), with sigma1 * sqrt(2) (sensitivity 1, not sqrt(2)).
/// Never above threshold_rdp(sigma1, order).
double threshold_rdp_data_dependent(double log_pass, double sigma1, double order);

// ---- the accountant ---------------------------------------------------------------

/// One ledger entry of PATE queries: at most `queries` threshold tests at
/// sigma1 (none when sigma1 == 0) and at most `answers` GNMax answers at sigma2
/// (answers <= queries).
///
/// Which queries pass the threshold depends on the data, so a run fixes both
/// caps before it starts and stops answering at `answers`: every possible run
/// then spends at most queries x threshold_rdp + answers x gnmax_rdp at each
/// order (adaptive composition bounds a run by its costliest path), and that is
/// what is recorded. Charging only the answers a run happened to give would be
/// a bound on its realised path (an odometer), not a guarantee (docs/pate.md).
struct PateQueries {
  double sigma1 = 0;  // noise std of the threshold test, in votes (0: no test)
  double sigma2 = 0;  // noise std of GNMax, in votes (> 0)
  long queries = 0;   // at most this many queries (each a threshold test when sigma1 > 0)
  long answers = 0;   // at most this many answers, in [0, queries]
};

/// Data-independent RDP of PATE queries, composed with DP-SGD steps of the
/// Poisson-subsampled Gaussian (step(), as RdpAccountant), so that a student
/// trained privately on top shares one ledger. Add/remove-one neighbours.
class PateAccountant final : public RdpCurveAccountant {
 public:
  /// Empty orders: default_rdp_orders(), refined over real orders.
  explicit PateAccountant(std::vector<double> orders = {});

  /// Records queries; throws std::invalid_argument naming a bad value (sigma2
  /// <= 0 or not finite, sigma1 < 0, queries < 0, answers outside [0, queries],
  /// or answers < queries without a threshold test).
  void record(const PateQueries& q);
  const std::vector<PateQueries>& queries() const { return queries_; }
  long total_queries() const;
  long total_answers() const;

  std::string name() const override { return "pate"; }
  Neighbouring neighbouring() const override { return Neighbouring::add_remove; }
  std::vector<double> rdp() const override;
  double rdp_at(double order) const override;

  nlohmann::json to_json() const override;  // adds "queries"
  std::unique_ptr<Accountant> clone() const override;
  /// Rebuilds the accountant from to_json() output: its orders, its ledger
  /// replayed through step() and its queries through record(), each validated again.
  static std::unique_ptr<PateAccountant> from_json(const nlohmann::json& j);

 protected:
  bool released_nothing() const override;

 private:
  bool refine_ = false;
  std::vector<PateQueries> queries_;
};

/// The epsilon a PATE run may claim at `delta`, and which of two sound analyses
/// gave it. Each is an upper bound with the noise grid's slack
/// (privacy/mechanisms.hpp) for the run's draws, one per threshold test and
/// `classes` per answer: the accountant's RDP curve, and the privacy loss
/// distribution (PldAccountant) of the same mechanisms, every threshold test a
/// Gaussian of sensitivity 1 at sigma1, every answer one of sensitivity sqrt(2)
/// at sigma2 (noise multiplier sigma2 / sqrt(2)), the ledger's DP-SGD steps as
/// they are. The PLD of composed Gaussians is within its discretisation of the
/// exact value, where the RDP conversion is 5-9% above it; a run's answers stop
/// at a cap fixed in advance, and Gaussian mechanisms composed adaptively under
/// such a cap are bounded by the capped composition (docs/pate.md).
struct PateEpsilon {
  double epsilon = 0;  // the smaller of the two
  double rdp = 0;      // RDP's
  double pld = 0;      // the PLD's (+infinity when it proves none)
  std::string by;      // "RDP" or "PLD": which gave `epsilon`
};
PateEpsilon pate_epsilons(const PateAccountant& accountant, std::size_t classes, double delta);
/// pate_epsilons(...).epsilon. +infinity when neither proves one.
double pate_epsilon(const PateAccountant& accountant, std::size_t classes, double delta);

/// The smallest GNMax sigma2 whose RDP epsilon (pate_epsilons' rdp) for `queries`
/// threshold tests at sigma1 (0: none) and `answers` answers is at most
/// `target_epsilon`; pate_epsilon, at most that, meets it too. Throws
/// std::invalid_argument if the threshold tests alone reach the target.
double calibrate_pate_sigma(double sigma1, long queries, long answers, std::size_t classes, double target_epsilon,
                            double delta);

/// The data-dependent RDP curve of a run's queries, summed query by query
/// (Theorem 6 applied to each): NOT releasable as is (see above).
class PateDataDependent {
 public:
  PateDataDependent();  // default_rdp_orders()
  /// One query with these votes: the threshold test (sigma1 > 0) and, when
  /// `answered`, the GNMax answer at sigma2.
  void add(std::span<const double> votes, double threshold, double sigma1, double sigma2, bool answered);
  const std::vector<double>& orders() const { return orders_; }
  const std::vector<double>& rdp() const { return rdp_; }
  /// Its epsilon at delta (the best order and conversion).
  double epsilon(double delta) const;

 private:
  std::vector<double> orders_, rdp_;
};

}  // namespace dpgrad::privacy
