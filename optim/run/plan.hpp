// The plan of a training run: everything it settles before it reads any data
// (docs/library.md). From the privacy and length settings, the number of
// records N and the number of parameters (both public), it checks the settings,
// picks the sampler and the accountant that analyses it, counts the steps, sets
// delta, calibrates the noise multiplier for a target epsilon (the strategy's
// sensitivity, the noise grid's slack and the releases made before training
// included) or cuts the run before it would exceed one. A plan can be built,
// printed and checked on its own; PrivateTrainer runs one.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dpgrad {

class Sampler;
namespace privacy {
class Accountant;
}

/// How batches are drawn (each has its own accountant; Sampler for the details).
enum class Sampling {
  poisson,  // every example joins each batch independently with probability q = L / N
  shuffle,  // shuffled passes over the data, each stopped after a fraction of it
  fixed,    // batches of exactly L examples, drawn without replacement
};
std::string to_string(Sampling s);  // "poisson", "shuffle", "fixed"
/// "poisson", "shuffle" or "fixed"; throws std::invalid_argument naming the others.
Sampling sampling_from_string(const std::string& name);

/// Which accountant analyses the run (privacy/ has the classes: PldAccountant, ...).
enum class Accounting {
  automatic,  // the tightest upper bound for the sampling: pld (poisson), wor (fixed), shuffle (shuffle)
  pld,        // numerical privacy-loss distributions (poisson; also jl:K)
  rdp,        // Renyi DP of the subsampled Gaussian (poisson)
  wor,        // Renyi DP of sampling without replacement (fixed)
  shuffle,    // shuffled passes (shuffle)
};
std::string to_string(Accounting a);       // "" for automatic, else the accountant's name
Accounting accounting_from_string(const std::string& name);  // "" -> automatic; throws on unknown names

/// A Gaussian mechanism run on the training data before training (a private
/// mean of its features, for instance: privacy::noisy_clipped_sum).
struct PriorRelease {
  double noise_multiplier = 0;  // noise std / L2 sensitivity under add/remove-one, > 0
  double draws = 0;             // noised values on the grid (its dimension), >= 1
  bool operator==(const PriorRelease&) const = default;
};

/// The default delta of a run on n records: the largest power of ten with
/// delta n <= 0.6 (Fashion-MNIST's 60,000 records: 1e-5; 999 records: 1e-4).
double default_delta_for(std::size_t n);

/// The settings a plan is made from: the privacy and length settings of a run
/// (PrivateTrainingConfigT has them all) and what the clipping strategy is.
struct PlanSettings {
  bool non_private = false;               // plain training: no clipping, no noise, shuffled epochs
  double clip_norm = 1.0;                 // C
  std::optional<double> target_epsilon;   // calibrate sigma for this epsilon...
  std::optional<double> noise_multiplier; // ...or use this sigma (with a target too: stop before exceeding it)
  std::optional<double> delta;            // default: default_delta_for(N)
  bool allow_no_noise = false;            // sigma 0 only when asked for (NOT private)
  bool allow_large_delta = false;         // delta >= 1/N only when asked for (warned)
  double epochs = 1;
  long max_steps = 0;                     // > 0: at most this many steps
  std::size_t batch_size = 256;           // L
  Sampling sampling = Sampling::poisson;
  double epoch_fraction = 0.5;            // shuffle: each pass stops after this fraction
  Accounting accounting = Accounting::automatic;
  std::vector<PriorRelease> released_before;
  // the clipping strategy, as the plan needs it
  std::string strategy = "ghost";
  double sensitivity = 1.0;               // of the clipped sum, in units of C, under add/remove-one
  int jl_dim = 0;                         // K of jl:K (0: exact norms)
  bool strategy_private = true;           // false only for "none"
};

/// Checks every setting that needs no data (epochs, C, sigma, target, delta,
/// sampling, releases, the strategy); throws std::invalid_argument naming the
/// first problem. RunPlan::make calls it; programs call it before reading data.
void check_plan_settings(const PlanSettings& settings);

