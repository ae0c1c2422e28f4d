// RunPlan (optim/run/plan.hpp): a run's settings checked and settled, before any data.
#include "optim/run/plan.hpp"

#include <cmath>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "engine/check.hpp"
#include "optim/sampling/sampler.hpp"
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

Sampling sampling_from_string(const std::string& name) {
  for (Sampling s : {Sampling::poisson, Sampling::shuffle, Sampling::fixed})
    if (to_string(s) == name) return s;
  throw std::invalid_argument("unknown sampler '" + name + "' (poisson, shuffle, fixed)");
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

double default_delta_for(std::size_t n) {
  double d = 1;
  while (d * double(n) > 0.6 * (1 + 1e-9)) d /= 10;
  return d;
}

namespace {

std::string num(double x) { return privacy::format_number(x, 6); }

}  // namespace

void check_plan_settings(const PlanSettings& c) {
  require(c.epochs > 0 && std::isfinite(c.epochs), "epochs must be > 0 and finite, got " + num(c.epochs));
  require(c.max_steps >= 0, "max_steps must be >= 0 (0: no limit), got " + std::to_string(c.max_steps));
  require(!c.allow_large_delta || c.delta, "allow_large_delta accepts a delta of 1/N or more: it goes with a delta");
  require(!c.allow_no_noise || (c.noise_multiplier == 0.0 && !c.target_epsilon),
          "allow_no_noise goes with noise_multiplier 0 and no target_epsilon (a run without noise has no epsilon)");
  if (c.non_private) {
    require(!c.noise_multiplier && !c.target_epsilon, "a non-private run takes no noise_multiplier or target_epsilon");
    require(c.released_before.empty(), "a non-private run has no privacy ledger for releases made before training");
    return;
  }
  require(c.strategy_private, "the clipping strategy " + c.strategy + " is not private");
  // below 1e-12 the noise sigma C leaves the noise grid's range for every useful sigma (docs/noise.md)
  require(c.clip_norm >= 1e-12 && c.clip_norm <= 1e6, "clip_norm must be in [1e-12, 1e6], got " + num(c.clip_norm));
  require(c.jl_dim <= 1000, c.strategy + ": each of the K directions is a forward pass, so a step costs about K "
                            "non-private steps (jl:1000 took 26 s a step on cnn26k); at most jl:1000 (ghost and "
                            "vanilla give exact norms faster)");
  require(c.noise_multiplier || c.target_epsilon, "a private run needs a noise_multiplier or a target_epsilon");
  require(!c.noise_multiplier || (*c.noise_multiplier >= 0 && std::isfinite(*c.noise_multiplier)),
          "noise_multiplier must be >= 0 and finite, got " + num(c.noise_multiplier.value_or(0)));
  require(!c.target_epsilon || (*c.target_epsilon > 0 && std::isfinite(*c.target_epsilon)),
          "target_epsilon must be > 0 and finite, got " + num(c.target_epsilon.value_or(0)));
  require(!c.delta || (*c.delta > 0 && *c.delta < 1), "delta must be in (0, 1), got " + num(c.delta.value_or(0)));
  if (c.noise_multiplier && *c.noise_multiplier > 0)
    require(*c.noise_multiplier * c.clip_norm <= 0x1.0p900,
            "noise_multiplier " + num(*c.noise_multiplier) + " times clip_norm " + num(c.clip_norm) + " is a noise "
            "standard deviation of " + num(*c.noise_multiplier * c.clip_norm) + ", outside the noise grid's range "
            "[2^-900, 2^900] (docs/noise.md)");
  require(c.noise_multiplier != 0.0 || c.allow_no_noise,
          "noise_multiplier 0 adds no noise and is NOT private; set allow_no_noise to insist");
  if (c.accounting != Accounting::automatic) {
    const std::string a = to_string(c.accounting), s = to_string(c.sampling), fits = privacy::analysed_sampler(a);
    require(fits == s, "the " + a + " accountant does not analyse " + s + " sampling (it analyses " + fits +
                           " sampling; " + s + " sampling goes with the " + privacy::default_accountant(s) +
                           (s == "poisson" ? " or rdp" : "") + " accountant)");
  }
  require(c.sampling != Sampling::shuffle || (c.epoch_fraction > 0 && c.epoch_fraction < 1),
          "epoch_fraction must be in (0, 1) for private shuffled training, got " + num(c.epoch_fraction));
  for (const PriorRelease& r : c.released_before)
    require(r.noise_multiplier > 0 && std::isfinite(r.noise_multiplier) && r.draws >= 1 && std::isfinite(r.draws),
            "a release before training needs a noise multiplier > 0 and at least one draw, got " +
                num(r.noise_multiplier) + " and " + num(r.draws));
  require(c.sensitivity > 0 && std::isfinite(c.sensitivity), "the strategy's sensitivity must be > 0");
}

RunPlan RunPlan::make(const PlanSettings& settings, std::size_t dataset_size, std::size_t parameters) {
  check_plan_settings(settings);
  RunPlan p;
  p.s_ = settings;
  p.n_ = dataset_size;
  p.parameters_ = parameters;
  const PlanSettings& c = p.s_;
  const bool dp = !c.non_private;
  require(dataset_size > 0, "the training set is empty");
  require(c.batch_size >= 1 && c.batch_size <= dataset_size,
          "batch_size must be in [1, " + std::to_string(dataset_size) + "] (the training set's size), got " +
              std::to_string(c.batch_size));
  // ---- sampler and length
  p.sampler_ = dp ? to_string(c.sampling) : "shuffle";
  p.fraction_ = dp && c.sampling == Sampling::shuffle ? c.epoch_fraction : 1.0;
  const std::unique_ptr<Sampler> sampler = p.make_sampler();
  p.q_ = sampler->sampling_rate();
  p.expected_batch_ = sampler->expected_batch_size();
  p.per_epoch_ = sampler->steps_per_epoch();
  p.total_steps_ = privacy::steps_for_epochs(p.sampler_, long(dataset_size), long(c.batch_size), c.epochs, p.fraction_);
  if (c.max_steps > 0) p.total_steps_ = std::min(p.total_steps_, c.max_steps);
  if (!dp) return p;

  // ---- delta
  p.delta_ = c.delta.value_or(default_delta_for(dataset_size));
  if (p.delta_ * double(dataset_size) >= 1) {
    const std::string what = "delta " + num(p.delta_) + " is at least 1/N for N = " + std::to_string(dataset_size) +
                              " records: (epsilon, delta)-DP then allows releasing a record in full with "
                              "probability delta, so that about delta N >= 1 records may be published exactly";
    require(c.allow_large_delta,
            what + "; use a delta below 1/N (the default keeps delta N <= 0.6), or set allow_large_delta to insist");
    p.warnings_.push_back(what);
  }
  // ---- the accountant of the sampler (check_plan_settings refused one that does not analyse it), and the
  // releases before training
  p.accountant_ = c.accounting == Accounting::automatic ? privacy::default_accountant(p.sampler_)
                                                        : to_string(c.accounting);
  const auto probe = p.make_accountant(false);
  require(probe->upper_bound(), "the " + p.accountant_ + " accountant is an approximation, not an upper bound: it can "
                                "neither set the noise nor be a run's epsilon; use " + privacy::default_accountant(p.sampler_));
  require(c.jl_dim == 0 || probe->supports_jl(), "the " + p.accountant_ + " accountant cannot analyse " + c.strategy +
                                                     " (its clipping bound is random); use pld with poisson sampling");
  require(c.released_before.empty() || p.accountant_ == "pld" || p.accountant_ == "rdp",
          "releases before training compose with Poisson sampling's accountants (pld, rdp), not " + p.accountant_);
  {
    const auto with = p.make_accountant(true);
    p.release_steps_ = with->total_steps();
    for (const PriorRelease& r : c.released_before) p.release_draws_ += r.draws;
  }

  // ---- the noise: calibrated for the target, or given (and the run cut to the target)
  const double sens = privacy::accounted_sensitivity(c.sensitivity, probe->neighbouring());
  const auto epsilon_at = [&](double sigma, long steps) {
    RunPlan trial = p;
    trial.sigma_ = sigma;
    return trial.epsilon_after(steps);
  };
  if (!c.noise_multiplier) {
    const double target = *c.target_epsilon;
    const auto slack = privacy::grid_noise_slack(p.delta_, p.noise_draws(p.total_steps_), 0x1p24, target);
    auto out_of_reach = [&](const std::string& detail) {
      // what this configuration can reach: from the largest noise calibration tries to the smallest
      const double low = epsilon_at(1e7, p.total_steps_), high = epsilon_at(1e-4, p.total_steps_);
      return "target_epsilon " + num(target) + " is out of reach (" + detail + "): over " +
             std::to_string(p.total_steps_) + " steps at delta " + num(p.delta_) + " with " + p.accountant_ +
             ", this configuration reaches epsilons from " + num(low) + " (noise multiplier 1e7) to " +
             (std::isfinite(high) ? num(high) : std::string("infinity")) + " (noise multiplier 1e-4)";
    };
    require(std::isfinite(slack.epsilon_slack) && slack.epsilon_slack < target,
            out_of_reach("the noise grid's accounting alone takes " + num(slack.epsilon_slack)));
    const long steps = p.total_steps_;
    privacy::Calibration cal;
    try {
      cal = privacy::calibrate_sigma(
          [&](double s) {
            auto a = p.make_accountant(true);
            a->step(p.q_, s, steps, c.jl_dim);
            return a->epsilon(slack.inner_delta);
          },
          target - slack.epsilon_slack);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(out_of_reach(e.what()));
    }
    p.sigma_ = cal.noise_multiplier * sens;
    p.calibrated_ = true;
  } else {
    p.sigma_ = *c.noise_multiplier;
    if (c.target_epsilon && p.sigma_ > 0 && epsilon_at(p.sigma_, p.total_steps_) > *c.target_epsilon) {
      long lo = 0, hi = p.total_steps_;
      while (hi - lo > 1) {
        const long mid = lo + (hi - lo) / 2;
        (epsilon_at(p.sigma_, mid) <= *c.target_epsilon ? lo : hi) = mid;
      }
      require(lo > 0, "even one step exceeds epsilon " + num(*c.target_epsilon) + " at noise multiplier " + num(p.sigma_));
      p.cut_ = p.total_steps_ - lo;
      p.total_steps_ = lo;
    }
  }
  if (p.sigma_ > 0)
    require(std::isfinite(p.final_epsilon()),
            "noise multiplier " + num(p.sigma_) + " proves no finite epsilon at delta " + num(p.delta_) + " over " +
                std::to_string(p.total_steps_) + " steps (" + p.accountant_ +
                "); use a larger noise multiplier, or 0 with allow_no_noise for a run that is knowingly NOT private");
  return p;
}

RunPlan RunPlan::resumed(double noise_multiplier, long total_steps, bool calibrated) const {
  require(std::isfinite(noise_multiplier) && noise_multiplier >= 0 && total_steps >= 0,
          "the checkpoint's noise multiplier or length is not valid");
  RunPlan p = *this;
  p.sigma_ = noise_multiplier;
  p.total_steps_ = total_steps;
  p.calibrated_ = calibrated;
  return p;
}

RunPlan RunPlan::extended(double noise_multiplier) const {
  require(std::isfinite(noise_multiplier) && noise_multiplier >= 0, "the checkpoint's noise multiplier is not valid");
  PlanSettings s = s_;
  s.noise_multiplier = noise_multiplier;
  return make(s, n_, parameters_);
}

double RunPlan::accounted_noise_multiplier() const {
  if (!is_private()) return 0;
  return sigma_ / privacy::accounted_sensitivity(s_.sensitivity, make_accountant(false)->neighbouring());
}

std::unique_ptr<Sampler> RunPlan::make_sampler() const {
  return dpgrad::make_sampler(sampler_, n_, s_.batch_size, fraction_);
}

std::unique_ptr<privacy::Accountant> RunPlan::make_accountant(bool with_releases) const {
  if (!is_private()) return nullptr;
  privacy::AccountantOptions o;
  o.dataset_size = long(n_);
  o.batch_size = long(s_.batch_size);
  o.epoch_fraction = fraction_;
  auto a = privacy::make_accountant(accountant_, o);
  if (with_releases) {
    const double sens = privacy::accounted_sensitivity(1.0, a->neighbouring());
    for (const PriorRelease& r : s_.released_before) a->step(1.0, r.noise_multiplier / sens, 1);
  }
  return a;
}

double RunPlan::noise_draws(long steps) const { return double(steps) * double(parameters_) + release_draws_; }

double RunPlan::epsilon_after(long steps) const {
  if (!adds_noise()) return INFINITY;
  auto a = make_accountant(true);
  if (steps > 0) a->step(q_, accounted_noise_multiplier(), steps, s_.jl_dim);
  return privacy::grid_noise_epsilon_of_draws(*a, delta_, noise_draws(steps));
}

nlohmann::json RunPlan::to_json() const {
  nlohmann::json j = {{"private", is_private()},
                      {"dataset_size", n_},
                      {"parameters", parameters_},
                      {"sampler", sampler_},
                      {"batch_size", s_.batch_size},
                      {"sampling_rate", q_},
                      {"expected_batch_size", expected_batch_},
                      {"steps_per_epoch", per_epoch_},
                      {"total_steps", total_steps_},
                      {"steps_cut_for_budget", cut_}};
  if (!is_private()) return j;
  nlohmann::json releases = nlohmann::json::array();
  for (const PriorRelease& r : s_.released_before)
    releases.push_back({{"noise_multiplier", r.noise_multiplier}, {"draws", r.draws}});
  j.update({{"clip_strategy", s_.strategy},
            {"clip_norm", s_.clip_norm},
            {"noise_multiplier", sigma_},
            {"calibrated", calibrated_},
            {"delta", delta_},
            {"accountant", accountant_},
            {"released_before", releases},
            {"final_epsilon", adds_noise() ? nlohmann::json(final_epsilon()) : nlohmann::json()},
            {"warnings", warnings_}});
  if (s_.target_epsilon) j["target_epsilon"] = *s_.target_epsilon;
  return j;
}

std::string RunPlan::describe() const {
  std::string s = std::to_string(total_steps_) + " steps (" + std::to_string(per_epoch_) + " per epoch), " + sampler_ +
                  " batches of " + std::to_string(s_.batch_size) + " from " + std::to_string(n_) + " records (q = " +
                  num(q_) + ")";
  if (!is_private()) return s + ", not private";
  s += ", " + s_.strategy + " clipping at C = " + num(s_.clip_norm) + ", noise multiplier " + num(sigma_) +
       (calibrated_ ? " (calibrated)" : "") + ", delta " + num(delta_) + ", " + accountant_;
  if (adds_noise()) s += ": epsilon " + privacy::format_epsilon(final_epsilon()) + " at the end";  // rounded up
  if (cut_ > 0) s += " (" + std::to_string(cut_) + " steps cut to stay within the target)";
  return s;
}

}  // namespace dpgrad
