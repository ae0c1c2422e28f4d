// PrivateTrainer: one object that owns a private training run (docs/library.md).
// It takes the model, the base optimizer, the training data and the run's
// settings. Its plan (RunPlan, optim/run/plan.hpp) settles before any data is
// read: sampler, accountant, steps, delta, the calibrated noise or the budget
// cut. Then it makes the releases before training (a private feature mean, say),
// checks the model on synthetic records (structural_self_check), draws noise,
// batches and directions from the secure generator, and runs the loop: train()
// saves the checkpoint that covers a step before any hook sees anything of that
// step, so a resumed run never re-draws a step whose results were shown.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>  // the full header only where JSON is used: it costs every compile a third more

#include "layers/module.hpp"
#include "optim/averaging.hpp"
#include "optim/checkpoint/checkpoint.hpp"
#include "optim/clipping/clipping.hpp"
#include "optim/dp_optimizer.hpp"
#include "optim/optimizer.hpp"
#include "optim/run/plan.hpp"
#include "optim/sampling/sampler.hpp"
#include "privacy/accountant.hpp"

namespace dpgrad {

class Communicator;
class Rng;

/// A Gaussian release made from the training data before training, owned by the
/// run: computed once (each record's row clipped to `bound`, the rows summed, grid
/// noise of std noise_multiplier * bound added, the sum divided by N), recorded
/// in the ledger as one step at q = 1 (so calibration, epsilon and the budget
/// cover it), kept in the checkpoints and handed to `use` again on resume, never
/// computed twice. private_feature_mean makes the usual one.
template <class T>
struct ReleaseBeforeTrainingT {
  std::string name;              // its key in checkpoints: letters, digits, '_', '-'
  std::string what;              // for output: "a private mean of per-record features"
  std::size_t dimension = 0;     // values released (the rows' width)
  double bound = 0;              // L2 bound of each record's row, > 0
  double noise_multiplier = 0;   // noise std / bound, > 0
  /// The rows of `records` (B records): (B, dimension), or (B, ...) with that many values a row.
  std::function<ArrayT<T>(const BatchT<T>& records)> rows;
  /// Receives the release, (dimension): the noisy mean. Called before training and after a resume.
  std::function<void(const ArrayT<T>& released)> use;
};

/// A private mean of per-record features (docs/feature-centring.md): `features`
/// maps records to (B, ...) rows of `dimension` values, each of L2 norm at most
/// `bound` (rows beyond are clipped), and `use` receives the noisy mean, e.g.
/// to set a CentreT's centre.
template <class T>
ReleaseBeforeTrainingT<T> private_feature_mean(std::size_t dimension, double bound, double noise_multiplier,
                                               std::function<ArrayT<T>(const BatchT<T>&)> features,
                                               std::function<void(const ArrayT<T>&)> use);

/// Where and how often the trainer saves its run (docs/checkpoints.md).
struct CheckpointPolicy {
  std::filesystem::path dir;  // empty: no checkpoints
  long every_steps = 0;       // also save every this many steps (0: at the end of each epoch and of the run)
  /// Continue the run checkpointed in `dir`: its plan, ledger and state; refused
  /// when there is none. Without it, a `dir` that holds a checkpoint is refused.
  bool resume = false;
  std::filesystem::path key_store;  // the per-user store of run keys (empty: default_key_store())
};

/// The settings of a training run for PrivateTrainerT; check_training_config
/// checks those that need no data.
template <class T>
struct PrivateTrainingConfigT {
  // ---- privacy
  double clip_norm = 1.0;                 // C
  std::optional<double> target_epsilon;   // calibrate sigma to spend this over the run...
  std::optional<double> noise_multiplier; // ...or use this sigma (with target_epsilon too: stop before exceeding it)
  std::optional<double> delta;            // default: the largest power of ten with delta N <= 0.6
  bool allow_no_noise = false;            // noise_multiplier 0 is refused unless this says so (NOT private)
  bool allow_large_delta = false;         // delta >= 1/N is refused unless this says so (then warnings() says why)
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
  /// Adaptive quantile clipping: clip_norm is the first step's C, which then
  /// follows a quantile of the norms (AdaptiveClipping; ghost, vanilla, naive, microbatch:M).
  std::optional<AdaptiveClipping> adaptive_clipping;
  /// Releases made from the training data before training (private_feature_mean, ...).
  std::vector<ReleaseBeforeTrainingT<T>> releases;
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
  // ---- checkpoints
  CheckpointPolicy checkpoints;
  // ---- processes (docs/distributed.md)
  /// A data-parallel run: `train` is this rank's shard, and `positions` (or, when
  /// empty, the shard's ids) its records' positions in the whole training set,
  /// every position on exactly one rank. Batches are drawn over positions; ids
  /// keep keying the rules fixed per record (microbatches, augmentation).
  /// Every rank must make the same calls in the same order. Null: one process.
  std::shared_ptr<Communicator> communicator;
  std::vector<std::size_t> positions;
  /// Under an MPI launcher, a run without a communicator is refused: every process
  /// would train alone on the same data and spend the budget again. Set this when
  /// each process's run is meant to be its own (on data of its own).
  bool alone_under_launcher = false;
  // ---- not private at all: plain training (no clipping, no noise, shuffled epochs from `seed`)
  bool non_private = false;
};
/// PrivateTrainingConfigT over float parameters.
using PrivateTrainingConfig = PrivateTrainingConfigT<float>;

/// Checks everything in `config` that needs no data, for an optimizer starting
/// at learning rate `lr`: the plan's settings (check_plan_settings), the
/// post-processing, the releases before training and the checkpoint policy.
/// Throws std::invalid_argument naming the first problem. The trainer calls it
/// first; a program can call it before reading any data.
template <class T>
void check_training_config(const PrivateTrainingConfigT<T>& config, double lr);

/// The plan a PrivateTrainerT built from `config` makes for `dataset_size`
/// records and a model of `parameters` values, before any data is read (a
/// search plans its trials with it: optim/run/tune.hpp). `layers`: the model's
/// clip_layers() count, which a "+layers:adaptive" strategy needs (it noises a
/// count per layer); 0 refuses that strategy.
template <class T>
RunPlan plan_run(const PrivateTrainingConfigT<T>& config, std::size_t dataset_size, std::size_t parameters,
                 std::size_t layers = 0);

/// What evaluate() measures on a data set: the loss, and the metrics that fit
/// the model's loss (ModelT::loss_name): "accuracy" for cross-entropy (the
/// share of examples whose largest output is their label); "accuracy@0.5"
/// (sigmoid of each output above 0.5 against its target at or above 0.5) and
/// "auc" (the area under the ROC curve of the outputs against those classes,
/// NaN when only one class is present) for BCE with logits; "mse" and "mae"
/// (over every output against its target) for MSE; then the user's
/// (PrivateTrainerT::add_metric), in the order added.
struct Evaluation {
  double loss = 0;      // mean per-example loss (the model's loss)
  double accuracy = 0;  // "accuracy" (cross-entropy) or "accuracy@0.5" (BCE); NaN for other losses or without labels
  std::size_t examples = 0;
  std::vector<std::pair<std::string, double>> metrics;  // name, value
  /// The metric called `name`; throws std::out_of_range naming the ones there are.
  double metric(const std::string& name) const;
  bool has(const std::string& name) const;
  /// "loss 0.31, accuracy@0.5 0.91, auc 0.95".
  std::string str() const;
};

/// A metric of one's own: from the model's outputs on the whole evaluated set
/// (its rows, ...) and that set, one number (PrivateTrainerT::add_metric).
template <class T>
using MetricFnT = std::function<double(const ArrayT<T>& outputs, const BatchT<T>& data)>;

/// How train() ended.
enum class RunStatus {
  complete,            // every planned step was taken
  stopped_by_budget,   // complete, but shorter than its epochs: more steps would exceed target_epsilon
};
std::string to_string(RunStatus s);  // "complete", "stopped by the privacy budget"

/// What the hooks of train() see of a step, once the checkpoint that covers it is saved.
struct StepReport {
  long step = 0;        // steps done (1 after the first)
  long epoch = 0;       // the epoch it belongs to, from 1
  StepStats stats;      // computed from the private data: NOT covered by epsilon (loss, clipped count, batch size)
  double epsilon = 0;   // spent so far (+infinity without noise)
};

/// What the hooks of train() see at an epoch's end, once it is saved.
struct EpochReport {
  long epoch = 0;       // from 1
  long steps = 0;       // steps done
  double epsilon = 0;   // spent so far (+infinity without noise)
  double seconds = 0;   // the epoch's wall time (since the run started or resumed, for the first)
  double step_seconds = 0;           // of it, in step(); and of that, data-parallel runs' summing and sending
  double communication_seconds = 0;  // gradients, and waiting for the slowest rank
  double wait_seconds = 0;
  /// The mean per-example loss over the epoch's batches, computed from the private
  /// data without noise: NOT covered by epsilon (show it only when asked, labelled).
  double train_loss = 0;
  double clip_norm = 0;  // the next step's clip norm (adaptive clipping moves it; released, no privacy cost)
  std::optional<Evaluation> evaluation;  // on the data train() was given
};

/// What train() calls as the run goes; each hook is optional (empty: not called).
template <class T>
struct TrainHooksT {
  /// After each step, with no private figure: steps done and planned (a progress bar). No save needed.
  std::function<void(long done, long total)> progress;
  /// After each step, once the checkpoint covering it is saved (with a checkpoint policy,
  /// a step hook makes every step a save: use epoch hooks for periodic output).
  std::function<void(const StepReport&)> on_step;
  /// At each epoch's end, after its evaluation and before the save: record (not show)
  /// what the checkpoint should keep of the epoch, e.g. a row of the history `extra` returns.
  std::function<void(const EpochReport&)> record_epoch;
  /// After each epoch's last step, its evaluation and the checkpoint covering it: show it here.
  std::function<void(const EpochReport&)> on_epoch;
  /// What to keep beside the run's state in each checkpoint (a program's history);
  /// resumed_extra() gives it back.
  std::function<nlohmann::json()> extra;
};

/// What train() returns: how the run ended, its steps and its epsilon.
struct TrainResult {
  RunStatus status = RunStatus::complete;  // stopped_by_budget when the plan cut steps for the target
  long steps = 0;           // taken in all (the resumed ones included)
  long planned_steps = 0;   // before the budget cut
  double epsilon = 0;       // spent (+infinity without noise)
  std::string message;      // one line saying how it ended
  double step_seconds = 0, communication_seconds = 0, wait_seconds = 0;  // this call's, summed over its epochs
};

/// Owns one training run (see the top of this file): built from the model, the
/// base optimizer, the data and the config, which it checks and plans; train()
/// runs it to the end, step() one step at a time.
template <class T>
class PrivateTrainerT {
 public:
  /// References must outlive the trainer. `train` is the private data (its ids key
  /// microbatches and augmentation). Everything is checked here, before any step;
  /// with config.checkpoints.resume, the run continues from its latest checkpoint:
  /// the config must describe the same run.
  PrivateTrainerT(ModelT<T>& model, OptimizerT<T>& optimizer, const BatchT<T>& train, PrivateTrainingConfigT<T> config);
  /// The same, resuming from `resume_from` (config.checkpoints.dir = resume_from, resume = true).
  PrivateTrainerT(ModelT<T>& model, OptimizerT<T>& optimizer, const BatchT<T>& train, PrivateTrainingConfigT<T> config,
                  const std::filesystem::path& resume_from);
  ~PrivateTrainerT();
  PrivateTrainerT(const PrivateTrainerT&) = delete;
  PrivateTrainerT& operator=(const PrivateTrainerT&) = delete;

