// Privacy audit of a training configuration (docs/audit.md): the real DP
// optimizer, clipping strategy and noise run many times on a fixed batch with
// and without a canary (an example whose gradient is far above the clipping
// norm), and a threshold test on the released update along the canary's
// gradient gives a lower bound on epsilon that holds with high confidence
// (privacy/audit_statistics.hpp). Deliberately broken mechanisms (AuditFault) show that the
// audit catches what it should; they exist for testing the audit only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "optim/audit/audit_config.hpp"
#include "privacy/audit_statistics.hpp"

namespace dpgrad {

/// What run_audit found: a lower bound on epsilon from running the mechanism,
/// next to the epsilon the accountant claims for it.
struct AuditResult {
  double epsilon_lower_bound = 0;    // from whichever method ran
  double confidence = 0;             // the lower bound holds with at least this probability
  privacy::AuditBound bound;         // "distinguish": the threshold test
  privacy::OneRunBound one_run;      // "one-run": the guesses
  double accountant_epsilon = 0;     // what the run claims (pld, with the grid's slack)
  std::size_t parameters = 0;        // the audited model's parameter count
  double seconds = 0;                // wall time of the audit
};

/// Runs the audit; `progress(done, total)` after each trial.
/// Throws std::invalid_argument on a config check_audit_config refuses.
AuditResult run_audit(const AuditConfig& config, const std::function<void(long, long)>& progress = {});

}  // namespace dpgrad
