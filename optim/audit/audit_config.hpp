// The settings of a privacy audit (optim/audit/audit.hpp, docs/audit.md), and their
// checks, apart from the audit itself: programs check them before any work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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
/// A fault's name ("none", "no-noise", "known-seed-noise", ...) and back;
/// audit_fault_from_string throws std::invalid_argument on an unknown name.
std::string to_string(AuditFault f);
AuditFault audit_fault_from_string(const std::string& name);  // "none", "no-noise", ...

/// The settings of a privacy audit; check_audit_config checks them.
struct AuditConfig {
  std::string model = "logreg";      // logreg, mlp, cnn26k, lstm (a small bidirectional LSTM over tokens)
  std::string strategy = "ghost";    // naive, vanilla, ghost, jl:K, microbatch:M
  double noise_multiplier = 1.0;     // sigma
  double clip_norm = 1.0;            // C
  double sampling_rate = 1.0;        // q: the canary joins each step's batch with this probability
  long steps = 1;                    // DP steps per trial
  long trials = 2000;                // trials without, and as many with, the canary
  std::size_t others = 3;            // fixed examples in every batch besides the canary
  double delta = 1e-5;               // the delta of the lower bound and of the claimed epsilon
  double confidence = 0.95;          // the lower bound holds with at least this probability
  AuditFault fault = AuditFault::none; // none: the real mechanism
  std::uint64_t seed = 1;            // initialisation and data (public); the noise is secure
  /// "distinguish": many trials with and without one canary (the threshold test);
  /// "one-run": one run with `canaries` canaries, each in the data with
  /// probability 1/2 (Steinke, Nasr, Jagielski 2023). `trials` is unused then.
  std::string method = "distinguish";
  long canaries = 1000;              // "one-run" only: at least 20, at most one per parameter
};

/// Checks every setting that needs no model; throws std::invalid_argument
/// naming the problem. run_audit calls it first.
void check_audit_config(const AuditConfig& config);

}  // namespace dpgrad
