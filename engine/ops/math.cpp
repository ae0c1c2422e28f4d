// Elementwise maps beyond the activations: sqrt, rsqrt, pow with a scalar
// exponent, abs and GELU, each with primal, vjp and jvp. One op type: the kinds
// differ only in their scalar rule and its derivative.
#include <cmath>
#include <numbers>

#include "engine/ops.hpp"
#include "engine/ops/common.hpp"

namespace dpgrad {

namespace {

enum class Map { sqrt, rsqrt, pow, abs, gelu };

const char* map_name(Map k) {
  switch (k) {
    case Map::sqrt: return "sqrt";
    case Map::rsqrt: return "rsqrt";
    case Map::pow: return "pow";
    case Map::abs: return "abs";
    case Map::gelu: return "gelu";
  }
  return "?";
}

constexpr std::size_t kGrain = std::size_t(1) << 15;

template <class T>
struct MapOp final : Op<T> {
  Map kind;
  T p = T(1);  // pow's exponent
  explicit MapOp(Map k) : kind(k) {}
  const char* name() const override { return map_name(kind); }
  Samples samples(std::span<const Samples> in, Values<T>, const ArrayT<T>&) const override { return in[0]; }

  T value(T x) const {
    switch (kind) {
      case Map::sqrt: return std::sqrt(x);
      case Map::rsqrt: return T(1) / std::sqrt(x);
      case Map::pow: return std::pow(x, p);
      case Map::abs: return std::abs(x);
      case Map::gelu: return x * T(0.5) * (T(1) + std::erf(x * T(std::numbers::sqrt2 / 2)));
    }
    return x;
  }
  /// f'(x), from x and y = f(x).
  T derivative(T x, T y) const {
    switch (kind) {
      case Map::sqrt: return T(0.5) / y;                  // +inf at 0
      case Map::rsqrt: return T(-0.5) * y * y * y;        // -x^(-3/2) / 2
      case Map::pow: return p == T(0) ? T(0) : p * std::pow(x, p - T(1));
      case Map::abs: return x > T(0) ? T(1) : x < T(0) ? T(-1) : T(0);
      case Map::gelu: {
        const T cdf = T(0.5) * (T(1) + std::erf(x * T(std::numbers::sqrt2 / 2)));
        const T pdf = std::exp(T(-0.5) * x * x) * T(0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2);
        return cdf + x * pdf;
      }
    }
    return T(1);
  }

  ArrayT<T> forward(Values<T> x) override {
    const ArrayT<T>& a = *x[0];
    ArrayT<T> r = ArrayT<T>::from_shape(a.shape());
    const T* pa = a.data();
    T* pr = r.data();
    parallel::for_range(a.size(), kGrain, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) pr[i] = value(pa[i]);
    });
    return r;
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>& out, Slots<T> dx) override {
    if (!dx[0]) return;
    bool fresh;
    ArrayT<T>& g = dx[0].buffer(fresh);
    T* pg = g.data();
    const T *pd = dout.data(), *pa = x[0]->data(), *po = out.data();
    parallel::for_range(g.size(), kGrain, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) {
        const T v = derivative(pa[i], po[i]) * pd[i];
        pg[i] = fresh ? v : pg[i] + v;
      }
    });
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    const std::size_t n = out.size();
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    const T *pa = x[0]->data(), *po = out.data(), *pt = dot[0]->data();
    T* pr = r.data();
    parallel::for_range(n, kGrain, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) {
        const T d = derivative(pa[i], po[i]);
        for (std::size_t j = 0; j < k; ++j) pr[j * n + i] = d * pt[j * n + i];
      }
    });
    return r;
  }
};

template <class T>
TensorT<T> map(Map k, const TensorT<T>& x, T p = T(1)) {
  auto op = std::make_unique<MapOp<T>>(k);
  op->p = p;
  return apply<T>(std::move(op), {x});
}

}  // namespace

template <class T>
TensorT<T> sqrt(const TensorT<T>& x) {
  return map(Map::sqrt, x);
}
template <class T>
TensorT<T> rsqrt(const TensorT<T>& x) {
  return map(Map::rsqrt, x);
}
template <class T>
TensorT<T> pow(const TensorT<T>& x, T p) {
  return map(Map::pow, x, p);
}
template <class T>
TensorT<T> abs(const TensorT<T>& x) {
  return map(Map::abs, x);
}
template <class T>
TensorT<T> gelu(const TensorT<T>& x) {
  return map(Map::gelu, x);
}

#define DPGRAD_INSTANTIATE(T)                       \
  template TensorT<T> sqrt(const TensorT<T>&);      \
  template TensorT<T> rsqrt(const TensorT<T>&);     \
  template TensorT<T> pow(const TensorT<T>&, T);    \
  template TensorT<T> abs(const TensorT<T>&);       \
  template TensorT<T> gelu(const TensorT<T>&);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
