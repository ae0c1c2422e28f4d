// Audit settings: see audit_config.hpp.
#include "optim/audit/audit_config.hpp"

#include <cmath>
#include <stdexcept>

#include "optim/clipping/clip_spec.hpp"

namespace dpgrad {

std::string to_string(AuditFault f) {
  switch (f) {
    case AuditFault::none: return "none";
    case AuditFault::no_noise: return "no-noise";
    case AuditFault::known_seed_noise: return "known-seed-noise";
    case AuditFault::batch_clipping: return "batch-clipping";
    case AuditFault::wrong_sampling_rate: return "wrong-sampling-rate";
    case AuditFault::under_reported_norm: return "under-reported-norm";
  }
  throw std::invalid_argument("unknown AuditFault");
}

AuditFault audit_fault_from_string(const std::string& name) {
  for (AuditFault f : {AuditFault::none, AuditFault::no_noise, AuditFault::known_seed_noise, AuditFault::batch_clipping,
                       AuditFault::wrong_sampling_rate, AuditFault::under_reported_norm})
    if (to_string(f) == name) return f;
  throw std::invalid_argument("unknown fault '" + name +
                              "' (none, no-noise, known-seed-noise, batch-clipping, wrong-sampling-rate, "
                              "under-reported-norm)");
}

void check_audit_config(const AuditConfig& c) {
  if (c.model != "logreg" && c.model != "mlp" && c.model != "cnn26k" && c.model != "lstm")
    throw std::invalid_argument("unknown audit model '" + c.model + "' (logreg, mlp, cnn26k, lstm)");
  if (parse_clip_spec(c.strategy).kind == ClipSpec::Kind::none)
    throw std::invalid_argument("audit: clip strategy none is not private: there is no claim to audit");
  if (!(c.noise_multiplier > 0 && std::isfinite(c.noise_multiplier)))
    throw std::invalid_argument("audit: the noise multiplier must be > 0 (the claim being audited)");
  if (!(c.clip_norm > 0 && std::isfinite(c.clip_norm))) throw std::invalid_argument("audit: clip norm must be > 0");
  if (!(c.sampling_rate > 0 && c.sampling_rate <= 1)) throw std::invalid_argument("audit: q must be in (0, 1]");
  if (c.steps < 1 || c.steps > 1000) throw std::invalid_argument("audit: steps must be in [1, 1000]");
  if (c.trials < 8 || c.trials > 10000000) throw std::invalid_argument("audit: trials must be in [8, 10^7]");
  if (c.others < 1 || c.others > 1000) throw std::invalid_argument("audit: others must be in [1, 1000]");
  if (!(c.delta > 0 && c.delta < 1)) throw std::invalid_argument("audit: delta must be in (0, 1)");
  if (!(c.confidence > 0 && c.confidence < 1)) throw std::invalid_argument("audit: confidence must be in (0, 1)");
  if (c.method != "distinguish" && c.method != "one-run")
    throw std::invalid_argument("audit: unknown method '" + c.method + "' (distinguish, one-run)");
  if (c.method == "one-run" && (c.canaries < 20 || c.canaries > 100000000))
    throw std::invalid_argument("audit: one-run needs at least 20 canaries (and at most one per parameter)");
}

}  // namespace dpgrad
