// Helpers shared by the op implementations (not installed): broadcasting in
// reverse (unbroadcast) and forward (broadcast_tangent) mode, shape strings,
// and explicit instantiation for float and double.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include <xtensor/xbroadcast.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xstrided_view.hpp>

#include "engine/op.hpp"
#include "engine/parallel.hpp"
#include "engine/simd.hpp"

namespace dpgrad::detail {

using dpgrad::shape_str;

/// The shapes of an op's inputs (for the per-sample axis rules).
template <class T>
std::vector<Shape> shapes_of(Values<T> x) {
  std::vector<Shape> r;
  r.reserve(x.size());
  for (const auto* a : x) r.push_back(shape_of(*a));
  return r;
}

/// Rows of the first input, none of the others' (weights, biases): a
/// parametric op's output rows are its input's; weights that hold samples mix them.
template <class T>
Samples rows_of_first(std::span<const Samples> in, Values<T> x) {
  for (std::size_t i = 1; i < in.size(); ++i)
    if (in[i].kind == Samples::Kind::mixed) return in[i];
    else if (!in[i].is_none())
      return Samples::mixed(MixedBy::What::product, "with a weight (input " + std::to_string(i) +
                                                        ") that holds samples (" + in[i].str() + ")");
  const Shape s = shape_of(*x[0]);
  return samples_rowwise(in.first(1), std::span<const Shape>(&s, 1));
}

/// The numpy broadcast of two shapes; throws naming `op` when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

/// g summed over the axes marked in `reduced` (one flag per axis of g), as an array of
/// shape `out` (the kept axes' sizes, in order, with or without 1s between them). Plain
/// passes over g in memory order: adjacent axes of one kind are merged, a reduced run
/// before a kept one is a column sum (simd::add_rows, rows in order), and a trailing
/// reduced run is one simd::sum.
template <class T>
ArrayT<T> sum_axes(const ArrayT<T>& g, const std::vector<bool>& reduced, const Shape& out) {
  struct Run {
    std::size_t len;
    bool reduced;
    std::size_t src = 1, dst = 1;  // strides in g and in the result
  };
  std::vector<Run> runs;
  const Shape gs = shape_of(g);
  for (std::size_t i = 0; i < gs.size(); ++i) {
    if (gs[i] == 1) continue;
    if (!runs.empty() && runs.back().reduced == reduced[i]) runs.back().len *= gs[i];
    else runs.push_back({gs[i], bool(reduced[i])});
  }
  ArrayT<T> r = ArrayT<T>::from_shape(out);
  std::fill(r.begin(), r.end(), T(0));
  if (g.size() == 0) return r;
  if (runs.empty()) {  // every axis has length 1
    r.data()[0] = g.data()[0];
    return r;
  }
  for (std::size_t k = runs.size() - 1, s = 1, d = 1; k + 1 > 0; --k) {
    runs[k].src = s;
    runs[k].dst = d;
    s *= runs[k].len;
    if (!runs[k].reduced) d *= runs[k].len;
  }
  const std::size_t m = runs.size();
  auto walk = [&](auto&& self, std::size_t k, const T* src, T* dst) -> void {
    const Run& u = runs[k];
    if (k + 1 == m) {  // the last run: contiguous
      if (u.reduced) dst[0] += simd::sum(src, u.len);
      else simd::add_rows(src, 1, u.len, dst);
      return;
    }
    if (u.reduced && k + 2 == m) {  // reduced rows of one kept run: column sums
      simd::add_rows(src, u.len, runs[k + 1].len, dst);
      return;
    }
    for (std::size_t i = 0; i < u.len; ++i) self(self, k + 1, src + i * u.src, u.reduced ? dst : dst + i * u.dst);
  };
  walk(walk, 0, g.data(), r.data());
  return r;
}

/// Sums g (broadcast shape) down to `target` (the reverse of broadcasting).
template <class T>
ArrayT<T> unbroadcast(const ArrayT<T>& g, const Shape& target) {
  Shape gs = shape_of(g);
  if (gs == target) return g;
  std::size_t lead = gs.size() - target.size();
  std::vector<bool> reduced(gs.size());
  for (std::size_t i = 0; i < gs.size(); ++i) reduced[i] = i < lead || (target[i - lead] == 1 && gs[i] != 1);
  return sum_axes(g, reduced, target);
}

/// `x` broadcast to `shape` as a contiguous array (a copy only when needed).
/// Plain loops: the innermost run of axes that x does not broadcast is copied
/// whole, and a broadcast innermost axis repeats one value (an LSTM's (B, 1)
/// padding mask against (B, H) states).
template <class T>
ArrayT<T> expand(const ArrayT<T>& x, const Shape& shape) {
  Shape xs = shape_of(x);
  if (xs == shape) return x;
  const std::size_t nd = shape.size(), lead = nd - xs.size();
  std::vector<std::size_t> stride(nd, 0);  // x's stride along each output axis, 0 where broadcast
  for (std::size_t i = nd, s = 1; i-- > lead;) {
    const std::size_t len = xs[i - lead];
    stride[i] = len == 1 ? 0 : s;
    s *= len;
  }
  ArrayT<T> r = ArrayT<T>::from_shape(shape);
  if (r.size() == 0) return r;
  // the output as (outer index, inner run): the run is either the trailing
  // broadcast axes (one value repeated) or the trailing axes x has whole (a copy)
  std::size_t repeat = 1, inner = 1, axis = nd;
  while (axis > 0 && stride[axis - 1] == 0) repeat *= shape[--axis];
  if (repeat == 1)
    while (axis > 0 && stride[axis - 1] == inner && shape[axis - 1] != 1) inner *= shape[--axis];
  const std::size_t run = repeat * inner;
  const T* src = x.data();
  T* dst = r.data();
  std::vector<std::size_t> idx(axis, 0);
  for (std::size_t o = 0, outer = r.size() / run; o < outer; ++o, dst += run) {
    std::size_t off = 0;
    for (std::size_t i = 0; i < axis; ++i) off += idx[i] * stride[i];
    if (repeat > 1) std::fill_n(dst, repeat, src[off]);
    else std::copy_n(src + off, inner, dst);
    for (std::size_t i = axis; i-- > 0;)  // next outer index
      if (++idx[i] < shape[i]) break;
      else idx[i] = 0;
  }
  return r;
}

/// Tangents x_dot (k, ...xs) broadcast to (k, ...out): a new leading axis stays in front.
template <class T>
ArrayT<T> broadcast_tangent(const ArrayT<T>& x_dot, const Shape& out) {
  Shape xs(x_dot.shape().begin() + 1, x_dot.shape().end());
  if (xs == out) return x_dot;
  std::size_t k = x_dot.shape()[0];
  Shape padded{k};
  for (std::size_t i = xs.size(); i < out.size(); ++i) padded.push_back(1);
  padded.insert(padded.end(), xs.begin(), xs.end());
  Shape full{k};
  full.insert(full.end(), out.begin(), out.end());
  auto v = xt::reshape_view(x_dot, padded);
  return xt::broadcast(v, full);
}

/// Shape (k, ...s).
inline Shape with_k(std::size_t k, const Shape& s) {
  Shape r{k};
  r.insert(r.end(), s.begin(), s.end());
  return r;
}

/// A row-major shape seen as (outer, len, inner) around one axis.
struct AxisSplit {
  std::size_t outer = 1, len = 1, inner = 1;
};
inline AxisSplit split_at(const Shape& s, std::size_t axis) {
  AxisSplit r;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i < axis) r.outer *= s[i];
    else if (i == axis) r.len = s[i];
    else r.inner *= s[i];
  }
  return r;
}

