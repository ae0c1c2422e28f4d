// PrivateTrainer (optim/private_trainer.hpp): everything a private run needs,
// checked and settled in the constructor, before any step.
#include "optim/private_trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <span>
#include <utility>

#include <sodium.h>

#include "engine/communicator.hpp"
#include "engine/ops.hpp"
#include "engine/random.hpp"
#include "engine/tape.hpp"
#include "optim/check_per_sample.hpp"
#include "optim/checkpoint.hpp"
#include "privacy/accountant.hpp"
#include "privacy/calibration.hpp"
#include "privacy/mechanisms.hpp"
#include "privacy/schedule.hpp"

namespace dpgrad {

std::string to_string(Sampling s) {
  switch (s) {
    case Sampling::poisson: return "poisson";
    case Sampling::shuffle: return "shuffle";
    case Sampling::fixed: return "fixed";
  }
  throw std::invalid_argument("unknown Sampling value");
}

std::string to_string(Accounting a) {
  switch (a) {
    case Accounting::automatic: return "";
    case Accounting::pld: return "pld";
    case Accounting::rdp: return "rdp";
    case Accounting::wor: return "wor";
    case Accounting::shuffle: return "shuffle";
  }
  throw std::invalid_argument("unknown Accounting value");
}

Accounting accounting_from_string(const std::string& name) {
  for (Accounting a : {Accounting::automatic, Accounting::pld, Accounting::rdp, Accounting::wor, Accounting::shuffle})
    if (to_string(a) == name) return a;
  if (name == "gdp")
    throw std::invalid_argument("the gdp accountant is an approximation (CLT), not an upper bound: it can neither set "
                                "the noise nor be a run's epsilon; use pld (compare with dpgrad-account --accountant gdp)");
  throw std::invalid_argument("unknown accountant '" + name + "' (pld, rdp, wor, shuffle)");
}

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

std::string num(double x) { return privacy::format_number(x, 6); }

}  // namespace

double default_delta_for(std::size_t n) {
  double d = 1;
  while (d * double(n) > 0.6 * (1 + 1e-9)) d /= 10;
  return d;
}

