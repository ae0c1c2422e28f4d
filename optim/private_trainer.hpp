// PrivateTrainer: one object that owns a private training run. It takes the
// model, the base optimizer, the training data and the privacy settings, and
// does what a run needs so that none of it can be set wrong by hand: it builds
// the sampler and the accountant that analyses it (q and the expected batch
// size come from the sampler), checks that sampler, accountant and clipping
// strategy match, calibrates the noise multiplier for a target epsilon (the
// strategy's sensitivity and the noise grid's slack included) or stops the run
// before it would exceed one, and draws noise, batches and directions from the
// secure generator. All of this happens in the constructor, before any step.
// Then step(), epsilon(), evaluate(), save() and resume (docs/library.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "layers/module.hpp"
#include "optim/averaging.hpp"
#include "optim/checkpoint.hpp"
#include "optim/clipping.hpp"
#include "optim/dp_optimizer.hpp"
#include "optim/optimizer.hpp"
#include "optim/sampler.hpp"
#include "privacy/accountant.hpp"

namespace dpgrad {

class Communicator;
class Rng;
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

/// A Gaussian mechanism already run on the training data before training (a
/// private mean of its features, for instance: privacy::noisy_clipped_sum).
struct PriorRelease {
  double noise_multiplier = 0;  // noise std / L2 sensitivity under add/remove-one, > 0
  double draws = 0;             // noised values on the grid (its dimension), >= 1
  bool operator==(const PriorRelease&) const = default;
};

/// The default delta of a run on n records: the largest power of ten with
/// delta n <= 0.6 (Fashion-MNIST's 60,000 records: 1e-5; 999 records: 1e-4).
double default_delta_for(std::size_t n);

template <class T>
struct PrivateTrainingConfigT {
  // ---- privacy
  double clip_norm = 1.0;                 // C
  std::optional<double> target_epsilon;   // calibrate sigma to spend this over the run...
  std::optional<double> noise_multiplier; // ...or use this sigma (with target_epsilon too: stop before exceeding it)
  std::optional<double> delta;            // default: the largest power of ten with delta N <= 0.6
  bool allow_large_delta = false;         // delta >= 1/N is refused unless this says so (then warnings() says why)
  bool allow_no_noise = false;            // noise_multiplier 0 is refused unless this says so (NOT private)
  // ---- length and batches
  double epochs = 1;                      // an epoch is N / L steps
  long max_steps = 0;                     // > 0: stop after this many steps at most
  std::size_t batch_size = 256;           // L: expected (Poisson) or exact logical batch size
  std::size_t physical_batch_size = 0;    // > 0: clip in chunks of at most this many examples (memory)
  Sampling sampling = Sampling::poisson;
  double epoch_fraction = 0.5;            // shuffle: each pass stops after this fraction of the data
  // ---- mechanism
  std::shared_ptr<ClipStrategyT<T>> clipping;  // null: ghost (clipping::ghost<T>())
  Accounting accounting = Accounting::automatic;
  double sat_rho = 0;                     // DP-SAT (post-processing)
  /// Releases made from the same data before training: the ledger starts with one
  /// Gaussian step (q = 1) for each, so calibration, epsilon() and the budget
  /// cover them with the run (docs/feature-centring.md).
  std::vector<PriorRelease> released_before;
  // ---- post-processing of the released iterates (no privacy cost)
  double ema = 0;                         // evaluate an exponential moving average of the parameters (0: off)
  double lr_final = -1;                   // >= 0: cosine learning rate from the optimizer's down to this
  /// Applied to each record of a sampled batch on its own (a batch of one
  /// example) before the step: augmentation, say. Its output may hold several
  /// views of the record; `step` counts from 0. It never sees two records at once,
  /// so it cannot mix them.
  std::function<BatchT<T>(const BatchT<T>& record, long step)> transform;
  // ---- randomness
  bool reproducible_noise = false;        // seeded noise, sampling and directions: NOT private (tests, studies)
  std::uint64_t seed = 0;                 // their seed when reproducible_noise
  // ---- processes (docs/distributed.md)
  /// A data-parallel run: `train` is this rank's shard, and `positions` (or, when
  /// empty, the shard's ids) its records' positions in the whole training set,
  /// every position on exactly one rank. Batches are drawn over positions; ids
  /// keep keying the rules fixed per record (microbatches, augmentation).
  /// Batches are drawn over the whole set from a generator all ranks share, each
  /// rank clips its records of the batch, each coordinate is noised once and every
  /// rank applies the same update; one ledger. Every rank must make the same calls
  /// in the same order (step, save, evaluate_sharded). Null: one process.
  std::shared_ptr<Communicator> communicator;
  std::vector<std::size_t> positions;
  // ---- checkpoints (docs/checkpoints.md)
  /// The per-user store of the keys that authenticate checkpoints (empty: default_key_store()).
  std::filesystem::path key_store;
  // ---- not private at all: plain training (no clipping, no noise, shuffled epochs from `seed`)
  bool non_private = false;
};
using PrivateTrainingConfig = PrivateTrainingConfigT<float>;

/// What evaluate() measures on a data set.
struct Evaluation {
  double loss = 0;      // mean per-example loss (the model's loss)
  double accuracy = 0;  // share of examples whose largest output is their label; NaN without labels
  std::size_t examples = 0;
};

template <class T>
class PrivateTrainerT {
 public:
  /// References must outlive the trainer. `train` is the private data (its ids
  /// key microbatches and augmentation). With `resume_from` (a checkpoint
  /// directory written by save()), the run continues from its latest checkpoint:
  /// same sigma, same length, same ledger; the config must describe the same run.
  PrivateTrainerT(ModelT<T>& model, OptimizerT<T>& optimizer, const BatchT<T>& train,
                  PrivateTrainingConfigT<T> config, std::optional<std::filesystem::path> resume_from = {});
  ~PrivateTrainerT();
  PrivateTrainerT(const PrivateTrainerT&) = delete;
  PrivateTrainerT& operator=(const PrivateTrainerT&) = delete;

