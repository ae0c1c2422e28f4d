// A check for users' models: every exact route to per-sample gradient norms
// (the vanilla and ghost strategies, the engine's rules taken directly) against
// the per-example loop, on one batch. A route either agrees or refuses; the
// report says which, and by how much (docs/per-sample.md).
#pragma once

#include <string>
#include <vector>

#include "layers/module.hpp"

namespace dpgrad {

/// One route compared with the per-example loop.
struct PerSampleRoute {
  std::string name;          // "vanilla", "ghost", "rules (ghost norms)", "rules (materialised norms)"
  bool refused = false;      // threw std::invalid_argument: `error` says why
  std::string error;
  double norm_error = 0;     // max over samples of |n_i - naive_i| / naive_i
  double sum_error = 0;      // ||clipped sum - naive's|| / ||naive's||, over all parameters
  bool has_sum = false;      // the strategies form a clipped sum; the rules taken directly only norms
};

struct PerSampleCheck {
  std::size_t batch = 0;             // examples
  double clip_norm = 0;              // the C both clipped sums used
  std::vector<double> naive_norms;   // (batch) the per-example loop's ||g_i||
  std::vector<PerSampleRoute> routes;

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

}  // namespace dpgrad
