// dpgrad-audit's options (programs/audit/options.hpp).
#include "programs/audit/options.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "programs/cli.hpp"

namespace dpgrad::audit {

Parsed parse_audit_options(int argc, const char* const* argv) {
  Parsed p;
  AuditConfig& c = p.config;
  std::string fault = "none";
  CLI::App app{"dpgrad-audit: measure a lower bound on epsilon for a training configuration, with canaries"};
  name_cli_errors(app, "dpgrad-audit");
  app.add_option("--model", c.model, "logreg, mlp, cnn26k, lstm (a small bidirectional LSTM)")->capture_default_str();
  app.add_option("--clip-strategy", c.strategy, "naive, vanilla, ghost, jl:K, microbatch:M")->capture_default_str();
  app.add_option("--noise-multiplier", c.noise_multiplier, "sigma")->check(real_number())->capture_default_str();
  app.add_option("--clip-norm", c.clip_norm, "C")->check(real_number())->capture_default_str();
  app.add_option("--sampling-rate", c.sampling_rate, "q: the canary joins each step's batch with this probability")->check(real_number())
      ->capture_default_str();
  app.add_option("--steps", c.steps, "DP steps per trial")->check(whole_number())->capture_default_str();
  app.add_option("--trials", c.trials, "trials without the canary, and as many with it")->check(whole_number())->capture_default_str();
  app.add_option("--others", c.others, "fixed examples in every batch besides the canary")->check(whole_number())->capture_default_str();
  app.add_option("--delta", c.delta, "delta of the claim and of the bound")->check(real_number())->capture_default_str();
  app.add_option("--confidence", c.confidence, "the bound holds with at least this probability")->check(real_number())->capture_default_str();
  app.add_option("--fault", fault,
                 "a DELIBERATELY BROKEN mechanism, for testing the audit itself: none, no-noise, known-seed-noise, "
                 "batch-clipping, wrong-sampling-rate, under-reported-norm")
      ->capture_default_str();
  app.add_option("--method", c.method,
                 "distinguish (many trials with and without one canary) or one-run (one run, --canaries dirac "
                 "canaries each in the data with probability 1/2)")
      ->capture_default_str();
  app.add_option("--canaries", c.canaries, "one-run: how many canaries (at most one per parameter)")->check(whole_number())
      ->capture_default_str();
  app.add_option("--seed", c.seed, "seed of the model and data (the noise is from the secure generator)")->check(whole_number());
  app.add_flag("--json", p.json, "one JSON object on stdout");
  p.exit_code = parse_arguments(app, argc, argv);
  if (p.exit_code) return p;
  c.fault = audit_fault_from_string(fault);
  check_audit_config(c);
  // the noise grid adds noise to values below 2^27 sigma C (docs/noise.md): the batch's clipped sum, the fixed
  // examples and the canaries (a broken mechanism clips a canary at 10 C), must stay below it
  if (c.fault != AuditFault::no_noise) {
    const double batch = double(c.others) + (c.method == "one-run" ? double(c.canaries) : 1.0);
    const double smallest = 4 * 10 * batch * std::ldexp(1.0, -27);
    if (!(c.noise_multiplier >= smallest))
      throw std::invalid_argument(fmt::format("--noise-multiplier {} is too small for the noise grid: the clipped "
                                              "sum of {} examples needs at least {:.3g} (docs/noise.md)",
                                              c.noise_multiplier, batch, smallest));
  }
  return p;
}

}  // namespace dpgrad::audit
