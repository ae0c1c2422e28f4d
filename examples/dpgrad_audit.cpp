// dpgrad-audit: a lower bound on epsilon, measured (docs/audit.md). Runs a
// training configuration's real DP step many times on a fixed batch with and
// without a canary and turns a threshold test on the released update into a
// bound that holds with the chosen confidence; prints it beside the epsilon the
// accountant claims for the same configuration.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "optim/audit.hpp"
#include "privacy/accountant.hpp"
#include "programs/cli.hpp"

using namespace dpgrad;

int main(int argc, char** argv) {
  AuditConfig c;
  std::string fault = "none";
  bool json_out = false;
  CLI::App app{"dpgrad-audit: measure a lower bound on epsilon for a training configuration, with canaries"};
  name_cli_errors(app, "dpgrad-audit");
  app.add_option("--model", c.model, "logreg, mlp, cnn26k, lstm (a small bidirectional LSTM)")->capture_default_str();
  app.add_option("--clip-strategy", c.strategy, "naive, vanilla, ghost, jl:K, microbatch:M")->capture_default_str();
  app.add_option("--noise-multiplier", c.noise_multiplier, "sigma")->capture_default_str();
  app.add_option("--clip-norm", c.clip_norm, "C")->capture_default_str();
  app.add_option("--sampling-rate", c.sampling_rate, "q: the canary joins each step's batch with this probability")
      ->capture_default_str();
  app.add_option("--steps", c.steps, "DP steps per trial")->capture_default_str();
  app.add_option("--trials", c.trials, "trials without the canary, and as many with it")->capture_default_str();
  app.add_option("--others", c.others, "fixed examples in every batch besides the canary")->capture_default_str();
  app.add_option("--delta", c.delta, "delta of the claim and of the bound")->capture_default_str();
  app.add_option("--confidence", c.confidence, "the bound holds with at least this probability")->capture_default_str();
  app.add_option("--fault", fault,
                 "a DELIBERATELY BROKEN mechanism, for testing the audit itself: none, no-noise, known-seed-noise, "
                 "batch-clipping, wrong-sampling-rate, under-reported-norm")
      ->capture_default_str();
  app.add_option("--method", c.method,
                 "distinguish (many trials with and without one canary) or one-run (one run, --canaries dirac "
                 "canaries each in the data with probability 1/2)")
      ->capture_default_str();
  app.add_option("--canaries", c.canaries, "one-run: how many canaries (at most one per parameter)")
      ->capture_default_str();
  app.add_option("--seed", c.seed, "seed of the model and data (the noise is from the secure generator)");
  app.add_flag("--json", json_out, "one JSON object on stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    c.fault = audit_fault_from_string(fault);
    if (!(c.delta > 0 && c.delta < 1)) throw std::invalid_argument("--delta must be in (0, 1)");
    if (!(c.confidence > 0 && c.confidence < 1)) throw std::invalid_argument("--confidence must be in (0, 1)");
    const bool tty = isatty(fileno(stderr));
    long last_tenth = -1;
    const AuditResult r = run_audit(c, [&](long done, long total) {
      if (json_out && !tty) return;
      const long tenth = done * 10 / total;
      if (tty) fmt::print(stderr, "\r  trial {}/{}", done, total);
      else if (tenth != last_tenth) fmt::print(stderr, "  trial {}/{}\n", done, total);
      last_tenth = tenth;
      if (tty && done == total) fmt::print(stderr, "\n");
    });
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
  } catch (const std::exception& e) {
    fmt::print(stderr, "dpgrad-audit: error: {}\n", e.what());
    return 2;
  }
}
