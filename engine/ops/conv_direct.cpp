// conv2d_direct: a convolution that never stores its patch array. Each image's
// patches are built a block of positions at a time into a buffer that stays
// in cache, and small register-blocked kernels (engine/simd.hpp's, built for the
// baseline and for AVX2 and chosen at run time) multiply them with W (forward
// and jvp), with the output gradient (dW, and each sample's G_i for the
// per-sample rules) or, for dx, scatter dout W^T back onto the image.
// Where a layer's weight is small against its positions (a first layer's 8x8
// kernel over 196 positions) this replaces im2col's pass over memory and a
// skinny GEMM that spends its time packing.
#include <algorithm>
#include <vector>

#include "engine/blas.hpp"
#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/ops/conv_geom.hpp"
#include "engine/ops/param_uses.hpp"
#include "engine/parallel.hpp"
#include "engine/per_sample.hpp"
#include "engine/simd.hpp"
#include "engine/tape.hpp"

namespace dpgrad {
namespace {
using detail::ConvGeom;
using detail::shape_str;

/// Positions per block of patch rows: about 2^14 values (64 KB of floats).
std::size_t block_positions(const ConvGeom& g) {
  return std::clamp<std::size_t>((std::size_t(1) << 14) / std::max<std::size_t>(1, g.patch()), 1,
                                 std::max<std::size_t>(1, g.positions()));
}

/// For each of nw weights w_j (d, p) at w + j d p, with bias_j (p) at bias + j p
/// when bias is given: out_j (images, Ho, Wo, p) (+)= patches(x) w_j + bias_j,
/// out_j at out + j out_stride. Each image's patch blocks serve all nw weights.
template <class T>
void conv_forward(const T* x, std::size_t images, const ConvGeom& g, const T* w, const T* bias, std::size_t nw,
                  std::size_t p, bool accumulate, std::size_t out_stride, T* out) {
  const std::size_t d = g.patch(), positions = g.positions(), blk = block_positions(g);
  parallel::for_range(images, detail::image_grain(g), [&](std::size_t n0, std::size_t n1) {
    detail::ImagePatches<T> im(g);
    std::vector<T> rows(blk * d);
    for (std::size_t n = n0; n < n1; ++n) {
      im.load(x + n * g.image());
      for (std::size_t q0 = 0; q0 < positions; q0 += blk) {
        const std::size_t q1 = std::min(positions, q0 + blk);
        im.gather(q0, q1, rows.data());
        for (std::size_t j = 0; j < nw; ++j)
          simd::conv_forward_block(rows.data(), q1 - q0, d, w + j * d * p, p, bias ? bias + j * p : nullptr,
                                   accumulate, out + j * out_stride + (n * positions + q0) * p);
      }
    }
  });
}

/// gw (d, p) += sum over images [0, images) of patches(x_n)^T dout_n, one thread;
/// x and dout start at the first image.
template <class T>
void conv_weight_grad(const T* x, std::size_t images, const ConvGeom& g, const T* dout, std::size_t p, T* gw) {
  const std::size_t d = g.patch(), positions = g.positions(), blk = block_positions(g);
  detail::ImagePatches<T> im(g);
  std::vector<T> rows(blk * d);
  for (std::size_t n = 0; n < images; ++n) {
    im.load(x + n * g.image());
    for (std::size_t q0 = 0; q0 < positions; q0 += blk) {
      const std::size_t q1 = std::min(positions, q0 + blk);
      im.gather(q0, q1, rows.data());
      simd::conv_weight_grad_block(rows.data(), q1 - q0, d, dout + (n * positions + q0) * p, p, gw);
    }
  }
}

/// dx (images, H, W, C) += col2im(dout W^T), a block of positions at a time.
template <class T>
void conv_input_grad(const T* dout, std::size_t images, const ConvGeom& g, const T* w, std::size_t p, T* dx) {
  const std::size_t d = g.patch(), positions = g.positions(), blk = block_positions(g);
  parallel::for_range(images, detail::image_grain(g), [&](std::size_t n0, std::size_t n1) {
    detail::ImagePatches<T> im(g);
    std::vector<T> rows(blk * d);
    for (std::size_t n = n0; n < n1; ++n) {
      im.begin_scatter(dx + n * g.image());
      for (std::size_t q0 = 0; q0 < positions; q0 += blk) {
        const std::size_t q1 = std::min(positions, q0 + blk);
        blas::gemm<T>(false, true, q1 - q0, d, p, T(1), dout + (n * positions + q0) * p, w, T(0), rows.data());
        im.scatter(q0, q1, rows.data());
      }
      im.end_scatter(dx + n * g.image());
    }
  });
}

template <class T>
struct DirectConvOp final : Op<T> {
  std::size_t kh = 0, kw = 0, sh = 0, sw = 0;
  Pad2d pad;
  bool has_bias = false;
  ConvGeom g;
  std::size_t p = 0;  // output channels
  detail::WeightBiasUses<T> uses;
  const char* name() const override { return "conv2d_direct"; }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    return detail::rows_of_first(in, x);
  }

