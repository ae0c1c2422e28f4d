// Pooling of channels-last images. max_pool2d over 'valid' windows: the forward
// pass keeps each output's argmax (its element's index in the window, 2 bytes);
// the vjp scatters dout there and the jvp gathers the tangents from there.
// Ties: the first maximum (row-major in the window) wins. avg_pool2d over
// zero-padded windows: linear, so its jvp is itself and its vjp spreads dout back.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/conv.hpp"
#include "engine/ops/common.hpp"
#include "engine/simd.hpp"
#include "engine/parallel.hpp"

namespace dpgrad {
namespace {
using detail::shape_str;

/// Where the windows are. Output row r = (image, oy) is cut into pieces of
/// `run` outputs whose inputs, for one window element, are one contiguous run
/// of x: the whole row (Wo * C values) when the stride across is 1, else one
/// output position (C values).
struct PoolGeom {
  std::size_t b = 0, h = 0, w = 0, c = 0, kh = 0, kw = 0, sh = 0, sw = 0, ho = 0, wo = 0;
  std::size_t run() const { return sw == 1 ? wo * c : c; }
  std::size_t per_image() const { return ho * wo * c; }
};

/// Calls f(out offset, x offset, len, index) for every piece of the outputs of
/// images [n0, n1) and every window element in row-major window order (index:
/// the element's place in its window, 0 first). Output (piece, l) reads
/// x[x offset + l].
template <class F>
void for_each_window_element(const PoolGeom& g, std::size_t n0, std::size_t n1, F&& f) {
  const std::size_t run = g.run(), pieces = g.wo * g.c / run;
  for (std::size_t n = n0; n < n1; ++n)
    for (std::size_t oy = 0; oy < g.ho; ++oy)
      for (std::size_t piece = 0; piece < pieces; ++piece) {
        const std::size_t o = (n * g.ho + oy) * g.wo * g.c + piece * run;
        const std::size_t ox0 = piece * run / g.c;
        const std::size_t corner = ((n * g.h + oy * g.sh) * g.w + ox0 * g.sw) * g.c;
        for (std::size_t i = 0; i < g.kh; ++i)
          for (std::size_t j = 0; j < g.kw; ++j)
            f(o, corner + (i * g.w + j) * g.c, run, std::uint16_t(i * g.kw + j));
      }
}

/// Images per parallel piece: about 2^14 outputs each.
std::size_t pool_grain(const PoolGeom& g) {
  return std::max<std::size_t>(1, (std::size_t(1) << 14) / std::max<std::size_t>(1, g.per_image()));
}

template <class T>
struct MaxPoolOp final : Op<T> {
  std::size_t kh = 0, kw = 0, sh = 0, sw = 0;
  PoolGeom g;
  std::vector<std::uint16_t> argmax;  // per output: its window element, row-major
  const char* name() const override { return "max_pool2d"; }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    return detail::rows_of_first(in, x);
  }

  ArrayT<T> forward(Values<T> xv) override {
    const ArrayT<T>& x = *xv[0];
    Shape xs = shape_of(x);
    if (xs.size() != 4) throw std::invalid_argument("max_pool2d: x must be (B, H, W, C), got " + shape_str(xs));
    if (kh == 0 || kw == 0 || sh == 0 || sw == 0)
      throw std::invalid_argument("max_pool2d: kernel " + std::to_string(kh) + "x" + std::to_string(kw) +
                                  " and stride " + std::to_string(sh) + "x" + std::to_string(sw) + " must be positive");
    const std::size_t b = xs[0], h = xs[1], w = xs[2], c = xs[3];
    if (h < kh || w < kw)
      throw std::invalid_argument("max_pool2d: window " + std::to_string(kh) + "x" + std::to_string(kw) +
                                  " is larger than the image of x " + shape_str(xs));
    if (kh * kw > 65536)
      throw std::invalid_argument("max_pool2d: window " + std::to_string(kh) + "x" + std::to_string(kw) +
                                  " has more than 65536 elements");
    g = PoolGeom{b, h, w, c, kh, kw, sh, sw, (h - kh) / sh + 1, (w - kw) / sw + 1};
    ArrayT<T> out = ArrayT<T>::from_shape({b, g.ho, g.wo, c});
    argmax.assign(out.size(), 0);
    const T* xp = x.data();
    T* op = out.data();
    std::uint16_t* ap = argmax.data();
    parallel::for_range(b, pool_grain(g), [&](std::size_t n0, std::size_t n1) {
      for_each_window_element(g, n0, n1, [&](std::size_t o, std::size_t xo, std::size_t len, std::uint16_t e) {
        if (e == 0) std::copy_n(xp + xo, len, op + o);
        else simd::max_into(xp + xo, op + o, ap + o, len, e);  // strict: the first max wins, and a NaN first element stays
      });
    });
    return out;
  }
  /// dx[argmax(o)] += dout[o]. Windows of one image overlap, images do not:
  /// pieces of images run in parallel.
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>& out, Slots<T> dx) override {
    if (!dx[0]) return;
    bool fresh;
    ArrayT<T>& gx = dx[0].buffer(fresh);
    if (fresh) gx.fill(T(0));
    T* gp = gx.data();
    const T* dp = dout.data();
    const std::uint16_t* ap = argmax.data();
    parallel::for_range(g.b, pool_grain(g), [&](std::size_t n0, std::size_t n1) {
      for_each_window_element(g, n0, n1, [&](std::size_t o, std::size_t xo, std::size_t len, std::uint16_t e) {
        simd::add_where(dp + o, ap + o, e, gp + xo, len);
      });
    });
  }
  /// out_dot[j, o] = x_dot[j, argmax(o)]
  ArrayT<T> jvp(Values<T> x, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    if (!dot[0]) {
      r.fill(T(0));
      return r;
    }
    const std::size_t n_out = out.size(), n_in = x[0]->size();
    T* rp = r.data();
    const T* tp = dot[0]->data();
    const std::uint16_t* ap = argmax.data();
    parallel::for_range(g.b, pool_grain(g), [&](std::size_t n0, std::size_t n1) {
      for_each_window_element(g, n0, n1, [&](std::size_t o, std::size_t xo, std::size_t len, std::uint16_t e) {
        for (std::size_t j = 0; j < k; ++j) simd::copy_where(tp + j * n_in + xo, ap + o, e, rp + j * n_out + o, len);
      });
    });
    return r;
  }
};

