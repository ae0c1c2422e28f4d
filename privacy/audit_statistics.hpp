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

/// What audit_epsilon() found: the lower bound on epsilon, the threshold test
/// chosen on the first half of the trials, and its errors on the second half.
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

/// The p-value of `correct` right guesses out of `guesses` about m canaries,
/// each in the training data independently with probability 1/2, if the
/// training is (epsilon, delta)-DP (Steinke, Nasr, Jagielski 2023): with
/// q = e^epsilon / (1 + e^epsilon),
///   P[Bin(guesses, q) >= correct]
///     + 2 m delta max_{i = 1..correct} P[correct - i <= Bin(guesses, q) < correct] / i.
double one_run_p_value(long m, long guesses, long correct, double epsilon, double delta);

/// What one_run_epsilon() found: the lower bound on epsilon and, for the k that
/// gave it, the guesses made and how many were right (0 and 0 when no k shows anything).
struct OneRunBound {
  double epsilon = 0;     // the lower bound
  double confidence = 0;
  long canaries = 0, guesses = 0, correct = 0;
};

/// The one-run audit: `scores` of m canaries and whether each was `included`
/// (drawn independently with probability 1/2). The auditor guesses "in" for the
/// k highest scores and "out" for the k lowest, for k in {m/100, m/20, m/10,
/// m/4} fixed in advance (a union bound over the four), and the bound is the
/// largest epsilon whose p-value stays below 1 - confidence.
OneRunBound one_run_epsilon(const std::vector<double>& scores, const std::vector<bool>& included, double delta,
                            double confidence);

}  // namespace dpgrad::privacy
