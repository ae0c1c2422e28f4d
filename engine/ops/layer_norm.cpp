// Fused LayerNorm (docs/fused-ops.md): y = (x - mean) / sqrt(var + eps) * gain
// + shift over the last axis, as one op in place of the chain of means,
// differences, products and a reciprocal square root. It keeps each row's mean
// and 1 / sqrt(var + eps) (two numbers a row) and recomputes the normalised x
// from its input when it needs it. Gain and shift stay exact for the
// per-sample rules: they are recorded as the elementwise uses a mul and an add
// would have recorded (docs/per-sample.md, "Elementwise parameters").
#include <algorithm>
#include <cmath>

#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/per_sample_rule.hpp"

namespace dpgrad {

namespace {

using detail::shape_str;

// Rows per parallel piece: about 2^14 values each.
inline std::size_t row_grain(std::size_t d) { return std::max<std::size_t>(1, (std::size_t(1) << 14) / std::max<std::size_t>(1, d)); }

/// x (..., d) -> (..., d), with gain (d) and shift (d) when affine.
template <class T>
struct LayerNormOp final : Op<T> {
  T eps;
  bool affine;
  std::size_t rows = 0, d = 0;
  std::vector<T> mean, rstd;  // (rows): each row's mean and 1 / sqrt(var + eps)
  ParamUse<T>* uses[2] = {nullptr, nullptr};  // gain (as y = xhat * gain), shift (as y = . + shift)
  SamplesToFront moved[2];  // a use whose rule reads the samples moved to the front (time-major): how to move dout
  bool param_grads = true;
  LayerNormOp(T e, bool a) : eps(e), affine(a) {}
  const char* name() const override { return "layer_norm"; }
  /// Row by row over every axis but the last, which it mixes.
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    for (std::size_t i = 1; i < in.size(); ++i)
      if (!in[i].is_none()) return Samples::mixed();
    if ((in[0].kind == Samples::Kind::axis || in[0].kind == Samples::Kind::subset) && in[0].axis + 1 == x[0]->dimension() &&
        in[0].count != 1)  // one sample on the last axis: its rows are its own
      return Samples::mixed();
    return in[0];
  }

  /// xhat of row r into out (d values).
  void normalised_row(const T* x, std::size_t r, T* out) const {
    const T m = mean[r], s = rstd[r];
    const T* xr = x + r * d;
    for (std::size_t j = 0; j < d; ++j) out[j] = (xr[j] - m) * s;
  }

  ArrayT<T> forward(Values<T> x) override {
    const ArrayT<T>& a = *x[0];
    if (a.dimension() < 1 || a.shape().back() == 0)
      throw std::invalid_argument("layer_norm: input " + shape_str(shape_of(a)) + " has no last axis to normalise");
    d = a.shape().back();
    rows = a.size() / d;
    if (affine)
      for (int i = 1; i <= 2; ++i)
        if (x[i]->dimension() != 1 || x[i]->shape()[0] != d)
          throw std::invalid_argument(std::string("layer_norm: ") + (i == 1 ? "gain " : "shift ") +
                                      shape_str(shape_of(*x[i])) + " must be (" + std::to_string(d) + ")");
    mean.resize(rows);
    rstd.resize(rows);
    ArrayT<T> out = ArrayT<T>::from_shape(a.shape());
    const T* pa = a.data();
    const T* g = affine ? x[1]->data() : nullptr;
    const T* sh = affine ? x[2]->data() : nullptr;
    T* po = out.data();
    parallel::for_range(rows, row_grain(d), [&](std::size_t r0, std::size_t r1) {
      for (std::size_t r = r0; r < r1; ++r) {
        const T* xr = pa + r * d;
        const T m = simd::sum(xr, d) / T(d);  // sums in 8 partial sums: not one chain of d dependent adds
        const T s = T(1) / std::sqrt(simd::centred_squares(xr, d, m) / T(d) + eps);
        mean[r] = m;
        rstd[r] = s;
        T* yr = po + r * d;
        if (affine)
          for (std::size_t j = 0; j < d; ++j) yr[j] = (xr[j] - m) * s * g[j] + sh[j];
        else
          for (std::size_t j = 0; j < d; ++j) yr[j] = (xr[j] - m) * s;
      }
    });
    return out;
  }

