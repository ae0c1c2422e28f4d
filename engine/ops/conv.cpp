// im2col: image patches as rows, so that a convolution is one GEMM (linear) and
// inherits linear's per-sample rules. The op is linear in x: its vjp is col2im
// (scatter-add) and its jvp is im2col of the k stacked tangents. Also the
// padding helpers and the conv2d composite.
#include "engine/conv.hpp"

#include <algorithm>
#include <vector>

#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
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

namespace {
using detail::shape_str;
using std::ptrdiff_t;

/// The geometry of one im2col application, checked against x (B, H, W, C).
struct ConvGeom {
  std::size_t b = 0, h = 0, w = 0, c = 0, kh = 0, kw = 0, sh = 0, sw = 0, ho = 0, wo = 0;
  Pad2d pad;
  std::size_t image() const { return h * w * c; }
  std::size_t patch() const { return kh * kw * c; }
  std::size_t cols() const { return ho * wo * patch(); }  // per image
};

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

/// Walks every (image, output position, window row) of images [n0, n1) and hands
/// the kernel the valid column range [j0, j1) of that row, or j0 = j1 when the
/// row is padding. f(image offset of x at column j0 or 0, patch-row offset, j0, j1).
template <class F>
void for_each_window_row(const ConvGeom& g, std::size_t n0, std::size_t n1, F&& f) {
  const ptrdiff_t h = ptrdiff_t(g.h), w = ptrdiff_t(g.w), kw = ptrdiff_t(g.kw);
  const std::size_t row = g.kw * g.c;
  std::size_t dst = n0 * g.cols();
  for (std::size_t n = n0; n < n1; ++n) {
    const std::size_t src = n * g.image();
    for (std::size_t oy = 0; oy < g.ho; ++oy)
      for (std::size_t ox = 0; ox < g.wo; ++ox) {
        const ptrdiff_t x0 = ptrdiff_t(ox * g.sw) - ptrdiff_t(g.pad.left);  // column of window column 0
        const ptrdiff_t j0 = std::clamp<ptrdiff_t>(-x0, 0, kw);
        const ptrdiff_t j1 = std::clamp<ptrdiff_t>(w - x0, j0, kw);
        for (std::size_t i = 0; i < g.kh; ++i, dst += row) {
          const ptrdiff_t iy = ptrdiff_t(oy * g.sh + i) - ptrdiff_t(g.pad.top);
          if (iy < 0 || iy >= h || j0 == j1) f(std::size_t(0), dst, 0, 0);
          else f(src + std::size_t(iy * w + x0 + j0) * g.c, dst, std::size_t(j0), std::size_t(j1));
        }
      }
  }
}

/// Images per parallel piece: about 2^16 patch entries each.
std::size_t image_grain(const ConvGeom& g) { return std::max<std::size_t>(1, (std::size_t(1) << 16) / std::max<std::size_t>(1, g.cols())); }

/// One window row: n values (Row of them when Row > 0, known at compile time).
template <std::size_t Row, class T>
inline void copy_row(const T* __restrict s, T* __restrict d, std::size_t n) {
  if constexpr (Row > 0)
    for (std::size_t l = 0; l < Row; ++l) d[l] = s[l];
  else
    for (std::size_t l = 0; l < n; ++l) d[l] = s[l];
}

/// Images [n0, n1) of im2col_kernel, written out as loops rather than through
/// for_each_window_row: conv1's window rows are 8 values, so the work per row
/// must be a handful of instructions (the walker's per-row call cost 6x the
/// copy). A padded image is first copied into a zero-bordered buffer, so every
/// window lies inside it and copies its kh rows straight. Row is kw * C when it
/// is known at compile time, else 0.
template <std::size_t Row, class T>
void im2col_images(const T* x, std::size_t n0, std::size_t n1, const ConvGeom& g, T* cols) {
  const std::size_t row = Row ? Row : g.kw * g.c, c = g.c;
  const std::size_t ph = g.h + g.pad.top + g.pad.bottom, pw = g.w + g.pad.left + g.pad.right, line = pw * c;
  const bool padded = ph != g.h || pw != g.w;
  std::vector<T> frame(padded ? ph * line : 0, T(0));  // its border stays zero
  T* d = cols + n0 * g.cols();
  for (std::size_t n = n0; n < n1; ++n) {
    const T* img = x + n * g.image();
    if (padded) {
      for (std::size_t y = 0; y < g.h; ++y)
        std::copy_n(img + y * g.w * c, g.w * c, frame.data() + ((y + g.pad.top) * pw + g.pad.left) * c);
      img = frame.data();
    }
    for (std::size_t oy = 0; oy < g.ho; ++oy)
      for (std::size_t ox = 0; ox < g.wo; ++ox) {
        const T* s = img + (oy * g.sh * pw + ox * g.sw) * c;
        for (std::size_t i = 0; i < g.kh; ++i, d += row, s += line) copy_row<Row>(s, d, row);
      }
  }
}

/// Images [n0, n1) of col2im_kernel.
template <class T>
void col2im_images(const T* cols, std::size_t n0, std::size_t n1, const ConvGeom& g, T* dx) {
  const std::size_t c = g.c;
  for_each_window_row(g, n0, n1, [&](std::size_t to, std::size_t from, std::size_t j0, std::size_t j1) {
    const T* s = cols + from + j0 * c;
    T* d = dx + to;
    for (std::size_t l = 0, n = (j1 - j0) * c; l < n; ++l) d[l] += s[l];
  });
}

/// cols (images, Ho, Wo, kh*kw*C) = patches of x (images, H, W, C).
template <class T>
void im2col_kernel(const T* x, std::size_t images, const ConvGeom& g, T* cols) {
  parallel::for_range(images, image_grain(g), [&](std::size_t n0, std::size_t n1) {
    switch (g.kw * g.c) {
      case 4: im2col_images<4>(x, n0, n1, g, cols); break;
      case 8: im2col_images<8>(x, n0, n1, g, cols); break;
      case 16: im2col_images<16>(x, n0, n1, g, cols); break;
      default: im2col_images<0>(x, n0, n1, g, cols);
    }
  });
}

/// dx (images, H, W, C) += col2im(cols): every patch entry added back to its
/// pixel. Images are independent, so pieces of images run in parallel.
template <class T>
void col2im_kernel(const T* cols, std::size_t images, const ConvGeom& g, T* dx) {
  parallel::for_range(images, image_grain(g), [&](std::size_t n0, std::size_t n1) { col2im_images(cols, n0, n1, g, dx); });
}

template <class T>
struct Im2colOp final : Op<T> {
  std::size_t kh = 0, kw = 0, sh = 0, sw = 0;
  Pad2d pad;
  ConvGeom g;
  const char* name() const override { return "im2col"; }

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
                  std::size_t kernel_w, std::size_t stride_h, std::size_t stride_w, Pad2d pad) {
  ConvGeom g = conv_geometry(x.shape(), kernel_h, kernel_w, stride_h, stride_w, pad, "conv2d");
  Shape ws = w.shape();
  if (ws.size() != 2 || ws[0] != g.patch())
    throw std::invalid_argument("conv2d: weight " + shape_str(ws) + " must be (kh*kw*C, Cout) with kh*kw*C = " +
                                std::to_string(g.patch()) + " for x " + shape_str(x.shape()));
  return linear(im2col(x, kernel_h, kernel_w, stride_h, stride_w, pad), w, b);  // (B, Ho, Wo, Cout)
}

#define DPGRAD_INSTANTIATE(T)                                                                                 \
  template TensorT<T> im2col(const TensorT<T>&, std::size_t, std::size_t, std::size_t, std::size_t, Pad2d); \
  template TensorT<T> conv2d(const TensorT<T>&, const TensorT<T>&, const TensorT<T>&, std::size_t, std::size_t, \
                             std::size_t, std::size_t, Pad2d);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