  /// The loop: epochs of step()s. With a checkpoint policy, the step that ends an
  /// epoch (and every checkpoints.every_steps-th) is saved before anything of it
  /// is shown: then `evaluate_on` (if given; the sharded test set of a
  /// data-parallel run) is evaluated and on_epoch called.
  TrainResult train(const TrainHooksT<T>& hooks = {}, const BatchT<T>* evaluate_on = nullptr);
  /// One logical step: sample, clip, noise once, update, account. Throws once done().
  /// Nothing is saved: a caller that shows anything of it saves first (or uses train()).
  StepStats step();
  bool done() const { return steps_ >= plan_.total_steps(); }

  /// Steps taken (a resumed run's earlier ones included), planned in all, and per epoch.
  long steps_done() const { return steps_; }
  long total_steps() const { return plan_.total_steps(); }
  long steps_per_epoch() const { return plan_.steps_per_epoch(); }
  /// The epoch the next step belongs to, from 1.
  long epoch() const { return steps_ / steps_per_epoch() + 1; }
  const RunPlan& plan() const { return plan_; }

  // ---- privacy
  /// The run's epsilon so far at delta(): the accountant's, with the noise grid's
  /// slack; +infinity without noise or when nothing is proven. Never below the truth.
  double epsilon() const;
  /// epsilon() the whole run will have spent when done().
  double final_epsilon() const;
  double delta() const { return plan_.delta(); }
  double noise_multiplier() const { return plan_.noise_multiplier(); }
  bool calibrated() const { return plan_.calibrated(); }
  /// What a run's output must say about settings it was asked to accept (a delta of 1/N or more).
  const std::vector<std::string>& warnings() const { return plan_.warnings(); }
  /// Seconds the structural self-check took (structural_self_check, before any step).
  double self_check_seconds() const { return self_check_seconds_; }
  /// A resumed run that goes on longer under a larger budget: what changed
  /// ("epochs 2 -> 4, target_epsilon 1 -> 2"); empty otherwise. The noise
  /// multiplier stays the run's, and the ledger continues.
  const std::string& extension() const { return extension_; }
  /// Steps cut to stay within target_epsilon at the given noise multiplier (0: none cut).
  long steps_cut_for_budget() const { return plan_.steps_cut(); }
  double sampling_rate() const { return plan_.sampling_rate(); }
  double expected_batch_size() const { return plan_.expected_batch_size(); }
  /// Private in the sense of the guarantee: noise added, from the secure generator.
  bool is_private() const;
  bool adds_noise() const;
  const privacy::Accountant* accountant() const { return accountant_.get(); }
  const std::string& accountant_name() const { return plan_.accountant_name(); }
  const ClipStrategyT<T>& clipping() const { return *strategy_; }
  const Sampler& sampler() const { return *sampler_; }
  /// The generator of noise, sampling and directions, for run output.
  std::string noise_generator() const;
  /// What output must say of the run's privacy at `epsilon` (default: epsilon()),
  /// epsilon rounded up: "epsilon 2.9999 (delta 1e-05, pld accountant, add/remove-one
  /// neighbours)", followed by "(not private: ...)" for reproducible noise;
  /// "NOT private: no noise" without noise; "non-private" for a non-private run.
  std::string privacy_statement(std::optional<double> epsilon = std::nullopt) const;
  /// The same as JSON fields: "private"; with noise "epsilon" (a number, or "inf"
  /// when nothing is proven), "delta", "accountant", "neighbouring"; and
  /// "privacy_note" for reproducible noise.
  nlohmann::json privacy_json(std::optional<double> epsilon = std::nullopt) const;
  /// The run's facts for the top of its output, one line each: a budget cut,
  /// neighbours and generator, warnings, the self-check, releases before training,
  /// data-parallel ranks, a resume and an extension. plan().describe() is not among them.
  std::vector<std::string> describe() const;
  DPOptimizerT<T>& dp_optimizer() { return *dp_; }
  /// What defines this run, before any data is read: the config's privacy,
  /// length and sampling settings, the clipping strategy, the releases before
  /// training, the model (its name, parameter names and shapes, and a hash of
  /// their values when the trainer was built) and the optimizer (name, lr,
  /// per-parameter scales and its own settings). The ranks of a data-parallel run
  /// must agree on all of it (checked before anything else).
  const nlohmann::json& settings() const;
  /// The config the run was built from (a resumed run's, with its checkpoint policy).
  const PrivateTrainingConfigT<T>& config() const { return config_; }