template <class T>
PrivateTrainerT<T>::PrivateTrainerT(ModelT<T>& model, OptimizerT<T>& optimizer, const BatchT<T>& train,
                                    PrivateTrainingConfigT<T> config, std::optional<std::filesystem::path> resume_from)
    : model_(model), optimizer_(optimizer), train_(train), config_(std::move(config)), base_lr_(optimizer.lr()) {
  const auto& c = config_;
  const bool dp = !c.non_private;
  // ---- data-parallel runs: every rank the same run, before anything a rank could refuse or wait for
  if (c.communicator) require_same_settings_on_all_ranks(*c.communicator, settings().dump(), "runs");
  // ---- settings that need no data
  require(c.epochs > 0 && std::isfinite(c.epochs), "epochs must be > 0 and finite, got " + num(c.epochs));
  require(c.max_steps >= 0, "max_steps must be >= 0 (0: no limit), got " + std::to_string(c.max_steps));
  require(c.ema == 0 || (c.ema > 0 && c.ema < 1), "ema must be in (0, 1) (0: off), got " + num(c.ema));
  require(c.lr_final < 0 || (c.lr_final <= base_lr_ && std::isfinite(c.lr_final)),
          "lr_final must be at most the optimizer's learning rate " + num(base_lr_) + ", got " + num(c.lr_final));
  if (dp) {
    require(c.clip_norm > 0 && std::isfinite(c.clip_norm), "clip_norm must be > 0 and finite, got " + num(c.clip_norm));
    require(c.noise_multiplier || c.target_epsilon, "a private run needs a noise_multiplier or a target_epsilon");
    require(!c.noise_multiplier || (*c.noise_multiplier >= 0 && std::isfinite(*c.noise_multiplier)),
            "noise_multiplier must be >= 0 and finite, got " + num(c.noise_multiplier.value_or(0)));
    require(!c.target_epsilon || (*c.target_epsilon > 0 && std::isfinite(*c.target_epsilon)),
            "target_epsilon must be > 0 and finite, got " + num(c.target_epsilon.value_or(0)));
    require(!c.delta || (*c.delta > 0 && *c.delta < 1), "delta must be in (0, 1), got " + num(c.delta.value_or(0)));
    if (c.noise_multiplier && *c.noise_multiplier == 0) {
      require(c.allow_no_noise, "noise_multiplier 0 adds no noise and is NOT private; set allow_no_noise to insist");
      require(!c.target_epsilon, "target_epsilon cannot be met without noise (noise_multiplier 0)");
    }
    require(c.sampling != Sampling::shuffle || (c.epoch_fraction > 0 && c.epoch_fraction < 1),
            "epoch_fraction must be in (0, 1) for private shuffled training, got " + num(c.epoch_fraction));
    for (const PriorRelease& r : c.released_before)
      require(r.noise_multiplier > 0 && std::isfinite(r.noise_multiplier) && r.draws >= 1 && std::isfinite(r.draws),
              "a release before training needs a noise multiplier > 0 and at least one draw, got " +
                  num(r.noise_multiplier) + " and " + num(r.draws));
  } else {
    require(!c.noise_multiplier && !c.target_epsilon, "a non-private run takes no noise_multiplier or target_epsilon");
    require(c.released_before.empty(), "a non-private run has no privacy ledger for releases made before training");
  }

  // ---- data, sampler, strategy, accountant
  const std::size_t n = c.communicator ? index_shard() : train.examples();
  require(n > 0, "the training set is empty");
  require(c.batch_size >= 1 && c.batch_size <= n,
          "batch_size must be in [1, " + std::to_string(n) + "] (the training set's size), got " +
              std::to_string(c.batch_size));
  const std::string sampling = dp ? to_string(c.sampling) : "shuffle";
  const double fraction = dp && c.sampling == Sampling::shuffle ? c.epoch_fraction : 1.0;
  sampler_ = make_sampler(sampling, n, c.batch_size, fraction);
  total_steps_ = privacy::steps_for_epochs(sampler_->name(), long(n), long(c.batch_size), c.epochs, fraction);
  if (c.max_steps > 0) total_steps_ = std::min(total_steps_, c.max_steps);
  strategy_ = !dp ? std::shared_ptr<ClipStrategyT<T>>(make_clip_strategy<T>("none"))
              : c.clipping ? c.clipping
                           : clipping::ghost<T>();
  require(!dp || strategy_->is_private(), "the clipping strategy " + strategy_->name() + " is not private");
  if (dp) run_self_check();

  nlohmann::json resumed_run;
  if (resume_from) {
    open_run_key(*resume_from);
    resumed_extra_ = CheckpointDir(*resume_from).read_extra(*run_key_);
    require(resumed_extra_.contains("trainer") && resumed_extra_["trainer"].is_object(),
            "the checkpoint in " + resume_from->string() + " does not record its run's noise and length");
    resumed_run = resumed_extra_["trainer"];
  }

  if (dp) {
    delta_ = c.delta.value_or(default_delta_for(n));
    if (delta_ * double(n) >= 1) {
      const std::string what = "delta " + num(delta_) + " is at least 1/N for N = " + std::to_string(n) +
                               " records: (epsilon, delta)-DP then allows releasing a record in full with "
                               "probability delta, so that about delta N >= 1 records may be published exactly";
      require(c.allow_large_delta, what + "; use a delta below 1/N (the default keeps delta N <= 0.6), or set "
                                          "allow_large_delta to insist");
      warnings_.push_back(what);
    }
    accountant_name_ = c.accounting == Accounting::automatic ? privacy::default_accountant(sampler_->name())
                                                              : to_string(c.accounting);
    privacy::AccountantOptions aopts;
    aopts.dataset_size = long(n);
    aopts.batch_size = long(c.batch_size);
    aopts.epoch_fraction = fraction;
    accountant_ = privacy::make_accountant(accountant_name_, aopts);
    check_accountant_matches(*sampler_, accountant_name_);
    require(accountant_->upper_bound(),
            "the " + accountant_name_ + " accountant is an approximation, not an upper bound: it can neither set the "
            "noise nor be a run's epsilon; use " + privacy::default_accountant(sampler_->name()));
    require(strategy_->jl_dim() == 0 || accountant_->supports_jl(),
            "the " + accountant_name_ + " accountant cannot analyse " + strategy_->name() +
                " (its clipping bound is random); use pld with poisson sampling");
    const double sens = privacy::accounted_sensitivity(strategy_->sensitivity(), accountant_->neighbouring());
    const double q = sampler_->sampling_rate(), coordinates = double(model.parameter_count());
    auto epsilon_after = [&](double sigma, long steps) {
      auto a = privacy::make_accountant(accountant_name_, aopts);
      add_prior_releases(*a);
      a->step(q, sigma / sens, steps, strategy_->jl_dim());
      return privacy::grid_noise_epsilon_of_draws(*a, delta_, double(steps) * coordinates + prior_draws_);
    };
    require(c.released_before.empty() || accountant_name_ == "pld" || accountant_name_ == "rdp",
            "releases before training compose with Poisson sampling's accountants (pld, rdp), not " + accountant_name_);
    {
      auto a = privacy::make_accountant(accountant_name_, aopts);
      add_prior_releases(*a);
      prior_ledger_ = a->ledger();
      prior_steps_ = a->total_steps();
      for (const PriorRelease& r : c.released_before) prior_draws_ += r.draws;
    }
    if (!resume_from) add_prior_releases(*accountant_);  // a checkpoint's ledger holds them already
    if (resume_from) {  // the run's own sigma and length, never recalibrated (the checkpoint's MAC vouches for them)
      require(resumed_run.value("noise_multiplier", nlohmann::json()).is_number() &&
                  resumed_run.value("total_steps", nlohmann::json()).is_number_integer(),
              "the checkpoint's noise multiplier or length is not valid");
      sigma_ = resumed_run.at("noise_multiplier").get<double>();
      total_steps_ = resumed_run.at("total_steps").get<long>();
      calibrated_ = resumed_run.value("calibrated", false);
      require(std::isfinite(sigma_) && sigma_ >= 0 && total_steps_ >= 0,
              "the checkpoint's noise multiplier or length is not valid");
    } else if (!c.noise_multiplier) {
      const auto slack =
          privacy::grid_noise_slack(delta_, double(total_steps_) * coordinates + prior_draws_, 0x1p24, *c.target_epsilon);
      require(std::isfinite(slack.epsilon_slack) && slack.epsilon_slack < *c.target_epsilon,
              "target_epsilon " + num(*c.target_epsilon) + " is out of reach of the noise grid's accounting");
      const double target = *c.target_epsilon - slack.epsilon_slack;
      const auto cal =
          c.released_before.empty()
              ? privacy::calibrate_noise_multiplier(accountant_name_, aopts, q, total_steps_, target,
                                                    slack.inner_delta, strategy_->jl_dim())
              : privacy::calibrate_sigma(
                    [&](double s) {
                      auto a = privacy::make_accountant(accountant_name_, aopts);
                      add_prior_releases(*a);
                      a->step(q, s, total_steps_, strategy_->jl_dim());
                      return a->epsilon(slack.inner_delta);
                    },
                    target);
      sigma_ = cal.noise_multiplier * sens;
      calibrated_ = true;
    } else {
      sigma_ = *c.noise_multiplier;
      if (c.target_epsilon && sigma_ > 0 && epsilon_after(sigma_, total_steps_) > *c.target_epsilon) {
        long lo = 0, hi = total_steps_;
        while (hi - lo > 1) {
          const long mid = lo + (hi - lo) / 2;
          (epsilon_after(sigma_, mid) <= *c.target_epsilon ? lo : hi) = mid;
        }
        require(lo > 0, "even one step exceeds epsilon " + num(*c.target_epsilon) + " at noise multiplier " +
                            num(sigma_));
        cut_ = total_steps_ - lo;
        total_steps_ = lo;
      }
    }
    if (sigma_ > 0)
      require(std::isfinite(epsilon_after(sigma_, total_steps_)),
              "noise multiplier " + num(sigma_) + " proves no finite epsilon at delta " + num(delta_) + " over " +
                  std::to_string(total_steps_) + " steps (" + accountant_name_ +
                  "); use a larger noise multiplier, or 0 with allow_no_noise for a run that is knowingly NOT private");
  }

  // ---- generators: secure unless asked for seeded ones by name (or not private at all)
  const bool reproducible = !dp || c.reproducible_noise;
  noise_rng_ = make_private_rng(reproducible, c.seed + 1);
  aux_rng_ = make_private_rng(reproducible, c.seed + 2);
  sample_rng_ = make_private_rng(reproducible, c.seed + 3);
  if (c.communicator) {  // every rank draws the same batches, directions and noise streams (docs/distributed.md)
    share_generator(*c.communicator, *sample_rng_);
    share_generator(*c.communicator, *aux_rng_);
    share_generator(*c.communicator, *noise_rng_);
  }

  DPConfig dc;
  dc.clip_norm = c.clip_norm;
  dc.noise_multiplier = sigma_;
  dc.allow_no_noise = c.allow_no_noise;
  dc.sat_rho = c.sat_rho;
  dc.physical_batch = c.physical_batch_size;
  dc.communicator = c.communicator;
  dp_ = std::make_unique<DPOptimizerT<T>>(model, optimizer, *strategy_, dc, *sampler_, *noise_rng_, *aux_rng_,
                                          accountant_.get());
  if (c.ema > 0) average_ = std::make_unique<ParameterAverageT<T>>(model.parameters(), c.ema);

  if (resume_from) {
    TrainingStateT<T> state = training_state();
    steps_ = CheckpointDir(*resume_from).load(state, *run_key_);
    require(steps_ >= 0 && steps_ <= total_steps_, "the checkpoint's step " + std::to_string(steps_) +
                                                       " is outside the run's " + std::to_string(total_steps_));
    if (accountant_ && adds_noise()) {
      // the ledger cannot shrink or soften: it holds the releases made before training, then every step
      // taken, each at this run's q, sigma and strategy
      const std::vector<privacy::Step>& ledger = accountant_->ledger();
      const std::size_t k = prior_ledger_.size();
      require(ledger.size() >= k && std::equal(prior_ledger_.begin(), prior_ledger_.end(), ledger.begin()),
              "the checkpoint's ledger does not start with this run's " + std::to_string(c.released_before.size()) +
                  " releases before training");
      require(accountant_->total_steps() == steps_ + prior_steps_,
              "the checkpoint's ledger holds " + std::to_string(accountant_->total_steps() - prior_steps_) +
                  " steps for step " + std::to_string(steps_));
      for (const privacy::Step& e : std::span(ledger).subspan(k))
        require(e.sampling_rate == sampler_->sampling_rate() &&
                    e.noise_multiplier == dp_->accounted_noise_multiplier() && e.jl_dim == strategy_->jl_dim(),
                "the checkpoint's ledger records steps at q " + num(e.sampling_rate) + ", sigma " +
                    num(e.noise_multiplier) + ", JL dimension " + std::to_string(e.jl_dim) + "; this run takes them at q " +
                    num(sampler_->sampling_rate()) + ", sigma " + num(dp_->accounted_noise_multiplier()) +
                    ", JL dimension " + std::to_string(strategy_->jl_dim()));
    }
    if (average_) average_->set_updates(resumed_run.value("ema_updates", 0L));
    if (c.communicator) {  // the secure generators re-keyed on loading: each rank its own
      share_generator(*c.communicator, *sample_rng_);
      share_generator(*c.communicator, *aux_rng_);
      share_generator(*c.communicator, *noise_rng_);
    }
  }
  if (c.communicator)  // what followed from the settings and the data: the same on every rank, or refused
    require_same_settings_on_all_ranks(
        *c.communicator,
        nlohmann::json{{"dataset_size", n}, {"sampling_rate", sampler_->sampling_rate()},
                       {"total_steps", total_steps_}, {"noise_multiplier", sigma_}, {"delta", delta_},
                       {"accountant", accountant_name_}, {"steps_done", steps_},
                       {"ledger", accountant_ ? accountant_->to_json() : nlohmann::json()}}
            .dump(),
        "derived run settings");
}

