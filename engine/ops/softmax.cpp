// Reductions along one axis that keep their argument's structure: softmax and
// log-softmax (fused, with the maximum subtracted, so that large inputs do not
// overflow) and the maximum (its derivative taken at the first maximal
// element). Every array is seen as (outer, n, inner) around the axis.
#include <cmath>
#include <limits>

#include "engine/ops.hpp"
#include "engine/ops/common.hpp"

namespace dpgrad {

namespace {

struct AxisView {
  std::size_t outer = 1, n = 1, inner = 1;
  AxisView(const Shape& s, std::size_t axis, const char* op) {
    if (axis >= s.size())
      throw std::invalid_argument(std::string(op) + ": axis " + std::to_string(axis) + " of a shape " +
                                  shape_str(s) + " with " + std::to_string(s.size()) + " axes");
    for (std::size_t i = 0; i < axis; ++i) outer *= s[i];
    n = s[axis];
    for (std::size_t i = axis + 1; i < s.size(); ++i) inner *= s[i];
  }
  /// Calls f(base, stride) for every line along the axis, lines in parallel.
  template <class F>
  void for_lines(F&& f) const {
    parallel::for_range(outer * inner, 64, [&](std::size_t l0, std::size_t l1) {
      for (std::size_t l = l0; l < l1; ++l) f((l / inner) * n * inner + l % inner, inner);
    });
  }
};

/// softmax (log = false) or log-softmax (log = true) along `axis`.
template <class T>
struct SoftmaxOp final : Op<T> {
  std::size_t axis;
  bool log;
  SoftmaxOp(std::size_t a, bool l) : axis(a), log(l) {}
  const char* name() const override { return log ? "log_softmax" : "softmax"; }
  Samples samples(std::span<const Samples> in, Values<T>, const ArrayT<T>&) const override {
    // along the samples' axis it mixes them (unless there is only one)
    return in[0].on_axis(axis) && in[0].count != 1 ? Samples::mixed() : in[0];
  }
  ArrayT<T> forward(Values<T> x) override {
    const ArrayT<T>& a = *x[0];
    const AxisView v(shape_of(a), axis, name());
    ArrayT<T> r = ArrayT<T>::from_shape(a.shape());
    const T* pa = a.data();
    T* pr = r.data();
    v.for_lines([&](std::size_t base, std::size_t s) {
      T m = -std::numeric_limits<T>::infinity();
      for (std::size_t i = 0; i < v.n; ++i) m = std::max(m, pa[base + i * s]);
      T total = 0;
      for (std::size_t i = 0; i < v.n; ++i) total += std::exp(pa[base + i * s] - m);
      const T log_total = std::log(total);
      for (std::size_t i = 0; i < v.n; ++i) {
        const T z = pa[base + i * s] - m;
        pr[base + i * s] = log ? z - log_total : std::exp(z - log_total);
      }
    });
    return r;
  }
  /// softmax: dx = y (g - sum(g y)); log-softmax: dx = g - softmax(x) sum(g).
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>& out, Slots<T> dx) override {
    if (!dx[0]) return;
    const AxisView v(shape_of(out), axis, name());
    bool fresh;
    ArrayT<T>& g = dx[0].buffer(fresh);
    T* pg = g.data();
    const T *pd = dout.data(), *py = out.data();
    v.for_lines([&](std::size_t base, std::size_t s) {
      T dot = 0;
      for (std::size_t i = 0; i < v.n; ++i)
        dot += log ? pd[base + i * s] : pd[base + i * s] * py[base + i * s];
      for (std::size_t i = 0; i < v.n; ++i) {
        const std::size_t e = base + i * s;
        const T val = log ? pd[e] - std::exp(py[e]) * dot : py[e] * (pd[e] - dot);
        pg[e] = fresh ? val : pg[e] + val;
      }
    });
  }
  /// softmax: y (t - sum(t y)); log-softmax: t - sum(softmax(x) t).
  ArrayT<T> jvp(Values<T>, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    const AxisView v(shape_of(out), axis, name());
    const std::size_t n = out.size();
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    const T* py = out.data();
    for (std::size_t j = 0; j < k; ++j) {
      const T* pt = dot[0]->data() + j * n;
      T* pr = r.data() + j * n;
      v.for_lines([&](std::size_t base, std::size_t s) {
        T sum = 0;
        for (std::size_t i = 0; i < v.n; ++i) {
          const std::size_t e = base + i * s;
          sum += (log ? std::exp(py[e]) : py[e]) * pt[e];
        }
        for (std::size_t i = 0; i < v.n; ++i) {
          const std::size_t e = base + i * s;
          pr[e] = log ? pt[e] - sum : py[e] * (pt[e] - sum);
        }
      });
    }
    return r;
  }
};

/// The maximum along `axis`; the first maximal element carries the derivative.
template <class T>
struct MaxOp final : Op<T> {
  std::size_t axis;
  bool keepdims;
  std::vector<std::size_t> arg;  // per line: the flat index of its first maximum
  MaxOp(std::size_t a, bool k) : axis(a), keepdims(k) {}
  const char* name() const override { return "max"; }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    return samples_reduced(in[0], {axis}, keepdims, x[0]->dimension());
  }
  Shape out_shape(const Shape& s) const {
    Shape r = s;
    if (keepdims) r[axis] = 1;
    else r.erase(r.begin() + std::ptrdiff_t(axis));
    return r;
  }
  ArrayT<T> forward(Values<T> x) override {
    const ArrayT<T>& a = *x[0];
    const Shape s = shape_of(a);
    const AxisView v(s, axis, name());
    if (v.n == 0) throw std::invalid_argument("max: axis " + std::to_string(axis) + " of " + shape_str(s) + " is empty");
    ArrayT<T> r = ArrayT<T>::from_shape(out_shape(s));
    arg.assign(v.outer * v.inner, 0);
    const T* pa = a.data();
    for (std::size_t l = 0; l < v.outer * v.inner; ++l) {
      const std::size_t base = (l / v.inner) * v.n * v.inner + l % v.inner;
      std::size_t best = base;
      for (std::size_t i = 1; i < v.n; ++i)
        if (pa[base + i * v.inner] > pa[best]) best = base + i * v.inner;
      arg[l] = best;
      r.data()[l] = pa[best];
    }
    return r;
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>&, Slots<T> dx) override {
    if (!dx[0]) return;
    bool fresh;
    ArrayT<T>& g = dx[0].buffer(fresh);
    if (fresh) std::fill(g.begin(), g.end(), T(0));
    (void)x;
    for (std::size_t l = 0; l < arg.size(); ++l) g.data()[arg[l]] += dout.data()[l];
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    const std::size_t n_in = x[0]->size(), n_out = out.size();
    for (std::size_t j = 0; j < k; ++j)
      for (std::size_t l = 0; l < n_out; ++l) r.data()[j * n_out + l] = dot[0]->data()[j * n_in + arg[l]];
    return r;
  }
};

}  // namespace

template <class T>
TensorT<T> softmax(const TensorT<T>& x, std::size_t axis) {
  return apply<T>(std::make_unique<SoftmaxOp<T>>(axis, false), {x});
}
template <class T>
TensorT<T> log_softmax(const TensorT<T>& x, std::size_t axis) {
  return apply<T>(std::make_unique<SoftmaxOp<T>>(axis, true), {x});
}
template <class T>
TensorT<T> max(const TensorT<T>& x, std::size_t axis, bool keepdims) {
  return apply<T>(std::make_unique<MaxOp<T>>(axis, keepdims), {x});
}

#define DPGRAD_INSTANTIATE(T)                                        \
  template TensorT<T> softmax(const TensorT<T>&, std::size_t);       \
  template TensorT<T> log_softmax(const TensorT<T>&, std::size_t);   \
  template TensorT<T> max(const TensorT<T>&, std::size_t, bool);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
