// Elementwise primitives: broadcasting binary ops (add, sub, mul) and unary
// maps (scale, add_scalar, relu, tanh, sigmoid, exp, log), each with primal,
// vjp and jvp. The kinds differ only in scalar rules; the broadcasting
// machinery is instantiated once per scalar type, which keeps compile time low.
#include "engine/ops.hpp"
#include "engine/ops/common.hpp"

namespace dpgrad {
namespace detail {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  Shape r(std::max(a.size(), b.size()));
  for (std::size_t i = 0; i < r.size(); ++i) {
    std::size_t da = i < r.size() - a.size() ? 1 : a[i - (r.size() - a.size())];
    std::size_t db = i < r.size() - b.size() ? 1 : b[i - (r.size() - b.size())];
    if (da != db && da != 1 && db != 1)
      throw std::invalid_argument(std::string(op) + ": shapes " + shape_str(a) + " and " + shape_str(b) +
                                  " do not broadcast");
    r[i] = da == 1 ? db : da;
  }
  return r;
}

}  // namespace detail

namespace {
using detail::broadcast_tangent;
using detail::unbroadcast;

/// `x` broadcast to `shape` as a contiguous array (a copy only when needed).
template <class T>
ArrayT<T> expand(const ArrayT<T>& x, const Shape& shape) {
  if (shape_of(x) == shape) return x;
  return xt::broadcast(x, shape);
}

enum class Binary { add, sub, mul };

template <class T>
struct BinaryOp final : Op<T> {
  Binary kind;
  Shape out_shape;
  explicit BinaryOp(Binary k) : kind(k) {}
  const char* name() const override { return kind == Binary::add ? "add" : kind == Binary::sub ? "sub" : "mul"; }

  ArrayT<T> forward(Values<T> x) override {
    out_shape = detail::broadcast_shapes(shape_of(*x[0]), shape_of(*x[1]), name());
    ArrayT<T> a = expand(*x[0], out_shape), b = expand(*x[1], out_shape);
    T* pa = a.data();
    const T* pb = b.data();
    const std::size_t n = a.size();
    switch (kind) {
      case Binary::add: for (std::size_t i = 0; i < n; ++i) pa[i] += pb[i]; break;
      case Binary::sub: for (std::size_t i = 0; i < n; ++i) pa[i] -= pb[i]; break;
      case Binary::mul: for (std::size_t i = 0; i < n; ++i) pa[i] *= pb[i]; break;
    }
    return a;
  }
  /// d out / d input `which`, times dout, still in the output's shape.
  ArrayT<T> scaled(const ArrayT<T>& dout, Values<T> x, int which) const {
    ArrayT<T> g = dout;
    if (kind == Binary::mul) {
      ArrayT<T> other = expand(*x[1 - which], out_shape);
      const T* po = other.data();
      T* pg = g.data();
      for (std::size_t i = 0; i < g.size(); ++i) pg[i] *= po[i];
    } else if (kind == Binary::sub && which == 1) {
      T* pg = g.data();
      for (std::size_t i = 0; i < g.size(); ++i) pg[i] = -pg[i];
    }
    return g;
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>&, Slots<T> dx) override {
    for (int i = 0; i < 2; ++i)
      if (dx[i]) dx[i].add(unbroadcast<T>(scaled(dout, x, i), shape_of(*x[i])));
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> d, const ArrayT<T>&, std::size_t k) override {
    ArrayT<T> r = xt::zeros<T>(detail::with_k(k, out_shape));
    const std::size_t n = numel(out_shape);
    T* pr = r.data();
    for (int i = 0; i < 2; ++i) {
      if (!d[i]) continue;
      ArrayT<T> t = broadcast_tangent<T>(*d[i], out_shape);  // (k, ...out)
      const T* pt = t.data();
      if (kind == Binary::mul) {
        ArrayT<T> other = expand(*x[1 - i], out_shape);
        const T* po = other.data();
        for (std::size_t j = 0; j < k; ++j)
          for (std::size_t l = 0; l < n; ++l) pr[j * n + l] += pt[j * n + l] * po[l];
      } else {
        const T s = kind == Binary::sub && i == 1 ? T(-1) : T(1);
        for (std::size_t l = 0; l < k * n; ++l) pr[l] += s * pt[l];
      }
    }
    return r;
  }
};

enum class Unary { scale, shift, relu, tanh, sigmoid, exp, log };

const char* unary_name(Unary k) {
  switch (k) {
    case Unary::scale: return "scale";
    case Unary::shift: return "add_scalar";
    case Unary::relu: return "relu";
    case Unary::tanh: return "tanh";
    case Unary::sigmoid: return "sigmoid";
    case Unary::exp: return "exp";
    case Unary::log: return "log";
  }
  return "?";
}

template <class T>
struct UnaryOp final : Op<T> {
  Unary kind;
  T c = T(1);
  explicit UnaryOp(Unary k) : kind(k) {}
  const char* name() const override { return unary_name(kind); }
  ArrayT<T> forward(Values<T> x) override {
    const ArrayT<T>& a = *x[0];
    switch (kind) {  // the transcendental ones through xtensor's vectorised kernels
      case Unary::tanh: return xt::tanh(a);
      case Unary::exp: return xt::exp(a);
      case Unary::log: return xt::log(a);
      case Unary::sigmoid: return T(1) / (T(1) + xt::exp(-a));
      default: break;
    }
    ArrayT<T> r = a;
    T* p = r.data();
    const std::size_t n = r.size();
    if (kind == Unary::scale) for (std::size_t i = 0; i < n; ++i) p[i] *= c;
    else if (kind == Unary::shift) for (std::size_t i = 0; i < n; ++i) p[i] += c;
    else for (std::size_t i = 0; i < n; ++i) p[i] = p[i] > T(0) ? p[i] : T(0);  // relu
    return r;
  }
  /// f'(x) elementwise, from the input and the output.
  ArrayT<T> derivative(const ArrayT<T>& a, const ArrayT<T>& out) const {
    ArrayT<T> d = ArrayT<T>::from_shape(a.shape());
    T* pd = d.data();
    const T* pa = a.data();
    const T* po = out.data();
    const std::size_t n = d.size();
    switch (kind) {
      case Unary::scale: for (std::size_t i = 0; i < n; ++i) pd[i] = c; break;
      case Unary::shift: for (std::size_t i = 0; i < n; ++i) pd[i] = T(1); break;
      case Unary::relu: for (std::size_t i = 0; i < n; ++i) pd[i] = pa[i] > T(0) ? T(1) : T(0); break;
      case Unary::tanh: for (std::size_t i = 0; i < n; ++i) pd[i] = T(1) - po[i] * po[i]; break;
      case Unary::sigmoid: for (std::size_t i = 0; i < n; ++i) pd[i] = po[i] * (T(1) - po[i]); break;
      case Unary::exp: for (std::size_t i = 0; i < n; ++i) pd[i] = po[i]; break;
      case Unary::log: for (std::size_t i = 0; i < n; ++i) pd[i] = T(1) / pa[i]; break;
    }
    return d;
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>& out, Slots<T> dx) override {
    if (!dx[0]) return;
    ArrayT<T> g = derivative(*x[0], out);
    T* pg = g.data();
    const T* pd = dout.data();
    for (std::size_t i = 0; i < g.size(); ++i) pg[i] *= pd[i];
    dx[0].add(g);
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> d, const ArrayT<T>& out, std::size_t k) override {
    ArrayT<T> f = derivative(*x[0], out);
    ArrayT<T> r = *d[0];  // (k, ...)
    const std::size_t n = f.size();
    T* pr = r.data();
    const T* pf = f.data();
    for (std::size_t j = 0; j < k; ++j)
      for (std::size_t l = 0; l < n; ++l) pr[j * n + l] *= pf[l];
    return r;
  }
};

template <class T>
TensorT<T> binary(Binary k, const TensorT<T>& a, const TensorT<T>& b) {
  return apply<T>(std::make_unique<BinaryOp<T>>(k), {a, b});
}
template <class T>
TensorT<T> unary(Unary k, const TensorT<T>& x, T c = T(1)) {
  auto op = std::make_unique<UnaryOp<T>>(k);
  op->c = c;
  return apply<T>(std::move(op), {x});
}
}  // namespace

