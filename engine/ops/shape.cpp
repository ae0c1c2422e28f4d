// Shape primitives: reshape, transpose, slice, concat and pad (stack is a composite).
// All are linear, so each jvp applies the op itself to the tangents (shifted by
// the leading k axis) and each vjp applies its adjoint.
#include "engine/ops.hpp"
#include "engine/ops/common.hpp"

namespace dpgrad {
namespace {
using detail::shape_str;
using detail::with_k;

template <class T>
struct ReshapeOp final : Op<T> {
  Shape to;
  const char* name() const override { return "reshape"; }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    return samples_reshaped(in[0], shape_of(*x[0]), to);
  }
  ArrayT<T> forward(Values<T> x) override {
    if (numel(to) != x[0]->size())
      throw std::invalid_argument("reshape: cannot reshape " + shape_str(shape_of(*x[0])) + " to " + shape_str(to));
    ArrayT<T> r = *x[0];
    r.reshape(to);
    return r;
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>&, Slots<T> dx) override {
    if (!dx[0]) return;  // same elements in the same order: a flat copy or add
    bool fresh;
    ArrayT<T>& g = dx[0].buffer(fresh);
    if (fresh) std::copy_n(dout.data(), dout.size(), g.data());
    else {
      T* gp = g.data();
      const T* dp = dout.data();
      for (std::size_t i = 0, n = dout.size(); i < n; ++i) gp[i] += dp[i];
    }
  }
  ArrayT<T> jvp(Values<T>, Tangents<T> d, const ArrayT<T>&, std::size_t k) override {
    ArrayT<T> r = *d[0];
    r.reshape(with_k(k, to));
    return r;
  }
};

template <class T>
struct TransposeOp final : Op<T> {
  std::vector<std::size_t> perm;
  const char* name() const override { return "transpose"; }
  Samples samples(std::span<const Samples> in, Values<T>, const ArrayT<T>&) const override {
    return samples_transposed(in[0], perm);
  }
  ArrayT<T> forward(Values<T> x) override {
    std::vector<std::size_t> sorted = perm;
    std::sort(sorted.begin(), sorted.end());
    bool ok = perm.size() == x[0]->dimension();
    for (std::size_t i = 0; ok && i < sorted.size(); ++i) ok = sorted[i] == i;
    if (!ok) throw std::invalid_argument("transpose: not a permutation of the axes of " + shape_str(shape_of(*x[0])));
    return xt::transpose(*x[0], perm);
  }
  void vjp(const ArrayT<T>& dout, Values<T>, const ArrayT<T>&, Slots<T> dx) override {
    if (!dx[0]) return;
    std::vector<std::size_t> inv(perm.size());
    for (std::size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = i;
    dx[0].add(xt::transpose(dout, inv));
  }
  ArrayT<T> jvp(Values<T>, Tangents<T> d, const ArrayT<T>&, std::size_t) override {
    std::vector<std::size_t> p{0};
    for (auto a : perm) p.push_back(a + 1);
    return xt::transpose(*d[0], p);
  }
};

using detail::copy_along;
using detail::split_at;

template <class T>
struct SliceOp final : Op<T> {
  std::size_t axis = 0, begin = 0, end = 0;
  const char* name() const override { return "slice"; }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    return samples_sliced(in[0], shape_of(*x[0]), axis, begin, end);
  }
  Shape sliced(const Shape& xs) const {
    Shape r = xs;
    r[axis] = end - begin;
    return r;
  }
  ArrayT<T> forward(Values<T> x) override {
    Shape xs = shape_of(*x[0]);
    if (axis >= xs.size() || begin > end || end > xs[axis])
      throw std::invalid_argument("slice: [" + std::to_string(begin) + ", " + std::to_string(end) + ") on axis " +
                                  std::to_string(axis) + " of shape " + shape_str(xs));
    Shape os = sliced(xs);
    ArrayT<T> r = ArrayT<T>::from_shape(os);
    copy_along<false>(x[0]->data(), split_at(xs, axis), begin, r.data(), split_at(os, axis), 0, end - begin);
    return r;
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>&, Slots<T> dx) override {
    if (!dx[0]) return;
    bool fresh;
    ArrayT<T>& g = dx[0].buffer(fresh);
    if (fresh) g.fill(T(0));
    Shape xs = shape_of(*x[0]);
    copy_along<true>(dout.data(), split_at(shape_of(dout), axis), 0, g.data(), split_at(xs, axis), begin, end - begin);
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> d, const ArrayT<T>& out, std::size_t k) override {
    Shape ts = shape_of(*d[0]), os = with_k(k, shape_of(out));
    ArrayT<T> r = ArrayT<T>::from_shape(os);
    copy_along<false>(d[0]->data(), split_at(ts, axis + 1), begin, r.data(), split_at(os, axis + 1), 0, end - begin);
    return r;
  }
};

template <class T>
struct ConcatOp final : Op<T> {
  std::size_t axis = 0;
  std::vector<std::size_t> offsets;  // start of each input along axis
  const char* name() const override { return "concat"; }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    const auto shapes = detail::shapes_of(x);
    return samples_concatenated(in, shapes, axis);
  }
  ArrayT<T> forward(Values<T> x) override {
    if (x.empty()) throw std::invalid_argument("concat: no inputs");
    Shape s = shape_of(*x[0]);
    if (axis >= s.size()) throw std::invalid_argument("concat: axis " + std::to_string(axis) + " out of range for " + shape_str(s));
    std::size_t total = 0;
    for (auto* a : x) {
      Shape as = shape_of(*a);
      Shape s1 = s, as1 = as;
      if (as.size() == s.size()) s1[axis] = as1[axis] = 0;
      if (s1 != as1) throw std::invalid_argument("concat: shapes " + shape_str(s) + " and " + shape_str(as) + " differ off axis " + std::to_string(axis));
      offsets.push_back(total);
      total += as[axis];
    }
    s[axis] = total;
    ArrayT<T> r = ArrayT<T>::from_shape(s);
    for (std::size_t i = 0; i < x.size(); ++i) {
      Shape xs = shape_of(*x[i]);
      copy_along<false>(x[i]->data(), split_at(xs, axis), 0, r.data(), split_at(s, axis), offsets[i], xs[axis]);
    }
    return r;
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>&, Slots<T> dx) override {
    Shape os = shape_of(dout);
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (!dx[i]) continue;
      bool fresh;
      ArrayT<T>& g = dx[i].buffer(fresh);
      if (fresh) g.fill(T(0));
      Shape xs = shape_of(*x[i]);
      copy_along<true>(dout.data(), split_at(os, axis), offsets[i], g.data(), split_at(xs, axis), 0, xs[axis]);
    }
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> d, const ArrayT<T>& out, std::size_t k) override {
    Shape os = with_k(k, shape_of(out));
    ArrayT<T> r = xt::zeros<T>(os);
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (!d[i]) continue;
      Shape ts = shape_of(*d[i]);
      copy_along<false>(d[i]->data(), split_at(ts, axis + 1), 0, r.data(), split_at(os, axis + 1), offsets[i], ts[axis + 1]);
    }
    return r;
  }
};

