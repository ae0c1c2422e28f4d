// Products of two activations, batched over their leading axes (attention's
// scores q k^T and its weighted values), and masked filling (padding masks).
#include "engine/blas.hpp"
#include "engine/ops.hpp"
#include "engine/ops/common.hpp"

namespace dpgrad {

namespace {

/// a (..., m, k) x b (..., k, n), or b (..., n, k) transposed: the leading axes
/// equal; one GEMM per leading index, the indices spread over the engine's threads.
template <class T>
struct MatmulOp final : Op<T> {
  bool transpose_b;
  std::size_t batch = 1, m = 0, k = 0, n = 0;
  explicit MatmulOp(bool t) : transpose_b(t) {}
  const char* name() const override { return "matmul"; }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    const auto shapes = detail::shapes_of(x);
    // with leading axes, axis 0 indexes independent products: rows stay rows.
    // Two-dimensional, b's axis 0 is summed over (or, transposed, becomes the
    // output's columns): samples there are mixed.
    if (shapes[0].size() == 2 && in[1].kind == Samples::Kind::mixed) return in[1];
    if (shapes[0].size() == 2 && !in[1].is_none())
      return Samples::mixed(MixedBy::What::product,
                            "of a " + shape_str(shapes[0]) + " by b " + shape_str(shapes[1]) +
                                (transpose_b ? " transposed" : "") + ", whose second factor holds samples (" +
                                in[1].str() + "): every output row combines them");
    return samples_rowwise(in.first(shapes[0].size() == 2 ? 1 : 2),
                           std::span<const Shape>(shapes.data(), shapes[0].size() == 2 ? 1 : 2));
  }
  ArrayT<T> forward(Values<T> x) override {
    const Shape sa = shape_of(*x[0]), sb = shape_of(*x[1]);
    const bool ok = sa.size() >= 2 && sa.size() == sb.size() &&
                    std::equal(sa.begin(), sa.end() - 2, sb.begin()) &&
                    sa.back() == (transpose_b ? sb.back() : sb[sb.size() - 2]);
    if (!ok)
      throw std::invalid_argument("matmul: shapes " + shape_str(sa) + " and " + shape_str(sb) +
                                  (transpose_b ? " (the second transposed)" : "") +
                                  " do not multiply: (..., m, k) and (..., k, n) with equal leading axes");
    m = sa[sa.size() - 2];
    k = sa.back();
    n = transpose_b ? sb[sb.size() - 2] : sb.back();
    batch = 1;
    for (std::size_t i = 0; i + 2 < sa.size(); ++i) batch *= sa[i];
    Shape so = sa;
    so.back() = n;
    ArrayT<T> r = ArrayT<T>::from_shape(so);
    product(x[0]->data(), x[1]->data(), T(0), r.data());
    return r;
  }
  /// c (+)= a b for every leading index.
  void product(const T* a, const T* b, T beta, T* c) const {
    parallel::for_range(batch, 1, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i)
        blas::gemm<T>(false, transpose_b, m, n, k, T(1), a + i * m * k, b + i * k * n, beta, c + i * m * n);
    });
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>&, Slots<T> dx) override {
    const T *a = x[0]->data(), *b = x[1]->data(), *g = dout.data();
    bool fresh;
    if (dx[0]) {  // da = g b^T (b (k, n)) or g b (b stored (n, k))
      ArrayT<T>& ga = dx[0].buffer(fresh);
      parallel::for_range(batch, 1, [&](std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i)
          blas::gemm<T>(false, !transpose_b, m, k, n, T(1), g + i * m * n, b + i * k * n, fresh ? T(0) : T(1),
                        ga.data() + i * m * k);
      });
    }
    if (dx[1]) {  // db = a^T g (k, n), or g^T a (n, k)
      ArrayT<T>& gb = dx[1].buffer(fresh);
      parallel::for_range(batch, 1, [&](std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i) {
          if (transpose_b)
            blas::gemm<T>(true, false, n, k, m, T(1), g + i * m * n, a + i * m * k, fresh ? T(0) : T(1),
                          gb.data() + i * k * n);
          else
            blas::gemm<T>(true, false, k, n, m, T(1), a + i * m * k, g + i * m * n, fresh ? T(0) : T(1),
                          gb.data() + i * k * n);
        }
      });
    }
  }
  /// ta b + a tb for each tangent.
  ArrayT<T> jvp(Values<T> x, Tangents<T> dot, const ArrayT<T>& out, std::size_t kt) override {
    ArrayT<T> r = xt::zeros<T>(detail::with_k(kt, shape_of(out)));
    const std::size_t na = x[0]->size(), nb = x[1]->size(), no = out.size();
    for (std::size_t j = 0; j < kt; ++j) {
      if (dot[0]) product(dot[0]->data() + j * na, x[1]->data(), T(1), r.data() + j * no);
      if (dot[1]) product(x[0]->data(), dot[1]->data() + j * nb, T(1), r.data() + j * no);
    }
    return r;
  }
};

/// x where mask is 0, `value` where it is not; mask broadcasts to x.
template <class T>
struct MaskedFillOp final : Op<T> {
  ArrayT<T> mask;  // expanded to x's shape
  T value;
  MaskedFillOp(ArrayT<T> m, T v) : mask(std::move(m)), value(v) {}
  const char* name() const override { return "masked_fill"; }
  Samples samples(std::span<const Samples> in, Values<T>, const ArrayT<T>&) const override { return in[0]; }
  ArrayT<T> forward(Values<T> x) override {
    const Shape s = shape_of(*x[0]);
    if (shape_of(mask) != s) {
      if (detail::broadcast_shapes(shape_of(mask), s, "masked_fill") != s)  // throws when they do not broadcast
        throw std::invalid_argument("masked_fill: a mask of shape " + shape_str(shape_of(mask)) +
                                    " is larger than the input " + shape_str(s));
      mask = xt::broadcast(mask, s);
    }
    ArrayT<T> r = *x[0];
    for (std::size_t i = 0; i < r.size(); ++i)
      if (mask.data()[i] != T(0)) r.data()[i] = value;
    return r;
  }
  void vjp(const ArrayT<T>& dout, Values<T>, const ArrayT<T>&, Slots<T> dx) override {
    if (!dx[0]) return;
    bool fresh;
    ArrayT<T>& g = dx[0].buffer(fresh);
    for (std::size_t i = 0; i < g.size(); ++i) {
      const T v = mask.data()[i] != T(0) ? T(0) : dout.data()[i];
      g.data()[i] = fresh ? v : g.data()[i] + v;
    }
  }
  ArrayT<T> jvp(Values<T>, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    ArrayT<T> r = *dot[0];
    const std::size_t n = out.size();
    for (std::size_t j = 0; j < k; ++j)
      for (std::size_t i = 0; i < n; ++i)
        if (mask.data()[i] != T(0)) r.data()[j * n + i] = T(0);
    return r;
  }
};

}  // namespace

template <class T>
TensorT<T> matmul(const TensorT<T>& a, const TensorT<T>& b, bool transpose_b) {
  return apply<T>(std::make_unique<MatmulOp<T>>(transpose_b), {a, b});
}
template <class T>
TensorT<T> masked_fill(const TensorT<T>& x, const ArrayT<T>& mask, T value) {
  return apply<T>(std::make_unique<MaskedFillOp<T>>(mask, value), {x});
}

#define DPGRAD_INSTANTIATE(T)                                                        \
  template TensorT<T> matmul(const TensorT<T>&, const TensorT<T>&, bool);           \
  template TensorT<T> masked_fill(const TensorT<T>&, const ArrayT<T>&, T);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