  ArrayT<T> forward(Values<T> x) override {
    g = detail::conv_geometry(shape_of(*x[0]), kh, kw, sh, sw, pad, "conv2d");
    const ArrayT<T>& w = *x[1];
    if (w.dimension() != 2 || w.shape()[0] != g.patch())
      throw std::invalid_argument("conv2d: weight " + shape_str(shape_of(w)) + " must be (kh*kw*C, Cout) with kh*kw*C = " +
                                  std::to_string(g.patch()) + " for x " + shape_str(shape_of(*x[0])));
    p = w.shape()[1];
    if (has_bias && (x[2]->dimension() != 1 || x[2]->shape()[0] != p))
      throw std::invalid_argument("conv2d: bias " + shape_str(shape_of(*x[2])) + " must be (" + std::to_string(p) + ")");
    ArrayT<T> out = ArrayT<T>::from_shape({g.b, g.ho, g.wo, p});
    conv_forward(x[0]->data(), g.b, g, w.data(), has_bias ? x[2]->data() : nullptr, 1, p, false, 0, out.data());
    return out;
  }

  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>&, Slots<T> dx) override {
    bool fresh;
    if (dx[0]) {  // dx = col2im(dout W^T)
      ArrayT<T>& gx = dx[0].buffer(fresh);
      if (fresh) gx.fill(T(0));
      conv_input_grad(dout.data(), g.b, g, x[1]->data(), p, gx.data());
    }
    if (dx[1] && uses.wants_weight_grad()) {  // dW = sum over images of patches^T dout
      ArrayT<T>& gw = dx[1].buffer(fresh);
      if (fresh) gw.fill(T(0));
      const T* xp = x[0]->data();
      const std::size_t per_image = g.positions() * p;
      parallel::sum_pieces(g.b, detail::image_grain(g), g.patch() * p, gw.data(), [&](std::size_t n0, std::size_t n1, T* acc) {
        conv_weight_grad(xp + n0 * g.image(), n1 - n0, g, dout.data() + n0 * per_image, p, acc);
      });
    }
    if (has_bias && dx[2] && uses.wants_bias_grad()) {  // db = column sums of dout
      ArrayT<T>& gb = dx[2].buffer(fresh);
      if (fresh) gb.fill(T(0));
      detail::add_column_sums(dout.data(), g.b * g.positions(), p, gb.data());
    }
  }

  bool keeps_output_grad() const override { return uses.keeps_output_grad(); }
  void keep_output_grad(std::shared_ptr<const ArrayT<T>> dout) override { uses.keep_output_grad(dout); }

  /// out_dot_j = conv(x, W_dot_j) + b_dot_j + conv(x_dot_j, W)
  ArrayT<T> jvp(Values<T> x, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    const std::size_t n_out = out.size();
    bool written = false;
    if (dot[1]) {  // all k weight tangents over one pass of patches, with the bias tangents as start
      const T* bd = has_bias && dot[2] ? dot[2]->data() : nullptr;
      conv_forward(x[0]->data(), g.b, g, dot[1]->data(), bd, k, p, false, n_out, r.data());
      written = true;
    }
    if (dot[0]) {  // the k x tangents are k * B more images
      conv_forward(dot[0]->data(), k * g.b, g, x[1]->data(), static_cast<const T*>(nullptr), 1, p, written, 0,
                   r.data());
      written = true;
    }
    if (!written) r.fill(T(0));
    if (has_bias && dot[2] && !dot[1])  // else added with the weight tangents
      detail::add_bias_tangents(dot[2]->data(), k, g.b * g.positions(), p, r.data());
    return r;
  }

  void on_record(TapeT<T>& tape, std::span<const std::shared_ptr<Node<T>>> in) override {
    uses.record(tape, in, UseKind::conv, has_bias, name());
    if (uses.w)  // G_i from the example's images, which the use keeps alive as its input
      uses.w->sample_gradient = [x = in[0], use = uses.w, geom = g, p = p](std::size_t i, std::size_t batch, T* gw) {
        const std::size_t views = geom.b / batch, n0 = i * views;
        conv_weight_grad(x->value.data() + n0 * geom.image(), views, geom,
                         use->delta->data() + n0 * geom.positions() * p, p, gw);
      };
  }
};

}  // namespace

bool direct_conv_fits(std::size_t patch, std::size_t cout, std::size_t positions) {
  return gradient_at_most(8, patch, cout, positions) && patch * cout <= (std::size_t(1) << 14);
}

std::size_t direct_conv_vector_bytes() { return simd::vector_bytes(); }

bool direct_conv_pays(std::size_t patch, std::size_t cout, std::size_t positions) {
  // with 16-byte vectors (the x86-64-v2 baseline's kernels) the patches route, on
  // OpenBLAS's kernels for the CPU, was faster (docs/per-sample.md, "Convolutions: two routes")
  return direct_conv_vector_bytes() >= 32 && direct_conv_fits(patch, cout, positions);
}

template <class T>
TensorT<T> conv2d_direct(const TensorT<T>& x, const TensorT<T>& w, const TensorT<T>& b, std::size_t kernel_h,
                         std::size_t kernel_w, std::size_t stride_h, std::size_t stride_w, Pad2d pad) {
  auto op = std::make_unique<DirectConvOp<T>>();
  op->kh = kernel_h;
  op->kw = kernel_w;
  op->sh = stride_h;
  op->sw = stride_w;
  op->pad = pad;
  op->has_bias = b.defined();
  if (op->has_bias) return apply<T>(std::move(op), {x, w, b});
  return apply<T>(std::move(op), {x, w});
}

#define DPGRAD_INSTANTIATE(T)                                                                                      \
  template TensorT<T> conv2d_direct(const TensorT<T>&, const TensorT<T>&, const TensorT<T>&, std::size_t, std::size_t, \
                                    std::size_t, std::size_t, Pad2d);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
