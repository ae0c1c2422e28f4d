// RunPlan: a run settled before any data is read, checked directly: the
// sampler's q and steps, delta, the accountant, the calibrated noise (against
// an independent accountant), the budget cut, and every refusal by name.
#include <cmath>
#include <string>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "optim/run/plan.hpp"
#include "optim/sampling/sampler.hpp"
#include "privacy/accountant.hpp"
#include "privacy/mechanisms.hpp"
#include "support/check.hpp"

using namespace dpgrad;

namespace {

PlanSettings demo() {
  PlanSettings s;
  s.target_epsilon = 3;
  s.epochs = 10;
  s.batch_size = 256;
  return s;
}

}  // namespace

TEST_CASE("plan: the demo's settings on 60,000 records settle before any data") {
  const RunPlan p = RunPlan::make(demo(), 60000, 26010);
  CHECK(p.is_private());
  CHECK(p.sampler_name() == "poisson");
  CHECK(p.sampling_rate() == doctest::Approx(256.0 / 60000));
  CHECK(p.steps_per_epoch() == 234);  // floor(60000 / 256)
  CHECK(p.total_steps() == 2344);  // ceil(10 * 60000 / 256)
  CHECK(p.delta() == doctest::Approx(1e-5));
  CHECK(p.accountant_name() == "pld");
  CHECK(p.calibrated());
  CHECK(p.final_epsilon() <= 3.0);
  CHECK(p.final_epsilon() > 2.95);
  // the same figure from an independent accountant and the grid's slack
  auto a = privacy::make_accountant("pld");
  a->step(p.sampling_rate(), p.noise_multiplier(), p.total_steps());
  CHECK(privacy::grid_noise_epsilon(*a, 1e-5, 26010.0) == doctest::Approx(p.final_epsilon()).epsilon(1e-9));
  CHECK(p.make_sampler()->name() == "poisson");
  CHECK(p.make_accountant()->total_steps() == 0);
  const nlohmann::json j = p.to_json();
  CHECK(j["total_steps"] == 2344);
  CHECK(j["accountant"] == "pld");
  CHECK(p.describe().find("noise multiplier") != std::string::npos);
}

TEST_CASE("plan: a sigma with a target cuts the run at the budget; the cut is reported") {
  PlanSettings s = demo();
  s.noise_multiplier = 0.55;
  const RunPlan p = RunPlan::make(s, 60000, 26010);
  CHECK_FALSE(p.calibrated());
  CHECK(p.steps_cut() > 0);
  CHECK(p.final_epsilon() <= 3.0);
  CHECK(p.epsilon_after(p.total_steps() + 1) > 3.0);
  CHECK(p.to_json()["steps_cut_for_budget"] == p.steps_cut());
}

TEST_CASE("plan: releases before training are in the ledger and the calibration") {
  PlanSettings s = demo();
  s.epochs = 2;
  const RunPlan plain = RunPlan::make(s, 60000, 1000);
  s.released_before = {{4.0, 3969}};
  const RunPlan with = RunPlan::make(s, 60000, 1000);
  CHECK(with.noise_multiplier() > plain.noise_multiplier());
  CHECK(with.release_steps() == 1);
  CHECK(with.release_draws() == 3969);
  CHECK(with.make_accountant(true)->total_steps() == 1);
  CHECK(with.make_accountant(false)->total_steps() == 0);
  CHECK(with.final_epsilon() <= 3.0);
}

TEST_CASE("plan: refusals name the setting, and an unreachable target says what is reachable") {
  auto refused = [](PlanSettings s, std::size_t n, const std::vector<std::string>& why) {
    test::check_error<std::invalid_argument>([&] { RunPlan::make(s, n, 1000); }, why);
  };
  PlanSettings s = demo();
  s.epochs = 0;
  refused(s, 1000, {"epochs must be > 0"});
  s = demo();
  s.batch_size = 2000;
  refused(s, 1000, {"batch_size must be in [1, 1000]"});
  s = demo();
  s.delta = 0.01;
  refused(s, 1000, {"at least 1/N", "allow_large_delta"});
  s.allow_large_delta = true;
  CHECK(RunPlan::make(s, 1000, 1000).warnings().size() == 1);
  s = demo();
  s.noise_multiplier = 0.0;
  s.target_epsilon.reset();
  refused(s, 1000, {"NOT private", "allow_no_noise"});
  s = demo();
  s.accounting = Accounting::wor;
  refused(s, 1000, {"does not analyse poisson"});
  s.sampling = Sampling::fixed;  // refused before any data: the settings alone say it
  s.accounting = Accounting::rdp;
  test::check_error<std::invalid_argument>([&] { check_plan_settings(s); },
                                           {"the rdp accountant does not analyse fixed sampling (it analyses poisson "
                                            "sampling; fixed sampling goes with the wor accountant)"});
  s = demo();
  s.jl_dim = 3;
  s.strategy = "jl:3";
  s.accounting = Accounting::rdp;
  refused(s, 1000, {"rdp accountant cannot analyse jl:3"});
  // a target the grid's slack alone exceeds: the reachable range is named
  s = demo();
  s.target_epsilon = 1e-9;
  refused(s, 60000, {"target_epsilon 1e-09 is out of reach", "reaches epsilons from"});
  s = demo();
  s.non_private = true;
  refused(s, 1000, {"non-private run takes no noise_multiplier or target_epsilon"});
  // settings that would be silently ignored, and settings outside the noise grid's range or too slow to run
  s = demo();
  s.allow_large_delta = true;
  refused(s, 1000, {"allow_large_delta", "goes with a delta"});
  s = demo();
  s.allow_no_noise = true;
  refused(s, 1000, {"allow_no_noise goes with noise_multiplier 0 and no target_epsilon"});
  s.noise_multiplier = 1.0;
  s.target_epsilon.reset();
  refused(s, 1000, {"allow_no_noise goes with noise_multiplier 0"});
  s = demo();
  s.clip_norm = 1e-13;
  refused(s, 1000, {"clip_norm must be in [1e-12, 1e6], got 1e-13"});
  s.clip_norm = 1e6;
  s.noise_multiplier = 0x1.0p890;
  refused(s, 1000, {"outside the noise grid's range"});
  s = demo();
  s.jl_dim = 1001;
  s.strategy = "jl:1001";
  refused(s, 1000, {"jl:1001", "at most jl:1000"});
  CHECK(sampling_from_string("fixed") == Sampling::fixed);
  test::check_error<std::invalid_argument>([] { sampling_from_string("random"); }, {"unknown sampler 'random'"});
}

TEST_CASE("plan: a resumed run keeps its own sigma and length") {
  const RunPlan p = RunPlan::make(demo(), 60000, 26010);
  const RunPlan r = p.resumed(2.0, 100, false);
  CHECK(r.noise_multiplier() == 2.0);
  CHECK(r.total_steps() == 100);
  CHECK_FALSE(r.calibrated());
  CHECK_THROWS_AS(p.resumed(NAN, 100, true), std::invalid_argument);
}
