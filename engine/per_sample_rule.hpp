// The interface a kind of parameter use implements to give vanilla and ghost
// their per-sample gradients (docs/per-sample.md, "Giving an op a rule"), and
// the helpers the rules share. Each rule lives beside its op:
// engine/ops/linear_rules.cpp (matmul, bias), gather_rules.cpp, conv_rules.cpp.
// Internal to the engine (not installed).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/parallel.hpp"
#include "engine/per_sample.hpp"

namespace dpgrad::detail {

/// Runs f(i0, i1) over pieces of samples on the engine's threads, about four
/// pieces a thread, each claimed by whichever thread is free (samples' lengths and
/// the threads' start differ); each piece keeps its own scratch, and every result
/// is written by the sample's own piece.
template <class F>
inline void for_samples(std::size_t batch, F&& f) {
  parallel::for_each_piece(batch, parallel::grain_for(batch, 4), f);
}

/// Runs f(lo, hi) over ranges of a table's rows [0, rows) on the engine's threads,
/// for scatter-adds into the table: each range adds only to its own rows, in the
/// order a single pass would, so the sums are the same whatever the split.
template <class F>
inline void for_table_rows(std::size_t rows, F&& f) {
  parallel::for_range(rows, 256, f);
}

template <class T>
struct UseView {  // one use seen as per-sample blocks
  const T* a = nullptr;      // (B, Ta, d) or nullptr
  const T* delta = nullptr;  // (B, Ta, p)
  const std::int32_t* ids = nullptr;  // (B, Ta) for gather
  const ParamUse<T>* use = nullptr;   // conv: builds G_i itself
  std::size_t steps = 0;     // Ta
};

/// <x, y> with 16 partial sums, which the compiler keeps in vector registers (one
/// running sum is a chain of dependent adds: 4x slower on 16k floats).
template <class T>
T dot(const T* x, const T* y, std::size_t n) {
  constexpr std::size_t K = 16;
  T part[K] = {};
  std::size_t i = 0;
  for (; i + K <= n; i += K)
    for (std::size_t k = 0; k < K; ++k) part[k] += x[i + k] * y[i + k];
  T s = 0;
  for (; i < n; ++i) s += x[i] * y[i];
  for (std::size_t k = 0; k < K; ++k) s += part[k];
  return s;
}

template <class T>
T sq_norm(const T* x, std::size_t n) {
  return dot(x, x, n);
}

template <class T>
void axpy(std::size_t n, T alpha, const T* x, T* y) {  // y += alpha x
  for (std::size_t j = 0; j < n; ++j) y[j] += alpha * x[j];
}

/// What one kind of parameter use provides. B samples; a use of a parameter of
/// shape (d, p) (bias: (p), d = 1) has per-sample blocks of Ta steps.
template <class T>
class PerSampleRule {
 public:
  virtual ~PerSampleRule() = default;
  /// The use's view (what the rule reads besides delta) and the parameter's d and p.
  virtual void view(const ParamUse<T>& u, const Shape& param, UseView<T>& v, std::size_t& d, std::size_t& p) const = 0;
  /// How norms are cheaper for this parameter: ghost (a Gram of the steps) or
  /// materialising G_i. Rules with only one way return it.
  virtual NormMethod cheaper_norm_method(const ParamUses<T>& g) const { return NormMethod::ghost; }
  /// Whether G_i may be kept dense per sample (false for tables: sparse rows).
  virtual bool dense_gradients() const { return true; }
  /// ||G_i||^2 per sample: (B).
  virtual ArrayT<T> norms_squared(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t d,
                                  std::size_t p, NormMethod method) const = 0;
  /// G_i of sample i, (d p) values, overwritten (rules with dense gradients).
  virtual void gradient(const std::vector<UseView<T>>& vs, std::size_t i, std::size_t batch, std::size_t d,
                        std::size_t p, T* g) const = 0;
  /// out += sum_i c_i G_i over the batch (out: the parameter's shape, zeroed by the caller).
  virtual void weighted_sum(const std::vector<UseView<T>>& vs, const T* c, std::size_t batch, std::size_t d,
                            std::size_t p, T* out) const = 0;
  /// Sparse G_i (tables): fills r's rows, row_ids and offsets.
  virtual void sparse_gradients(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t d, std::size_t p,
                                PerSampleGradients<T>& r) const;
};

template <class T>
const PerSampleRule<T>& matmul_rule();  // engine/ops/linear_rules.cpp
template <class T>
const PerSampleRule<T>& bias_rule();    // engine/ops/linear_rules.cpp
template <class T>
const PerSampleRule<T>& gather_rule();  // engine/ops/gather_rules.cpp
template <class T>
const PerSampleRule<T>& conv_rule();    // engine/ops/conv_rules.cpp
template <class T>
const PerSampleRule<T>& elementwise_rule();  // engine/ops/elementwise_rules.cpp

/// Notes a use of `param` by an elementwise op (y = other * param when
/// `multiplies`, else other + param, or other - param when `negated`) whose
/// output has shape `out` (engine/ops/elementwise_rules.cpp). When other's
/// samples lie on another output axis than 0 (time-major) or interleaved along
/// it, the use keeps x with the samples moved to the front, as linear's does,
/// and `moved` says how the op must move dout (moved.identity: as it is).
template <class T>
ParamUse<T>* record_elementwise_use(TapeT<T>& tape, const std::shared_ptr<Node<T>>& param,
                                    const std::shared_ptr<Node<T>>& other, bool multiplies, bool negated,
                                    const Shape& out, const char* op, SamplesToFront& moved);
/// `a` (shape split as `order` says) made contiguous with its samples in front.
template <class T>
ArrayT<T> samples_in_front(const ArrayT<T>& a, const SamplesToFront& order);
/// What an elementwise use's rule reads as its output gradient: `dout` itself,
/// or a copy with the samples moved to the front as `moved` says.
template <class T>
std::shared_ptr<const ArrayT<T>> moved_output_grad(std::shared_ptr<const ArrayT<T>> dout, const SamplesToFront& moved) {
  return moved.identity ? dout : std::make_shared<const ArrayT<T>>(samples_in_front<T>(*dout, moved));
}

}  // namespace dpgrad::detail
