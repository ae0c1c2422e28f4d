// PrivateTrainer (optim/run/private_trainer.hpp): a run's construction in
// named steps, its loop with save-before-release, evaluation and checkpoints.
#include "optim/run/private_trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>
#include <sodium.h>

#include "engine/blas.hpp"
#include "engine/check.hpp"
#include "engine/communicator.hpp"
#include "engine/ops.hpp"
#include "engine/random.hpp"
#include "engine/tape.hpp"
#include "layers/dropout.hpp"
#include "optim/clipping/check_per_sample.hpp"
#include "privacy/accountant.hpp"
#include "privacy/mechanisms.hpp"

namespace dpgrad {

std::string to_string(RunStatus s) {
  switch (s) {
    case RunStatus::complete: return "complete";
    case RunStatus::stopped_by_budget: return "stopped by the privacy budget";
  }
  throw std::invalid_argument("unknown RunStatus value");
}

template <class T>
ReleaseBeforeTrainingT<T> private_feature_mean(std::size_t dimension, double bound, double noise_multiplier,
                                               std::function<ArrayT<T>(const BatchT<T>&)> features,
                                               std::function<void(const ArrayT<T>&)> use) {
  ReleaseBeforeTrainingT<T> r;
  r.name = "feature_mean";
  r.what = "a private mean of per-record features";
  r.dimension = dimension;
  r.bound = bound;
  r.noise_multiplier = noise_multiplier;
  r.rows = std::move(features);
  r.use = std::move(use);
  return r;
}

namespace {

std::string num(double x) { return privacy::format_number(x, 6); }

/// The plan's view of a config and its strategy.
template <class T>
PlanSettings plan_settings(const PrivateTrainingConfigT<T>& c, const ClipStrategyT<T>& strategy) {
  PlanSettings s;
  s.non_private = c.non_private;
  s.clip_norm = c.clip_norm;
  s.target_epsilon = c.target_epsilon;
  s.noise_multiplier = c.noise_multiplier;
  s.delta = c.delta;
  s.allow_no_noise = c.allow_no_noise;
  s.allow_large_delta = c.allow_large_delta;
  s.epochs = c.epochs;
  s.max_steps = c.max_steps;
  s.batch_size = c.batch_size;
  s.sampling = c.sampling;
  s.epoch_fraction = c.epoch_fraction;
  s.accounting = c.accounting;
  for (const auto& r : c.releases) s.released_before.push_back({r.noise_multiplier, double(r.dimension)});
  s.strategy = strategy.name();
  s.sensitivity = strategy.sensitivity();
  s.jl_dim = strategy.jl_dim();
  s.strategy_private = strategy.is_private();
  return s;
}

/// The strategy a config runs: "none" when not private, else its own or ghost.
template <class T>
std::shared_ptr<ClipStrategyT<T>> strategy_of(const PrivateTrainingConfigT<T>& c) {
  if (c.non_private) return make_clip_strategy<T>(ClipSpec{ClipSpec::Kind::none});
  return c.clipping ? c.clipping : clipping::ghost<T>();
}

/// Adaptive clipping's settings.
nlohmann::json adaptive_json(const AdaptiveClipping& a) {
  return {{"quantile", a.quantile}, {"count_noise", a.count_noise}, {"lr", a.lr}, {"min_clip_norm", a.min_clip_norm},
          {"max_clip_norm", a.max_clip_norm}, {"normalise", a.normalise}};
}

/// What defines a run before any data: see PrivateTrainerT::settings().
template <class T>
nlohmann::json run_settings(const PrivateTrainingConfigT<T>& c, const ClipStrategyT<T>& strategy,
                            const ModelT<T>& model, const OptimizerT<T>& optimizer, double base_lr) {
  auto optional = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
  nlohmann::json releases = nlohmann::json::array();
  for (const auto& r : c.releases)
    releases.push_back({{"name", r.name}, {"dimension", r.dimension}, {"bound", r.bound},
                        {"noise_multiplier", r.noise_multiplier}});
  nlohmann::json params = nlohmann::json::array();
  crypto_generichash_state h;
  crypto_generichash_init(&h, nullptr, 0, 32);
  for (const auto& p : model.parameters()) {
    params.push_back({p.name(), shape_of(p.value())});
    crypto_generichash_update(&h, reinterpret_cast<const unsigned char*>(p.value().data()), p.value().size() * sizeof(T));
  }
  unsigned char digest[32];
  crypto_generichash_final(&h, digest, sizeof digest);
  std::string hex;
  for (unsigned char b : digest) hex += "0123456789abcdef"[b >> 4], hex += "0123456789abcdef"[b & 15];
  nlohmann::json scales = nlohmann::json::array();
  for (std::size_t i = 0; i < optimizer.params().size(); ++i) scales.push_back(optimizer.lr_scale(i));
  nlohmann::json opt = {{"name", optimizer.name()}, {"lr", base_lr}, {"lr_scales", scales}};
  for (const auto& [k, v] : optimizer.settings()) opt[k] = v;
  nlohmann::json j = {{"private", !c.non_private},
          {"clip_norm", c.clip_norm},
          {"target_epsilon", optional(c.target_epsilon)},
          {"noise_multiplier", optional(c.noise_multiplier)},
          {"delta", optional(c.delta)},
          {"allow_no_noise", c.allow_no_noise},
          {"allow_large_delta", c.allow_large_delta},
          {"epochs", c.epochs},
          {"max_steps", c.max_steps},
          {"batch_size", c.batch_size},
          {"sampler", to_string(c.sampling)},
          {"epoch_fraction", c.epoch_fraction},
          {"clip_strategy", strategy.name()},
          {"accountant", to_string(c.accounting)},
          {"sat_rho", c.sat_rho},
          {"releases_before", releases},
          {"ema", c.ema},
          {"lr_final", c.lr_final},
          {"transform", bool(c.transform)},
          {"reproducible_noise", c.reproducible_noise},
          {"seed", c.reproducible_noise ? nlohmann::json(c.seed) : nlohmann::json()},
          {"model", {{"name", model.name()}, {"parameters", params}, {"values", hex}}},
          {"optimizer", opt}};
  if (c.adaptive_clipping) j["adaptive_clipping"] = adaptive_json(*c.adaptive_clipping);  // absent when off
  return j;
}

/// What a checkpoint records of a run's settings: all but the parameters' values,
/// which training changes (a resumed run takes them from the checkpoint).
nlohmann::json recorded(nlohmann::json settings) {
  if (settings.contains("model")) settings["model"].erase("values");
  return settings;
}

/// The settings of `now` that differ from `stored`, as "key (checkpoint X, now Y)"; nested keys dotted.
std::string differences(const nlohmann::json& now, const nlohmann::json& stored) {
  std::string out;
  const nlohmann::json a = now.flatten(), b = stored.is_object() ? stored.flatten() : nlohmann::json::object();
  auto add = [&](const std::string& key, const nlohmann::json& was, const nlohmann::json& is) {
    std::string k = key;
    std::replace(k.begin(), k.end(), '/', '.');
    out += (out.empty() ? "" : "; ") + k.substr(k.empty() ? 0 : 1) + " (checkpoint " + (was.is_null() ? "none" : was.dump()) +
           ", now " + (is.is_null() ? "none" : is.dump()) + ")";
  };
  for (const auto& [k, v] : a.items())
    if (!b.contains(k) || b[k] != v) add(k, b.contains(k) ? b[k] : nlohmann::json(), v);
  for (const auto& [k, v] : b.items())
    if (!a.contains(k)) add(k, v, nlohmann::json());
  return out;
}

/// A resumed run may go on longer under a larger budget (docs/checkpoints.md):
/// more epochs, a larger step limit (0: none), a larger target epsilon (kept if
/// the checkpointed run had one). Each such change in `now` is copied into
/// `stored`, so that the comparison that follows sees only the other changes,
/// and described in the return ("" when there is none). A change the other way
/// is left for the comparison to refuse.
std::string longer_run(const nlohmann::json& now, nlohmann::json& stored) {
  if (!now.is_object() || !stored.is_object()) return "";
  std::string out;
  auto number = [](const nlohmann::json& j, const char* k) { return j.contains(k) && j[k].is_number(); };
  auto take = [&](const char* key, bool longer) {
    if (!longer || !stored.contains(key) || stored[key] == now[key]) return;
    out += std::string(out.empty() ? "" : ", ") + key + " " + stored[key].dump() + " -> " + now[key].dump();
    stored[key] = now[key];
  };
  take("epochs", number(now, "epochs") && number(stored, "epochs") && now["epochs"] > stored["epochs"]);
  take("max_steps", number(now, "max_steps") && number(stored, "max_steps") && stored["max_steps"] != 0 &&
                        (now["max_steps"] == 0 || now["max_steps"] > stored["max_steps"]));
  take("target_epsilon", number(now, "target_epsilon") && number(stored, "target_epsilon") &&
                             now["target_epsilon"] > stored["target_epsilon"]);
  return out;
}

}  // namespace

// ---------------------------------------------------------------- construction

template <class T>
PrivateTrainerT<T>::PrivateTrainerT(ModelT<T>& model, OptimizerT<T>& optimizer, const BatchT<T>& train,
                                    PrivateTrainingConfigT<T> config, const std::filesystem::path& resume_from)
    : PrivateTrainerT(model, optimizer, train, [&] {
        config.checkpoints.dir = resume_from;
        config.checkpoints.resume = true;
        return std::move(config);
      }()) {}

template <class T>
PrivateTrainerT<T>::PrivateTrainerT(ModelT<T>& model, OptimizerT<T>& optimizer, const BatchT<T>& train,
                                    PrivateTrainingConfigT<T> config)
    : model_(model), optimizer_(optimizer), train_(train), config_(std::move(config)), base_lr_(optimizer.lr()) {
  strategy_ = strategy_of(config_);
  settings_ = std::make_shared<nlohmann::json>(run_settings(config_, *strategy_, model_, optimizer_, base_lr_));
  check_settings_on_all_ranks();
  check_training_config(config_, base_lr_);
  const std::size_t n = dataset_size();
  make_plan(n);
  if (!config_.non_private) run_self_check();
  open_checkpoints();
  make_generators();
  make_optimizer();
  if (resumed()) restore();
  else make_releases();
  check_derived_on_all_ranks(n);
}

template <class T>
void PrivateTrainerT<T>::check_settings_on_all_ranks() {
  // before anything a rank could refuse or wait for (docs/distributed.md)
  if (config_.communicator) require_same_settings_on_all_ranks(*config_.communicator, settings_->dump(), "runs");
  else
    require(config_.alone_under_launcher || !launched_by_mpi_launcher(),
            "an MPI launcher started this process, and the run has no communicator: each process would train alone "
            "and spend the privacy budget again; set the config's communicator (world_communicator(), with the "
            "program linked with dpgrad-mpi; docs/distributed.md), run one process, or set alone_under_launcher "
            "when each process's run is its own, on data of its own");
}

template <class T>
std::size_t PrivateTrainerT<T>::dataset_size() {
  return config_.communicator ? index_shard() : train_.examples();
}

template <class T>
RunPlan plan_run(const PrivateTrainingConfigT<T>& c, std::size_t dataset_size, std::size_t parameters,
                 std::size_t layers) {
  // adaptive clipping noises more coordinates per step, the counts: one, or one per layer (their grid draws
  // are charged)
  const auto strategy = strategy_of(c);
  require(!strategy->adapts_layers() || layers > 0,
          "plan_run: " + strategy->name() + " noises a count per layer; give the model's number of layers (clip_layers)");
  return RunPlan::make(plan_settings(c, *strategy), dataset_size,
                       parameters + adaptive_counts(c.adaptive_clipping.has_value(), *strategy, layers));
}

template <class T>
void check_training_config(const PrivateTrainingConfigT<T>& c, double lr) {
  const auto strategy = strategy_of(c);
  check_plan_settings(plan_settings(c, *strategy));
  require(c.ema == 0 || (c.ema > 0 && c.ema < 1), "ema must be in (0, 1) (0: off), got " + num(c.ema));
  require(c.lr_final < 0 || (c.lr_final <= lr && std::isfinite(c.lr_final)),
          "lr_final must be at most the optimizer's learning rate " + num(lr) + ", got " + num(c.lr_final));
  require(c.sat_rho >= 0 && std::isfinite(c.sat_rho), "sat_rho must be >= 0 and finite, got " + num(c.sat_rho));
  require(!c.adaptive_clipping || !c.non_private, "adaptive clipping belongs to private runs (it releases a noised count)");
  require(c.adaptive_clipping || !strategy->adapts_layers(),
          strategy->name() + " moves each layer's clip norm by a noised count of its own: it needs adaptive "
          "clipping (adaptive_clipping: the quantile, the counts' noise and the step)");
  for (const auto& r : c.releases) {
    bool name_ok = !r.name.empty() && r.name.size() <= 64;
    for (char ch : r.name) name_ok = name_ok && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-');
    require(name_ok, "a release before training needs a name of letters, digits, '_' and '-', got '" + r.name + "'");
    require(r.dimension >= 1 && r.rows && r.use, "the release '" + r.name + "' needs a dimension, rows and a use");
    require(r.bound > 0 && std::isfinite(r.bound), "the release '" + r.name + "' needs a bound > 0, got " + num(r.bound));
    require(std::count_if(c.releases.begin(), c.releases.end(), [&](const auto& o) { return o.name == r.name; }) == 1,
            "two releases before training are called '" + r.name + "'");
  }
  require(c.checkpoints.every_steps >= 0,
          "checkpoints.every_steps must be >= 0, got " + std::to_string(c.checkpoints.every_steps));
  require(!c.checkpoints.resume || !c.checkpoints.dir.empty(), "resuming needs the checkpoint directory (checkpoints.dir)");
}

template <class T>
void PrivateTrainerT<T>::make_plan(std::size_t n) {
  plan_ = plan_run(config_, n, model_.parameter_count(), clip_layers(model_.parameters()).size());
  sampler_ = plan_.make_sampler();
}

template <class T>
void PrivateTrainerT<T>::run_self_check() {
  const auto start = std::chrono::steady_clock::now();
  std::string failure;
  try {
    self_check_ = structural_self_check(model_, *strategy_, train_, config_.transform).str();
  } catch (const std::invalid_argument& e) {
    failure = e.what();
  }
  if (config_.communicator) require_on_all_ranks(*config_.communicator, failure.empty(), failure);
  require(failure.empty(), failure);
  self_check_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <class T>
void PrivateTrainerT<T>::open_checkpoints() {
  const CheckpointPolicy& p = config_.checkpoints;
  if (p.dir.empty()) return;
  const bool writer = !config_.communicator || config_.communicator->rank() == 0;
  std::string error;
  try {  // the directory is claimed now: unwritable, or used by another run, fails before any work
    if (writer) lock_.emplace(p.dir);
    // the key store too: a store that cannot keep the run's key is found now, not at the first save after
    // an epoch of training (docs/checkpoints.md)
    if (writer && !p.resume) check_key_store(p.key_store.empty() ? default_key_store() : p.key_store);
    const bool has = CheckpointDir(p.dir).has_checkpoint();
    if (p.resume && !has) error = "no checkpoint in " + p.dir.string() + " to resume";
    if (!p.resume && has)
      error = "the checkpoint directory " + p.dir.string() + " already holds a checkpoint: resume that run, or choose "
              "another directory";
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (config_.communicator) require_on_all_ranks(*config_.communicator, error.empty(), error);
  require(error.empty(), error);
  if (!p.resume) return;
  open_run_key(p.dir);
  resumed_extra_ = std::make_shared<nlohmann::json>(CheckpointDir(p.dir).read_extra(*run_key_));
  require(resumed_extra_->contains("trainer") && (*resumed_extra_)["trainer"].is_object(),
          "the checkpoint in " + p.dir.string() + " does not record its run");
  const nlohmann::json& run = (*resumed_extra_)["trainer"];
  // the run keeps its settings: every difference is listed and refused (docs/checkpoints.md), but for
  // more steps under a larger budget
  const nlohmann::json now = recorded(*settings_);
  nlohmann::json stored = run.value("settings", nlohmann::json());
  extension_ = config_.non_private ? "" : longer_run(now, stored);
  const std::string changed = differences(now, stored);
  require(changed.empty(), "the checkpoint in " + p.dir.string() + " is of a run with other settings: " + changed +
                               "; a resumed run keeps its settings (it may only go on longer: more epochs or "
                               "max_steps, a larger target_epsilon)");
  // the run's own noise, never recalibrated, and its length (the checkpoint's MAC vouches for them)
  require(run.value("noise_multiplier", nlohmann::json()).is_number() &&
              run.value("total_steps", nlohmann::json()).is_number_integer(),
          "the checkpoint's noise multiplier or length is not valid");
  const double sigma = run["noise_multiplier"].get<double>();
  plan_ = extension_.empty() ? plan_.resumed(sigma, run["total_steps"].get<long>(), run.value("calibrated", false))
                             : plan_.extended(sigma);
}

template <class T>
void PrivateTrainerT<T>::make_generators() {
  // secure unless asked for seeded ones by name (or not private at all)
  const bool reproducible = config_.non_private || config_.reproducible_noise;
  noise_rng_ = make_private_rng(reproducible, config_.seed + 1);
  aux_rng_ = make_private_rng(reproducible, config_.seed + 2);
  sample_rng_ = make_private_rng(reproducible, config_.seed + 3);
  dropout_key_ = reproducible ? hash_key_from_seed(config_.seed, "dpgrad-dropout") : random_hash_key();
  if (config_.communicator) {  // every rank draws the same batches, directions and noise streams (docs/distributed.md)
    share_generator(*config_.communicator, *sample_rng_);
    share_generator(*config_.communicator, *aux_rng_);
    share_generator(*config_.communicator, *noise_rng_);
    // and the same dropout masks
    const std::string key =
        broadcast_string(*config_.communicator, std::string(dropout_key_.begin(), dropout_key_.end()));
    std::copy(key.begin(), key.end(), dropout_key_.begin());
  }
}

template <class T>
void PrivateTrainerT<T>::make_optimizer() {
  accountant_ = plan_.make_accountant(!resumed());  // a checkpoint's ledger holds the releases already
  DPConfig dc;
  dc.clip_norm = config_.clip_norm;
  dc.noise_multiplier = plan_.noise_multiplier();
  dc.allow_no_noise = config_.allow_no_noise;
  dc.sat_rho = config_.sat_rho;
  dc.adaptive = config_.adaptive_clipping;
  dc.physical_batch = config_.physical_batch_size;
  dc.communicator = config_.communicator;
  dp_ = std::make_unique<DPOptimizerT<T>>(model_, optimizer_, *strategy_, dc, *sampler_, *noise_rng_, *aux_rng_,
                                          accountant_.get());
  if (config_.ema > 0) average_ = std::make_unique<ParameterAverageT<T>>(model_.parameters(), config_.ema);
}

template <class T>
void PrivateTrainerT<T>::make_releases() {
  released_.clear();
  if (config_.releases.empty()) return;
  const std::size_t n = plan_.dataset_size();
  for (const auto& r : config_.releases) {
    // each record's row, a chunk of records at a time; every rank its own, summed and noised once
    std::vector<float> rows;
    for (std::size_t start = 0; start < train_.examples(); start += 512) {
      std::vector<std::size_t> index;
      for (std::size_t i = start; i < std::min(train_.examples(), start + 512); ++i) index.push_back(i);
      const ArrayT<T> part = r.rows(train_.select(index));
      require(part.dimension() >= 1 && part.shape()[0] == index.size() && part.size() == index.size() * r.dimension,
              "the release '" + r.name + "': rows of " + std::to_string(index.size()) + " records must be (" +
                  std::to_string(index.size()) + ", " + std::to_string(r.dimension) + "), got " +
                  shape_str(shape_of(part)));
      rows.insert(rows.end(), part.begin(), part.end());
    }
    auto rng = make_private_rng(config_.reproducible_noise, config_.seed + 5);
    if (config_.communicator) share_generator(*config_.communicator, *rng);
    const std::vector<double> sum = privacy::noisy_clipped_sum(rows, r.dimension, r.bound, r.noise_multiplier, *rng,
                                                               config_.communicator.get());
    ArrayT<T> mean = ArrayT<T>::from_shape({r.dimension});
    for (std::size_t k = 0; k < r.dimension; ++k) mean(k) = T(sum[k] / double(n));
    r.use(mean);
    released_.push_back(std::move(mean));
  }
}

template <class T>
void PrivateTrainerT<T>::restore() {
  released_.assign(config_.releases.size(), ArrayT<T>());
  for (std::size_t i = 0; i < config_.releases.size(); ++i) released_[i] = xt::zeros<T>({config_.releases[i].dimension});
  TrainingStateT<T> state = training_state();
  steps_ = CheckpointDir(config_.checkpoints.dir).load(state, *run_key_);
  saved_at_ = steps_;
  require(steps_ >= 0 && steps_ <= plan_.total_steps(), "the checkpoint's step " + std::to_string(steps_) +
                                                            " is outside the run's " + std::to_string(plan_.total_steps()));
  for (std::size_t i = 0; i < config_.releases.size(); ++i) config_.releases[i].use(released_[i]);
  dp_->clip_state_restored();
  if (accountant_ && adds_noise()) {
    // the ledger cannot shrink or soften: it holds the releases made before training, then every step
    // taken, each at this run's q, sigma and strategy
    const auto fresh = plan_.make_accountant(true);
    const std::vector<privacy::Step>& ledger = accountant_->ledger();
    const std::size_t k = fresh->ledger().size();
    require(ledger.size() >= k && std::equal(fresh->ledger().begin(), fresh->ledger().end(), ledger.begin()),
            "the checkpoint's ledger does not start with this run's " + std::to_string(config_.releases.size()) +
                " releases before training");
    require(accountant_->total_steps() == steps_ + plan_.release_steps(),
            "the checkpoint's ledger holds " + std::to_string(accountant_->total_steps() - plan_.release_steps()) +
                " steps for step " + std::to_string(steps_));
    for (const privacy::Step& e : std::span(ledger).subspan(k))
      require(e.sampling_rate == plan_.sampling_rate() && e.noise_multiplier == dp_->accounted_noise_multiplier() &&
                  e.jl_dim == strategy_->jl_dim(),
              "the checkpoint's ledger records steps at q " + num(e.sampling_rate) + ", sigma " +
                  num(e.noise_multiplier) + ", JL dimension " + std::to_string(e.jl_dim) + "; this run takes them at q " +
                  num(plan_.sampling_rate()) + ", sigma " + num(dp_->accounted_noise_multiplier()) +
                  ", JL dimension " + std::to_string(strategy_->jl_dim()));
  }
  if (average_) average_->set_updates((*resumed_extra_)["trainer"].value("ema_updates", 0L));
  if (config_.communicator) {  // the secure generators re-keyed on loading: each rank its own
    share_generator(*config_.communicator, *sample_rng_);
    share_generator(*config_.communicator, *aux_rng_);
    share_generator(*config_.communicator, *noise_rng_);
  }
}

template <class T>
void PrivateTrainerT<T>::check_derived_on_all_ranks(std::size_t n) {
  if (!config_.communicator) return;  // what followed from the settings and the data: the same on every rank, or refused
  require_same_settings_on_all_ranks(
      *config_.communicator,
      nlohmann::json{{"dataset_size", n}, {"plan", plan_.to_json()}, {"steps_done", steps_},
                     {"ledger", accountant_ ? accountant_->to_json() : nlohmann::json()}}
          .dump(),
      "derived run settings");
}

template <class T>
PrivateTrainerT<T>::~PrivateTrainerT() = default;


template <class T>
void PrivateTrainerT<T>::open_run_key(const std::filesystem::path& dir) {
  const std::filesystem::path store =
      config_.checkpoints.key_store.empty() ? default_key_store() : config_.checkpoints.key_store;
  if (!config_.communicator) {
    run_key_ = RunKey::open(CheckpointDir(dir).run_id(), store);
    return;
  }
  // rank 0 holds the run's key (and its lock) and sends it to the others, which only verify with it
  Communicator& comm = *config_.communicator;
  std::string error, id;
  try {
    id = CheckpointDir(dir).run_id();
    if (comm.rank() == 0) run_key_ = RunKey::open(id, store);
  } catch (const std::exception& e) {
    error = e.what();
  }
  require_on_all_ranks(comm, error.empty(), error);
  require_same_settings_on_all_ranks(comm, nlohmann::json{{"checkpoint_run", id}}.dump(), "checkpoints");
  const std::string key = broadcast_string(comm, comm.rank() == 0 ? run_key_->key_bytes() : std::string());
  double marks[2] = {run_key_ ? double(run_key_->saved_step()) : 0.0, run_key_ ? double(run_key_->saved_ledger()) : 0.0};
  comm.broadcast(marks, sizeof marks, 0);
  if (comm.rank() != 0) run_key_ = RunKey::borrowed(id, key, long(marks[0]), long(marks[1]));
}

template <class T>
std::size_t PrivateTrainerT<T>::index_shard() {
  Communicator& comm = *config_.communicator;
  const std::size_t local = train_.examples();
  double total = double(local);
  comm.allreduce_sum(&total, 1);
  const std::size_t n = std::size_t(total);
  require(n > 0, "the training set is empty (on every rank)");
  shard_.clear();
  bool ok = true;
  std::string why;
  if (!config_.positions.empty()) {
    ok = config_.positions.size() == local;
    why = "positions: " + std::to_string(config_.positions.size()) + " for a shard of " + std::to_string(local) +
          " records";
    for (std::size_t i = 0; ok && i < local; ++i) shard_.emplace_back(std::int64_t(config_.positions[i]), i);
  } else if (train_.ids.empty()) {
    ok = comm.size() == 1;
    why = "a data-parallel run needs each record's position in the whole training set (Batch::ids) on every rank";
    for (std::size_t i = 0; ok && i < local; ++i) shard_.emplace_back(std::int64_t(i), i);
  } else {
    for (std::size_t i = 0; i < local; ++i) shard_.emplace_back(train_.ids[i * train_.views], i);
  }
  std::sort(shard_.begin(), shard_.end());
  for (std::size_t i = 0; ok && i < shard_.size(); ++i) {
    const std::int64_t id = shard_[i].first;
    if (id < 0 || std::size_t(id) >= n || (i > 0 && shard_[i - 1].first == id)) {
      ok = false;
      why = "rank " + std::to_string(comm.rank()) + "'s shard holds record id " + std::to_string(id) +
            (id >= 0 && std::size_t(id) < n ? " twice" : ", outside the whole set's 0.." + std::to_string(n - 1));
    }
  }
  require_on_all_ranks(comm, ok, why);
  // every position on exactly one rank: each rank marks its own, rank 0 counts
  std::vector<float> cover(n, 0.0f);
  for (const auto& e : shard_) cover[std::size_t(e.first)] = 1.0f;
  comm.reduce_sum(cover.data(), n, 0);
  std::string gap;
  if (comm.rank() == 0)
    for (std::size_t i = 0; i < n && gap.empty(); ++i)
      if (cover[i] != 1.0f)
        gap = "record " + std::to_string(i) + " is on " + std::to_string(int(cover[i])) +
              " ranks: the shards must hold every position 0.." + std::to_string(n - 1) + " exactly once";
  gap = broadcast_string(comm, gap);
  require(gap.empty(), gap);
  return n;
}

template <class T>
std::vector<std::size_t> PrivateTrainerT<T>::local_rows(const std::vector<std::size_t>& global) const {
  std::vector<std::size_t> rows;
  for (const std::size_t g : global) {
    const auto it = std::lower_bound(shard_.begin(), shard_.end(), std::make_pair(std::int64_t(g), std::size_t(0)));
    if (it != shard_.end() && it->first == std::int64_t(g)) rows.push_back(it->second);
  }
  return rows;
}

template <class T>
int PrivateTrainerT<T>::processes() const {
  return config_.communicator ? config_.communicator->size() : 1;
}

template <class T>
int PrivateTrainerT<T>::rank() const {
  return config_.communicator ? config_.communicator->rank() : 0;
}

template <class T>
bool PrivateTrainerT<T>::is_private() const {
  return !config_.non_private && dp_->is_private();
}

template <class T>
bool PrivateTrainerT<T>::adds_noise() const {
  return !config_.non_private && dp_->adds_noise();
}

template <class T>
std::string PrivateTrainerT<T>::noise_generator() const {
  return noise_rng_->describe();
}

template <class T>
std::string PrivateTrainerT<T>::privacy_statement(std::optional<double> eps) const {
  if (config_.non_private) return "non-private";
  if (!adds_noise()) return "NOT private: no noise";
  std::string s = "epsilon " + privacy::format_epsilon(eps.value_or(epsilon())) + " (delta " + num(delta()) + ", " +
                  accountant_name() + " accountant, " + privacy::to_string(accountant_->neighbouring()) + " neighbours)";
  return dp_->noise_reproducible() ? s + " (" + kNotPrivateReproducible + ")" : s;
}

template <class T>
nlohmann::json PrivateTrainerT<T>::privacy_json(std::optional<double> eps) const {
  nlohmann::json j = {{"private", is_private()}};
  if (!adds_noise()) return j;
  const double e = eps.value_or(epsilon());
  j["epsilon"] = std::isfinite(e) ? nlohmann::json(e) : nlohmann::json("inf");
  j["delta"] = delta();
  j["accountant"] = accountant_name();
  j["neighbouring"] = privacy::to_string(accountant_->neighbouring());
  if (dp_->noise_reproducible()) j["privacy_note"] = kNotPrivateReproducible;
  return j;
}

template <class T>
std::vector<std::string> PrivateTrainerT<T>::describe() const {
  std::vector<std::string> lines;
  if (steps_cut_for_budget() > 0)
    lines.push_back("training stops after " + std::to_string(total_steps()) + " of " +
                    std::to_string(total_steps() + steps_cut_for_budget()) + " steps: more would exceed epsilon " +
                    num(*config_.target_epsilon));
  if (config_.non_private) {
    lines.push_back("non-private training: no clipping, no noise, no privacy guarantee");
  } else {
    lines.push_back(privacy::to_string(accountant_->neighbouring()) +
                    " neighbours; noise, sampling and directions: " + noise_generator());
    if (noise_multiplier() == 0) lines.push_back("WARNING: noise multiplier 0: this run is NOT private; no epsilon is reported");
    for (const std::string& w : warnings()) lines.push_back("WARNING: " + w);
    if (!self_check_.empty())
      lines.push_back(self_check_ + " in " + privacy::format_number(self_check_seconds_, 3) + " s (docs/per-sample.md)");
    if (dp_->noise_reproducible()) lines.push_back(std::string("WARNING: reproducible noise: this run is ") + kNotPrivateReproducible);
    if (const auto& a = dp_->config().adaptive) {
      const auto layers = dp_->layer_clip_norms();
      std::string now = num(dp_->clip_norm());
      if (!layers.empty()) {
        now += " (";
        for (std::size_t g = 0; g < layers.size(); ++g) now += (g ? ", " : "") + layers[g].first + " " + num(layers[g].second);
        now += ")";
      }
      lines.push_back("adaptive clipping: " + std::string(layers.empty() ? "C follows" : "each layer's C_g follows") +
                      " the " + num(a->quantile) + " quantile of the " + (layers.empty() ? "" : "layer's ") +
                      "norms (geometric step " + num(a->lr) + ", " + (layers.empty() ? "C" : "C_g") + " in [" +
                      num(a->min_clip_norm) + ", " + num(a->max_clip_norm) + "]), each step's count" +
                      (layers.empty() ? "" : "s") + " noised at " + num(a->count_noise) +
                      " and accounted with the gradient, whose own noise multiplier is " +
                      num(dp_->gradient_noise_multiplier()) + "; C is now " + now +
                      (a->normalise ? "; the noised sum is taken in units of C" : ""));
    }
    for (const auto& r : config_.releases)
      lines.push_back("released before training, " + r.name + ": " + (r.what.empty() ? "a private release" : r.what) +
                      ", noise multiplier " + num(r.noise_multiplier) + " (accounted with the run" +
                      (resumed() ? "; kept in the checkpoint)" : ")"));
  }
  // ---- what is done with the released gradients (no privacy cost)
  std::string opt = "optimizer " + optimizer_.name() + " at lr " + num(base_lr_) +
                    (config_.lr_final >= 0 ? ", cosine down to " + num(config_.lr_final) : std::string());
  const auto settings = optimizer_.settings();
  if (const auto v = settings.find("noise_variance"); v != settings.end() && v->second > 0)
    opt += "; Adam's second moment less the noise's variance " + num(v->second) + " (DP-AdamBC, floor " +
           num(settings.at("noise_floor")) + ")";
  std::map<double, std::string> scaled;  // factor -> the parameters moving with lr * factor
  for (std::size_t i = 0; i < optimizer_.params().size(); ++i)
    if (optimizer_.lr_scale(i) != 1.0) {
      std::string& names = scaled[optimizer_.lr_scale(i)];
      names += (names.empty() ? "" : ", ") + optimizer_.params()[i].name();
    }
  for (const auto& [factor, names] : scaled) opt += "; lr x" + num(factor) + " for " + names;
  lines.push_back(opt + (adds_noise() ? " (post-processing: no privacy cost)" : ""));
  if (config_.ema > 0)
    lines.push_back("evaluating the parameters' moving average (decay " + num(config_.ema) + "; no privacy cost)");
  if (config_.sat_rho > 0)
    lines.push_back("DP-SAT: gradients taken " + num(config_.sat_rho) + " along the last noised gradient (no privacy "
                    "cost)");
  if (config_.communicator)
    lines.push_back("data-parallel: " + config_.communicator->describe() + ", " + std::to_string(blas::threads()) +
                    " engine threads each; each clips its shard of every batch, each coordinate is noised once "
                    "(docs/distributed.md)");
  if (resumed())
    lines.push_back("resumed from " + config_.checkpoints.dir.string() + " at step " + std::to_string(steps_) + " of " +
                    std::to_string(total_steps()) +
                    (adds_noise() ? ", epsilon so far " + privacy::format_epsilon(epsilon()) : std::string()));
  if (!extension_.empty())
    lines.push_back("going on longer under a larger budget: " + extension_ + " (the run's noise multiplier " +
                    privacy::format_number(noise_multiplier(), 5) + "; the ledger continues)");
  return lines;
}

template <class T>
double PrivateTrainerT<T>::epsilon() const {
  if (!adds_noise()) return INFINITY;
  return privacy::grid_noise_epsilon_of_draws(*accountant_, plan_.delta(),
                                              plan_.noise_draws(accountant_->total_steps() - plan_.release_steps()));
}

template <class T>
double PrivateTrainerT<T>::final_epsilon() const {
  if (!adds_noise()) return INFINITY;
  auto a = accountant_->clone();
  const long rest = plan_.total_steps() - steps_;
  if (rest > 0) a->step(plan_.sampling_rate(), dp_->accounted_noise_multiplier(), rest, strategy_->jl_dim());
  return privacy::grid_noise_epsilon_of_draws(*a, plan_.delta(), plan_.noise_draws(a->total_steps() - plan_.release_steps()));
}

// ---------------------------------------------------------------- the loop

template <class T>
BatchT<T> PrivateTrainerT<T>::transform_each(const BatchT<T>& batch, long step) const {
  std::vector<BatchT<T>> records;
  records.reserve(batch.examples());
  for (std::size_t i = 0; i < batch.examples(); ++i) records.push_back(config_.transform(batch.select({i}), step));
  if (records.empty()) return config_.transform(batch, step);  // an empty batch keeps the transform's layout
  return concat_batches(records);
}

template <class T>
StepStats PrivateTrainerT<T>::step() {
  if (done())
    throw std::logic_error("PrivateTrainer::step: the run is done (" + std::to_string(total_steps()) + " steps)");
  if (config_.lr_final >= 0) optimizer_.set_lr(cosine_lr(base_lr_, config_.lr_final, steps_, total_steps()));
  const std::vector<std::size_t> drawn = sampler_->next(*sample_rng_);  // positions in the whole set
  BatchT<T> batch = train_.select(config_.communicator ? local_rows(drawn) : drawn);
  if (config_.transform) batch = transform_each(batch, steps_);
  const DropoutKeyScope dropout(dropout_key_, std::uint64_t(steps_));  // masks keyed per record (docs/data-privacy.md)
  StepStats st = dp_->step(batch);
  if (average_) average_->update();
  ++steps_;
  return st;
}

template <class T>
void PrivateTrainerT<T>::save_covering(const TrainHooksT<T>& hooks) {
  if (config_.checkpoints.dir.empty() || saved_at_ == steps_) return;
  save(config_.checkpoints.dir, hooks.extra ? hooks.extra() : nlohmann::json::object());
}

template <class T>
TrainResult PrivateTrainerT<T>::train(const TrainHooksT<T>& hooks, const BatchT<T>* evaluate_on) {
  const long per_epoch = steps_per_epoch(), every = config_.checkpoints.every_steps;
  auto epoch_start = std::chrono::steady_clock::now();
  EpochReport e;  // this epoch's sums so far
  double loss_sum = 0, examples = 0;
  TrainResult r;
  while (!done()) {
    const auto t = std::chrono::steady_clock::now();
    const StepStats st = step();
    e.step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    e.communication_seconds += st.communication_seconds;
    e.wait_seconds += st.wait_seconds;
    loss_sum += st.loss * double(st.batch);
    examples += double(st.batch);
    if (hooks.progress) hooks.progress(steps_, total_steps());
    const bool epoch_end = steps_ % per_epoch == 0 || done();
    // the checkpoint that covers this step comes before anything of it is shown (docs/library.md)
    if (!epoch_end && ((every > 0 && steps_ % every == 0) || hooks.on_step)) save_covering(hooks);
    if (!epoch_end) {
      if (hooks.on_step) hooks.on_step({steps_, (steps_ - 1) / per_epoch + 1, st, epsilon()});
      continue;
    }
    e.epoch = (steps_ - 1) / per_epoch + 1;
    e.steps = steps_;
    e.epsilon = epsilon();
    e.train_loss = examples > 0 ? loss_sum / examples : 0.0;
    e.clip_norm = dp_->clip_norm();
    if (evaluate_on) e.evaluation = evaluate_sharded(*evaluate_on);
    e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
    if (hooks.record_epoch) hooks.record_epoch(e);
    save_covering(hooks);
    if (hooks.on_step) hooks.on_step({steps_, e.epoch, st, e.epsilon});
    if (hooks.on_epoch) hooks.on_epoch(e);
    r.step_seconds += e.step_seconds;
    r.communication_seconds += e.communication_seconds;
    r.wait_seconds += e.wait_seconds;
    e = EpochReport();
    loss_sum = examples = 0;
    epoch_start = std::chrono::steady_clock::now();
  }
  r.steps = steps_;
  r.planned_steps = total_steps() + steps_cut_for_budget();
  r.epsilon = epsilon();
  r.status = steps_cut_for_budget() > 0 ? RunStatus::stopped_by_budget : RunStatus::complete;
  r.message = r.status == RunStatus::complete
                  ? "complete: " + std::to_string(steps_) + " steps"
                  : "stopped by the privacy budget after " + std::to_string(steps_) + " of " +
                        std::to_string(r.planned_steps) + " steps: more would exceed epsilon " +
                        num(config_.target_epsilon.value_or(0));
  return r;
}

template <class T>
void PrivateTrainerT<T>::run_inference(const BatchT<T>& data, std::size_t chunk,
                                       const std::function<void(const BatchT<T>&, std::size_t, const TensorT<T>&)>& use) {
  require(chunk >= 1, "evaluate: chunk must be >= 1");
  AveragedScopeT<T> averaged(average_.get());
  NoRecordScope<T> none;
  model_.set_training(false);
  struct Back {
    ModelT<T>& m;
    ~Back() { m.set_training(true); }
  } back{model_};
  const std::size_t n = data.examples();
  std::vector<std::size_t> rows;
  for (std::size_t start = 0; start < n; start += chunk) {
    rows.clear();
    for (std::size_t i = start; i < std::min(n, start + chunk); ++i) rows.push_back(i);
    const BatchT<T> b = data.select(rows);
    use(b, start, model_.forward(b));
  }
}

namespace {

const char* const kBuiltinMetrics[] = {"accuracy", "accuracy@0.5", "auc", "mse", "mae"};
/// The built-in metrics that are means over examples: they combine over shards exactly.
bool is_mean_metric(const std::string& name) { return name != "auc" && std::count(std::begin(kBuiltinMetrics), std::end(kBuiltinMetrics), name); }

/// The area under the ROC curve of (score, positive) pairs: the Mann-Whitney
/// statistic, P(score of a positive > score of a negative), ties counted half
/// (average ranks). NaN when one class is missing.
double roc_auc(std::vector<std::pair<double, bool>> scored) {
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  double positives = 0, rank_sum = 0;
  for (std::size_t i = 0; i < scored.size();) {
    std::size_t j = i;
    while (j < scored.size() && scored[j].first == scored[i].first) ++j;
    const double rank = (double(i) + double(j - 1)) / 2 + 1;  // the tie's average rank, from 1
    for (std::size_t k = i; k < j; ++k)
      if (scored[k].second) rank_sum += rank, positives += 1;
    i = j;
  }
  const double negatives = double(scored.size()) - positives;
  if (positives == 0 || negatives == 0) return std::nan("");
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

}  // namespace

double Evaluation::metric(const std::string& name) const {
  std::string there;
  for (const auto& [k, v] : metrics) {
    if (k == name) return v;
    there += (there.empty() ? "" : ", ") + k;
  }
  throw std::out_of_range("evaluation: no metric '" + name + "' (there are: " + (there.empty() ? "none" : there) + ")");
}

bool Evaluation::has(const std::string& name) const {
  return std::any_of(metrics.begin(), metrics.end(), [&](const auto& m) { return m.first == name; });
}

std::string Evaluation::str() const {
  std::string s = "loss " + num(loss);
  for (const auto& [k, v] : metrics) s += ", " + k + " " + num(v);
  return s;
}

template <class T>
void PrivateTrainerT<T>::add_metric(const std::string& name, MetricFnT<T> metric) {
  require(!name.empty(), "add_metric: a metric needs a name");
  require(metric != nullptr, "add_metric: the metric '" + name + "' has no function");
  require(!std::count(std::begin(kBuiltinMetrics), std::end(kBuiltinMetrics), name),
          "add_metric: '" + name + "' is a built-in metric's name; choose another");
  require(std::none_of(metrics_.begin(), metrics_.end(), [&](const auto& m) { return m.first == name; }),
          "add_metric: a metric called '" + name + "' was added already");
  metrics_.emplace_back(name, std::move(metric));
}

template <class T>
Evaluation PrivateTrainerT<T>::evaluate(const BatchT<T>& data, std::size_t chunk) {
  Evaluation e;
  const std::size_t n = data.examples();
  const bool labelled = !data.labels.empty();
  const std::string& kind = model_.loss_name();
  const bool bce = kind == "bce_with_logits", mse = kind == "mse", classes = !bce && !mse;
  std::size_t correct = 0, elements = 0, hits = 0;
  double loss = 0, squared = 0, absolute = 0;
  std::vector<std::pair<double, bool>> scored;  // BCE: each output and its target's class, for the AUC
  std::vector<ArrayT<T>> outputs;               // the user's metrics read them all at once
  run_inference(data, chunk, [&](const BatchT<T>& b, std::size_t, const TensorT<T>& out) {
    const TensorT<T> losses = model_.row_losses(out, b);  // kept: the loop reads its value
    for (const T v : losses.value()) loss += double(v) / double(b.views);
    const ArrayT<T>& z = out.value();
    if (classes && labelled && b.views == 1 && z.dimension() == 2) {
      const std::size_t k = z.shape()[1];
      for (std::size_t i = 0; i < b.examples(); ++i) {
        const T* row = z.data() + i * k;
        if (std::int32_t(std::max_element(row, row + k) - row) == b.labels[i]) ++correct;
      }
    }
    if ((bce || mse) && b.targets.shape() == z.shape()) {  // the loss has checked the shapes
      const T *pz = z.data(), *py = b.targets.data();
      for (std::size_t i = 0; i < z.size(); ++i) {
        const double zi = double(pz[i]), yi = double(py[i]);
        if (bce) {  // sigmoid(z) > 0.5 exactly when z > 0
          const bool positive = yi >= 0.5;
          hits += (zi > 0) == positive;
          scored.emplace_back(zi, positive);
        } else {
          squared += (zi - yi) * (zi - yi);
          absolute += std::abs(zi - yi);
        }
      }
      elements += z.size();
    }
    if (!metrics_.empty()) outputs.push_back(z);
  });
  const double nan = std::nan("");
  e.examples = n;
  e.loss = n ? loss / double(n) : 0.0;
  e.accuracy = nan;
  if (classes && labelled) {
    e.accuracy = n ? double(correct) / double(n) : nan;
    e.metrics.emplace_back("accuracy", e.accuracy);
  }
  if (bce) {
    e.accuracy = elements ? double(hits) / double(elements) : nan;
    e.metrics.emplace_back("accuracy@0.5", e.accuracy);
    e.metrics.emplace_back("auc", roc_auc(std::move(scored)));
  }
  if (mse) {
    e.metrics.emplace_back("mse", elements ? squared / double(elements) : nan);
    e.metrics.emplace_back("mae", elements ? absolute / double(elements) : nan);
  }
  if (!metrics_.empty()) {
    ArrayT<T> all = ArrayT<T>::from_shape({0});
    if (!outputs.empty()) {  // the chunks joined along axis 0 (each contiguous, row-major)
      Shape s = shape_of(outputs[0]);
      std::size_t rows = 0;
      for (const auto& o : outputs) rows += o.shape()[0];
      s[0] = rows;
      all = ArrayT<T>::from_shape(s);
      T* at = all.data();
      for (const auto& o : outputs) at = std::copy(o.begin(), o.end(), at);
    }
    for (const auto& [name, fn] : metrics_) e.metrics.emplace_back(name, fn(all, data));
  }
  return e;
}

template <class T>
Evaluation PrivateTrainerT<T>::evaluate_sharded(const BatchT<T>& shard, std::size_t chunk) {
  Evaluation e = evaluate(shard, chunk);
  if (!config_.communicator) return e;
  {  // the means, weighted by each shard's examples (every example has as many outputs); the rest NaN
    std::vector<double> sums;
    for (const auto& [k, v] : e.metrics) {
      const bool counted = is_mean_metric(k) && !std::isnan(v);
      sums.push_back(counted ? v * double(e.examples) : 0.0);
      sums.push_back(counted ? double(e.examples) : 0.0);
    }
    if (!sums.empty()) config_.communicator->allreduce_sum(sums.data(), sums.size());
    for (std::size_t i = 0; i < e.metrics.size(); ++i)
      e.metrics[i].second = is_mean_metric(e.metrics[i].first) && sums[2 * i + 1] > 0 ? sums[2 * i] / sums[2 * i + 1]
                                                                                        : std::nan("");
  }
  const bool unlabelled = e.examples > 0 && std::isnan(e.accuracy);  // correct answers: accuracy * examples
  double sums[4] = {e.loss * double(e.examples), unlabelled || !e.examples ? 0.0 : e.accuracy * double(e.examples),
                    double(e.examples), unlabelled ? 1.0 : 0.0};
  config_.communicator->allreduce_sum(sums, 4);
  e.examples = std::size_t(sums[2]);
  e.loss = e.examples ? sums[0] / sums[2] : 0.0;
  e.accuracy = sums[3] == 0 && e.examples ? std::round(sums[1]) / sums[2] : std::nan("");
  for (auto& [k, v] : e.metrics)  // the exact count of correct answers for "accuracy"; the threshold's for BCE
    if (k == "accuracy") v = e.accuracy;
    else if (k == "accuracy@0.5") e.accuracy = v;
  return e;
}

template <class T>
ArrayT<T> PrivateTrainerT<T>::predict(const BatchT<T>& data, std::size_t chunk) {
  ArrayT<T> all;
  run_inference(data, chunk, [&](const BatchT<T>& b, std::size_t start, const TensorT<T>& out) {
    const ArrayT<T>& z = out.value();
    require(z.dimension() == 2 && b.views == 1, "predict: the model's outputs must be (examples, classes)");
    if (start == 0) all = ArrayT<T>::from_shape({data.examples(), z.shape()[1]});
    std::copy(z.begin(), z.end(), all.data() + start * z.shape()[1]);
  });
  return all;
}

template <class T>
TrainingStateT<T> PrivateTrainerT<T>::training_state() {
  auto params = model_.parameters();
  TrainingStateT<T> state;
  state.params = params;
  state.optimizer = &optimizer_;
  state.sampler = sampler_.get();
  state.generators = {{"noise", noise_rng_.get()}, {"aux", aux_rng_.get()}, {"sampling", sample_rng_.get()}};
  state.accountant = accountant_.get();
  state.keys = {{"dropout", &dropout_key_}};
  if (average_)
    for (std::size_t i = 0; i < params.size(); ++i) state.arrays["ema." + params[i].name()] = &average_->averages()[i];
  for (std::size_t i = 0; i < dp_->sat_direction().size(); ++i)
    state.arrays["sat." + params[i].name()] = &dp_->sat_direction()[i];
  for (std::size_t i = 0; i < released_.size(); ++i) state.arrays["release." + config_.releases[i].name] = &released_[i];
  if (config_.adaptive_clipping) state.arrays["adaptive.clip_norm"] = &dp_->clip_state();
  return state;
}

template <class T>
const nlohmann::json& PrivateTrainerT<T>::settings() const {
  static const nlohmann::json none;
  return settings_ ? *settings_ : none;
}

template <class T>
const nlohmann::json& PrivateTrainerT<T>::resumed_extra() const {
  static const nlohmann::json none;
  return resumed_extra_ ? *resumed_extra_ : none;
}

template <class T>
bool PrivateTrainerT<T>::resumed() const {
  return resumed_extra_ && !resumed_extra_->is_null();
}

template <class T>
void PrivateTrainerT<T>::save(const std::filesystem::path& dir) {
  save(dir, nlohmann::json::object());
}

template <class T>
void PrivateTrainerT<T>::save(const std::filesystem::path& dir, nlohmann::json extra) {
  const TrainingStateT<T> state = training_state();
  if (!extra.is_object()) throw std::invalid_argument("PrivateTrainer::save: extra must be a JSON object");
  extra["trainer"] = {{"noise_multiplier", plan_.noise_multiplier()}, {"total_steps", plan_.total_steps()},
                      {"calibrated", plan_.calibrated()}, {"ema_updates", average_ ? average_->updates() : 0L},
                      {"private", is_private()}, {"processes", processes()}, {"settings", recorded(*settings_)}};
  if (dp_->noise_reproducible()) extra["trainer"]["privacy_note"] = kNotPrivateReproducible;
  const std::filesystem::path store =
      config_.checkpoints.key_store.empty() ? default_key_store() : config_.checkpoints.key_store;
  auto key = [&]() -> RunKey& {
    if (!run_key_) run_key_ = RunKey::create(store);
    return *run_key_;
  };
  if (!config_.communicator) {
    CheckpointDir(dir).save(steps_, state, extra, key());
    saved_at_ = steps_;
    return;
  }
  // one checkpoint, by rank 0: every rank holds the same parameters, optimizer,
  // sampler and shared generators, and the same ledger (checked here)
  Communicator& comm = *config_.communicator;
  require_same_on_all_ranks(comm, double(steps_), "the step count");
  require_same_on_all_ranks(comm, accountant_ ? double(accountant_->total_steps()) : 0.0, "the ledger's steps");
  std::string error;
  if (comm.rank() == 0) {
    try {
      CheckpointDir(dir).save(steps_, state, extra, key());
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  error = broadcast_string(comm, error);
  if (!error.empty()) throw std::runtime_error("rank 0 could not write the checkpoint: " + error);
  saved_at_ = steps_;
}

template class PrivateTrainerT<float>;
template class PrivateTrainerT<double>;
template void check_training_config(const PrivateTrainingConfigT<float>&, double);
template void check_training_config(const PrivateTrainingConfigT<double>&, double);
template RunPlan plan_run(const PrivateTrainingConfigT<float>&, std::size_t, std::size_t, std::size_t);
template RunPlan plan_run(const PrivateTrainingConfigT<double>&, std::size_t, std::size_t, std::size_t);
template ReleaseBeforeTrainingT<float> private_feature_mean(std::size_t, double, double,
                                                            std::function<ArrayT<float>(const BatchT<float>&)>,
                                                            std::function<void(const ArrayT<float>&)>);
template ReleaseBeforeTrainingT<double> private_feature_mean(std::size_t, double, double,
                                                             std::function<ArrayT<double>(const BatchT<double>&)>,
                                                             std::function<void(const ArrayT<double>&)>);

}  // namespace dpgrad
