// max_pool2d over 'valid' windows of channels-last images. The primal keeps the
// argmax of every window; the vjp scatters dout there and the jvp gathers the
// tangents there. Ties: the first maximum (row-major in the window) wins.
#include <cstdint>
#include <limits>

#include "engine/conv.hpp"
#include "engine/ops/common.hpp"

namespace dpgrad {
namespace {
using detail::shape_str;

template <class T>
struct MaxPoolOp final : Op<T> {
  std::size_t kh = 0, kw = 0, sh = 0, sw = 0;
  std::vector<std::uint32_t> argmax;  // per output element: its flat index into x
  std::size_t x_size = 0;
  const char* name() const override { return "max_pool2d"; }

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
    const std::size_t ho = (h - kh) / sh + 1, wo = (w - kw) / sw + 1;
    if (x.size() > std::numeric_limits<std::uint32_t>::max())
      throw std::invalid_argument("max_pool2d: x " + shape_str(xs) + " has more than 2^32 elements");
    x_size = x.size();
    ArrayT<T> out = ArrayT<T>::from_shape({b, ho, wo, c});
    argmax.resize(out.size());
    const T* __restrict xp = x.data();
    T* __restrict op = out.data();
    std::uint32_t* __restrict ap = argmax.data();
    for (std::size_t n = 0; n < b; ++n)
      for (std::size_t oy = 0; oy < ho; ++oy)
        for (std::size_t ox = 0; ox < wo; ++ox, op += c, ap += c) {
          const std::size_t corner = ((n * h + oy * sh) * w + ox * sw) * c;
          for (std::size_t ch = 0; ch < c; ++ch) op[ch] = xp[corner + ch], ap[ch] = std::uint32_t(corner + ch);
          for (std::size_t i = 0; i < kh; ++i)
            for (std::size_t j = 0; j < kw; ++j) {
              if (i == 0 && j == 0) continue;
              const std::uint32_t at = std::uint32_t(corner + (i * w + j) * c);
              const T* __restrict v = xp + at;
              // branch-free selects so that the channel loop vectorises; strict: the first max wins
              for (std::size_t ch = 0; ch < c; ++ch) {
                const bool more = v[ch] > op[ch];
                op[ch] = more ? v[ch] : op[ch];
                ap[ch] = more ? at + std::uint32_t(ch) : ap[ch];
              }
            }
        }
    return out;
  }
  /// dx[argmax[o]] += dout[o]
  void vjp(const ArrayT<T>& dout, Values<T>, const ArrayT<T>&, Slots<T> dx) override {
    if (!dx[0]) return;
    bool fresh;
    ArrayT<T>& g = dx[0].buffer(fresh);
    if (fresh) g.fill(T(0));
    T* gp = g.data();
    const T* dp = dout.data();
    for (std::size_t o = 0; o < argmax.size(); ++o) gp[argmax[o]] += dp[o];
  }
  /// out_dot[j, o] = x_dot[j, argmax[o]]
  ArrayT<T> jvp(Values<T>, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    if (!dot[0]) {
      r.fill(T(0));
      return r;
    }
    const std::size_t n = argmax.size();
    for (std::size_t j = 0; j < k; ++j) {
      const T* t = dot[0]->data() + j * x_size;
      T* rp = r.data() + j * n;
      for (std::size_t o = 0; o < n; ++o) rp[o] = t[argmax[o]];
    }
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
