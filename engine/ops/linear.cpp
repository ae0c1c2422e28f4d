// linear: y = x W + b on BLAS GEMMs, the parametric op behind dense layers,
// convolutions (after im2col) and recurrent cells. Besides its rules it records
// each use of W and b for the per-sample rules (engine/tape.hpp).
#include <algorithm>

#include "engine/blas.hpp"
#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/ops/param_uses.hpp"
#include "engine/parallel.hpp"
#include "engine/tape.hpp"

namespace dpgrad {
namespace {
using detail::add_column_sums;
using detail::fill_rows;
using detail::shape_str;

template <class T>
struct LinearOp final : Op<T> {
  bool has_bias = false;
  std::size_t m = 0, d = 0, p = 0;  // x as (m, d), W (d, p)
  detail::WeightBiasUses<T> uses;
  const char* name() const override { return "linear"; }
  /// Row by row over every axis but the last, which it contracts.
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    for (std::size_t i = 1; i < in.size(); ++i)
      if (!in[i].is_none()) return Samples::mixed();
    if (in[0].kind != Samples::Kind::none && in[0].kind != Samples::Kind::mixed && in[0].axis + 1 == x[0]->dimension() &&
        in[0].count != 1)
      return Samples::mixed();
    return in[0];
  }

  ArrayT<T> forward(Values<T> x) override {
    const ArrayT<T>& a = *x[0];
    const ArrayT<T>& w = *x[1];
    if (w.dimension() != 2 || a.dimension() < 1 || a.shape().back() != w.shape()[0])
      throw std::invalid_argument("linear: x " + shape_str(shape_of(a)) + " does not fit W " + shape_str(shape_of(w)) +
                                  " (need x (..., d), W (d, p))");
    d = w.shape()[0];
    p = w.shape()[1];
    m = d == 0 ? 0 : a.size() / d;
    if (has_bias && (x[2]->dimension() != 1 || x[2]->shape()[0] != p))
      throw std::invalid_argument("linear: bias " + shape_str(shape_of(*x[2])) + " must be (" + std::to_string(p) + ")");
    Shape os = shape_of(a);
    os.back() = p;
    ArrayT<T> out = ArrayT<T>::from_shape(os);
    if (has_bias) fill_rows(x[2]->data(), m, p, out.data());  // every row starts as b; the GEMM adds x W (beta 1)
    blas::gemm<T>(false, false, m, p, d, T(1), a.data(), w.data(), has_bias ? T(1) : T(0), out.data());
    return out;
  }

  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>&, Slots<T> dx) override {
    bool fresh;
    if (dx[0]) {  // dx = dout W^T
      ArrayT<T>& g = dx[0].buffer(fresh);
      blas::gemm<T>(false, true, m, d, p, T(1), dout.data(), x[1]->data(), fresh ? T(0) : T(1), g.data());
    }
    if (dx[1] && uses.wants_weight_grad()) {  // dW = x^T dout
      ArrayT<T>& g = dx[1].buffer(fresh);
      blas::gemm<T>(true, false, d, p, m, T(1), x[0]->data(), dout.data(), fresh ? T(0) : T(1), g.data());
    }
    if (has_bias && dx[2] && uses.wants_bias_grad()) {  // db = column sums of dout (m, p)
      ArrayT<T>& g = dx[2].buffer(fresh);
      if (fresh) std::fill(g.begin(), g.end(), T(0));
      add_column_sums(dout.data(), m, p, g.data());
    }
  }

  bool keeps_output_grad() const override { return uses.keeps_output_grad(); }
  void keep_output_grad(std::shared_ptr<const ArrayT<T>> dout) override { uses.keep_output_grad(dout); }

  ArrayT<T> jvp(Values<T> x, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    T beta = T(0);
    if (dot[0]) {  // x_dot W, all k tangents in one GEMM
      blas::gemm<T>(false, false, k * m, p, d, T(1), dot[0]->data(), x[1]->data(), T(0), r.data());
      beta = T(1);
    }
    if (dot[1]) {  // x W_dot_j
      auto product = [&](std::size_t j) {
        blas::gemm<T>(false, false, m, p, d, T(1), x[0]->data(), dot[1]->data() + j * d * p, beta, r.data() + j * m * p);
      };
      if (k % std::size_t(parallel::threads()) == 0) {  // whole products per thread (nested GEMMs run single-threaded)
        parallel::for_range(k, 1, [&](std::size_t j0, std::size_t j1) {
          for (std::size_t j = j0; j < j1; ++j) product(j);
        });
      } else {  // a share of products would leave threads idle: each product split over all of them
        for (std::size_t j = 0; j < k; ++j) product(j);
      }
      beta = T(1);
    }
    if (beta == T(0)) r.fill(T(0));
    if (has_bias && dot[2]) detail::add_bias_tangents(dot[2]->data(), k, m, p, r.data());
    return r;
  }

  void on_record(TapeT<T>& tape, std::span<const std::shared_ptr<Node<T>>> in) override {
    uses.record(tape, in, UseKind::matmul, has_bias, name());
  }
};

}  // namespace

template <class T>
TensorT<T> linear(const TensorT<T>& x, const TensorT<T>& w, const TensorT<T>& b) {
  auto op = std::make_unique<LinearOp<T>>();
  op->has_bias = b.defined();
  if (op->has_bias) return apply<T>(std::move(op), {x, w, b});
  return apply<T>(std::move(op), {x, w});
}

template TensorT<float> linear(const TensorT<float>&, const TensorT<float>&, const TensorT<float>&);
template TensorT<double> linear(const TensorT<double>&, const TensorT<double>&, const TensorT<double>&);

}  // namespace dpgrad