  // ---- evaluation (with the parameter average when ema > 0)
  /// The model's Evaluation on `data`, run `chunk` examples at a time in
  /// evaluation mode. Throws std::invalid_argument when chunk is 0.
  Evaluation evaluate(const BatchT<T>& data, std::size_t chunk = 500);
  /// Adds a metric evaluate() reports after the built-in ones. Throws
  /// std::invalid_argument for an empty name, a name taken (by a built-in
  /// metric or one added before) or an empty function.
  void add_metric(const std::string& name, MetricFnT<T> metric);
  /// evaluate() of each rank's `shard` (of a test set, say), added up over the
  /// ranks of a data-parallel run: every rank gets the whole set's figures.
  /// The means (accuracy, accuracy@0.5, mse, mae) combine exactly; the AUC and
  /// the user's metrics, which do not, are NaN on several processes.
  Evaluation evaluate_sharded(const BatchT<T>& shard, std::size_t chunk = 500);
  /// Processes of the run (1 without a communicator) and this one's rank.
  int processes() const;
  int rank() const;
  /// The model's outputs (examples, classes) on `data` (teachers' votes, pseudo-labels).
  ArrayT<T> predict(const BatchT<T>& data, std::size_t chunk = 500);

  // ---- checkpoints
  /// Writes the run's state to `dir` (atomically; CheckpointDir), authenticated
  /// with the run's key: created in the key store by the first save of a new
  /// run, the resumed run's otherwise. `extra` is stored beside it and comes back
  /// from resumed_extra(). train() calls it under the checkpoint policy.
  void save(const std::filesystem::path& dir, nlohmann::json extra);
  /// save(dir, an empty object).
  void save(const std::filesystem::path& dir);
  /// The extra JSON of the checkpoint this run resumed from (null when it did not).
  const nlohmann::json& resumed_extra() const;
  bool resumed() const;

