// Private hyperparameter search (docs/tuning.md): a random number K of private
// training runs (trials), each with settings drawn from a search space, each
// scored by a noised accuracy on a held-out part of the private data; only the
// best trial's settings, model and score are released. K is drawn from a
// truncated negative binomial or a Poisson distribution and kept secret; the
// epsilon of the whole search is Papernot and Steinke's bound
// (privacy/selection.hpp), and the trials' noise multiplier is calibrated so
// that the whole search meets its target. The search saves itself after every
// trial, and every trial saves its run, so an interrupted search resumes
// without running a trial twice or dropping one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "optim/run/private_trainer.hpp"
#include "privacy/selection.hpp"

namespace dpgrad {

/// Where the trials' settings come from: each drawn independently for each trial.
struct SearchSpace {
  std::pair<double, double> lr{0.1, 0.1};          // log-uniform in [lo, hi] (lo == hi: fixed)
  std::pair<double, double> clip_norm{1.0, 1.0};   // C (the first step's C with adaptive clipping), log-uniform
  /// Set: adaptive clipping, its quantile uniform in [lo, hi] (with the base config's other adaptive settings).
  std::optional<std::pair<double, double>> clip_quantile;
  std::vector<std::size_t> batch_sizes{256};       // one drawn uniformly
  std::vector<double> epochs{1.0};                 // one drawn uniformly
  /// Throws std::invalid_argument naming the bad range.
  void check() const;
  nlohmann::json to_json() const;
};

/// One trial's settings.
struct TrialSettings {
  double lr = 0, clip_norm = 0;         // the base optimizer's learning rate; C (the first step's, when adaptive)
  std::optional<double> clip_quantile;  // set: adaptive clipping at this quantile
  std::size_t batch_size = 0;           // expected (Poisson) batch size
  double epochs = 0;
  /// The seed the factory initialises the trial's model from (drawn with the
  /// settings): a resumed trial must start from the same parameters.
  std::uint64_t init_seed = 0;
  nlohmann::json to_json() const;
  /// From to_json() output (untrusted: checked against `space`).
  static TrialSettings from_json(const nlohmann::json& j, const SearchSpace& space);
  /// "lr 0.05, C 0.3, batch 512, 4 epochs".
  std::string describe() const;
};

/// A search's settings.
template <class T>
struct SearchConfigT {
  /// Everything else of each trial: model-independent training settings. The search
  /// sets each trial's lr, clip norm (and quantile), batch size, epochs, noise
  /// multiplier, delta and checkpoints; target_epsilon must be unset. Poisson
  /// sampling, exact per-sample norms (not jl:K), one process.
  PrivateTrainingConfigT<T> trial;
  SearchSpace space;
  privacy::TrialCount trials;
  double target_epsilon = 0;               // for the whole search (and the releases before it), > 0
  std::optional<double> delta;             // default: default_delta_for(N)
  /// Releases made before the search from the same data, composed into its epsilon.
  std::vector<PriorRelease> released_before;
  double validation_fraction = 0.1;        // the held-out part: this share of the records, drawn at random
  /// The score: the mean over the held-out records of `score` (each clipped to [0, 1];
  /// default: 1 when the record's largest output is its label), released with
  /// Gaussian noise of this standard deviation (in units of the mean).
  double score_noise = 0.01;
  std::function<std::vector<double>(const ArrayT<T>& outputs, const BatchT<T>& records)> score;
  /// Where the search keeps its state and its trials' checkpoints (required).
  std::filesystem::path dir;
  bool resume = false;                     // continue the search saved in `dir`
  std::filesystem::path key_store;         // empty: default_key_store()
  /// Seeded trial counts, settings, splits and noise: NOT private (tests, studies).
  bool reproducible = false;
  std::uint64_t seed = 0;
};
using SearchConfig = SearchConfigT<float>;

/// A trial's model and base optimizer, built afresh for its settings (the
/// optimizer at settings.lr, the model initialised from settings.init_seed: the
/// same settings must give the same model). The factory must not read the data.
template <class T>
struct TrialModelT {
  std::unique_ptr<ModelT<T>> model;          // initialised from the settings' init_seed
  std::unique_ptr<OptimizerT<T>> optimizer;  // over the model's parameters, at the settings' lr
};
template <class T>
using TrialFactoryT = std::function<TrialModelT<T>(const TrialSettings&)>;

/// What a search settles before it reads any data.
struct SearchPlan {
  double noise_multiplier = 0;   // every trial's sigma
  double score_noise_multiplier = 0;  // the score's noise std / its sensitivity (one record)
  double epsilon = 0;            // of the whole search at delta, rounded up
  double delta = 0;
  long max_trials = 0;           // the cap on K
  double cap_tail = 0;           // P[K > max_trials], charged to delta
  std::size_t train_records = 0, validation_records = 0;
  nlohmann::json to_json() const;
};

/// What the search releases: the best trial (none when K was 0).
template <class T>
struct SearchResultT {
  bool released = false;         // false: K was 0, nothing released
  TrialSettings best;            // the best trial's settings
  double score = 0;              // the best trial's noised score
  std::unique_ptr<ModelT<T>> model;  // the best trial's trained model
  SearchPlan plan;
  /// "epsilon 2.9999 (delta 1e-05, private selection over a truncated negative binomial number of trials ...)".
  std::string privacy_statement() const;
};
using SearchResult = SearchResultT<float>;

/// What a search's settings allow to check before the number of records is known
/// (a program calls it before it reads any data; plan_search calls it first): the
/// space, the distribution of K, the trial config, and a target within reach for
/// some number of records: one below what the trials' count (and the releases
/// before the search) spend even when the trials and the scores cost nothing is
/// refused, saying that floor. Throws std::invalid_argument naming the problem.
template <class T>
void check_search_settings(const SearchConfigT<T>& config);

/// Plans a search on `records` records for models of `parameters` values:
/// calibrates the trials' noise multiplier for config.target_epsilon (the
/// score's noise, every configuration of the space and the releases before it
/// included), then checks every configuration at that sigma as its trial's
/// optimizer will (adaptive clipping's count-noise rule, say), so that no trial is
/// refused after K is drawn. `layers`: the models' clip_layers() count, which a
/// "+layers:adaptive" strategy needs (as plan_run). Throws std::invalid_argument
/// naming the first problem (a target out of reach says what is reachable).
template <class T>
SearchPlan plan_search(const SearchConfigT<T>& config, std::size_t records, std::size_t parameters,
                       std::size_t layers = 0);

/// Runs the search on `data` (the private records: a held-out part scores, the
/// rest trains). `progress`, if given, is called with the seconds elapsed and
/// nothing else: the number of trials and their scores are secret.
template <class T>
SearchResultT<T> tune(const TrialFactoryT<T>& factory, const BatchT<T>& data, SearchConfigT<T> config,
                      const std::function<void(double seconds)>& progress = {});

}  // namespace dpgrad
