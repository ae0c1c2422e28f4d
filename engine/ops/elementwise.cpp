// Elementwise primitives: broadcasting binary ops (add, sub, mul, div) and unary
// maps (scale, add_scalar, relu, leaky_relu, tanh, sigmoid, exp, log, sqrt,
// rsqrt, pow, abs, gelu, erf), each with primal, vjp and jvp. The kinds differ only in scalar rules;
// the broadcasting machinery is instantiated once per scalar type, which keeps
// compile time low.
#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>

#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/simd.hpp"
#include "engine/parallel.hpp"
#include "engine/per_sample_rule.hpp"
#include "engine/tape.hpp"

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
using detail::expand;

using Binary = simd::Arith;  // the kernels' own list of the four operations

// Elementwise kernels split across the engine's threads in pieces of at least this many values.
constexpr std::size_t kElementGrain = 1 << 15;

template <class T>
struct BinaryOp final : Op<T> {
  Binary kind;
  Shape out_shape;
  // per-sample recording: the uses of inputs that are parameters (elementwise_rules.cpp)
  ParamUse<T>* uses[2] = {nullptr, nullptr};
  SamplesToFront moved[2];  // a use whose samples its rule reads moved to the front: how to move dout
  bool param_grads = true;
  explicit BinaryOp(Binary k) : kind(k) {}
  const char* name() const override {
    return kind == Binary::add ? "add" : kind == Binary::sub ? "sub" : kind == Binary::mul ? "mul" : "div";
  }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>& out) const override {
    if (in[0] == in[1] && x[0]->shape() == x[1]->shape()) return in[0];
    const auto shapes = detail::shapes_of(x);
    return samples_broadcast(in, shapes, shape_of(out));
  }

  /// r[i] = a[i] op b[i] over [0, n), in parallel pieces.
  void combine(const T* a, const T* b, T* r, std::size_t n) const {
    parallel::for_range(n, kElementGrain, [&](std::size_t i0, std::size_t i1) {
      simd::combine(a + i0, b + i0, r + i0, i1 - i0, kind);
    });
  }

  ArrayT<T> forward(Values<T> x) override {
    out_shape = detail::broadcast_shapes(shape_of(*x[0]), shape_of(*x[1]), name());
    ArrayT<T> r = ArrayT<T>::from_shape(out_shape);
    if (shape_of(*x[0]) == out_shape && shape_of(*x[1]) == out_shape) {
      combine(x[0]->data(), x[1]->data(), r.data(), r.size());
    } else {
      ArrayT<T> a = expand(*x[0], out_shape), b = expand(*x[1], out_shape);
      combine(a.data(), b.data(), r.data(), r.size());
    }
    return r;
  }
  /// d out / d input `which`, times dout, still in the output's shape.
  ArrayT<T> scaled(const ArrayT<T>& dout, Values<T> x, int which) const {
    ArrayT<T> g = dout;
    if (kind == Binary::div) {  // d/da = 1 / b, d/db = -a / b^2
      ArrayT<T> a = expand(*x[0], out_shape), b = expand(*x[1], out_shape);
      const T *pa = a.data(), *pb = b.data();
      T* pg = g.data();
      for (std::size_t i = 0; i < g.size(); ++i) pg[i] = which == 0 ? pg[i] / pb[i] : -pg[i] * pa[i] / (pb[i] * pb[i]);
    } else if (kind == Binary::mul) {
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
  void on_record(TapeT<T>& tape, std::span<const std::shared_ptr<Node<T>>> in) override {
    if (!tape.records_uses() || kind == Binary::div) return;  // a divisor has no per-sample rule
    param_grads = tape.param_grads();
    for (int i = 0; i < 2; ++i)
      if (in[i]->is_parameter)
        uses[i] = detail::record_elementwise_use<T>(tape, in[i], in[1 - i], kind == Binary::mul,
                                                    kind == Binary::sub && i == 1, out_shape, name(), moved[i]);
  }
  bool keeps_output_grad() const override { return uses[0] || uses[1]; }
  void keep_output_grad(std::shared_ptr<const ArrayT<T>> dout) override {
    for (int i = 0; i < 2; ++i)
      if (uses[i])
        uses[i]->delta = detail::moved_output_grad<T>(dout, moved[i]);
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>&, Slots<T> dx) override {
    for (int i = 0; i < 2; ++i) {
      if (!dx[i] || (uses[i] && !param_grads)) continue;  // the per-sample rule builds it from the use
      if (shape_of(*x[i]) != out_shape || shape_of(*x[1 - i]) != out_shape) {  // broadcast: sum back down
        dx[i].add(unbroadcast<T>(scaled(dout, x, i), shape_of(*x[i])));
        continue;
      }
      // same shapes: straight into the gradient buffer, one pass
      bool fresh;
      ArrayT<T>& g = dx[i].buffer(fresh);
      T* pg = g.data();
      const T* pd = dout.data();
      const T* po = x[1 - i]->data();
      const T sign = kind == Binary::sub && i == 1 ? T(-1) : T(1);
      const bool mul = kind == Binary::mul, div = kind == Binary::div;
      const T* pa = x[0]->data();
      const T* pb = x[1]->data();
      parallel::for_range(g.size(), kElementGrain, [&](std::size_t i0, std::size_t i1) {
        if (!div) return simd::scaled_into(pd + i0, mul ? po + i0 : nullptr, sign, pg + i0, i1 - i0, !fresh);
        for (std::size_t l = i0; l < i1; ++l) {
          const T v = i == 0 ? pd[l] / pb[l] : -pd[l] * pa[l] / (pb[l] * pb[l]);
          pg[l] = fresh ? v : pg[l] + v;
        }
      });
    }
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> d, const ArrayT<T>&, std::size_t k) override {
    const std::size_t n = numel(out_shape);
    if (shape_of(*x[0]) == out_shape && shape_of(*x[1]) == out_shape) {  // same shapes: one pass per tangent
      ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, out_shape));
      T* pr = r.data();
      const T* ta = d[0] ? d[0]->data() : nullptr;
      const T* tb = d[1] ? d[1]->data() : nullptr;
      const T* pa = x[0]->data();
      const T* pb = x[1]->data();
      const T sb = kind == Binary::sub ? T(-1) : T(1);
      const bool mul = kind == Binary::mul, div = kind == Binary::div;
      parallel::for_range(k * n, kElementGrain, [&](std::size_t i0, std::size_t i1) {
        for (std::size_t l = i0; l < i1;) {  // runs within one tangent: e is the primal's element
          const std::size_t stop = std::min(i1, (l / n + 1) * n);
          for (std::size_t e = l % n; l < stop; ++l, ++e) {
            const T da = ta ? ta[l] : T(0), db = tb ? tb[l] : T(0);
            pr[l] = div ? (da - pa[e] / pb[e] * db) / pb[e] : mul ? da * pb[e] + pa[e] * db : da + sb * db;
          }
        }
      });
      return r;
    }
    return broadcast_jvp(x, d, k);
  }
  /// The general case: tangents broadcast to the output's shape, then combined.
  ArrayT<T> broadcast_jvp(Values<T> x, Tangents<T> d, std::size_t k) const {
    ArrayT<T> r = xt::zeros<T>(detail::with_k(k, out_shape));
    const std::size_t n = numel(out_shape);
    T* pr = r.data();
    for (int i = 0; i < 2; ++i) {
      if (!d[i]) continue;
      ArrayT<T> t = broadcast_tangent<T>(*d[i], out_shape);  // (k, ...out)
      const T* pt = t.data();
      if (kind == Binary::div) {
        ArrayT<T> a = expand(*x[0], out_shape), b = expand(*x[1], out_shape);
        const T *pa = a.data(), *pb = b.data();
        for (std::size_t j = 0; j < k; ++j)
          for (std::size_t l = 0; l < n; ++l)
            pr[j * n + l] += i == 0 ? pt[j * n + l] / pb[l] : -pt[j * n + l] * pa[l] / (pb[l] * pb[l]);
      } else if (kind == Binary::mul) {
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

enum class Unary { scale, shift, relu, leaky_relu, tanh, sigmoid, exp, log, sqrt, rsqrt, pow, abs, gelu, erf };

const char* unary_name(Unary k) {
  switch (k) {
    case Unary::scale: return "scale";
    case Unary::shift: return "add_scalar";
    case Unary::relu: return "relu";
    case Unary::tanh: return "tanh";
    case Unary::sigmoid: return "sigmoid";
    case Unary::exp: return "exp";
    case Unary::log: return "log";
    case Unary::sqrt: return "sqrt";
    case Unary::rsqrt: return "rsqrt";
    case Unary::pow: return "pow";
    case Unary::abs: return "abs";
    case Unary::gelu: return "gelu";
    case Unary::leaky_relu: return "leaky_relu";
    case Unary::erf: return "erf";
  }
  return "?";
}

// Unary rules run in blocks that stay in cache (pieces of kElementGrain values in parallel).
constexpr std::size_t kBlock = 1024;

template <class T>
struct UnaryOp final : Op<T> {
  Unary kind;
  T c = T(1);  // scale's factor, add_scalar's term, pow's exponent, leaky_relu's slope
  // gelu, when a vjp or jvp will follow: the forward pass also writes f'(x) here, in the
  // same pass as f(x) (their erfc is shared), and the rules read it instead of recomputing.
  bool keep_slope = false;
  ArrayT<T> slope;
  explicit UnaryOp(Unary k) : kind(k) {}
  const char* name() const override { return unary_name(kind); }
  Samples samples(std::span<const Samples> in, Values<T>, const ArrayT<T>&) const override { return in[0]; }

  /// out[0, n) = f(a[0, n)).
  void primal(const T* a, T* out, std::size_t n) const {
    switch (kind) {  // tanh, sigmoid, exp and gelu: engine/simd.hpp's kernels; log through xtensor
      case Unary::tanh: simd::tanh(a, static_cast<const T*>(nullptr), out, n); return;
      case Unary::exp: simd::exp(a, out, n); return;
      case Unary::log: adapt(out, n) = xt::log(adapt(a, n)); return;
      case Unary::sigmoid: simd::sigmoid(a, static_cast<const T*>(nullptr), out, n); return;
      case Unary::scale: for (std::size_t i = 0; i < n; ++i) out[i] = a[i] * c; return;
      case Unary::shift: for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + c; return;
      case Unary::relu: for (std::size_t i = 0; i < n; ++i) out[i] = a[i] > T(0) ? a[i] : T(0); return;
      case Unary::sqrt: for (std::size_t i = 0; i < n; ++i) out[i] = std::sqrt(a[i]); return;
      case Unary::rsqrt: for (std::size_t i = 0; i < n; ++i) out[i] = T(1) / std::sqrt(a[i]); return;
      case Unary::pow: for (std::size_t i = 0; i < n; ++i) out[i] = std::pow(a[i], c); return;
      case Unary::abs: for (std::size_t i = 0; i < n; ++i) out[i] = std::abs(a[i]); return;
      case Unary::gelu: simd::gelu(a, out, n, false); return;
      case Unary::leaky_relu: for (std::size_t i = 0; i < n; ++i) out[i] = a[i] > T(0) ? a[i] : c * a[i]; return;
      case Unary::erf: for (std::size_t i = 0; i < n; ++i) out[i] = std::erf(a[i]); return;
    }
  }
  /// d[0, n) = f'(x) elementwise, from the input a and the output o.
  void derivative(const T* a, const T* o, T* d, std::size_t n) const {
    switch (kind) {
      case Unary::scale: for (std::size_t i = 0; i < n; ++i) d[i] = c; break;
      case Unary::shift: for (std::size_t i = 0; i < n; ++i) d[i] = T(1); break;
      case Unary::relu: for (std::size_t i = 0; i < n; ++i) d[i] = a[i] > T(0) ? T(1) : T(0); break;
      case Unary::tanh: for (std::size_t i = 0; i < n; ++i) d[i] = T(1) - o[i] * o[i]; break;
      case Unary::sigmoid: for (std::size_t i = 0; i < n; ++i) d[i] = o[i] * (T(1) - o[i]); break;
      case Unary::exp: for (std::size_t i = 0; i < n; ++i) d[i] = o[i]; break;
      case Unary::log: for (std::size_t i = 0; i < n; ++i) d[i] = T(1) / a[i]; break;
      case Unary::sqrt: for (std::size_t i = 0; i < n; ++i) d[i] = T(0.5) / o[i]; break;  // +inf at 0
      case Unary::rsqrt: for (std::size_t i = 0; i < n; ++i) d[i] = T(-0.5) * o[i] * o[i] * o[i]; break;
      case Unary::pow:
        for (std::size_t i = 0; i < n; ++i) d[i] = c == T(0) ? T(0) : c * std::pow(a[i], c - T(1));
        break;
      case Unary::abs: for (std::size_t i = 0; i < n; ++i) d[i] = a[i] > T(0) ? T(1) : a[i] < T(0) ? T(-1) : T(0); break;
      case Unary::gelu: simd::gelu(a, d, n, true); break;  // Phi(x) + x phi(x)
      case Unary::leaky_relu: for (std::size_t i = 0; i < n; ++i) d[i] = a[i] > T(0) ? T(1) : c; break;
      case Unary::erf: {  // 2 / sqrt(pi) e^(-x^2)
        const T two_over_sqrt_pi = T(std::numbers::inv_sqrtpi * 2);
        for (std::size_t i = 0; i < n; ++i) d[i] = two_over_sqrt_pi * std::exp(-a[i] * a[i]);
        break;
      }
    }
  }
  /// Calls f(i0, f'(x) on [i0, i0 + len), len) block by block, blocks in parallel.
  template <class F>
  void for_each_derivative_block(const T* a, const T* o, std::size_t n, F&& f) const {
    if (keep_slope && kind == Unary::gelu && slope.size() == n) {  // kept by the forward pass
      const T* d = slope.data();
      parallel::for_range(n, kElementGrain, [&](std::size_t r0, std::size_t r1) { f(r0, d + r0, r1 - r0); });
      return;
    }
    parallel::for_range(n, kElementGrain, [&](std::size_t r0, std::size_t r1) {
      T d[kBlock];
      for (std::size_t i0 = r0; i0 < r1; i0 += kBlock) {
        const std::size_t len = std::min(kBlock, r1 - i0);
        derivative(a + i0, o + i0, d, len);
        f(i0, static_cast<const T*>(d), len);
      }
    });
  }

  ArrayT<T> forward(Values<T> x) override {
    const ArrayT<T>& a = *x[0];
    ArrayT<T> r = ArrayT<T>::from_shape(a.shape());
    const T* pa = a.data();
    T* pr = r.data();
    if (keep_slope && kind == Unary::gelu) {
      slope = ArrayT<T>::from_shape(a.shape());
      T* ps = slope.data();
      parallel::for_range(a.size(), kElementGrain,
                          [&](std::size_t i0, std::size_t i1) { simd::gelu_slope(pa + i0, pr + i0, ps + i0, i1 - i0); });
      return r;
    }
    parallel::for_range(a.size(), kElementGrain, [&](std::size_t i0, std::size_t i1) { primal(pa + i0, pr + i0, i1 - i0); });
    return r;
  }
  /// dx = f'(x) * dout, accumulated in one pass.
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>& out, Slots<T> dx) override {
    if (!dx[0]) return;
    bool fresh;
    ArrayT<T>& g = dx[0].buffer(fresh);
    T* pg = g.data();
    const T* pd = dout.data();
    for_each_derivative_block(x[0]->data(), out.data(), out.size(), [&](std::size_t i0, const T* d, std::size_t len) {
      T* __restrict gi = pg + i0;
      const T* __restrict di = pd + i0;
      if (fresh) for (std::size_t l = 0; l < len; ++l) gi[l] = d[l] * di[l];
      else for (std::size_t l = 0; l < len; ++l) gi[l] += d[l] * di[l];
    });
  }
  /// out_dot_j = f'(x) * x_dot_j for each of the k tangents.
  ArrayT<T> jvp(Values<T> x, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    const std::size_t n = out.size();
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    T* pr = r.data();
    const T* pt = dot[0]->data();
    for_each_derivative_block(x[0]->data(), out.data(), n, [&](std::size_t i0, const T* d, std::size_t len) {
      for (std::size_t j = 0; j < k; ++j) {
        T* __restrict ri = pr + j * n + i0;
        const T* __restrict ti = pt + j * n + i0;
        for (std::size_t l = 0; l < len; ++l) ri[l] = d[l] * ti[l];
      }
    });
    return r;
  }

 private:
  static auto adapt(const T* p, std::size_t n) {
    return xt::adapt(p, n, xt::no_ownership(), std::array<std::size_t, 1>{n});
  }
  static auto adapt(T* p, std::size_t n) { return xt::adapt(p, n, xt::no_ownership(), std::array<std::size_t, 1>{n}); }
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
template <class T> TensorT<T> div(const TensorT<T>& a, const TensorT<T>& b) { return binary(Binary::div, a, b); }
template <class T> TensorT<T> scale(const TensorT<T>& x, T c) { return unary(Unary::scale, x, c); }
template <class T> TensorT<T> add_scalar(const TensorT<T>& x, T c) { return unary(Unary::shift, x, c); }
template <class T> TensorT<T> relu(const TensorT<T>& x) { return unary(Unary::relu, x); }
template <class T> TensorT<T> tanh(const TensorT<T>& x) { return unary(Unary::tanh, x); }
template <class T> TensorT<T> sigmoid(const TensorT<T>& x) { return unary(Unary::sigmoid, x); }
template <class T> TensorT<T> exp(const TensorT<T>& x) { return unary(Unary::exp, x); }
template <class T> TensorT<T> log(const TensorT<T>& x) { return unary(Unary::log, x); }
template <class T> TensorT<T> sqrt(const TensorT<T>& x) { return unary(Unary::sqrt, x); }
template <class T> TensorT<T> rsqrt(const TensorT<T>& x) { return unary(Unary::rsqrt, x); }
template <class T> TensorT<T> pow(const TensorT<T>& x, T p) { return unary(Unary::pow, x, p); }
template <class T> TensorT<T> abs(const TensorT<T>& x) { return unary(Unary::abs, x); }
template <class T> TensorT<T> gelu(const TensorT<T>& x) {
  auto op = std::make_unique<UnaryOp<T>>(Unary::gelu);
  // the slope is kept when a rule will read it: a tape records this op, or tangents ride along
  op->keep_slope = x.defined() && ((active_tape<T>() && x.requires_grad()) || x.has_tangent());
  return apply<T>(std::move(op), {x});
}
template <class T> TensorT<T> leaky_relu(const TensorT<T>& x, T slope) { return unary(Unary::leaky_relu, x, slope); }
template <class T> TensorT<T> erf(const TensorT<T>& x) { return unary(Unary::erf, x); }

#define DPGRAD_INSTANTIATE(T)                                               \
  template TensorT<T> add(const TensorT<T>&, const TensorT<T>&);           \
  template TensorT<T> sub(const TensorT<T>&, const TensorT<T>&);           \
  template TensorT<T> mul(const TensorT<T>&, const TensorT<T>&);           \
  template TensorT<T> div(const TensorT<T>&, const TensorT<T>&);           \
  template TensorT<T> scale(const TensorT<T>&, T);                         \
  template TensorT<T> add_scalar(const TensorT<T>&, T);                    \
  template TensorT<T> relu(const TensorT<T>&);                             \
  template TensorT<T> tanh(const TensorT<T>&);                             \
  template TensorT<T> sigmoid(const TensorT<T>&);                          \
  template TensorT<T> exp(const TensorT<T>&);                              \
  template TensorT<T> log(const TensorT<T>&);                              \
  template TensorT<T> sqrt(const TensorT<T>&);                             \
  template TensorT<T> rsqrt(const TensorT<T>&);                            \
  template TensorT<T> pow(const TensorT<T>&, T);                           \
  template TensorT<T> abs(const TensorT<T>&);                              \
  template TensorT<T> gelu(const TensorT<T>&);                             \
  template TensorT<T> leaky_relu(const TensorT<T>&, T);                    \
  template TensorT<T> erf(const TensorT<T>&);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
