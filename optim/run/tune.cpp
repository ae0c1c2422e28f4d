// Private hyperparameter search (tune.hpp, docs/tuning.md).
#include "optim/run/tune.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/check.hpp"
#include "engine/random.hpp"
#include "optim/checkpoint/checkpoint.hpp"
#include "optim/checkpoint/checkpoint_key.hpp"
#include "privacy/accountant.hpp"
#include "privacy/mechanisms.hpp"
#include "privacy/rdp.hpp"

namespace dpgrad {

namespace {

std::string num(double x) { return privacy::format_number(x, 6); }

void check_range(const std::pair<double, double>& r, const char* name, double lo, double hi) {
  require(std::isfinite(r.first) && std::isfinite(r.second) && r.first > lo && r.second < hi && r.first <= r.second,
          std::string("search space: ") + name + " must be a range lo <= hi within (" + num(lo) + ", " + num(hi) +
              "), got [" + num(r.first) + ", " + num(r.second) + "]");
}

double log_uniform(const std::pair<double, double>& r, Rng& rng) {
  return r.first == r.second ? r.first
                             : std::exp(std::log(r.first) + rng.uniform() * (std::log(r.second) - std::log(r.first)));
}

/// The search's state as it is saved: what defines the search, its draws, and the trials done.
constexpr int kSearchStateVersion = 1;

/// What must not change when a search resumes.
template <class T>
nlohmann::json search_identity(const SearchConfigT<T>& c, const SearchPlan& plan) {
  nlohmann::json prior = nlohmann::json::array();
  for (const auto& r : c.released_before) prior.push_back({r.noise_multiplier, r.draws});
  return {{"space", c.space.to_json()},   {"trials", c.trials.to_json()},
          {"target_epsilon", c.target_epsilon}, {"validation_fraction", c.validation_fraction},
          {"score_noise", c.score_noise}, {"released_before", prior},
          {"reproducible", c.reproducible}, {"plan", plan.to_json()}};
}

/// The trial's RDP curve (at the default orders) and its noised values, for one
/// configuration of the space at noise multiplier sigma.
struct TrialCurve {
  std::vector<double> orders, rdp;
  double draws = 0;
};

/// The trial's plan at noise multiplier sigma; null when sigma is too small to
/// prove any finite epsilon (the calibration then takes more noise: the user gave a
/// target epsilon, not this sigma). A problem other than the noise is thrown.
template <class T>
std::optional<RunPlan> trial_plan(PrivateTrainingConfigT<T> cfg, std::size_t n_train, std::size_t parameters,
                                  std::size_t layers, double sigma) {
  cfg.noise_multiplier = sigma;
  try {
    return plan_run(cfg, n_train, parameters, layers);
  } catch (const std::invalid_argument&) {
    cfg.noise_multiplier = 1e6;
    plan_run(cfg, n_train, parameters, layers);  // throws when the problem is not the noise
    return std::nullopt;
  }
}

template <class T>
TrialCurve trial_curve(PrivateTrainingConfigT<T> cfg, std::size_t n_train, std::size_t parameters, std::size_t layers,
                       double sigma, double score_sigma) {
  const std::optional<RunPlan> at_sigma = trial_plan(cfg, n_train, parameters, layers, sigma);
  if (!at_sigma) {  // no finite epsilon at this sigma: every order's RDP infinite
    const std::vector<double> orders = privacy::default_rdp_orders();
    return {orders, std::vector<double>(orders.size(), std::numeric_limits<double>::infinity()), 0};
  }
  const RunPlan& plan = *at_sigma;
  auto acc = plan.make_accountant(true);
  acc->step(plan.sampling_rate(), plan.accounted_noise_multiplier(), plan.total_steps());
  acc->step(1.0, score_sigma, 1);  // the score: a count of sensitivity 1 with noise std score_sigma
  const auto& rdp = dynamic_cast<const privacy::RdpCurveAccountant&>(*acc);
  return {rdp.orders(), rdp.rdp(), plan.noise_draws(plan.total_steps()) + 1};
}

/// The trial config of `s` (no checkpoints yet), as plan_search and tune build it.
template <class T>
PrivateTrainingConfigT<T> trial_config(const SearchConfigT<T>& c, const TrialSettings& s, double sigma, double delta) {
  PrivateTrainingConfigT<T> t = c.trial;
  t.clip_norm = s.clip_norm;
  if (s.clip_quantile) {
    AdaptiveClipping a = c.trial.adaptive_clipping.value_or(AdaptiveClipping{});
    a.quantile = *s.clip_quantile;
    t.adaptive_clipping = a;
  } else {
    t.adaptive_clipping.reset();
  }
  t.batch_size = s.batch_size;
  t.epochs = s.epochs;
  t.noise_multiplier = sigma;
  t.target_epsilon.reset();
  t.delta = delta;
  t.accounting = Accounting::rdp;
  t.reproducible_noise = c.reproducible;
  t.checkpoints = {};
  return t;
}

/// Every (batch size, epochs, adaptive or not) combination: the accounting of a trial depends on no other setting.
template <class T>
std::vector<TrialSettings> accounting_cases(const SearchConfigT<T>& c) {
  std::vector<TrialSettings> out;
  for (std::size_t b : c.space.batch_sizes)
    for (double e : c.space.epochs) {
      TrialSettings s;
      s.lr = c.space.lr.first;
      s.clip_norm = c.space.clip_norm.first;
      if (c.space.clip_quantile) s.clip_quantile = c.space.clip_quantile->first;
      s.batch_size = b;
      s.epochs = e;
      out.push_back(s);
    }
  return out;
}

/// Refuses a search folder that exists and that other users may enter or list, or
/// that is another user's: its trials' folders would tell them how many trials ran,
/// which the search's bound needs secret. A folder the search creates is 0700
/// (CheckpointLock creates missing folders so).
void require_private_search_folder(const std::filesystem::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return;  // missing: created private
  require(S_ISDIR(st.st_mode), "the search folder " + dir.string() + " is not a folder");
  require(st.st_uid == ::geteuid(), "the search folder " + dir.string() + " belongs to another user");
  require(!(st.st_mode & 077), "the search folder " + dir.string() + " is open to other users (mode " +
                                   std::to_string((st.st_mode >> 6) & 7) + std::to_string((st.st_mode >> 3) & 7) +
                                   std::to_string(st.st_mode & 7) + "), who could count its trials' folders; run " +
                                   "chmod 700 on it");
}

/// Refuses a configuration of the space that its trial's optimizer would refuse
/// at the search's sigma: adaptive clipping's count-noise rule, its range of C
/// (at both ends of the space's clip norms) and the noise grid's range. Checked
/// before K and the settings are drawn: a trial refused part-way through a search
/// would show that the search got that far, which tells something of K.
template <class T>
void check_case_at_sigma(const SearchConfigT<T>& c, TrialSettings s, const SearchPlan& p, std::size_t parameters,
                         std::size_t layers) {
  for (const double clip_norm : {c.space.clip_norm.first, c.space.clip_norm.second}) {
    s.clip_norm = clip_norm;
    const PrivateTrainingConfigT<T> cfg = trial_config(c, s, p.noise_multiplier, p.delta);
    try {
      check_training_config(cfg, s.lr);
      const RunPlan plan = plan_run(cfg, p.train_records, parameters, layers);
      const std::shared_ptr<ClipStrategyT<T>> strategy = cfg.clipping ? cfg.clipping : clipping::ghost<T>();
      DPConfig dc;
      dc.clip_norm = clip_norm;
      dc.noise_multiplier = plan.noise_multiplier();
      dc.adaptive = cfg.adaptive_clipping;
      check_noise_settings(dc, *strategy, plan.expected_batch_size(), layers);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("the search's trials at its calibrated noise multiplier " + num(p.noise_multiplier) +
                                  " (for the target epsilon " + num(c.target_epsilon) + "), batch size " +
                                  std::to_string(s.batch_size) + ", " + num(s.epochs) + " epochs and C " +
                                  num(clip_norm) + ": " + e.what());
    }
  }
}

/// A lower bound on the epsilon plan_search finds for any number of records n >= 4:
/// the trials' training taken to cost nothing, the scores what n records' held-out
/// part makes them cost, at the given delta or n's default (the prior releases
/// included). With a given delta the bound falls as n grows, so n -> infinity
/// (scores that cost nothing) bounds every n. The default delta is 10^-k for n in
/// (0.6 10^(k-1), 0.6 10^k]: within each such band the bound is smallest at the
/// band's top; above 6e14 records delta is at most 1e-16.
template <class T>
double search_floor(const SearchConfigT<T>& c) {
  const std::vector<double> orders = privacy::default_rdp_orders();
  std::vector<double> prior(orders.size(), 0.0);
  double draws = 1;  // the score
  for (const auto& r : c.released_before) {
    for (std::size_t i = 0; i < prior.size(); ++i) prior[i] += privacy::rdp_subsampled_gaussian(1.0, r.noise_multiplier, orders[i]);
    draws += r.draws;
  }
  auto at = [&](double n, double delta) {  // n = 0: infinitely many records
    std::vector<double> scores(orders.size(), 0.0);
    if (n > 0) {
      const double held_out = std::max(1.0, double(std::llround(n * c.validation_fraction)));
      for (std::size_t i = 0; i < orders.size(); ++i)
        scores[i] = privacy::rdp_subsampled_gaussian(1.0, c.score_noise * held_out, orders[i]);
    }
    return privacy::search_epsilon(c.trials, orders, scores, prior, delta, draws).epsilon;
  };
  if (c.delta) return at(0, *c.delta);
  double floor = at(0, 1e-16);
  for (int k = 1; k <= 15; ++k) floor = std::min(floor, at(std::floor(0.6 * std::pow(10.0, k)), std::pow(10.0, -k)));
  return floor;
}

}  // namespace

// ---------------------------------------------------------------- settings

void SearchSpace::check() const {
  check_range(lr, "lr", 0, 1e6);
  check_range(clip_norm, "clip_norm", 0, 1e6);
  if (clip_quantile) check_range(*clip_quantile, "clip_quantile", 0, 1);
  require(!batch_sizes.empty() && batch_sizes.size() <= 64, "search space: give 1 to 64 batch sizes");
  for (std::size_t b : batch_sizes) require(b >= 1 && b <= (1u << 24), "search space: a batch size must be in [1, 2^24], got " + std::to_string(b));
  require(!epochs.empty() && epochs.size() <= 64, "search space: give 1 to 64 epoch counts");
  for (double e : epochs) require(e > 0 && e <= 1e4 && std::isfinite(e), "search space: epochs must be in (0, 10000], got " + num(e));
  // a trial's settings are read back by value (TrialSettings::from_json): each value once
  for (std::size_t i = 0; i < batch_sizes.size(); ++i)
    require(std::count(batch_sizes.begin(), batch_sizes.begin() + long(i), batch_sizes[i]) == 0,
            "search space: the batch size " + std::to_string(batch_sizes[i]) + " is listed twice");
  for (std::size_t i = 0; i < epochs.size(); ++i)
    require(std::count(epochs.begin(), epochs.begin() + long(i), epochs[i]) == 0,
            "search space: the epoch count " + num(epochs[i]) + " is listed twice");
}

nlohmann::json SearchSpace::to_json() const {
  nlohmann::json j{{"lr", {lr.first, lr.second}},
                   {"clip_norm", {clip_norm.first, clip_norm.second}},
                   {"batch_sizes", batch_sizes},
                   {"epochs", epochs}};
  j["clip_quantile"] = clip_quantile ? nlohmann::json{clip_quantile->first, clip_quantile->second} : nlohmann::json();
  return j;
}

nlohmann::json TrialSettings::to_json() const {
  return {{"lr", lr}, {"clip_norm", clip_norm},
          {"clip_quantile", clip_quantile ? nlohmann::json(*clip_quantile) : nlohmann::json()},
          {"batch_size", batch_size}, {"epochs", epochs}, {"init_seed", init_seed}};
}

TrialSettings TrialSettings::from_json(const nlohmann::json& j, const SearchSpace& space) {
  const std::string bad = "the search state's trial settings are not valid";
  require(j.is_object(), bad);
  auto number = [&](const char* key) {
    require(j.contains(key) && j[key].is_number(), bad + " (\"" + key + "\")");
    return j[key].get<double>();
  };
  TrialSettings s;
  s.lr = number("lr");
  s.clip_norm = number("clip_norm");
  if (j.contains("clip_quantile") && !j["clip_quantile"].is_null()) s.clip_quantile = number("clip_quantile");
  require(j.contains("batch_size") && j["batch_size"].is_number_unsigned(), bad + " (\"batch_size\")");
  s.batch_size = j["batch_size"].get<std::size_t>();
  s.epochs = number("epochs");
  require(j.contains("init_seed") && j["init_seed"].is_number_unsigned(), bad + " (\"init_seed\")");
  s.init_seed = j["init_seed"].get<std::uint64_t>();
  auto within = [](double v, const std::pair<double, double>& r) { return v >= r.first && v <= r.second; };
  require(within(s.lr, space.lr) && within(s.clip_norm, space.clip_norm) &&
              s.clip_quantile.has_value() == space.clip_quantile.has_value() &&
              (!s.clip_quantile || within(*s.clip_quantile, *space.clip_quantile)) &&
              std::count(space.batch_sizes.begin(), space.batch_sizes.end(), s.batch_size) == 1 &&
              std::count(space.epochs.begin(), space.epochs.end(), s.epochs) >= 1,
          bad + " (outside the search space)");
  return s;
}

std::string TrialSettings::describe() const {
  std::string s = "lr " + num(lr) + ", " + (clip_quantile ? "C from " + num(clip_norm) + " at quantile " + num(*clip_quantile)
                                                          : "C " + num(clip_norm));
  return s + ", batch " + std::to_string(batch_size) + ", " + num(epochs) + " epochs";
}

nlohmann::json SearchPlan::to_json() const {
  return {{"noise_multiplier", noise_multiplier}, {"score_noise_multiplier", score_noise_multiplier},
          {"epsilon", epsilon}, {"delta", delta}, {"max_trials", max_trials}, {"cap_tail", cap_tail},
          {"train_records", train_records}, {"validation_records", validation_records}};
}

template <class T>
std::string SearchResultT<T>::privacy_statement() const {
  return "epsilon " + privacy::format_epsilon(plan.epsilon) + " (delta " + num(plan.delta) +
         ", private selection over a random number of trials, Papernot-Steinke RDP bound, add/remove-one neighbours)";
}

// ---------------------------------------------------------------- the plan

template <class T>
void check_search_settings(const SearchConfigT<T>& c) {
  c.space.check();
  c.trials.check();
  require(std::isfinite(c.target_epsilon) && c.target_epsilon > 0,
          "the search's target epsilon must be > 0 and finite, got " + num(c.target_epsilon));
  require(!c.trial.target_epsilon && !c.trial.noise_multiplier,
          "the search calibrates its trials' noise: leave the trial config's target_epsilon and noise_multiplier unset");
  require(!c.trial.non_private, "a search's trials are private runs (non_private is set)");
  require(c.trial.sampling == Sampling::poisson, "a search's trials use Poisson sampling (its RDP analysis)");
  require(!c.trial.communicator, "a search runs in one process (the trial config has a communicator)");
  require(c.trial.releases.empty(),
          "a search's trials make no releases before training: make them before the search (released_before)");
  require(!c.trial.clipping || c.trial.clipping->jl_dim() == 0,
          "a search's trials need exact per-sample norms: jl:K's projections have no RDP analysis here");
  require(c.validation_fraction > 0 && c.validation_fraction <= 0.5,
          "validation_fraction must be in (0, 0.5], got " + num(c.validation_fraction));
  require(std::isfinite(c.score_noise) && c.score_noise > 0 && c.score_noise <= 1,
          "score_noise must be in (0, 1] (the noise std of a score in [0, 1]), got " + num(c.score_noise));
  for (const auto& r : c.released_before)
    require(r.noise_multiplier > 0 && std::isfinite(r.noise_multiplier) && r.draws >= 1 && std::isfinite(r.draws),
            "a release before the search needs a noise multiplier > 0 and draws >= 1");
  require(!c.delta || (*c.delta > 0 && *c.delta < 1), "the search's delta must be in (0, 1), got " + num(c.delta.value_or(0)));
  for (const auto& s : accounting_cases(c)) check_training_config(trial_config(c, s, 1.0, c.delta.value_or(0.1)), s.lr);
  const double floor = search_floor(c);
  require(floor < c.target_epsilon,
          "the search's target epsilon " + num(c.target_epsilon) + " is out of reach whatever the number of records: " +
              "even with trials that cost nothing it spends at least " + privacy::format_epsilon(floor) + " (the " +
              "number of trials, the scores" + (c.released_before.empty() ? "" : ", the releases before the search") +
              " and delta); raise the target or score_noise, or use a distribution with fewer trials");
}

template <class T>
SearchPlan plan_search(const SearchConfigT<T>& c, std::size_t records, std::size_t parameters, std::size_t layers) {
  check_search_settings(c);
  SearchPlan p;
  p.validation_records = std::max<std::size_t>(1, std::size_t(std::llround(double(records) * c.validation_fraction)));
  require(records >= 2 * p.validation_records && records >= 4,
          "a search needs at least 4 records, and more to train on than to score on; got " + std::to_string(records));
  p.train_records = records - p.validation_records;
  p.delta = c.delta ? *c.delta : default_delta_for(records);
  require(p.delta > 0 && p.delta < 1, "the search's delta must be in (0, 1), got " + num(p.delta));
  p.score_noise_multiplier = c.score_noise * double(p.validation_records);

  // the worst trial's RDP curve over every configuration of the space, and the prior releases'
  const auto cases = accounting_cases(c);
  const std::vector<double> orders = privacy::default_rdp_orders();  // the trials' RdpAccountant's grid
  std::vector<double> prior(orders.size(), 0.0);
  double prior_draws = 0;
  for (const auto& r : c.released_before) {
    for (std::size_t i = 0; i < prior.size(); ++i) prior[i] += privacy::rdp_subsampled_gaussian(1.0, r.noise_multiplier, orders[i]);
    prior_draws += r.draws;
  }
  auto search_at = [&](double sigma) {
    TrialCurve worst;
    for (const auto& s : cases) {
      const TrialCurve t = trial_curve(trial_config(c, s, sigma, p.delta), p.train_records, parameters, layers, sigma,
                                       p.score_noise_multiplier);
      if (worst.orders.empty()) worst = t;
      for (std::size_t i = 0; i < t.rdp.size(); ++i) worst.rdp[i] = std::max(worst.rdp[i], t.rdp[i]);
      worst.draws = std::max(worst.draws, t.draws);
    }
    require(worst.orders == orders, "tune: the trials' accountant has another grid of orders");
    // the prior releases' draws are counted once per trial: more than they are, which only adds slack
    return privacy::search_epsilon(c.trials, worst.orders, worst.rdp, prior, p.delta, worst.draws + prior_draws);
  };
  // the smallest sigma (to a relative 1e-4) whose search meets the target; larger sigmas spend less
  double hi = 1;
  privacy::SearchEpsilon at_hi = search_at(hi);
  while (!(at_hi.epsilon <= c.target_epsilon)) {
    if (hi >= 1e4) {
      const auto floor = search_at(1e6);
      throw std::invalid_argument(
          "the search's target epsilon " + num(c.target_epsilon) + " is out of reach: with noise multiplier 1e6 it " +
          "spends " + privacy::format_epsilon(floor.epsilon) + " (the scores' noise, the number of trials and the " +
          "releases before it); raise the target or score_noise, or use a distribution with fewer trials");
    }
    hi *= 4;
    at_hi = search_at(hi);
  }
  double lo = hi / 4;
  while (lo > 1e-3 && search_at(lo).epsilon <= c.target_epsilon) lo /= 4;
  while (hi / lo > 1 + 1e-4) {
    const double mid = std::sqrt(lo * hi);
    const auto e = search_at(mid);
    if (e.epsilon <= c.target_epsilon) {
      hi = mid;
      at_hi = e;
    } else {
      lo = mid;
    }
  }
  p.noise_multiplier = hi;
  p.epsilon = at_hi.epsilon;
  p.max_trials = at_hi.max_trials;
  p.cap_tail = at_hi.tail;
  for (const auto& s : cases) check_case_at_sigma(c, s, p, parameters, layers);
  return p;
}

// ---------------------------------------------------------------- the search

template <class T>
SearchResultT<T> tune(const TrialFactoryT<T>& factory, const BatchT<T>& data, SearchConfigT<T> c,
                      const std::function<void(double)>& progress) {
  require(bool(factory), "tune: the trial factory is empty");
  require(!c.dir.empty(), "tune: the search needs a directory (dir) for its state and its trials' checkpoints");
  require_private_search_folder(c.dir);
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  const std::filesystem::path state_dir = c.dir / "search";
  const std::filesystem::path store = c.key_store.empty() ? default_key_store() : c.key_store;

  // ---- the plan, from a model built for the space's first settings (its size is the trials')
  TrialSettings probe = accounting_cases(c).front();
  std::size_t parameters = 0, layers = 0;
  {
    TrialModelT<T> m = factory(probe);
    require(m.model && m.optimizer, "tune: the trial factory returned no model or no optimizer");
    parameters = m.model->parameter_count();
    layers = clip_layers(m.model->parameters()).size();
  }
  SearchResultT<T> result;
  result.plan = plan_search(c, data.examples(), parameters, layers);
  const SearchPlan& plan = result.plan;
  const nlohmann::json identity = search_identity(c, plan);

  // ---- the search's state: new (K, the split and every trial's settings drawn now) or resumed
  auto has_search = [&] { return std::filesystem::is_directory(state_dir) && CheckpointDir(state_dir).has_checkpoint(); };
  auto check_state = [&] {
    require(c.resume || !has_search(), "the search directory " + c.dir.string() + " already holds a search: resume it, "
                                       "or choose another directory");
    require(!c.resume || has_search(), "no search in " + c.dir.string() + " to resume");
  };
  check_state();  // before the lock creates anything
  CheckpointLock lock(state_dir);
  check_state();  // and again under it
  std::unique_ptr<RunKey> key;
  nlohmann::json state;
  TrainingStateT<T> nothing;
  if (c.resume) {
    key = RunKey::open(CheckpointDir(state_dir).run_id(), store);
    state = CheckpointDir(state_dir).read_extra(*key);
    require(state.value("version", 0) == kSearchStateVersion, "the search state in " + state_dir.string() + " is of another version");
    require(state.value("identity", nlohmann::json()) == identity,
            "the search in " + c.dir.string() + " has other settings (space, trials, target, validation, score noise or "
            "the releases before it): a resumed search keeps its settings");
  } else {
    key = RunKey::create(store);
    auto rng = make_private_rng(c.reproducible, c.seed);
    const long k = c.trials.draw(*rng, plan.max_trials);
    nlohmann::json settings = nlohmann::json::array();
    for (long i = 0; i < k; ++i) {
      TrialSettings s;
      s.lr = log_uniform(c.space.lr, *rng);
      s.clip_norm = log_uniform(c.space.clip_norm, *rng);
      if (c.space.clip_quantile)
        s.clip_quantile = c.space.clip_quantile->first +
                          rng->uniform() * (c.space.clip_quantile->second - c.space.clip_quantile->first);
      s.batch_size = c.space.batch_sizes[rng->below(c.space.batch_sizes.size())];
      s.epochs = c.space.epochs[rng->below(c.space.epochs.size())];
      s.init_seed = rng->next_u64() >> 11;  // exact in a JSON number
      settings.push_back(s.to_json());
    }
    state = {{"version", kSearchStateVersion}, {"identity", identity}, {"split_seed", rng->next_u64() >> 11},
             {"settings", settings}, {"scores", nlohmann::json::array()}, {"best", nlohmann::json()}};
    CheckpointDir(state_dir).save(0, nothing, state, *key);
  }
  const std::string bad = "the search state in " + state_dir.string() + " is not valid";
  require(state.contains("settings") && state["settings"].is_array() &&
              long(state["settings"].size()) <= plan.max_trials && state.contains("scores") &&
              state["scores"].is_array() && state["scores"].size() <= state["settings"].size() &&
              state.contains("split_seed") && state["split_seed"].is_number_unsigned(),
          bad);
  std::vector<TrialSettings> settings;
  for (const auto& j : state["settings"]) settings.push_back(TrialSettings::from_json(j, c.space));
  std::vector<double> scores;
  for (const auto& j : state["scores"]) {
    require(j.is_number() && std::isfinite(j.get<double>()), bad);
    scores.push_back(j.get<double>());
  }
  long best = -1;
  if (!state["best"].is_null()) {
    require(state["best"].is_number_integer() && state["best"].get<long>() >= 0 &&
                state["best"].get<long>() < long(scores.size()),
            bad);
    best = state["best"].get<long>();
  }

  // ---- the split: a random held-out part (data-independent; both parts are accounted)
  std::vector<std::size_t> order(data.examples());
  std::iota(order.begin(), order.end(), std::size_t(0));
  FastRng split(state["split_seed"].get<std::uint64_t>());
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[split.below(i)]);
  const auto cut = order.begin() + long(plan.validation_records);
  const BatchT<T> validation = data.select(std::vector<std::size_t>(order.begin(), cut));
  const BatchT<T> train = data.select(std::vector<std::size_t>(cut, order.end()));