template <class T>
nlohmann::json PrivateTrainerT<T>::settings() const {
  const auto& c = config_;
  auto optional = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
  nlohmann::json releases = nlohmann::json::array();
  for (const PriorRelease& r : c.released_before) releases.push_back({r.noise_multiplier, r.draws});
  nlohmann::json params = nlohmann::json::array();
  crypto_generichash_state h;
  crypto_generichash_init(&h, nullptr, 0, 32);
  for (const auto& p : model_.parameters()) {
    params.push_back({p.name(), shape_of(p.value())});
    crypto_generichash_update(&h, reinterpret_cast<const unsigned char*>(p.value().data()), p.value().size() * sizeof(T));
  }
  unsigned char digest[32];
  crypto_generichash_final(&h, digest, sizeof digest);
  std::string hex;
  for (unsigned char b : digest) hex += "0123456789abcdef"[b >> 4], hex += "0123456789abcdef"[b & 15];
  nlohmann::json scales = nlohmann::json::array();
  for (std::size_t i = 0; i < optimizer_.params().size(); ++i) scales.push_back(optimizer_.lr_scale(i));
  nlohmann::json optimizer = {{"name", optimizer_.name()}, {"lr", base_lr_}, {"lr_scales", scales}};
  for (const auto& [k, v] : optimizer_.settings()) optimizer[k] = v;
  return {{"private", !c.non_private},
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
          {"clip_strategy", c.clipping ? c.clipping->name() : std::string("ghost")},
          {"accountant", to_string(c.accounting)},
          {"sat_rho", c.sat_rho},
          {"released_before", releases},
          {"ema", c.ema},
          {"lr_final", c.lr_final},
          {"transform", bool(c.transform)},
          {"reproducible_noise", c.reproducible_noise},
          {"seed", c.reproducible_noise ? nlohmann::json(c.seed) : nlohmann::json()},
          {"model", {{"name", model_.name()}, {"parameters", params}, {"values", hex}}},
          {"optimizer", optimizer}};
}

