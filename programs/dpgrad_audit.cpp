// dpgrad-audit: a lower bound on epsilon, measured (docs/audit.md). Runs a
// training configuration's real DP step many times on a fixed batch with and
// without a canary and turns a threshold test on the released update into a
// bound that holds with the chosen confidence; prints it beside the epsilon the
// accountant claims for the same configuration.

#include <cmath>
#include <cstdio>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "engine/progress.hpp"
#include "engine/runtime.hpp"
#include "optim/audit/audit.hpp"
#include "privacy/accountant.hpp"
#include "programs/audit/options.hpp"
#include "programs/cli.hpp"

using namespace dpgrad;

namespace {

int run(int argc, char** argv) {
  const audit::Parsed parsed = audit::parse_audit_options(argc, argv);
  if (parsed.exit_code) return *parsed.exit_code;
  const AuditConfig& c = parsed.config;
  const bool json_out = parsed.json;
  Progress progress("trial", json_out);  // trial counts only
  const AuditResult r = run_audit(c, [&](long done, long total) { progress.update(done, total); });
  const double ratio = std::isfinite(r.accountant_epsilon) && r.accountant_epsilon > 0
                           ? r.epsilon_lower_bound / r.accountant_epsilon
                           : NAN;
  if (json_out) {
    nlohmann::json j = {{"model", c.model},
                        {"clip_strategy", c.strategy},
                        {"noise_multiplier", c.noise_multiplier},
                        {"clip_norm", c.clip_norm},
                        {"sampling_rate", c.sampling_rate},
                        {"steps", c.steps},
                        {"trials", c.trials},
                        {"fault", to_string(c.fault)},
                        {"delta", c.delta},
                        {"method", c.method},
                        {"epsilon_lower_bound", r.epsilon_lower_bound},
                        {"confidence", r.confidence},
                        {"accountant", "pld"},
                        {"accountant_epsilon", std::isfinite(r.accountant_epsilon) ? nlohmann::json(r.accountant_epsilon)
                                                                                   : nlohmann::json("inf")},
                        {"ratio", std::isfinite(ratio) ? nlohmann::json(ratio) : nlohmann::json()},
                        {"false_positives", r.bound.false_positives},
                        {"negatives", r.bound.negatives},
                        {"false_negatives", r.bound.false_negatives},
                        {"positives", r.bound.positives},
                        {"canaries", c.method == "one-run" ? c.canaries : 1},
                        {"guesses", r.one_run.guesses},
                        {"correct_guesses", r.one_run.correct},
                        {"parameters", r.parameters},
                        {"seconds", r.seconds}};
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("dpgrad-audit: {} ({} parameters), {}, sigma {}, C {}, q {}, {} step(s), {} + {} trials{}\n", c.model,
               r.parameters, c.strategy, c.noise_multiplier, c.clip_norm, c.sampling_rate, c.steps, c.trials,
               c.trials,
               c.fault == AuditFault::none ? ""
                                           : fmt::format(", DELIBERATELY BROKEN: {}", to_string(c.fault)));
    if (c.method == "one-run")
      fmt::print("  one run, {} dirac canaries: {} right of {} guesses\n", c.canaries, r.one_run.correct,
                 r.one_run.guesses);
    else
      fmt::print("  threshold test on the held-out half: {} false positives in {}, {} false negatives in {}\n",
                 r.bound.false_positives, r.bound.negatives, r.bound.false_negatives, r.bound.positives);
    fmt::print("epsilon lower bound {:.3f} (confidence {}, delta {:g}); the accountant claims {} (pld); ratio {:.2f}\n",
               r.epsilon_lower_bound, r.confidence, c.delta, privacy::format_epsilon(r.accountant_epsilon), ratio);
    if (r.epsilon_lower_bound > r.accountant_epsilon)
      fmt::print("VIOLATION: the measured lower bound exceeds the claimed epsilon\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  use_best_blas_core("dpgrad-audit", argc, argv);
  if (const auto closed = guard_standard_output("dpgrad-audit")) return *closed;
  keep_freed_memory();  // reuse what each training step frees (docs/library.md, "Speed")
  try {
    return finish_standard_output("dpgrad-audit", run(argc, argv));
  } catch (const std::exception& e) {
    fmt::print(stderr, "dpgrad-audit: error: {}\n", e.what());
    return 2;
  }
}