  auto trial_dir = [&](std::size_t i) {
    char name[32];
    std::snprintf(name, sizeof name, "trial-%04zu", i + 1);
    return c.dir / name;
  };
  auto run_trial = [&](std::size_t i, TrialModelT<T>& m) {
    PrivateTrainingConfigT<T> cfg = trial_config(c, settings[i], plan.noise_multiplier, plan.delta);
    cfg.seed = c.seed + 1000 + i;
    cfg.checkpoints.dir = trial_dir(i);
    cfg.checkpoints.every_steps = c.trial.checkpoints.every_steps;
    cfg.checkpoints.key_store = store;
    cfg.checkpoints.resume = std::filesystem::exists(trial_dir(i)) && CheckpointDir(trial_dir(i)).has_checkpoint();
    PrivateTrainerT<T> trainer(*m.model, *m.optimizer, train, cfg);
    TrainHooksT<T> hooks;
    double shown = seconds();
    if (progress)
      hooks.progress = [&](long, long) {
        if (seconds() - shown >= 5) progress(shown = seconds());
      };
    try {
      trainer.train(hooks);
    } catch (const DivergedError&) {
      // the trial's steps were taken and accounted; its model is scored as it is
    }
    return trainer.predict(validation);
  };

  // ---- the trials not done yet, each saved before the next begins
  std::unique_ptr<ModelT<T>> best_model;
  for (std::size_t i = scores.size(); i < settings.size(); ++i) {
    TrialModelT<T> m = factory(settings[i]);
    require(m.model && m.optimizer && m.model->parameter_count() == parameters,
            "tune: the trial factory must build models of one size (" + std::to_string(parameters) + " parameters)");
    const ArrayT<T> outputs = run_trial(i, m);
    std::vector<double> per_record;
    if (c.score) {
      per_record = c.score(outputs, validation);
      require(per_record.size() == validation.examples(), "tune: the score function must give one value per record");
    } else {
      require(!validation.labels.empty() && outputs.dimension() == 2 && outputs.shape()[0] == validation.size(),
              "tune: the default score (accuracy) needs labelled records and class outputs; give a score function");
      for (std::size_t r = 0; r < validation.examples(); ++r) {
        std::size_t arg = 0;
        for (std::size_t j = 1; j < outputs.shape()[1]; ++j) arg = outputs(r, j) > outputs(r, arg) ? j : arg;
        per_record.push_back(std::isfinite(double(outputs(r, arg))) && long(arg) == validation.labels[r] ? 1.0 : 0.0);
      }
    }
    std::vector<float> rows;
    for (double v : per_record) rows.push_back(std::isfinite(v) ? float(std::clamp(v, 0.0, 1.0)) : 0.0f);
    auto rng = make_private_rng(c.reproducible, c.seed + 2000 + i);
    const double noised = privacy::noisy_clipped_sum(rows, 1, 1.0, plan.score_noise_multiplier, *rng)[0] /
                          double(plan.validation_records);
    scores.push_back(noised);
    if (best < 0 || noised > scores[std::size_t(best)]) {
      best = long(i);
      best_model = std::move(m.model);
    }
    state["scores"] = scores;
    state["best"] = best;
    CheckpointDir(state_dir).save(long(i) + 1, nothing, state, *key);  // no progress call here: it would count trials
  }

