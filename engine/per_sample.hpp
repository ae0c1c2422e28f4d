// Per-sample rules (MATH.md section 7): from the uses a tape recorded during
// one backward pass of the summed per-sample losses, compute per-sample
// gradient norms (ghost or materialised, whichever is cheaper per parameter),
// the materialised per-sample gradients, and weighted sums sum_i c_i G_i.
// All uses of one parameter are grouped first: a weight used at many steps or
// positions has one per-sample gradient.
#pragma once

#include <vector>

#include "engine/tape.hpp"

namespace dpgrad {

enum class NormMethod {
  automatic,    // per parameter, the cheaper of ghost and materialise
  ghost,        // Gram-matrix identity, nothing of parameter size per sample
  materialise,  // build G_i, take its norm
};

/// ||G_i||^2 for one parameter: (B).
template <class T>
ArrayT<T> per_sample_norms_squared(const ParamUses<T>& group, std::size_t batch,
                                   NormMethod method = NormMethod::automatic);
/// G_i for one parameter: (B, ...parameter shape).
template <class T>
ArrayT<T> per_sample_gradients(const ParamUses<T>& group, std::size_t batch);
/// sum_i c_i G_i for one parameter, by book-keeping (one GEMM per use): parameter shape.
template <class T>
ArrayT<T> weighted_gradient_sum(const ParamUses<T>& group, const ArrayT<T>& c);

/// The method `automatic` picks for this parameter (for benchmarks and tests).
template <class T>
NormMethod cheaper_norm_method(const ParamUses<T>& group);

}  // namespace dpgrad