/// Average pooling's geometry: windows over the zero-padded image, and each
/// output position's divisor.
struct AvgGeom {
  std::size_t h = 0, w = 0, c = 0, kh = 0, kw = 0, sh = 0, sw = 0, ho = 0, wo = 0;
  Pad2d pad;
  std::vector<double> inv_count;  // (Ho * Wo): 1 / the window's divisor
  /// The window of output (oy, ox) clipped to the image: rows [y0, y1), columns [x0, x1).
  void window(std::size_t oy, std::size_t ox, std::size_t& y0, std::size_t& y1, std::size_t& x0, std::size_t& x1) const {
    const std::ptrdiff_t ty = std::ptrdiff_t(oy * sh) - std::ptrdiff_t(pad.top);
    const std::ptrdiff_t tx = std::ptrdiff_t(ox * sw) - std::ptrdiff_t(pad.left);
    y0 = std::size_t(std::max<std::ptrdiff_t>(ty, 0));
    y1 = std::size_t(std::clamp<std::ptrdiff_t>(ty + std::ptrdiff_t(kh), 0, std::ptrdiff_t(h)));
    x0 = std::size_t(std::max<std::ptrdiff_t>(tx, 0));
    x1 = std::size_t(std::clamp<std::ptrdiff_t>(tx + std::ptrdiff_t(kw), 0, std::ptrdiff_t(w)));
    y1 = std::max(y1, y0);
    x1 = std::max(x1, x0);
  }
};

/// out (n, Ho, Wo, C) = the window means of x (n, H, W, C); Back: the adjoint,
/// x += dout spread over the windows (x and out swap roles).
template <bool Back, class T>
void avg_pool_kernel(const AvgGeom& g, std::size_t n, const T* in, T* out) {
  const std::size_t per_image = g.ho * g.wo * g.c;
  parallel::for_range(n, std::max<std::size_t>(1, (std::size_t(1) << 14) / std::max<std::size_t>(1, per_image)),
                      [&](std::size_t n0, std::size_t n1) {
    for (std::size_t b = n0; b < n1; ++b)
      for (std::size_t oy = 0; oy < g.ho; ++oy)
        for (std::size_t ox = 0; ox < g.wo; ++ox) {
          std::size_t y0, y1, x0, x1;
          g.window(oy, ox, y0, y1, x0, x1);
          const T f = T(g.inv_count[oy * g.wo + ox]);
          if constexpr (!Back) {
            T* __restrict o = out + ((b * g.ho + oy) * g.wo + ox) * g.c;
            std::fill_n(o, g.c, T(0));
            for (std::size_t y = y0; y < y1; ++y)
              for (std::size_t x = x0; x < x1; ++x) {
                const T* __restrict v = in + ((b * g.h + y) * g.w + x) * g.c;
                for (std::size_t l = 0; l < g.c; ++l) o[l] += v[l];
              }
            for (std::size_t l = 0; l < g.c; ++l) o[l] *= f;
          } else {  // in: dout (n, Ho, Wo, C); out: dx (n, H, W, C)
            const T* __restrict u = in + ((b * g.ho + oy) * g.wo + ox) * g.c;
            for (std::size_t y = y0; y < y1; ++y)
              for (std::size_t x = x0; x < x1; ++x) {
                T* __restrict d = out + ((b * g.h + y) * g.w + x) * g.c;
                for (std::size_t l = 0; l < g.c; ++l) d[l] += f * u[l];
              }
          }
        }
  });
}