 private:
  // the steps of construction, in order
  void check_settings_on_all_ranks();
  std::size_t dataset_size();
  void make_plan(std::size_t n);
  void run_self_check();
  void open_checkpoints();
  void make_generators();
  void make_optimizer();
  void make_releases();
  void restore();
  void check_derived_on_all_ranks(std::size_t n);

  /// The model's outputs on `data`, chunk by chunk (the average's parameters when
  /// ema > 0, nothing recorded): use(batch, first row, outputs).
  void run_inference(const BatchT<T>& data, std::size_t chunk,
                     const std::function<void(const BatchT<T>&, std::size_t, const TensorT<T>&)>& use);
  /// config.transform applied to each example of `batch` alone, the results joined.
  BatchT<T> transform_each(const BatchT<T>& batch, long step) const;
  /// Data-parallel runs: the rows of train_ (this rank's shard) of records at
  /// positions `global` in the whole set, which must be this rank's.
  std::vector<std::size_t> local_rows(const std::vector<std::size_t>& global) const;
  /// Data-parallel runs: checks that the shards' ids cover 0..N-1 once; returns N.
  std::size_t index_shard();
  /// The key of the run checkpointed in `dir`: opened and locked on rank 0 (or
  /// the one process), received by the other ranks.
  void open_run_key(const std::filesystem::path& dir);
  /// What a checkpoint holds of the run (pointers into this trainer and the model).
  TrainingStateT<T> training_state();
  /// The save train() makes at `step` (once per step), under the policy.
  void save_covering(const TrainHooksT<T>& hooks);