  /// One logical step: sample, clip, noise once, update, account. Throws once done().
  StepStats step();
  /// step() until done(); `on_epoch(epoch)` after each epoch's last step (metrics,
  /// checkpoints: save before showing anything of the epoch).
  void train(const std::function<void(long epoch)>& on_epoch = {});
  bool done() const { return steps_ >= total_steps_; }

  long steps_done() const { return steps_; }
  long total_steps() const { return total_steps_; }
  long steps_per_epoch() const;
  /// The epoch the next step belongs to, from 1.
  long epoch() const { return steps_ / steps_per_epoch() + 1; }

  /// What defines this run, before any data is read: the config's privacy,
  /// length and sampling settings, the clipping strategy, the model (its name,
  /// parameter names and shapes, and a hash of their values) and the optimizer
  /// (name, lr, per-parameter scales and its own settings). The ranks of a
  /// data-parallel run must agree on all of it (checked before anything else).
  nlohmann::json settings() const;

  // ---- privacy
  /// The run's epsilon so far at delta(): the accountant's, with the noise grid's
  /// slack; +infinity without noise or when nothing is proven. Never below the truth.
  double epsilon() const;
  /// epsilon() the whole run will have spent when done().
  double final_epsilon() const;
  double delta() const { return delta_; }
  double noise_multiplier() const { return sigma_; }
  bool calibrated() const { return calibrated_; }
  /// What a run's output must say about settings it was asked to accept (a delta of 1/N or more).
  const std::vector<std::string>& warnings() const { return warnings_; }
  /// Seconds the structural self-check took (structural_self_check, before any step).
  double self_check_seconds() const { return self_check_seconds_; }
  /// Steps cut to stay within target_epsilon at the given noise multiplier (0: none cut).
  long steps_cut_for_budget() const { return cut_; }
  double sampling_rate() const;
  double expected_batch_size() const;
  /// Private in the sense of the guarantee: noise added, from the secure generator.
  bool is_private() const;
  bool adds_noise() const;
  const privacy::Accountant* accountant() const { return accountant_.get(); }
  const std::string& accountant_name() const { return accountant_name_; }
  const ClipStrategyT<T>& clipping() const { return *strategy_; }
  const Sampler& sampler() const { return *sampler_; }
  /// The generator of noise, sampling and directions, for run output.
  std::string noise_generator() const;
  DPOptimizerT<T>& dp_optimizer() { return *dp_; }

  // ---- evaluation (with the parameter average when ema > 0)
  Evaluation evaluate(const BatchT<T>& data, std::size_t chunk = 500);
  /// evaluate() of each rank's `shard` (of a test set, say), added up over the
  /// ranks of a data-parallel run: every rank gets the whole set's figures.
  Evaluation evaluate_sharded(const BatchT<T>& shard, std::size_t chunk = 500);
  /// Processes of the run (1 without a communicator) and this one's rank.
  int processes() const;
  int rank() const;
  /// The model's outputs (examples, classes) on `data` (teachers' votes, pseudo-labels).
  ArrayT<T> predict(const BatchT<T>& data, std::size_t chunk = 500);

