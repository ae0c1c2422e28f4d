// The primitive ops users compose layers from. Each has a primal, a vjp and a
// jvp (in engine/ops/*.cpp); composites here declare no derivative of their own.
// Arguments follow numpy broadcasting where noted; B is the batch axis.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/tensor.hpp"

namespace dpgrad {

// ---- elementwise (engine/ops/elementwise.cpp) ----
/// a + b, numpy broadcasting.                d/da = 1, d/db = 1
template <class T> TensorT<T> add(const TensorT<T>& a, const TensorT<T>& b);
/// a - b, numpy broadcasting.                d/da = 1, d/db = -1
template <class T> TensorT<T> sub(const TensorT<T>& a, const TensorT<T>& b);
/// a * b, numpy broadcasting.                d/da = b, d/db = a
template <class T> TensorT<T> mul(const TensorT<T>& a, const TensorT<T>& b);
/// a / b, numpy broadcasting.                d/da = 1 / b, d/db = -a / b^2
/// (a parameter used as a divisor has no per-sample rule: the exact strategies refuse it)
template <class T> TensorT<T> div(const TensorT<T>& a, const TensorT<T>& b);
/// c * x.                                    d = c
template <class T> TensorT<T> scale(const TensorT<T>& x, T c);
/// x + c.                                    d = 1
template <class T> TensorT<T> add_scalar(const TensorT<T>& x, T c);
/// max(x, 0).                                d = 1 for x > 0, 0 for x <= 0 (kink at 0: 0)
template <class T> TensorT<T> relu(const TensorT<T>& x);
/// tanh(x).                                  d = 1 - tanh^2
template <class T> TensorT<T> tanh(const TensorT<T>& x);
/// 1 / (1 + e^-x).                           d = s (1 - s)
template <class T> TensorT<T> sigmoid(const TensorT<T>& x);
/// e^x.                                      d = e^x
template <class T> TensorT<T> exp(const TensorT<T>& x);
/// log x (x > 0).                            d = 1 / x
template <class T> TensorT<T> log(const TensorT<T>& x);

// ---- more elementwise maps (engine/ops/elementwise.cpp) ----
/// sqrt(x), x >= 0.                          d = 1 / (2 sqrt x): +inf at 0
template <class T> TensorT<T> sqrt(const TensorT<T>& x);
/// 1 / sqrt(x), x > 0.                       d = -x^(-3/2) / 2
template <class T> TensorT<T> rsqrt(const TensorT<T>& x);
/// x^p for a scalar p (x > 0 unless p is a whole number).   d = p x^(p-1) (0 when p = 0)
template <class T> TensorT<T> pow(const TensorT<T>& x, T p);
/// |x|.                                      d = sign(x); at 0 the subgradient 0
template <class T> TensorT<T> abs(const TensorT<T>& x);
/// GELU, exactly: x Phi(x), Phi the standard normal CDF.   d = Phi(x) + x phi(x)
template <class T> TensorT<T> gelu(const TensorT<T>& x);
/// x for x > 0, slope x otherwise.          d = 1 for x > 0, slope for x <= 0 (kink at 0: slope)
template <class T> TensorT<T> leaky_relu(const TensorT<T>& x, T slope);
/// The error function erf(x).                d = 2 / sqrt(pi) e^(-x^2)
template <class T> TensorT<T> erf(const TensorT<T>& x);

// ---- along one axis (engine/ops/softmax.cpp) ----
/// exp(x) / sum exp(x) along `axis`, with the maximum subtracted first.
///                                           vjp: y (g - sum(g y)); along the samples' axis it mixes them
template <class T> TensorT<T> softmax(const TensorT<T>& x, std::size_t axis);
/// x - log sum exp(x) along `axis`, stable.  vjp: g - softmax(x) sum(g)
template <class T> TensorT<T> log_softmax(const TensorT<T>& x, std::size_t axis);
/// The maximum along `axis`. The derivative is taken at the first maximal
/// element along the axis (ties: the lowest index gets all of it).
template <class T> TensorT<T> max(const TensorT<T>& x, std::size_t axis, bool keepdims = false);

// ---- products of activations, masks (engine/ops/batched.cpp) ----
/// a (..., m, k) x b (..., k, n) -> (..., m, n), the leading axes equal (one
/// product per leading index); with transpose_b, b is (..., n, k) and b^T is used.
///                                           da = g b^T, db = a^T g
template <class T> TensorT<T> matmul(const TensorT<T>& a, const TensorT<T>& b, bool transpose_b = false);
/// x where mask == 0, `value` where mask != 0; mask broadcasts to x's shape and
/// is a constant. No gradient or tangent reaches x where it is masked.
template <class T> TensorT<T> masked_fill(const TensorT<T>& x, const ArrayT<T>& mask, T value);

/// |re + i im| = sqrt(re^2 + im^2), re and im of one shape (engine/ops/modulus.cpp).
///                                           d/d re = re / |z|, d/d im = im / |z|; 0 at z = 0
template <class T> TensorT<T> complex_abs(const TensorT<T>& re, const TensorT<T>& im);

/// a + b, a - b and a * b: add, sub and mul above (numpy broadcasting).
template <class T> TensorT<T> operator+(const TensorT<T>& a, const TensorT<T>& b) { return add(a, b); }
template <class T> TensorT<T> operator-(const TensorT<T>& a, const TensorT<T>& b) { return sub(a, b); }
template <class T> TensorT<T> operator*(const TensorT<T>& a, const TensorT<T>& b) { return mul(a, b); }

// ---- reductions (engine/ops/reduce.cpp) ----
/// Sum over `axes` (all axes when empty).    d = 1 broadcast back
template <class T> TensorT<T> sum(const TensorT<T>& x, std::vector<std::size_t> axes = {}, bool keepdims = false);
/// Mean over `axes` (all when empty): sum scaled by 1/count.
template <class T> TensorT<T> mean(const TensorT<T>& x, std::vector<std::size_t> axes = {}, bool keepdims = false);

// ---- shape (engine/ops/shape.cpp) ----
/// Same elements, new shape (row-major order).
template <class T> TensorT<T> reshape(const TensorT<T>& x, Shape shape);
/// Axes permuted: out.shape[i] = x.shape[perm[i]].
template <class T> TensorT<T> transpose(const TensorT<T>& x, std::vector<std::size_t> perm);
/// x[..., begin:end, ...] along `axis`.
template <class T> TensorT<T> slice(const TensorT<T>& x, std::size_t axis, std::size_t begin, std::size_t end);
/// Joins along an existing axis; shapes agree elsewhere.
template <class T> TensorT<T> concat(const std::vector<TensorT<T>>& xs, std::size_t axis);
/// Joins along a new axis (a composite of reshape and concat).
template <class T> TensorT<T> stack(const std::vector<TensorT<T>>& xs, std::size_t axis);
/// x with before[i] and after[i] elements of `value` added around axis i.
///                                           vjp: dout's interior; jvp: the tangents padded with 0
template <class T>
TensorT<T> pad(const TensorT<T>& x, std::vector<std::size_t> before, std::vector<std::size_t> after, T value = T(0));

// ---- fused layers (engine/ops/attention.cpp, engine/ops/layer_norm.cpp; docs/fused-ops.md) ----
/// Multi-head scaled dot-product attention, one op: q (B, Lq, H dk), k (B, Lk, H dk),
/// v (B, Lk, H dv) -> (B, Lq, H dv), head h reading and writing columns
/// [h dk, (h + 1) dk) in place. Per sample and head, softmax(scale q k^T) v with
/// scale 1 / sqrt(dk) when `scale` is 0; keys where `key_mask` (B, Lk) or (B, 1, 1, Lk) (0-d, the default: none)
/// is nonzero get weight 0 (all of a sample's keys masked: every weight 1 / Lk,
/// as a masked_fill with a large negative value gives). Keeps only each score
/// row's log-sum-exp and recomputes the weights in blocks of keys.
///   with P = softmax(s): dv = P^T dout, ds = P (dout v^T - rowsum(dout out)),
///   dq = scale ds k, dk = scale ds^T q (0 through masked scores)
template <class T>
TensorT<T> attention(const TensorT<T>& q, const TensorT<T>& k, const TensorT<T>& v, std::size_t heads,
                     const ArrayT<T>& key_mask = {}, double scale = 0);
/// LayerNorm over the last axis: (x - mean) / sqrt(var + eps) * gain + shift, x (..., d),
/// gain and shift (d) or both undefined. Gain and shift are recorded as elementwise
/// parameter uses (docs/per-sample.md).
///   xhat = (x - mean) rstd; dx = rstd (u - mean(u) - xhat mean(u xhat)), u = dy gain
template <class T>
TensorT<T> layer_norm(const TensorT<T>& x, const TensorT<T>& gain, const TensorT<T>& shift, double eps = 1e-5);

// ---- parametric ops (engine/ops/linear.cpp, engine/ops/gather.cpp) ----
/// x W + b: x (B, ..., d), W (d, p), b (p) or undefined -> (B, ..., p). BLAS GEMMs.
/// Records per-sample uses of W and b when the tape asks (engine/tape.hpp).
template <class T> TensorT<T> linear(const TensorT<T>& x, const TensorT<T>& w, const TensorT<T>& b = {});
/// Rows of a table: W (V, p), ids (B, ...) in [0, V) -> (B, ..., p). Positions
/// holding `padding_id` (if >= 0) give zero rows and no gradient.
template <class T>
TensorT<T> gather(const TensorT<T>& w, const ArrayT<std::int32_t>& ids, std::int32_t padding_id = -1);

// ---- recurrent cells (engine/ops/recurrent.cpp) ----
// An LSTM step as three fused elementwise ops instead of a dozen small ones.
// z (B, 4H) holds the gate pre-activations in the order [i f g o].
/// Gate activations a = [sigmoid(z_i), sigmoid(z_f), tanh(z_g), sigmoid(z_o)]: (B, 4H),
/// of z = x + zh, zh (B, 4H) optional (the recurrent term h W_hh; undefined: zero).
///                                           d = a (1 - a) on i, f, o; 1 - a^2 on g
template <class T> TensorT<T> lstm_gates(const TensorT<T>& x, const TensorT<T>& zh = {});
/// Shared by lstm_gates_at ops that are a projection's only readers, each step
/// read by exactly one of them (an LSTM layer's loop): each then writes its
/// step's block of the projection's gradient outright, instead of the first
/// zero-filling the whole gradient and every step adding to it.
class StepBlocks;
std::shared_ptr<StepBlocks> sole_step_readers(std::size_t steps);
/// The same with x = proj[:, t, :] read in place from proj (B, L, 4H).
template <class T> TensorT<T> lstm_gates_at(const TensorT<T>& proj, std::size_t t, const TensorT<T>& zh = {},
                                            std::shared_ptr<StepBlocks> blocks = nullptr);
/// The new cell state a_i a_g + a_f c (B, H), from gates a (B, 4H) and the
/// previous state c (B, H); without c (a zero state) a_i a_g.
template <class T> TensorT<T> lstm_state(const TensorT<T>& a, const TensorT<T>& c = {});
/// The cell output a_o tanh(c) (B, H), from gates a (B, 4H) and the new state c (B, H).
template <class T> TensorT<T> lstm_output(const TensorT<T>& a, const TensorT<T>& c);

// ---- losses (engine/ops/loss.cpp) ----
/// Per-sample softmax cross-entropy: logits (B, C), labels (B) in [0, C) -> (B).
/// d/dz_i = softmax(z_i) - onehot(y_i); computed with the max subtracted.
template <class T> TensorT<T> cross_entropy(const TensorT<T>& logits, const std::vector<std::int32_t>& labels);
/// Batch mean of cross_entropy (an empty batch gives 0).
template <class T> TensorT<T> mean_cross_entropy(const TensorT<T>& logits, const std::vector<std::int32_t>& labels);

/// A constant (no gradient, no tangent): masks, targets.
template <class T> TensorT<T> constant(ArrayT<T> value) { return TensorT<T>(std::move(value), false); }

}  // namespace dpgrad