template <class T>
void PrivateTrainerT<T>::run_self_check() {
  const auto start = std::chrono::steady_clock::now();
  std::string failure;
  try {
    structural_self_check(model_, *strategy_, train_, config_.transform);
  } catch (const std::invalid_argument& e) {
    failure = e.what();
  }
  if (config_.communicator) require_on_all_ranks(*config_.communicator, failure.empty(), failure);
  require(failure.empty(), failure);
  self_check_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <class T>
BatchT<T> PrivateTrainerT<T>::transform_each(const BatchT<T>& batch, long step) const {
  std::vector<BatchT<T>> records;
  records.reserve(batch.examples());
  for (std::size_t i = 0; i < batch.examples(); ++i) records.push_back(config_.transform(batch.select({i}), step));
  if (records.empty()) return config_.transform(batch, step);  // an empty batch keeps the transform's layout
  return concat_batches(records);
}

template <class T>
void PrivateTrainerT<T>::open_run_key(const std::filesystem::path& dir) {
  const std::filesystem::path store = config_.key_store.empty() ? default_key_store() : config_.key_store;
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
PrivateTrainerT<T>::~PrivateTrainerT() = default;

template <class T>
long PrivateTrainerT<T>::steps_per_epoch() const {
  return sampler_->steps_per_epoch();
}

template <class T>
double PrivateTrainerT<T>::sampling_rate() const {
  return sampler_->sampling_rate();
}

template <class T>
double PrivateTrainerT<T>::expected_batch_size() const {
  return sampler_->expected_batch_size();
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
double PrivateTrainerT<T>::epsilon() const {
  if (!adds_noise()) return INFINITY;
  return privacy::grid_noise_epsilon_of_draws(*accountant_, delta_, noise_draws(*accountant_));
}

template <class T>
double PrivateTrainerT<T>::final_epsilon() const {
  if (!adds_noise()) return INFINITY;
  auto a = accountant_->clone();
  const long rest = total_steps_ - steps_;
  if (rest > 0) a->step(sampling_rate(), dp_->accounted_noise_multiplier(), rest, strategy_->jl_dim());
  return privacy::grid_noise_epsilon_of_draws(*a, delta_, noise_draws(*a));
}

template <class T>
void PrivateTrainerT<T>::add_prior_releases(privacy::Accountant& a) const {
  const double sens = privacy::accounted_sensitivity(1.0, a.neighbouring());
  for (const PriorRelease& r : config_.released_before) a.step(1.0, r.noise_multiplier / sens, 1);
}

template <class T>
double PrivateTrainerT<T>::noise_draws(const privacy::Accountant& a) const {
  return double(a.total_steps() - prior_steps_) * double(model_.parameter_count()) + prior_draws_;
}

template <class T>
StepStats PrivateTrainerT<T>::step() {
  if (done())
    throw std::logic_error("PrivateTrainer::step: the run is done (" + std::to_string(total_steps_) + " steps)");
  if (config_.lr_final >= 0) optimizer_.set_lr(cosine_lr(base_lr_, config_.lr_final, steps_, total_steps_));
  const std::vector<std::size_t> drawn = sampler_->next(*sample_rng_);  // positions in the whole set
  BatchT<T> batch = train_.select(config_.communicator ? local_rows(drawn) : drawn);
  if (config_.transform) batch = transform_each(batch, steps_);
  StepStats st = dp_->step(batch);
  if (average_) average_->update();
  ++steps_;
  return st;
}

template <class T>
void PrivateTrainerT<T>::train(const std::function<void(long epoch)>& on_epoch) {
  const long per_epoch = steps_per_epoch();
  while (!done()) {
    step();
    if (on_epoch && (steps_ % per_epoch == 0 || done())) on_epoch((steps_ - 1) / per_epoch + 1);
  }
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

template <class T>
Evaluation PrivateTrainerT<T>::evaluate(const BatchT<T>& data, std::size_t chunk) {
  Evaluation e;
  const std::size_t n = data.examples();
  const bool labelled = !data.labels.empty();
  std::size_t correct = 0;
  double loss = 0;
  run_inference(data, chunk, [&](const BatchT<T>& b, std::size_t, const TensorT<T>& out) {
    const TensorT<T> losses = model_.row_losses(out, b);  // kept: the loop reads its value
    for (const T v : losses.value()) loss += double(v) / double(b.views);
    if (labelled && b.views == 1 && out.value().dimension() == 2) {
      const ArrayT<T>& z = out.value();
      const std::size_t k = z.shape()[1];
      for (std::size_t i = 0; i < b.examples(); ++i) {
        const T* row = z.data() + i * k;
        if (std::int32_t(std::max_element(row, row + k) - row) == b.labels[i]) ++correct;
      }
    }
  });
  e.examples = n;
  e.loss = n ? loss / double(n) : 0.0;
  e.accuracy = labelled && n ? double(correct) / double(n) : std::nan("");
  return e;
}

template <class T>
Evaluation PrivateTrainerT<T>::evaluate_sharded(const BatchT<T>& shard, std::size_t chunk) {
  Evaluation e = evaluate(shard, chunk);
  if (!config_.communicator) return e;
  const bool unlabelled = e.examples > 0 && std::isnan(e.accuracy);  // correct answers: accuracy * examples
  double sums[4] = {e.loss * double(e.examples), unlabelled || !e.examples ? 0.0 : e.accuracy * double(e.examples),
                    double(e.examples), unlabelled ? 1.0 : 0.0};
  config_.communicator->allreduce_sum(sums, 4);
  e.examples = std::size_t(sums[2]);
  e.loss = e.examples ? sums[0] / sums[2] : 0.0;
  e.accuracy = sums[3] == 0 && e.examples ? std::round(sums[1]) / sums[2] : std::nan("");
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
TrainingStateT<T> PrivateTrainerT<T>::training_state() const {
  auto params = model_.parameters();
  TrainingStateT<T> state;
  state.params = params;
  state.optimizer = &optimizer_;
  state.sampler = sampler_.get();
  state.generators = {{"noise", noise_rng_.get()}, {"aux", aux_rng_.get()}, {"sampling", sample_rng_.get()}};
  state.accountant = accountant_.get();
  if (average_)
    for (std::size_t i = 0; i < params.size(); ++i) state.arrays["ema." + params[i].name()] = &average_->averages()[i];
  for (std::size_t i = 0; i < dp_->sat_direction().size(); ++i)
    state.arrays["sat." + params[i].name()] = &dp_->sat_direction()[i];
  return state;
}

template <class T>
void PrivateTrainerT<T>::save(const std::filesystem::path& dir, nlohmann::json extra) {
  const TrainingStateT<T> state = training_state();
  if (!extra.is_object()) throw std::invalid_argument("PrivateTrainer::save: extra must be a JSON object");
  extra["trainer"] = {{"noise_multiplier", sigma_}, {"total_steps", total_steps_}, {"calibrated", calibrated_},
                      {"ema_updates", average_ ? average_->updates() : 0L}, {"private", is_private()},
                      {"processes", processes()}};
  if (dp_->noise_reproducible()) extra["trainer"]["privacy_note"] = kNotPrivateReproducible;
  auto key = [&]() -> RunKey& {
    if (!run_key_) run_key_ = RunKey::create(config_.key_store.empty() ? default_key_store() : config_.key_store);
    return *run_key_;
  };
  if (!config_.communicator) {
    CheckpointDir(dir).save(steps_, state, extra, key());
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
}

namespace clipping {
template <class T>
std::shared_ptr<ClipStrategyT<T>> naive() {
  return make_clip_strategy<T>("naive");
}
template <class T>
std::shared_ptr<ClipStrategyT<T>> vanilla() {
  return make_clip_strategy<T>("vanilla");
}
template <class T>
std::shared_ptr<ClipStrategyT<T>> ghost() {
  return make_clip_strategy<T>("ghost");
}
template <class T>
std::shared_ptr<ClipStrategyT<T>> jl(int k, int chunk) {
  if (k < 1) throw std::invalid_argument("clipping::jl: K must be >= 1, got " + std::to_string(k));
  if (chunk < 0) throw std::invalid_argument("clipping::jl: chunk must be >= 0, got " + std::to_string(chunk));
  return make_clip_strategy<T>("jl:" + std::to_string(k) + (chunk ? "/" + std::to_string(chunk) : ""));
}
template <class T>
std::shared_ptr<ClipStrategyT<T>> microbatch(int m, double expected_batch) {
  if (m < 1) throw std::invalid_argument("clipping::microbatch: M must be >= 1, got " + std::to_string(m));
  return make_clip_strategy<T>("microbatch:" + std::to_string(m), expected_batch);
}
#define DPGRAD_CLIPPING(T)                                                  \
  template std::shared_ptr<ClipStrategyT<T>> naive<T>();                    \
  template std::shared_ptr<ClipStrategyT<T>> vanilla<T>();                  \
  template std::shared_ptr<ClipStrategyT<T>> ghost<T>();                    \
  template std::shared_ptr<ClipStrategyT<T>> jl<T>(int, int);               \
  template std::shared_ptr<ClipStrategyT<T>> microbatch<T>(int, double);
DPGRAD_CLIPPING(float)
DPGRAD_CLIPPING(double)
#undef DPGRAD_CLIPPING
}  // namespace clipping

template class PrivateTrainerT<float>;
template class PrivateTrainerT<double>;

}  // namespace dpgrad
