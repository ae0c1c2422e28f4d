// im2col: image patches as rows, so that a convolution is one GEMM (linear) and
// inherits linear's per-sample rules. The op is linear in x: its vjp is col2im
// (scatter-add) and its jvp is im2col of the k stacked tangents. Also the
// padding helpers and the conv2d composite.
#include "engine/conv.hpp"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/ops/conv_geom.hpp"
#include "engine/parallel.hpp"

namespace dpgrad {

Pad1d same_padding(std::size_t in, std::size_t kernel, std::size_t stride) {
  if (kernel == 0 || stride == 0)
    throw std::invalid_argument("same padding: kernel (" + std::to_string(kernel) + ") and stride (" +
                                std::to_string(stride) + ") must be positive");
  std::size_t out = (in + stride - 1) / stride;
  std::size_t need = out == 0 ? 0 : (out - 1) * stride + kernel;
  std::size_t total = need > in ? need - in : 0;
  return {total / 2, total - total / 2};
}

Pad2d resolve_padding(const Padding& padding, std::size_t h, std::size_t w, std::size_t kh, std::size_t kw,
                      std::size_t sh, std::size_t sw) {
  switch (padding.mode) {
    case PaddingMode::valid: return {};
    case PaddingMode::explicit_pads: return padding.pads;
    case PaddingMode::same: {
      Pad1d v = same_padding(h, kh, sh), u = same_padding(w, kw, sw);
      return {v.before, v.after, u.before, u.after};
    }
  }
  throw std::invalid_argument("resolve_padding: unknown padding mode");
}

std::size_t window_output_size(std::size_t in, std::size_t kernel, std::size_t stride, std::size_t before,
                               std::size_t after) {
  if (kernel == 0 || stride == 0)
    throw std::invalid_argument("window: kernel (" + std::to_string(kernel) + ") and stride (" +
                                std::to_string(stride) + ") must be positive");
  std::size_t padded = in + before + after;
  if (padded < kernel)
    throw std::invalid_argument("window: kernel " + std::to_string(kernel) + " is larger than the padded input " +
                                std::to_string(padded) + " (size " + std::to_string(in) + " + padding " +
                                std::to_string(before) + " + " + std::to_string(after) + ")");
  return (padded - kernel) / stride + 1;
}

namespace detail {
ConvGeom conv_geometry(const Shape& xs, std::size_t kh, std::size_t kw, std::size_t sh, std::size_t sw, Pad2d pad,
                       const char* op) {
  if (xs.size() != 4)
    throw std::invalid_argument(std::string(op) + ": x must be (B, H, W, C), got " + shape_str(xs));
  if (kh == 0 || kw == 0 || sh == 0 || sw == 0)
    throw std::invalid_argument(std::string(op) + ": kernel " + std::to_string(kh) + "x" + std::to_string(kw) +
                                " and stride " + std::to_string(sh) + "x" + std::to_string(sw) + " must be positive");
  ConvGeom g{xs[0], xs[1], xs[2], xs[3], kh, kw, sh, sw, 0, 0, pad};
  if (g.h + pad.top + pad.bottom < kh || g.w + pad.left + pad.right < kw)
    throw std::invalid_argument(std::string(op) + ": kernel " + std::to_string(kh) + "x" + std::to_string(kw) +
                                " does not fit the padded image of x " + shape_str(xs) + " (pads top " +
                                std::to_string(pad.top) + ", bottom " + std::to_string(pad.bottom) + ", left " +
                                std::to_string(pad.left) + ", right " + std::to_string(pad.right) + ")");
  g.ho = window_output_size(g.h, kh, sh, pad.top, pad.bottom);
  g.wo = window_output_size(g.w, kw, sw, pad.left, pad.right);
  return g;
}

}  // namespace detail

namespace {
using detail::ConvGeom;
using detail::conv_geometry;
using detail::image_grain;
using detail::shape_str;

/// Patches of images [0, images) in parallel pieces (images are independent),
/// or (ToImage) patches added back onto the images.
template <bool ToImage, class T>
void patch_kernel(const T* src, std::size_t images, const ConvGeom& g, T* dst) {
  parallel::for_range(images, image_grain(g), [&](std::size_t n0, std::size_t n1) {
    detail::ImagePatches<T> im(g);
    for (std::size_t n = n0; n < n1; ++n) {
      if constexpr (ToImage) {
        im.begin_scatter(dst + n * g.image());
        im.scatter(0, g.positions(), src + n * g.cols());
        im.end_scatter(dst + n * g.image());
      } else {
        im.load(src + n * g.image());
        im.gather(0, g.positions(), dst + n * g.cols());
      }
    }
  });
}

/// cols (images, Ho, Wo, kh*kw*C) = patches of x (images, H, W, C).
template <class T>
void im2col_kernel(const T* x, std::size_t images, const ConvGeom& g, T* cols) {
  patch_kernel<false>(x, images, g, cols);
}

/// dx (images, H, W, C) += col2im(cols): every patch entry added back to its pixel.
template <class T>
void col2im_kernel(const T* cols, std::size_t images, const ConvGeom& g, T* dx) {
  patch_kernel<true>(cols, images, g, dx);
}

template <class T>
struct Im2colOp final : Op<T> {
  std::size_t kh = 0, kw = 0, sh = 0, sw = 0;
  Pad2d pad;
  ConvGeom g;
  const char* name() const override { return "im2col"; }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    return detail::rows_of_first(in, x);
  }