  ModelT<T>& model_;
  OptimizerT<T>& optimizer_;
  const BatchT<T>& train_;
  PrivateTrainingConfigT<T> config_;
  double base_lr_ = 0;
  std::shared_ptr<nlohmann::json> settings_;  // (pointers: the header sees only json_fwd.hpp)
  RunPlan plan_;
  std::unique_ptr<Sampler> sampler_;
  std::shared_ptr<ClipStrategyT<T>> strategy_;
  std::unique_ptr<privacy::Accountant> accountant_;
  std::unique_ptr<Rng> noise_rng_, aux_rng_, sample_rng_;
  HashKey dropout_key_{};  // keys the dropout masks per record (layers/dropout.hpp); checkpointed
  std::unique_ptr<DPOptimizerT<T>> dp_;
  std::unique_ptr<ParameterAverageT<T>> average_;
  std::vector<ArrayT<T>> released_;  // the releases before training, config order
  std::vector<std::pair<std::string, MetricFnT<T>>> metrics_;  // add_metric's
  double self_check_seconds_ = 0;
  std::string self_check_;  // what the structural self-check ran, one line (SelfCheckReport::str); empty: none ran
  std::string extension_;
  long steps_ = 0, saved_at_ = -1;
  std::shared_ptr<nlohmann::json> resumed_extra_;
  std::optional<CheckpointLock> lock_;
  std::unique_ptr<RunKey> run_key_;  // created by the first save, or opened to resume
  std::vector<std::pair<std::int64_t, std::size_t>> shard_;  // (record position, row), sorted: data-parallel runs
};

/// PrivateTrainerT over float parameters.
using PrivateTrainer = PrivateTrainerT<float>;


}  // namespace dpgrad