template <class T> TensorT<T> add(const TensorT<T>& a, const TensorT<T>& b) { return binary(Binary::add, a, b); }
template <class T> TensorT<T> sub(const TensorT<T>& a, const TensorT<T>& b) { return binary(Binary::sub, a, b); }
template <class T> TensorT<T> mul(const TensorT<T>& a, const TensorT<T>& b) { return binary(Binary::mul, a, b); }
template <class T> TensorT<T> scale(const TensorT<T>& x, T c) { return unary(Unary::scale, x, c); }
template <class T> TensorT<T> add_scalar(const TensorT<T>& x, T c) { return unary(Unary::shift, x, c); }
template <class T> TensorT<T> relu(const TensorT<T>& x) { return unary(Unary::relu, x); }
template <class T> TensorT<T> tanh(const TensorT<T>& x) { return unary(Unary::tanh, x); }
template <class T> TensorT<T> sigmoid(const TensorT<T>& x) { return unary(Unary::sigmoid, x); }
template <class T> TensorT<T> exp(const TensorT<T>& x) { return unary(Unary::exp, x); }
template <class T> TensorT<T> log(const TensorT<T>& x) { return unary(Unary::log, x); }

#define DPGRAD_INSTANTIATE(T)                                               \
  template TensorT<T> add(const TensorT<T>&, const TensorT<T>&);           \
  template TensorT<T> sub(const TensorT<T>&, const TensorT<T>&);           \
  template TensorT<T> mul(const TensorT<T>&, const TensorT<T>&);           \
  template TensorT<T> scale(const TensorT<T>&, T);                         \
  template TensorT<T> add_scalar(const TensorT<T>&, T);                    \
  template TensorT<T> relu(const TensorT<T>&);                             \
  template TensorT<T> tanh(const TensorT<T>&);                             \
  template TensorT<T> sigmoid(const TensorT<T>&);                          \
  template TensorT<T> exp(const TensorT<T>&);                              \
  template TensorT<T> log(const TensorT<T>&);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
