// Per-sample rules (docs/math.md section 7): from the uses a tape recorded during
// one backward pass of the summed per-sample losses, compute per-sample
// gradient norms (ghost or materialised, whichever is cheaper per parameter),
// the materialised per-sample gradients, and weighted sums sum_i c_i G_i.
// All uses of one parameter are grouped first: a weight used at many steps or
// positions has one per-sample gradient.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tape.hpp"

namespace dpgrad {

/// How per_sample_norms_squared computes a parameter's ||G_i||^2.
enum class NormMethod {
  automatic,    // per parameter, the cheaper of ghost and materialise
  ghost,        // Gram-matrix identity, nothing of parameter size per sample
                // (a conv use keeps no patches to take a Gram of: it materialises)
  materialise,  // build G_i, take its norm
};

/// The per-sample gradients G_i of one parameter, as the vanilla strategy keeps
/// them: dense for matmul and bias uses; for a gather only the rows sample i's
/// ids touch (dense, G would be B copies of the table, nearly all zero).
template <class T>
struct PerSampleGradients {
  Shape param_shape;                  // the parameter's shape
  std::size_t batch = 0;              // B, the number of samples
  bool sparse = false;                // rows kept, not dense: a parameter used by gathers only
  ArrayT<T> dense;                    // (B, ...param_shape) unless sparse
  std::vector<std::size_t> offsets;   // sparse, (B + 1): sample i holds rows [offsets[i], offsets[i + 1])
  std::vector<std::int32_t> row_ids;  // sparse, (R): the table row of each stored row
  std::vector<T> rows;                // sparse, (R, p): G_i restricted to its rows
  std::vector<T> sq_norms;            // (B) when filled: ||G_i||^2, taken as each G_i was built

  /// ||G_i||^2: (B).
  ArrayT<T> norms_squared() const;
  /// sum_i c_i G_i, c: (B); parameter shape.
  ArrayT<T> weighted_sum(const ArrayT<T>& c) const;
  /// (B, ...param_shape).
  ArrayT<T> to_dense() const;
};

/// Refuses a forward pass the rules below cannot make exact for `batch`
/// samples (engine/samples.hpp), before any backward is spent on it: first a
/// use of a parameter whose input does not hold the samples on axis 0, naming
/// the parameter and the op (every rule below also refuses such a use); then
/// `losses` that are not one per sample, each of its own sample only (a model
/// that mixes samples after its last parametric op).
template <class T>
void check_per_sample_tape(const TapeT<T>& tape, const TensorT<T>& losses, std::size_t batch);
/// The second half of that check alone.
template <class T>
void check_per_sample_losses(const TensorT<T>& losses, std::size_t batch);

/// ||G_i||^2 for one parameter: (B).
template <class T>
ArrayT<T> per_sample_norms_squared(const ParamUses<T>& group, std::size_t batch,
                                   NormMethod method = NormMethod::automatic);
/// G_i for one parameter, kept as compactly as its kind of use allows.
template <class T>
PerSampleGradients<T> materialise_per_sample_gradients(const ParamUses<T>& group, std::size_t batch);
/// G_i for one parameter: (B, ...parameter shape).
template <class T>
ArrayT<T> per_sample_gradients(const ParamUses<T>& group, std::size_t batch);
/// sum_i c_i G_i for one parameter, by book-keeping (one GEMM per use): parameter shape.
template <class T>
ArrayT<T> weighted_gradient_sum(const ParamUses<T>& group, const ArrayT<T>& c);

/// True when a parameter's per-sample gradients G_i (matmul or bias uses) take
/// at most half the memory its uses already hold in activations and
/// cotangents, as a convolution kernel's do over many positions (cnn26k's conv1:
/// 1,024 values per sample against 15,680) and an attention or MLP weight's over
/// a sequence (the transformer's 64 x 64 query weight: 4,096 against 19,200). Building them is then also cheaper
/// than the ghost norm, and sum_i c_i G_i from them avoids reading every use
/// again; the ghost strategy keeps them for that.
template <class T>
bool per_sample_gradients_are_small(const ParamUses<T>& group, std::size_t batch);

/// Whether a (d, p) gradient whose uses hold `steps` rows of activations (d
/// values) and cotangents (p values) per sample takes at most 1/`times` of
/// them: times d p <= steps (d + p).
inline bool gradient_at_most(std::size_t times, std::size_t d, std::size_t p, std::size_t steps) {
  return times * d * p <= steps * (d + p);
}
/// The rule of per_sample_gradients_are_small: at most half
/// (EXPERIMENTS.md, "Which per-sample gradients ghost keeps").
inline bool gradient_is_small(std::size_t d, std::size_t p, std::size_t steps) { return gradient_at_most(2, d, p, steps); }

/// The method `automatic` picks for this parameter (for benchmarks and tests).
template <class T>
NormMethod cheaper_norm_method(const ParamUses<T>& group);

/// Compiled once, in engine/per_sample.cpp, for float and double.
extern template struct PerSampleGradients<float>;
extern template struct PerSampleGradients<double>;

}  // namespace dpgrad