  ArrayT<T> forward(Values<T> x) override {
    g = conv_geometry(shape_of(*x[0]), kh, kw, sh, sw, pad, "im2col");
    ArrayT<T> out = ArrayT<T>::from_shape({g.b, g.ho, g.wo, g.patch()});
    im2col_kernel(x[0]->data(), g.b, g, out.data());
    return out;
  }
  /// dx = col2im(dout)
  void vjp(const ArrayT<T>& dout, Values<T>, const ArrayT<T>&, Slots<T> dx) override {
    if (!dx[0]) return;
    bool fresh;
    ArrayT<T>& gx = dx[0].buffer(fresh);
    if (fresh) gx.fill(T(0));
    col2im_kernel(dout.data(), g.b, g, gx.data());
  }
  /// out_dot = im2col(x_dot): the k tangents are k * B more images.
  ArrayT<T> jvp(Values<T>, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    if (!dot[0]) r.fill(T(0));
    else im2col_kernel(dot[0]->data(), k * g.b, g, r.data());
    return r;
  }
};

}  // namespace

template <class T>
TensorT<T> im2col(const TensorT<T>& x, std::size_t kernel_h, std::size_t kernel_w, std::size_t stride_h,
                  std::size_t stride_w, Pad2d pad) {
  auto op = std::make_unique<Im2colOp<T>>();
  op->kh = kernel_h;
  op->kw = kernel_w;
  op->sh = stride_h;
  op->sw = stride_w;
  op->pad = pad;
  return apply<T>(std::move(op), {x});
}

template <class T>
TensorT<T> conv2d(const TensorT<T>& x, const TensorT<T>& w, const TensorT<T>& b, std::size_t kernel_h,
                  std::size_t kernel_w, std::size_t stride_h, std::size_t stride_w, Pad2d pad, ConvMethod method) {
  ConvGeom g = conv_geometry(x.shape(), kernel_h, kernel_w, stride_h, stride_w, pad, "conv2d");
  Shape ws = w.shape();
  if (ws.size() != 2 || ws[0] != g.patch())
    throw std::invalid_argument("conv2d: weight " + shape_str(ws) + " must be (kh*kw*C, Cout) with kh*kw*C = " +
                                std::to_string(g.patch()) + " for x " + shape_str(x.shape()));
  if (method == ConvMethod::automatic)
    method = direct_conv_pays(g.patch(), ws[1], g.positions()) ? ConvMethod::direct : ConvMethod::patches;
  if (method == ConvMethod::direct) return conv2d_direct(x, w, b, kernel_h, kernel_w, stride_h, stride_w, pad);
  return linear(im2col(x, kernel_h, kernel_w, stride_h, stride_w, pad), w, b);  // (B, Ho, Wo, Cout)
}

#define DPGRAD_INSTANTIATE(T)                                                                                 \
  template TensorT<T> im2col(const TensorT<T>&, std::size_t, std::size_t, std::size_t, std::size_t, Pad2d); \
  template TensorT<T> conv2d(const TensorT<T>&, const TensorT<T>&, const TensorT<T>&, std::size_t, std::size_t, \
                             std::size_t, std::size_t, Pad2d, ConvMethod);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