/// dst[i + offset] = src[i] for every index i of src (shape `from`), dst of shape
/// `to` (every axis at least as long as from's plus the offset): the interior
/// of a padded array, copied one innermost run at a time. Add: += instead.
template <bool Add, class T>
void copy_into(const T* src, const Shape& from, T* dst, const Shape& to, const std::vector<std::size_t>& offset) {
  const std::size_t nd = from.size();
  if (numel(from) == 0) return;
  if (nd == 0) {
    if constexpr (Add) dst[0] += src[0];
    else dst[0] = src[0];
    return;
  }
  std::vector<std::size_t> stride(nd, 1);
  for (std::size_t i = nd - 1; i-- > 0;) stride[i] = stride[i + 1] * to[i + 1];
  std::size_t base = 0;
  for (std::size_t i = 0; i < nd; ++i) base += offset[i] * stride[i];
  const std::size_t run = from[nd - 1], rows = numel(from) / run;
  std::vector<std::size_t> idx(nd - 1, 0);
  for (std::size_t r = 0; r < rows; ++r, src += run) {
    std::size_t o = base;
    for (std::size_t i = 0; i + 1 < nd; ++i) o += idx[i] * stride[i];
    if constexpr (Add)
      for (std::size_t l = 0; l < run; ++l) dst[o + l] += src[l];
    else
      std::copy_n(src, run, dst + o);
    for (std::size_t i = nd - 1; i-- > 0;)
      if (++idx[i] < from[i]) break;
      else idx[i] = 0;
  }
}

/// The reverse: dst (shape `to`) = src[i + offset] (src of shape `from`), the
/// interior read back out.
template <class T>
void copy_out_of(const T* src, const Shape& from, T* dst, const Shape& to, const std::vector<std::size_t>& offset) {
  const std::size_t nd = to.size();
  if (numel(to) == 0) return;
  if (nd == 0) {
    dst[0] = src[0];
    return;
  }
  std::vector<std::size_t> stride(nd, 1);
  for (std::size_t i = nd - 1; i-- > 0;) stride[i] = stride[i + 1] * from[i + 1];
  std::size_t base = 0;
  for (std::size_t i = 0; i < nd; ++i) base += offset[i] * stride[i];
  const std::size_t run = to[nd - 1], rows = numel(to) / run;
  std::vector<std::size_t> idx(nd - 1, 0);
  for (std::size_t r = 0; r < rows; ++r, dst += run) {
    std::size_t o = base;
    for (std::size_t i = 0; i + 1 < nd; ++i) o += idx[i] * stride[i];
    std::copy_n(src + o, run, dst);
    for (std::size_t i = nd - 1; i-- > 0;)
      if (++idx[i] < to[i]) break;
      else idx[i] = 0;
  }
}