  // ---- checkpoints
  /// Writes the run's state to `dir` (atomically; CheckpointDir), authenticated
  /// with the run's key: created in config.key_store by the first save of a new
  /// run, the resumed run's otherwise. `extra` is stored beside it (a program's
  /// history, say) and comes back from resumed_extra().
  void save(const std::filesystem::path& dir, nlohmann::json extra = nlohmann::json::object());
  /// The extra JSON of the checkpoint this run resumed from (null when it did not).
  const nlohmann::json& resumed_extra() const { return resumed_extra_; }

 private:
  /// The model's outputs on `data`, chunk by chunk (the average's parameters when
  /// ema > 0, nothing recorded): use(batch, first row, outputs).
  void run_inference(const BatchT<T>& data, std::size_t chunk,
                     const std::function<void(const BatchT<T>&, std::size_t, const TensorT<T>&)>& use);
  /// Data-parallel runs: the rows of train_ (this rank's shard) of records at
  /// positions `global` in the whole set, which must be this rank's.
  std::vector<std::size_t> local_rows(const std::vector<std::size_t>& global) const;
  /// The key of the run checkpointed in `dir`: opened and locked on rank 0 (or
  /// the one process), received by the other ranks.
  void open_run_key(const std::filesystem::path& dir);
  /// structural_self_check of the model and strategy on synthetic records, on every rank.
  void run_self_check();
  /// config.transform applied to each example of `batch` alone, the results joined.
  BatchT<T> transform_each(const BatchT<T>& batch, long step) const;
  /// Data-parallel runs: checks that the shards' ids cover 0..N-1 once; returns N.
  std::size_t index_shard();
  /// What a checkpoint holds of the run (pointers into this trainer and the model).
  TrainingStateT<T> training_state() const;
  /// One Gaussian step (q = 1) per release before training, in the accountant's units.
  void add_prior_releases(privacy::Accountant& a) const;
  /// Noised values the ledger of `a` covers: the releases' draws, then the parameters at every step.
  double noise_draws(const privacy::Accountant& a) const;

  ModelT<T>& model_;
  OptimizerT<T>& optimizer_;
  const BatchT<T>& train_;
  PrivateTrainingConfigT<T> config_;
  double base_lr_ = 0;
  std::unique_ptr<Sampler> sampler_;
  std::shared_ptr<ClipStrategyT<T>> strategy_;
  std::string accountant_name_;
  std::unique_ptr<privacy::Accountant> accountant_;
  std::unique_ptr<Rng> noise_rng_, aux_rng_, sample_rng_;
  std::unique_ptr<DPOptimizerT<T>> dp_;
  std::unique_ptr<ParameterAverageT<T>> average_;
  double sigma_ = 0, delta_ = 0, self_check_seconds_ = 0;
  bool calibrated_ = false;
  long steps_ = 0, total_steps_ = 0, cut_ = 0;
  double prior_draws_ = 0;                 // noised values released before training
  std::vector<privacy::Step> prior_ledger_;  // the ledger's first entries: those releases
  long prior_steps_ = 0;
  nlohmann::json resumed_extra_;
  std::unique_ptr<RunKey> run_key_;  // created by the first save, or opened to resume
  std::vector<std::string> warnings_;
  std::vector<std::pair<std::int64_t, std::size_t>> shard_;  // (record position, row), sorted: data-parallel runs
};

using PrivateTrainer = PrivateTrainerT<float>;

/// Typed clipping strategies (make_clip_strategy takes the same as strings).
namespace clipping {
template <class T = float>
std::shared_ptr<ClipStrategyT<T>> naive();
template <class T = float>
std::shared_ptr<ClipStrategyT<T>> vanilla();
template <class T = float>
std::shared_ptr<ClipStrategyT<T>> ghost();
/// K random projections per example (DP-SGD-JL); `chunk` directions per pass (0: automatic).
template <class T = float>
std::shared_ptr<ClipStrategyT<T>> jl(int k, int chunk = 0);
/// Microbatches of M examples each (TF Privacy's microbatches): ceil(expected_batch / M)
/// microbatches a step, each clipped as one contribution (sensitivity 2C).
template <class T = float>
std::shared_ptr<ClipStrategyT<T>> microbatch(int m, double expected_batch);
}  // namespace clipping

}  // namespace dpgrad