  /// u = dy gain; dx = rstd (u - mean(u) - xhat mean(u xhat)); dgain = sum over
  /// rows of dy xhat; dshift = sum over rows of dy.
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>&, Slots<T> dx) override {
    const T* px = x[0]->data();
    const T* pd = dout.data();
    const T* g = affine ? x[1]->data() : nullptr;
    if (dx[0]) {
      bool fresh;
      T* pg = dx[0].buffer(fresh).data();
      parallel::for_range(rows, row_grain(d), [&](std::size_t r0, std::size_t r1) {
        std::vector<T> xh(d), u(d);
        for (std::size_t r = r0; r < r1; ++r) {
          normalised_row(px, r, xh.data());
          const T* dr = pd + r * d;
          const T* ur = dr;  // u = dy gain, or dy itself without a gain
          if (g) {
            for (std::size_t j = 0; j < d; ++j) u[j] = dr[j] * g[j];
            ur = u.data();
          }
          const T mu = simd::sum(ur, d) / T(d), mux = simd::dot(ur, xh.data(), d) / T(d), s = rstd[r];
          T* gr = pg + r * d;
          if (fresh)
            for (std::size_t j = 0; j < d; ++j) gr[j] = s * (ur[j] - mu - xh[j] * mux);
          else
            for (std::size_t j = 0; j < d; ++j) gr[j] += s * (ur[j] - mu - xh[j] * mux);
        }
      });
    }
    if (!affine) return;
    if (dx[1] && (!uses[0] || param_grads)) {  // else the per-sample rule builds it from the use
      bool fresh;
      ArrayT<T>& gg = dx[1].buffer(fresh);
      if (fresh) std::fill(gg.begin(), gg.end(), T(0));
      parallel::sum_pieces(rows, row_grain(d), d, gg.data(), [&](std::size_t r0, std::size_t r1, T* acc) {
        std::vector<T> xh(d);
        for (std::size_t r = r0; r < r1; ++r) {
          normalised_row(px, r, xh.data());
          const T* dr = pd + r * d;
          for (std::size_t j = 0; j < d; ++j) acc[j] += dr[j] * xh[j];
        }
      });
    }
    if (dx[2] && (!uses[1] || param_grads)) {
      bool fresh;
      ArrayT<T>& gs = dx[2].buffer(fresh);
      if (fresh) std::fill(gs.begin(), gs.end(), T(0));
      detail::add_column_sums(pd, rows, d, gs.data());
    }
  }

  /// y_dot = rstd (x_dot - mean(x_dot) - xhat mean(xhat x_dot)) gain + xhat gain_dot + shift_dot.
  ArrayT<T> jvp(Values<T> x, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    const std::size_t n = out.size();
    const T* px = x[0]->data();
    const T* g = affine ? x[1]->data() : nullptr;
    const T* xd = dot[0] ? dot[0]->data() : nullptr;
    const T* gd = affine && dot[1] ? dot[1]->data() : nullptr;
    const T* sd = affine && dot[2] ? dot[2]->data() : nullptr;
    parallel::for_range(rows, row_grain(d), [&](std::size_t r0, std::size_t r1) {
      std::vector<T> xh(d);
      for (std::size_t row = r0; row < r1; ++row) {
        normalised_row(px, row, xh.data());
        for (std::size_t t = 0; t < k; ++t) {
          T* yr = r.data() + t * n + row * d;
          if (xd) {
            const T* tr = xd + t * n + row * d;
            const T mt = simd::sum(tr, d) / T(d), mtx = simd::dot(tr, xh.data(), d) / T(d), s = rstd[row];
            for (std::size_t j = 0; j < d; ++j) yr[j] = s * (tr[j] - mt - xh[j] * mtx) * (g ? g[j] : T(1));
          } else {
            std::fill_n(yr, d, T(0));
          }
          if (gd)
            for (std::size_t j = 0; j < d; ++j) yr[j] += xh[j] * gd[t * d + j];
          if (sd)
            for (std::size_t j = 0; j < d; ++j) yr[j] += sd[t * d + j];
        }
      }
    });
    return r;
  }

  void on_record(TapeT<T>& tape, std::span<const std::shared_ptr<Node<T>>> in) override {
    if (!affine || !tape.records_uses()) return;
    param_grads = tape.param_grads();
    const Shape out = shape_of(in[0]->value);
    if (in[1]->is_parameter) {  // y = xhat * gain: the rule reads xhat, kept only for it
      auto xhat = std::make_shared<Node<T>>();
      xhat->value = ArrayT<T>::from_shape(in[0]->value.shape());
      const T* px = in[0]->value.data();
      T* ph = xhat->value.data();
      parallel::for_range(rows, row_grain(d), [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r) normalised_row(px, r, ph + r * d);
      });
      xhat->samples = in[0]->samples;
      uses[0] = detail::record_elementwise_use<T>(tape, in[1], xhat, true, false, out, name(), moved[0]);
    }
    if (in[2]->is_parameter)
      uses[1] = detail::record_elementwise_use<T>(tape, in[2], in[0], false, false, out, name(), moved[1]);
  }
  bool keeps_output_grad() const override { return uses[0] || uses[1]; }
  void keep_output_grad(std::shared_ptr<const ArrayT<T>> dout) override {
    for (int i = 0; i < 2; ++i)
      if (uses[i])
        uses[i]->delta = detail::moved_output_grad<T>(dout, moved[i]);
  }
};

}  // namespace

template <class T>
TensorT<T> layer_norm(const TensorT<T>& x, const TensorT<T>& gain, const TensorT<T>& shift, double eps) {
  if (!(eps > 0)) throw std::invalid_argument("layer_norm: eps must be > 0");
  if (gain.defined() != shift.defined())
    throw std::invalid_argument("layer_norm: give both a gain and a shift, or neither");
  auto op = std::make_unique<LayerNormOp<T>>(T(eps), gain.defined());
  if (gain.defined()) return apply<T>(std::move(op), {x, gain, shift});
  return apply<T>(std::move(op), {x});
}

#define DPGRAD_INSTANTIATE(T) \
  template TensorT<T> layer_norm(const TensorT<T>&, const TensorT<T>&, const TensorT<T>&, double);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