  // ---- the release: the best trial (rebuilt from its checkpoint when an earlier session ran it)
  if (best < 0) return result;  // K = 0: nothing
  if (!best_model) {
    TrialModelT<T> m = factory(settings[std::size_t(best)]);
    run_trial(std::size_t(best), m);  // its run is complete: the checkpoint is restored, no step taken
    best_model = std::move(m.model);
  }
  result.released = true;
  result.best = settings[std::size_t(best)];
  result.score = scores[std::size_t(best)];
  result.model = std::move(best_model);
  return result;
}

template struct SearchResultT<float>;
template struct SearchResultT<double>;
template void check_search_settings(const SearchConfigT<float>&);
template void check_search_settings(const SearchConfigT<double>&);
template SearchPlan plan_search(const SearchConfigT<float>&, std::size_t, std::size_t, std::size_t);
template SearchPlan plan_search(const SearchConfigT<double>&, std::size_t, std::size_t, std::size_t);
template SearchResultT<float> tune(const TrialFactoryT<float>&, const BatchT<float>&, SearchConfigT<float>,
                                   const std::function<void(double)>&);
template SearchResultT<double> tune(const TrialFactoryT<double>&, const BatchT<double>&, SearchConfigT<double>,
                                    const std::function<void(double)>&);

}  // namespace dpgrad
