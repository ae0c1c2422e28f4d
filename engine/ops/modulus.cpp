// The modulus of a complex signal held as two real arrays, |z| = sqrt(re^2 +
// im^2): the nonlinearity of the scattering transform (layers/scattering.hpp).
// One op rather than a square root of a sum of squares, so that its derivative
// is taken where it is defined: at z = 0 the modulus has no derivative and the
// op uses 0 (a subgradient; kymatio does the same).
#include <cmath>

#include "engine/ops.hpp"
#include "engine/ops/common.hpp"

namespace dpgrad {

namespace {

template <class T>
struct ModulusOp final : Op<T> {
  const char* name() const override { return "complex_abs"; }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>& out) const override {
    const auto shapes = detail::shapes_of(x);
    return samples_broadcast(in, shapes, shape_of(out));
  }
  ArrayT<T> forward(Values<T> x) override {
    if (shape_of(*x[0]) != shape_of(*x[1]))
      throw std::invalid_argument("complex_abs: the real part " + shape_str(shape_of(*x[0])) +
                                  " and the imaginary part " + shape_str(shape_of(*x[1])) + " differ in shape");
    ArrayT<T> r = ArrayT<T>::from_shape(x[0]->shape());
    const T* re = x[0]->data();
    const T* im = x[1]->data();
    T* pr = r.data();
    parallel::for_range(r.size(), std::size_t(1) << 15, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) pr[i] = std::hypot(re[i], im[i]);
    });
    return r;
  }
  /// d|z| / d re = re / |z|, d|z| / d im = im / |z| (0 where |z| = 0).
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>& out, Slots<T> dx) override {
    const T* pd = dout.data();
    const T* po = out.data();
    for (int part = 0; part < 2; ++part) {
      if (!dx[part]) continue;
      bool fresh;
      ArrayT<T>& g = dx[part].buffer(fresh);
      T* pg = g.data();
      const T* pz = x[part]->data();
      for (std::size_t i = 0; i < g.size(); ++i) {
        const T v = po[i] > T(0) ? pd[i] * pz[i] / po[i] : T(0);
        pg[i] = fresh ? v : pg[i] + v;
      }
    }
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    const std::size_t n = out.size();
    ArrayT<T> r = xt::zeros<T>(detail::with_k(k, shape_of(out)));
    T* pr = r.data();
    const T* po = out.data();
    for (int part = 0; part < 2; ++part) {
      if (!dot[part]) continue;
      const T* pt = dot[part]->data();
      const T* pz = x[part]->data();
      for (std::size_t j = 0; j < k; ++j)
        for (std::size_t i = 0; i < n; ++i)
          if (po[i] > T(0)) pr[j * n + i] += pz[i] / po[i] * pt[j * n + i];
    }
    return r;
  }
};

}  // namespace

template <class T>
TensorT<T> complex_abs(const TensorT<T>& re, const TensorT<T>& im) {
  return apply<T>(std::make_unique<ModulusOp<T>>(), {re, im});
}

template TensorT<float> complex_abs(const TensorT<float>&, const TensorT<float>&);
template TensorT<double> complex_abs(const TensorT<double>&, const TensorT<double>&);

}  // namespace dpgrad
