// Elementwise primitives: broadcasting binary ops (add, sub, mul) and unary
// maps (scale, relu, tanh, sigmoid, exp, log), each with primal, vjp and jvp.
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

enum class Binary { add, sub, mul };

template <class T, Binary K>
struct BinaryOp final : Op<T> {
  Shape out_shape;
  const char* name() const override { return K == Binary::add ? "add" : K == Binary::sub ? "sub" : "mul"; }
  ArrayT<T> forward(Values<T> x) override {
    out_shape = detail::broadcast_shapes(shape_of(*x[0]), shape_of(*x[1]), name());
    if constexpr (K == Binary::add) return *x[0] + *x[1];
    else if constexpr (K == Binary::sub) return *x[0] - *x[1];
    else return *x[0] * *x[1];
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>&, Slots<T> dx) override {
    if constexpr (K == Binary::mul) {
      if (dx[0]) dx[0].add(unbroadcast<T>(dout * *x[1], shape_of(*x[0])));
      if (dx[1]) dx[1].add(unbroadcast<T>(dout * *x[0], shape_of(*x[1])));
    } else {
      if (dx[0]) dx[0].add(unbroadcast<T>(dout, shape_of(*x[0])));
      if (dx[1]) {
        if constexpr (K == Binary::add) dx[1].add(unbroadcast<T>(dout, shape_of(*x[1])));
        else dx[1].add(unbroadcast<T>(ArrayT<T>(-dout), shape_of(*x[1])));
      }
    }
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> d, const ArrayT<T>&, std::size_t k) override {
    ArrayT<T> r = xt::zeros<T>(detail::with_k(k, out_shape));
    if constexpr (K == Binary::mul) {
      if (d[0]) r += broadcast_tangent<T>(*d[0], out_shape) * *x[1];
      if (d[1]) r += *x[0] * broadcast_tangent<T>(*d[1], out_shape);
    } else {
      if (d[0]) r += broadcast_tangent<T>(*d[0], out_shape);
      if (d[1]) {
        if constexpr (K == Binary::add) r += broadcast_tangent<T>(*d[1], out_shape);
        else r -= broadcast_tangent<T>(*d[1], out_shape);
      }
    }
    return r;
  }
};

enum class Unary { scale, shift, relu, tanh, sigmoid, exp, log };

template <class T, Unary K>
struct UnaryOp final : Op<T> {
  T c = T(1);
  const char* name() const override {
    switch (K) {
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
  ArrayT<T> forward(Values<T> x) override {
    const ArrayT<T>& a = *x[0];
    if constexpr (K == Unary::scale) return c * a;
    else if constexpr (K == Unary::shift) return a + c;
    else if constexpr (K == Unary::relu) return xt::maximum(a, T(0));
    else if constexpr (K == Unary::tanh) return xt::tanh(a);
    else if constexpr (K == Unary::sigmoid) return T(1) / (T(1) + xt::exp(-a));
    else if constexpr (K == Unary::exp) return xt::exp(a);
    else return xt::log(a);
  }
  /// The derivative f'(x) as an array of x's shape.
  ArrayT<T> derivative(const ArrayT<T>& a, const ArrayT<T>& out) const {
    if constexpr (K == Unary::scale) return xt::full_like(a, c);
    else if constexpr (K == Unary::shift) return xt::ones_like(a);
    else if constexpr (K == Unary::relu) return xt::cast<T>(a > T(0));
    else if constexpr (K == Unary::tanh) return T(1) - out * out;
    else if constexpr (K == Unary::sigmoid) return out * (T(1) - out);
    else if constexpr (K == Unary::exp) return out;
    else return T(1) / a;
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>& out, Slots<T> dx) override {
    if (!dx[0]) return;
    if constexpr (K == Unary::scale) dx[0].add(c * dout);
    else if constexpr (K == Unary::shift) dx[0].add(dout);
    else if constexpr (K == Unary::relu) dx[0].add(xt::where(*x[0] > T(0), dout, T(0)));
    else if constexpr (K == Unary::tanh) dx[0].add(dout * (T(1) - out * out));
    else if constexpr (K == Unary::sigmoid) dx[0].add(dout * out * (T(1) - out));
    else if constexpr (K == Unary::exp) dx[0].add(dout * out);
    else dx[0].add(dout / *x[0]);
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> d, const ArrayT<T>& out, std::size_t) override {
    if constexpr (K == Unary::scale) return c * *d[0];
    else if constexpr (K == Unary::shift) return *d[0];
    else return *d[0] * derivative(*x[0], out);  // (k, ...) * (...) broadcasts over k
  }
};

template <class T, Binary K>
TensorT<T> binary(const TensorT<T>& a, const TensorT<T>& b) {
  return apply<T>(std::make_unique<BinaryOp<T, K>>(), {a, b});
}
template <class T, Unary K>
TensorT<T> unary(const TensorT<T>& x, T c = T(1)) {
  auto op = std::make_unique<UnaryOp<T, K>>();
  op->c = c;
  return apply<T>(std::move(op), {x});
}
}  // namespace

template <class T> TensorT<T> add(const TensorT<T>& a, const TensorT<T>& b) { return binary<T, Binary::add>(a, b); }
template <class T> TensorT<T> sub(const TensorT<T>& a, const TensorT<T>& b) { return binary<T, Binary::sub>(a, b); }
template <class T> TensorT<T> mul(const TensorT<T>& a, const TensorT<T>& b) { return binary<T, Binary::mul>(a, b); }
template <class T> TensorT<T> scale(const TensorT<T>& x, T c) { return unary<T, Unary::scale>(x, c); }
template <class T> TensorT<T> add_scalar(const TensorT<T>& x, T c) { return unary<T, Unary::shift>(x, c); }
template <class T> TensorT<T> relu(const TensorT<T>& x) { return unary<T, Unary::relu>(x); }
template <class T> TensorT<T> tanh(const TensorT<T>& x) { return unary<T, Unary::tanh>(x); }
template <class T> TensorT<T> sigmoid(const TensorT<T>& x) { return unary<T, Unary::sigmoid>(x); }
template <class T> TensorT<T> exp(const TensorT<T>& x) { return unary<T, Unary::exp>(x); }
template <class T> TensorT<T> log(const TensorT<T>& x) { return unary<T, Unary::log>(x); }

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
