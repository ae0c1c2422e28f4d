// A check for users' models: every exact route to per-sample gradient norms
// (the vanilla and ghost strategies, the engine's rules taken directly) against
// the per-example loop, on one batch. A route either agrees or refuses; the
// report says which, and by how much (docs/per-sample.md).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "layers/module.hpp"

namespace dpgrad {

/// One route compared with the per-example loop.
struct PerSampleRoute {
  std::string name;          // "vanilla", "ghost", "rules (ghost norms)", "rules (materialised norms)"
  bool refused = false;      // threw std::invalid_argument: `error` says why
  std::string error;         // the refusal's message (empty unless refused)
  double norm_error = 0;     // max over samples of |n_i - naive_i| / naive_i
  double sum_error = 0;      // ||clipped sum - naive's|| / ||naive's||, over all parameters
  bool has_sum = false;      // the strategies form a clipped sum; the rules taken directly only norms
};

/// What check_per_sample found: the per-example loop's norms, and every exact
/// route compared with the loop.
struct PerSampleCheck {
  std::size_t batch = 0;             // examples
  double clip_norm = 0;              // the C both clipped sums used
  std::vector<double> naive_norms;   // (batch) the per-example loop's ||g_i||
  std::vector<PerSampleRoute> routes;  // in the order of PerSampleRoute::name's list

  /// Every route ran and agrees within `tolerance` (relative).
  bool agrees(double tolerance) const;
  /// Every route either refused or agrees within `tolerance`: none is silently wrong.
  bool never_silently_wrong(double tolerance) const;
  /// The largest error of the routes that ran (0 if none ran).
  double max_error() const;
  /// One line per route, for test output.
  std::string str() const;
};

/// Runs `model` on `batch` (at least 2 examples) by the per-example loop and by
/// every exact route, in evaluation mode (the model's mode is restored). The
/// clipped sums use C = the median of the loop's norms, so that some samples
/// are clipped and some are not. Throws std::invalid_argument for batches of
/// fewer than 2 examples; a route that refuses the model is reported, not thrown.
template <class T>
PerSampleCheck check_per_sample(ModelT<T>& model, const BatchT<T>& batch);

template <class T>
class ClipStrategyT;
class Rng;

/// `examples` records laid out like those of `like` (the same fields, the same
/// row shapes, the same views) whose values come from `rng` alone: inputs and
/// targets standard normal, token ids 0 or 1 up to a random length, labels in
/// [0, classes), ids 0, 1, ... Only the layout of `like` is read, never a value,
/// so the records are data-independent even when `like` is private.
template <class T>
BatchT<T> synthetic_records(const BatchT<T>& like, std::size_t examples, std::size_t classes, Rng& rng);

/// The structural self-check a private run makes before its first step
/// (docs/per-sample.md): a few synthetic records (synthetic_records, never the
/// private ones: a refusal decided from private data would itself leak), each
/// passed through `transform` on its own when there is one, go through the model
/// batched and through the per-example loop, in evaluation mode. What `strategy`
/// computes must agree: per-sample norms for the exact strategies (vanilla,
/// ghost), the projections on the same directions for jl:K. A model that mixes
/// samples where the engine cannot see it (a constant built from the batch,
/// state shared between examples) then differs. Throws std::invalid_argument
/// naming the strategy, the record and the two values. naive, microbatch:M and
/// none have nothing to compare: they run each example (or group) alone.
template <class T>
void structural_self_check(ModelT<T>& model, ClipStrategyT<T>& strategy, const BatchT<T>& like,
                           const std::function<BatchT<T>(const BatchT<T>&, long)>& transform);

}  // namespace dpgrad
