// How a training run meets its accountant: which sound accountant analyses each batch
// sampler most tightly, and how many steps a number of epochs makes. dpgrad-train and
// dpgrad-account both ask these, so a run and its calculator agree.
#pragma once

#include <string>

namespace dpgrad::privacy {

/// The tightest accountant that is an upper bound for `sampler`: "pld" for "poisson"
/// (exact norms and DP-SGD-JL alike), "wor" for "fixed", "shuffle" for "shuffle".
/// Throws std::invalid_argument for an unknown sampler.
std::string default_accountant(const std::string& sampler);

/// The sampler an accountant analyses: "fixed" for wor, "shuffle" for shuffle,
/// "poisson" for the others.
std::string analysed_sampler(const std::string& accountant);

/// Steps of `epochs` epochs, rounded up. "poisson" and "fixed": an epoch is N / L steps
/// (q = L / N, so each example is used once per epoch in expectation); "shuffle": an
/// epoch is one pass stopped after floor(F N / L) batches. Throws std::invalid_argument
/// for bad sizes, epochs <= 0 or not finite, or a count beyond a long.
long steps_for_epochs(const std::string& sampler, long dataset_size, long batch_size, double epochs,
                      double epoch_fraction = 1.0);

}  // namespace dpgrad::privacy