template <class T>
struct PadOp final : Op<T> {
  std::vector<std::size_t> before, after;
  T value = T(0);
  const char* name() const override { return "pad"; }
  /// Padding along the per-sample axis adds elements of no sample between the blocks: mixed.
  Samples samples(std::span<const Samples> in, Values<T>, const ArrayT<T>&) const override {
    const Samples& s = in[0];
    if (s.kind == Samples::Kind::axis && (before[s.axis] != 0 || after[s.axis] != 0)) return Samples::mixed();
    if (s.kind == Samples::Kind::subset && (before[s.axis] != 0 || after[s.axis] != 0)) return Samples::mixed();
    return s;
  }
  Shape padded(const Shape& xs) const {
    Shape r = xs;
    for (std::size_t i = 0; i < r.size(); ++i) r[i] += before[i] + after[i];
    return r;
  }
  ArrayT<T> forward(Values<T> x) override {
    const Shape xs = shape_of(*x[0]);
    if (before.size() != xs.size() || after.size() != xs.size())
      throw std::invalid_argument("pad: " + std::to_string(before.size()) + " and " + std::to_string(after.size()) +
                                  " pads for x " + shape_str(xs));
    ArrayT<T> r = ArrayT<T>::from_shape(padded(xs));
    r.fill(value);
    copy_into<false>(x[0]->data(), xs, r.data(), shape_of(r), before);
    return r;
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>&, Slots<T> dx) override {
    if (!dx[0]) return;
    ArrayT<T> g = ArrayT<T>::from_shape(x[0]->shape());
    copy_out_of(dout.data(), shape_of(dout), g.data(), shape_of(g), before);
    dx[0].add(g);
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> d, const ArrayT<T>& out, std::size_t k) override {
    ArrayT<T> r = xt::zeros<T>(with_k(k, shape_of(out)));
    std::vector<std::size_t> off{0};
    off.insert(off.end(), before.begin(), before.end());
    copy_into<false>(d[0]->data(), shape_of(*d[0]), r.data(), shape_of(r), off);
    return r;
  }
};

}  // namespace

template <class T>
TensorT<T> pad(const TensorT<T>& x, std::vector<std::size_t> before, std::vector<std::size_t> after, T value) {
  auto op = std::make_unique<PadOp<T>>();
  op->before = std::move(before);
  op->after = std::move(after);
  op->value = value;
  return apply<T>(std::move(op), {x});
}

template <class T>
TensorT<T> reshape(const TensorT<T>& x, Shape shape) {
  auto op = std::make_unique<ReshapeOp<T>>();
  op->to = std::move(shape);
  return apply<T>(std::move(op), {x});
}

template <class T>
TensorT<T> transpose(const TensorT<T>& x, std::vector<std::size_t> perm) {
  auto op = std::make_unique<TransposeOp<T>>();
  op->perm = std::move(perm);
  return apply<T>(std::move(op), {x});
}

template <class T>
TensorT<T> slice(const TensorT<T>& x, std::size_t axis, std::size_t begin, std::size_t end) {
  auto op = std::make_unique<SliceOp<T>>();
  op->axis = axis;
  op->begin = begin;
  op->end = end;
  return apply<T>(std::move(op), {x});
}

template <class T>
TensorT<T> concat(const std::vector<TensorT<T>>& xs, std::size_t axis) {
  auto op = std::make_unique<ConcatOp<T>>();
  op->axis = axis;
  return apply<T>(std::move(op), std::span<const TensorT<T>>(xs));
}

template <class T>
TensorT<T> stack(const std::vector<TensorT<T>>& xs, std::size_t axis) {
  if (xs.empty()) throw std::invalid_argument("stack: no inputs");
  std::vector<TensorT<T>> expanded;
  for (const auto& x : xs) {
    Shape s = x.shape();
    if (axis > s.size()) throw std::invalid_argument("stack: axis " + std::to_string(axis) + " out of range for " + shape_str(s));
    s.insert(s.begin() + std::ptrdiff_t(axis), 1);
    expanded.push_back(reshape(x, s));
  }
  return concat(expanded, axis);
}

#define DPGRAD_INSTANTIATE(T)                                                          \
  template TensorT<T> reshape(const TensorT<T>&, Shape);                              \
  template TensorT<T> transpose(const TensorT<T>&, std::vector<std::size_t>);         \
  template TensorT<T> slice(const TensorT<T>&, std::size_t, std::size_t, std::size_t); \
  template TensorT<T> concat(const std::vector<TensorT<T>>&, std::size_t);            \
  template TensorT<T> stack(const std::vector<TensorT<T>>&, std::size_t);            \
  template TensorT<T> pad(const TensorT<T>&, std::vector<std::size_t>, std::vector<std::size_t>, T);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
