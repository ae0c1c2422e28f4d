// Privacy audit of a training configuration (docs/audit.md): the real DP
// optimizer, clipping strategy and noise run many times on a fixed batch with
// and without a canary (an example whose gradient is far above the clipping
// norm), and a threshold test on the released update along the canary's
// gradient gives a lower bound on epsilon that holds with high confidence
// (privacy/audit.hpp). Deliberately broken mechanisms (AuditFault) show that the
// audit catches what it should; they exist for testing the audit only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "privacy/audit.hpp"

namespace dpgrad {

/// A mechanism broken on purpose, to test that the audit catches it. Never a
/// setting of a real run.
enum class AuditFault {
  none,
  no_noise,             // the noise is switched off, the accountant told it is there
  known_seed_noise,     // the noise comes from a seed the attacker knows, and is subtracted
  batch_clipping,       // one clip factor for the batch (from its mean gradient) instead of one per example
  wrong_sampling_rate,  // the canary is always in the batch, the accountant told q
  under_reported_norm,  // the per-sample rule reports a tenth of the canary's norm
};
std::string to_string(AuditFault f);
AuditFault audit_fault_from_string(const std::string& name);  // "none", "no-noise", ...

struct AuditConfig {
  std::string model = "logreg";      // logreg, mlp, cnn26k, lstm (a small bidirectional LSTM over tokens)
  std::string strategy = "ghost";    // naive, vanilla, ghost, jl:K, microbatch:M
  double noise_multiplier = 1.0;     // sigma
  double clip_norm = 1.0;            // C
  double sampling_rate = 1.0;        // q: the canary joins each step's batch with this probability
  long steps = 1;                    // DP steps per trial
  long trials = 2000;                // trials without, and as many with, the canary
  std::size_t others = 3;            // fixed examples in every batch besides the canary
  double delta = 1e-5;
  double confidence = 0.95;
  AuditFault fault = AuditFault::none;
  std::uint64_t seed = 1;            // initialisation and data (public); the noise is secure
  /// "distinguish": many trials with and without one canary (the threshold test);
  /// "one-run": one run with `canaries` canaries, each in the data with
  /// probability 1/2 (Steinke, Nasr, Jagielski 2023). `trials` is unused then.
  std::string method = "distinguish";
  long canaries = 1000;
};

struct AuditResult {
  double epsilon_lower_bound = 0;    // from whichever method ran
  double confidence = 0;
  privacy::AuditBound bound;         // "distinguish": the threshold test
  privacy::OneRunBound one_run;      // "one-run": the guesses
  double accountant_epsilon = 0;     // what the run claims (pld, with the grid's slack)
  std::size_t parameters = 0;
  double seconds = 0;
};

/// Runs the audit; `progress(done, total)` after each trial.
AuditResult run_audit(const AuditConfig& config, const std::function<void(long, long)>& progress = {});

}  // namespace dpgrad