/// A run's plan (see the top of this file): its sampler, length, delta,
/// accountant and noise multiplier, settled by make() before any data is read.
class RunPlan {
 public:
  /// An empty plan (of nothing); RunPlan::make() makes real ones.
  RunPlan() = default;
  /// Checks `settings` and settles the run for `dataset_size` records and
  /// `parameters` noised coordinates a step. Throws std::invalid_argument naming
  /// the first problem (a target out of reach says which epsilons are reachable).
  static RunPlan make(const PlanSettings& settings, std::size_t dataset_size, std::size_t parameters);

  /// The same plan with the noise multiplier and length a run recorded when it
  /// started (a resumed run keeps its own, never recalibrated).
  RunPlan resumed(double noise_multiplier, long total_steps, bool calibrated) const;
  /// A resumed run that goes on longer under a larger budget: these settings
  /// (more epochs or steps, a larger target epsilon) at the noise multiplier the
  /// run started with, never recalibrated; the run is cut where the target is
  /// reached. Throws std::invalid_argument as make() does.
  RunPlan extended(double noise_multiplier) const;

  /// What the plan settled: the settings it was made from; whether the run is
  /// private and adds noise (sigma > 0); N; the noised coordinates a step; the
  /// sampler's name ("poisson", "shuffle" or "fixed"; always "shuffle" when not
  /// private), its sampling rate q and expected batch size L; the steps of an
  /// epoch and of the whole run.
  const PlanSettings& settings() const { return s_; }
  bool is_private() const { return !s_.non_private; }
  bool adds_noise() const { return is_private() && sigma_ > 0; }
  std::size_t dataset_size() const { return n_; }
  std::size_t parameters() const { return parameters_; }
  const std::string& sampler_name() const { return sampler_; }
  double sampling_rate() const { return q_; }
  double expected_batch_size() const { return expected_batch_; }
  long steps_per_epoch() const { return per_epoch_; }
  long total_steps() const { return total_steps_; }
  /// Steps cut to stay within the target at the given noise multiplier (0: none).
  long steps_cut() const { return cut_; }
  /// sigma: calibrated for the target epsilon, given, or kept by resumed().
  double noise_multiplier() const { return sigma_; }
  /// The noise multiplier the accountant sees: sigma / the strategy's accounted sensitivity.
  double accounted_noise_multiplier() const;
  /// Whether sigma was calibrated for a target; delta and the accountant's name
  /// (0 and "" when not private).
  bool calibrated() const { return calibrated_; }
  double delta() const { return delta_; }
  const std::string& accountant_name() const { return accountant_; }
  /// What a run's output must say about settings it was asked to accept (a large delta).
  const std::vector<std::string>& warnings() const { return warnings_; }

  /// A fresh sampler of the plan's kind over the N records (optim/sampling/sampler.hpp).
  std::unique_ptr<Sampler> make_sampler() const;
  /// A fresh accountant for the run (null when not private), holding the
  /// releases made before training when `with_releases`.
  std::unique_ptr<privacy::Accountant> make_accountant(bool with_releases = true) const;
  /// The steps the releases before training take in the ledger, and their draws.
  long release_steps() const { return release_steps_; }
  double release_draws() const { return release_draws_; }
  /// Noised values a ledger of `steps` training steps covers (the releases' draws included).
  double noise_draws(long steps) const;
  /// The epsilon at delta() after `steps` steps (the releases included), with the
  /// noise grid's slack; +infinity without noise.
  double epsilon_after(long steps) const;
  /// epsilon_after(total_steps()).
  double final_epsilon() const { return epsilon_after(total_steps_); }

  /// Every settled value, for printing and for checking.
  nlohmann::json to_json() const;
  /// One line a program can print: steps, sampling, sigma, delta, accountant, epsilon.
  std::string describe() const;

 private:
  PlanSettings s_;
  std::size_t n_ = 0, parameters_ = 0;
  std::string sampler_, accountant_;
  double fraction_ = 1, q_ = 0, expected_batch_ = 0, sigma_ = 0, delta_ = 0, release_draws_ = 0;
  long per_epoch_ = 0, total_steps_ = 0, cut_ = 0, release_steps_ = 0;
  bool calibrated_ = false;
  std::vector<std::string> warnings_;
};

}  // namespace dpgrad