/// dst[o, db + j, i] = (or +=) src[o, sb + j, i] for j < n: block copies along an
/// axis (xtensor 0.24's strided-view assignment is unreliable with xsimd).
template <bool Add, class T>
void copy_along(const T* src, AxisSplit s, std::size_t sb, T* dst, AxisSplit d, std::size_t db, std::size_t n) {
  std::size_t run = n * s.inner;
  for (std::size_t o = 0; o < s.outer; ++o) {
    const T* from = src + (o * s.len + sb) * s.inner;
    T* to = dst + (o * d.len + db) * d.inner;
    if constexpr (Add)
      for (std::size_t i = 0; i < run; ++i) to[i] += from[i];
    else
      std::copy_n(from, run, to);
  }
}

/// Rows per parallel piece of the bias passes: about 2^14 values each.
inline std::size_t bias_grain(std::size_t p) { return std::max<std::size_t>(1, (std::size_t(1) << 14) / std::max<std::size_t>(1, p)); }

/// Every row of out (m, p) = b.
template <class T>
void fill_rows(const T* b, std::size_t m, std::size_t p, T* out) {
  parallel::for_range(m, bias_grain(p), [&](std::size_t r0, std::size_t r1) {
    for (std::size_t i = r0; i < r1; ++i) std::copy_n(b, p, out + i * p);
  });
}

/// r (k, m, p) += b_dot_j (k, p) on every row of tangent j: a bias's jvp.
template <class T>
void add_bias_tangents(const T* b_dot, std::size_t k, std::size_t m, std::size_t p, T* r) {
  for (std::size_t j = 0; j < k; ++j) {
    const T* bp = b_dot + j * p;
    for (std::size_t i = 0; i < m; ++i, r += p)
      for (std::size_t l = 0; l < p; ++l) r[l] += bp[l];
  }
}

/// g (p) += the column sums of r (m, p), in parallel pieces of rows.
template <class T>
void add_column_sums(const T* r, std::size_t m, std::size_t p, T* g) {
  parallel::sum_pieces(m, bias_grain(p), p, g, [&](std::size_t r0, std::size_t r1, T* acc) {
    simd::add_rows(r + r0 * p, r1 - r0, p, acc);  // the CPU's widest vectors (engine/simd.hpp)
  });
}

}  // namespace dpgrad::detail
