// max_pool2d over 'valid' windows of channels-last images. The forward pass
// keeps each output's argmax (its element's index in the window, 2 bytes); the
// vjp scatters dout there and the jvp gathers the tangents from there.
// Ties: the first maximum (row-major in the window) wins.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/conv.hpp"
#include "engine/ops/common.hpp"
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
        T* __restrict m = op + o;
        std::uint16_t* __restrict a = ap + o;
        const T* __restrict v = xp + xo;
        if (e == 0) {
          std::copy_n(v, len, m);
          return;
        }
        for (std::size_t l = 0; l < len; ++l) {  // strict: the first max wins, and a NaN first element stays
          const bool greater = v[l] > m[l];
          m[l] = greater ? v[l] : m[l];
          a[l] = greater ? e : a[l];
        }
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
        T* __restrict d = gp + xo;
        const T* __restrict u = dp + o;
        const std::uint16_t* __restrict a = ap + o;
        for (std::size_t l = 0; l < len; ++l) d[l] += a[l] == e ? u[l] : T(0);
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
        const std::uint16_t* __restrict a = ap + o;
        for (std::size_t j = 0; j < k; ++j) {
          T* __restrict d = rp + j * n_out + o;
          const T* __restrict t = tp + j * n_in + xo;
          for (std::size_t l = 0; l < len; ++l) d[l] = a[l] == e ? t[l] : d[l];
        }
      });
    });
    return r;
  }
};

}  // namespace

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
