// Reference implementations of the fused ops (docs/fused-ops.md): the
// compositions of elementary ops that attention and layer_norm replaced, as
// layers/attention.cpp and layers/norm.cpp built them. Tests hold the fused ops
// and the transformer to these.
#pragma once

#include <cmath>

#include "engine/ops.hpp"

namespace dpgrad::test {

/// The attention of layers/attention.cpp before the fused op: heads split by
/// reshape and transpose, scores by a batched matmul, scale, masked_fill with
/// -1e9, softmax, the weighted values, the heads merged again.
template <class T>
inline TensorT<T> reference_attention(const TensorT<T>& q, const TensorT<T>& k, const TensorT<T>& v, std::size_t heads,
                               const ArrayT<T>& mask) {
  const std::size_t b = q.shape()[0], lq = q.shape()[1], lk = k.shape()[1];
  const std::size_t dk = q.shape()[2] / heads, dv = v.shape()[2] / heads;
  auto split = [&](const TensorT<T>& t, std::size_t len, std::size_t w) {
    return transpose(reshape(t, {b, len, heads, w}), {0, 2, 1, 3});
  };
  TensorT<T> scores = scale(matmul(split(q, lq, dk), split(k, lk, dk), true), T(1.0 / std::sqrt(double(dk))));
  if (mask.dimension() > 0) {
    ArrayT<T> m = mask;
    m.reshape({b, std::size_t(1), std::size_t(1), lk});
    scores = masked_fill(scores, m, T(-1e9));
  }
  const TensorT<T> mixed = matmul(softmax(scores, 3), split(v, lk, dv));  // (B, heads, Lq, dv)
  return reshape(transpose(mixed, {0, 2, 1, 3}), {b, lq, heads * dv});
}

/// LayerNorm as layers/norm.cpp composed it: normalise, then * gain + shift.
template <class T>
inline TensorT<T> reference_layer_norm(const TensorT<T>& x, const TensorT<T>& gain, const TensorT<T>& shift, double eps) {
  const std::size_t last = x.dim() - 1;
  const TensorT<T> centred = sub(x, mean(x, {last}, true));
  const TensorT<T> var = mean(mul(centred, centred), {last}, true);
  TensorT<T> y = mul(centred, rsqrt(add_scalar(var, T(eps))));
  if (gain.defined()) y = add(mul(y, gain), shift);
  return y;
}

}  // namespace dpgrad::test