template <class T>
struct AvgPoolOp final : Op<T> {
  std::size_t kh = 0, kw = 0, sh = 0, sw = 0;
  Pad2d pad;
  bool count_include_pad = true;
  AvgGeom g;
  const char* name() const override { return "avg_pool2d"; }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    return detail::rows_of_first(in, x);
  }
  ArrayT<T> forward(Values<T> xv) override {
    const Shape xs = shape_of(*xv[0]);
    if (xs.size() != 4) throw std::invalid_argument("avg_pool2d: x must be (B, H, W, C), got " + shape_str(xs));
    if (pad.top >= kh || pad.bottom >= kh || pad.left >= kw || pad.right >= kw)
      throw std::invalid_argument("avg_pool2d: padding must be smaller than the " + std::to_string(kh) + "x" +
                                  std::to_string(kw) + " window");
    g = AvgGeom{xs[1], xs[2], xs[3], kh, kw, sh, sw, 0, 0, pad, {}};
    g.ho = window_output_size(g.h, kh, sh, pad.top, pad.bottom);
    g.wo = window_output_size(g.w, kw, sw, pad.left, pad.right);
    g.inv_count.resize(g.ho * g.wo);
    for (std::size_t oy = 0; oy < g.ho; ++oy)
      for (std::size_t ox = 0; ox < g.wo; ++ox) {
        std::size_t y0, y1, x0, x1;
        g.window(oy, ox, y0, y1, x0, x1);
        const std::size_t n = count_include_pad ? kh * kw : (y1 - y0) * (x1 - x0);
        g.inv_count[oy * g.wo + ox] = n == 0 ? 0.0 : 1.0 / double(n);
      }
    ArrayT<T> out = ArrayT<T>::from_shape({xs[0], g.ho, g.wo, g.c});
    avg_pool_kernel<false>(g, xs[0], xv[0]->data(), out.data());
    return out;
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>&, Slots<T> dx) override {
    if (!dx[0]) return;
    bool fresh;
    ArrayT<T>& gx = dx[0].buffer(fresh);
    if (fresh) gx.fill(T(0));
    avg_pool_kernel<true>(g, x[0]->shape()[0], dout.data(), gx.data());
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    avg_pool_kernel<false>(g, k * x[0]->shape()[0], dot[0]->data(), r.data());
    return r;
  }
};

}  // namespace

template <class T>
TensorT<T> avg_pool2d(const TensorT<T>& x, std::size_t kernel_h, std::size_t kernel_w, std::size_t stride_h,
                      std::size_t stride_w, Pad2d pad, bool count_include_pad) {
  if (kernel_h == 0 || kernel_w == 0 || stride_h == 0 || stride_w == 0)
    throw std::invalid_argument("avg_pool2d: kernel " + std::to_string(kernel_h) + "x" + std::to_string(kernel_w) +
                                " and stride " + std::to_string(stride_h) + "x" + std::to_string(stride_w) +
                                " must be positive");
  auto op = std::make_unique<AvgPoolOp<T>>();
  op->kh = kernel_h;
  op->kw = kernel_w;
  op->sh = stride_h;
  op->sw = stride_w;
  op->pad = pad;
  op->count_include_pad = count_include_pad;
  return apply<T>(std::move(op), {x});
}

template TensorT<float> avg_pool2d(const TensorT<float>&, std::size_t, std::size_t, std::size_t, std::size_t, Pad2d,
                                   bool);
template TensorT<double> avg_pool2d(const TensorT<double>&, std::size_t, std::size_t, std::size_t, std::size_t, Pad2d,
                                    bool);

template <class T>
TensorT<T> max_pool2d(const TensorT<T>& x, std::size_t kernel_h, std::size_t kernel_w, std::size_t stride_h,
                      std::size_t stride_w) {
  auto op = std::make_unique<MaxPoolOp<T>>();
  op->kh = kernel_h;
  op->kw = kernel_w;
  op->sh = stride_h;
  op->sw = stride_w;
  return apply<T>(std::move(op), {x});
}

template TensorT<float> max_pool2d(const TensorT<float>&, std::size_t, std::size_t, std::size_t, std::size_t);
template TensorT<double> max_pool2d(const TensorT<double>&, std::size_t, std::size_t, std::size_t, std::size_t);

}  // namespace dpgrad
