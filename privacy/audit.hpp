// The statistics of a privacy audit (docs/audit.md): from the scores of trials
// run without and with a canary, a lower bound on epsilon that holds with a
// chosen confidence (Jagielski, Ullman, Oprea 2020; Nasr et al. 2021): a
// threshold test's false positive and false negative rates, bounded above by
// Clopper-Pearson intervals, bound epsilon from below through the definition of
// (epsilon, delta)-DP.
#pragma once

#include <vector>

namespace dpgrad::privacy {

/// Clopper-Pearson one-sided upper bound on a binomial proportion: the p with
/// P(Binomial(n, p) <= k) = alpha (1 for k = n). 0 <= k <= n, 0 < alpha < 1.
double binomial_upper_bound(long k, long n, double alpha);

struct AuditBound {
  double epsilon = 0;       // the lower bound (0 when the test shows nothing)
  double confidence = 0;    // it holds with at least this probability
  double threshold = 0;     // the test: "canary" when the score is above it
  long false_positives = 0, negatives = 0;   // on the evaluation half
  long false_negatives = 0, positives = 0;
  double fpr_upper = 0, fnr_upper = 0;       // their Clopper-Pearson upper bounds
};

/// The lower bound from scores of trials without the canary (`negatives`) and
/// with it (`positives`), higher scores meaning "canary". The threshold is chosen
/// on the first half of each list and the rates counted on the second half, so
/// the choice does not bias them. For (epsilon, delta)-DP, FPR and FNR of any
/// test satisfy FPR >= (1 - delta - FNR) e^-epsilon, so with both rates bounded
/// above (each at 1 - (1 - confidence) / 2):
///   epsilon >= log((1 - delta - FNR_up) / FPR_up)
/// (and the same with the roles of the two rates exchanged; the larger is taken).
AuditBound audit_epsilon(const std::vector<double>& negatives, const std::vector<double>& positives, double delta,
                         double confidence);

}  // namespace dpgrad::privacy
