// Convolution and pooling primitives: padding geometry, im2col and max_pool2d
// values against naive loops, their gradient checks over many geometries, both
// conv2d routes (im2col + linear, and the direct op) against a naive
// convolution, the direct op's per-sample rule, and bad input.
#include <algorithm>
#include <numeric>

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "engine/conv.hpp"
#include "engine/ops.hpp"
#include "engine/per_sample.hpp"
#include "engine/tape.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;

namespace {

struct Geometry {
  Shape x;  // (B, H, W, C)
  std::size_t kh, kw, sh, sw;
  Padding padding;
};

std::string shape_text(const Shape& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

Pad2d pads_of(const Geometry& g) { return resolve_padding(g.padding, g.x[1], g.x[2], g.kh, g.kw, g.sh, g.sw); }

/// Stride 1 and 2, same / valid / explicit, non-square kernels and images, C > 1, batch 1 and 3.
std::vector<Geometry> geometries() {
  return {
      {{1, 5, 5, 1}, 3, 3, 1, 1, Padding::valid()},
      {{3, 5, 5, 1}, 3, 3, 1, 1, Padding::same()},
      {{3, 5, 4, 2}, 3, 2, 2, 2, Padding::same()},
      {{1, 6, 7, 3}, 2, 3, 2, 1, Padding::explicit_pads(1, 0, 2, 1)},
      {{3, 4, 6, 2}, 3, 3, 2, 2, Padding::valid()},
      {{1, 7, 5, 2}, 4, 2, 3, 2, Padding::same()},
      {{3, 3, 3, 1}, 2, 2, 1, 1, Padding::explicit_pads(1, 1, 1, 1)},
      {{1, 2, 2, 1}, 3, 3, 1, 1, Padding::same()},                   // kernel larger than the image
      {{1, 3, 3, 2}, 1, 1, 2, 2, Padding::explicit_pads(2, 2, 0, 3)},  // pad wider than the kernel
      {{2, 10, 9, 1}, 8, 8, 2, 2, Padding::same()},                  // window rows of 8 values (cnn26k's conv1)
      {{2, 7, 8, 4}, 4, 4, 2, 1, Padding::explicit_pads(1, 2, 0, 1)},  // window rows of 16 values
      {{1, 6, 6, 16}, 4, 4, 2, 2, Padding::explicit_pads(1, 0, 0, 1)},  // window rows of 64 values (conv2)
  };
}

/// The definition: cols[b, oy, ox, (i*kw + j)*C + c] = x[b, oy*sh + i - top, ox*sw + j - left, c] or 0.
A naive_im2col(const A& x, std::size_t kh, std::size_t kw, std::size_t sh, std::size_t sw, Pad2d p) {
  std::size_t B = x.shape()[0], H = x.shape()[1], W = x.shape()[2], C = x.shape()[3];
  std::size_t ho = (H + p.top + p.bottom - kh) / sh + 1, wo = (W + p.left + p.right - kw) / sw + 1;
  A r = xt::zeros<double>({B, ho, wo, kh * kw * C});
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t oy = 0; oy < ho; ++oy)
      for (std::size_t ox = 0; ox < wo; ++ox)
        for (std::size_t i = 0; i < kh; ++i)
          for (std::size_t j = 0; j < kw; ++j)
            for (std::size_t c = 0; c < C; ++c) {
              long iy = long(oy * sh + i) - long(p.top), ix = long(ox * sw + j) - long(p.left);
              if (iy >= 0 && iy < long(H) && ix >= 0 && ix < long(W))
                r(b, oy, ox, (i * kw + j) * C + c) = x(b, std::size_t(iy), std::size_t(ix), c);
            }
  return r;
}

/// Direct convolution (cross-correlation, as every DL library): w (kh*kw*C, Cout) rows ordered (i, j, c).
template <class T>
ArrayT<T> naive_conv(const ArrayT<T>& x, const ArrayT<T>& w, const ArrayT<T>& bias, std::size_t kh, std::size_t kw,
                     std::size_t sh, std::size_t sw, Pad2d p) {
  std::size_t B = x.shape()[0], H = x.shape()[1], W = x.shape()[2], C = x.shape()[3], F = w.shape()[1];
  std::size_t ho = (H + p.top + p.bottom - kh) / sh + 1, wo = (W + p.left + p.right - kw) / sw + 1;
  ArrayT<T> y = xt::zeros<T>({B, ho, wo, F});
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t oy = 0; oy < ho; ++oy)
      for (std::size_t ox = 0; ox < wo; ++ox)
        for (std::size_t f = 0; f < F; ++f) {
          double s = bias(f);
          for (std::size_t i = 0; i < kh; ++i)
            for (std::size_t j = 0; j < kw; ++j) {
              long iy = long(oy * sh + i) - long(p.top), ix = long(ox * sw + j) - long(p.left);
              if (iy < 0 || iy >= long(H) || ix < 0 || ix >= long(W)) continue;
              for (std::size_t c = 0; c < C; ++c)
                s += double(x(b, std::size_t(iy), std::size_t(ix), c)) * double(w((i * kw + j) * C + c, f));
            }
          y(b, oy, ox, f) = T(s);
        }
  return y;
}

A distinct_values(const Shape& s, Rng& rng) { return test::distinct_values<double>(s, rng); }

}  // namespace

TEST_CASE("conv geometry: 'same' (TF convention) and 'valid'") {
  // 28 -> 14 with an 8x8 kernel, stride 2: total pad (14-1)*2 + 8 - 28 = 6
  CHECK(same_padding(28, 8, 2).before == 3);
  CHECK(same_padding(28, 8, 2).after == 3);
  // odd total: the smaller half goes first
  CHECK(same_padding(5, 2, 1).before == 0);
  CHECK(same_padding(5, 2, 1).after == 1);
  CHECK(same_padding(13, 4, 2).before == 1);  // out 7, total 3
  CHECK(same_padding(13, 4, 2).after == 2);
  CHECK(same_padding(4, 1, 3).before == 0);   // out 2, total max(3 + 1 - 4, 0) = 0
  CHECK(same_padding(4, 1, 3).after == 0);
  CHECK(same_padding(7, 3, 1).before == 1);
  CHECK(same_padding(7, 3, 1).after == 1);
  // out = ceil(in / stride) for 'same'; floor((in - k) / stride) + 1 for 'valid'
  for (std::size_t in : {1, 2, 5, 13, 28})
    for (std::size_t k : {1, 2, 3, 8})
      for (std::size_t s : {1, 2, 3}) {
        Pad1d p = same_padding(in, k, s);
        CHECK(window_output_size(in, k, s, p.before, p.after) == (in + s - 1) / s);
        if (in >= k) CHECK(window_output_size(in, k, s) == (in - k) / s + 1);
      }
  CHECK(window_output_size(13, 4, 2) == 5);
  Pad2d p = resolve_padding(Padding::same(), 7, 5, 4, 2, 3, 2);
  CHECK(p == Pad2d{1, 2, 0, 1});
  CHECK(resolve_padding(Padding::valid(), 7, 5, 4, 2, 3, 2) == Pad2d{});
  CHECK(resolve_padding(Padding::explicit_pads(1, 2, 3, 4), 7, 5, 4, 2, 3, 2) == Pad2d{1, 2, 3, 4});
  CHECK_THROWS_AS(same_padding(5, 0, 1), std::invalid_argument);
  CHECK_THROWS_AS(same_padding(5, 2, 0), std::invalid_argument);
  CHECK_THROWS_AS(window_output_size(3, 4, 1), std::invalid_argument);
  CHECK_THROWS_AS(window_output_size(3, 2, 0), std::invalid_argument);
}

TEST_CASE("im2col: values against the definition") {
  FastRng rng(31);
  NoRecordScope<double> none;
  for (const auto& g : geometries()) {
    CAPTURE(shape_text(g.x));
    A x = randn<double>(g.x, rng);
    Pad2d p = pads_of(g);
    A got = im2col(D(x), g.kh, g.kw, g.sh, g.sw, p).value();
    A want = naive_im2col(x, g.kh, g.kw, g.sh, g.sw, p);
    REQUIRE(shape_of(got) == shape_of(want));
    DPGRAD_CHECK_CLOSE(got, want, 0.0);
  }
  // an empty batch gives an empty batch of patches
  A none_x = A::from_shape({0, 4, 4, 2});
  CHECK(shape_of(im2col(D(none_x), 3, 3, 1, 1).value()) == Shape{0, 2, 2, 18});
}

TEST_CASE("im2col: gradient checks") {
  FastRng rng(32);
  for (const auto& g : geometries()) {
    CAPTURE(shape_text(g.x));
    CAPTURE(g.kh);
    CAPTURE(g.kw);
    CAPTURE(g.sh);
    CAPTURE(g.sw);
    Pad2d p = pads_of(g);
    A x = randn<double>(g.x, rng);
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return im2col(v[0], g.kh, g.kw, g.sh, g.sw, p); }, {x}));
  }
}

const std::vector<ConvMethod> both_routes{ConvMethod::patches, ConvMethod::direct};

TEST_CASE("conv2d: both routes' values against a naive convolution, float and double") {
  FastRng rng(33);
  std::vector<Geometry> gs = geometries();
  gs.push_back({{3, 20, 20, 16}, 8, 8, 1, 1, Padding::valid()});  // 1,024-value patches: the direct op's blocks of 16 positions
  // output channels: fewer than a vector, one float vector and a remainder, two double vectors and a remainder
  for (std::size_t f : {3, 19})
  for (ConvMethod method : both_routes)
  for (const auto& g : gs) {
    CAPTURE(shape_text(g.x));
    CAPTURE(f);
    CAPTURE(int(method));
    std::size_t k = g.kh * g.kw * g.x[3];
    Pad2d p = pads_of(g);
    A x = randn<double>(g.x, rng), w = randn<double>({k, f}, rng), b = randn<double>({f}, rng);
    {
      NoRecordScope<double> none;
      A got = conv2d(D(x), D(w), D(b), g.kh, g.kw, g.sh, g.sw, p, method).value();
      A want = naive_conv(x, w, b, g.kh, g.kw, g.sh, g.sw, p);
      REQUIRE(shape_of(got) == shape_of(want));
      // a sum of k + 1 products of standard normals is about sqrt(k) in size: errors relative to that
      std::string diff = test::mismatch(got, want, 1e-12, std::sqrt(double(k)));
      INFO(diff);
      CHECK(diff.empty());
    }
    {
      NoRecordScope<float> none;
      ArrayT<float> xf = xt::cast<float>(x), wf = xt::cast<float>(w), bf = xt::cast<float>(b);
      ArrayT<float> got =
          conv2d(TensorT<float>(xf), TensorT<float>(wf), TensorT<float>(bf), g.kh, g.kw, g.sh, g.sw, p, method).value();
      ArrayT<float> want = naive_conv(xf, wf, bf, g.kh, g.kw, g.sh, g.sw, p);
      REQUIRE(shape_of(got) == shape_of(want));
      std::string diff = test::mismatch(got, want, 1e-5, std::sqrt(double(k)));
      INFO(diff);
      CHECK(diff.empty());
    }
  }
}

TEST_CASE("conv2d: both routes' gradient checks with respect to x, W and b") {
  FastRng rng(34);
  for (ConvMethod method : both_routes)
  for (std::size_t f : {2, 9})  // the direct op: channels in its scalar remainder; a whole double vector and one more
  for (const auto& g : geometries()) {
    CAPTURE(shape_text(g.x));
    CAPTURE(int(method));
    CAPTURE(f);
    std::size_t k = g.kh * g.kw * g.x[3];
    Pad2d p = pads_of(g);
    A x = randn<double>(g.x, rng), w = randn<double>({k, f}, rng), b = randn<double>({f}, rng);
    GradcheckOptions o;
    o.step = 1e-4;  // conv2d is bilinear in (x, W): central differences are exact but for rounding, which a longer step shrinks
    DPGRAD_CHECK_GRADS(gradcheck(
        [&](const std::vector<D>& v) { return conv2d(v[0], v[1], v[2], g.kh, g.kw, g.sh, g.sw, p, method); }, {x, w, b},
        o));
    DPGRAD_CHECK_GRADS(gradcheck(
        [&](const std::vector<D>& v) { return conv2d(v[0], v[1], D{}, g.kh, g.kw, g.sh, g.sw, p, method); }, {x, w}, o));
  }
}

TEST_CASE("conv2d: the automatic route is direct where a sample's kernel gradient is small and the kernels vectorised") {
  CHECK(direct_conv_fits(64, 16, 196));     // cnn26k's conv1: 8x8x1 -> 16 over 14x14 positions
  CHECK_FALSE(direct_conv_fits(256, 32, 25));  // cnn26k's conv2: 4x4x16 -> 32 over 5x5
  CHECK_FALSE(direct_conv_fits(64, 16, 1));  // one position: G_i is the whole patch times delta
  CHECK_FALSE(direct_conv_fits(1024, 64, 1u << 20));  // W beyond 2^14 values
  const std::size_t bytes = direct_conv_vector_bytes();
  CHECK((bytes == 16 || bytes == 32 || bytes == 64));
  const bool wide = bytes >= 32;  // the x86-64-v2 baseline's 16-byte kernels (a CPU without AVX2) leave conv1 to patches
  CHECK(direct_conv_pays(64, 16, 196) == wide);
  CHECK_FALSE(direct_conv_pays(256, 32, 25));
  FastRng rng(37);
  A x = randn<double>({2, 28, 28, 1}, rng), w = randn<double>({64, 16}, rng);
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D wp = make_parameter<double>("w", w);
  D y = conv2d(D(x), wp, D{}, 8, 8, 2, 2, Pad2d{3, 3, 3, 3});
  CHECK(y.shape() == Shape{2, 14, 14, 16});
  REQUIRE(tape.ops_reading(wp.node()).size() == 1);
  CHECK(tape.ops_reading(wp.node())[0] == (wide ? "conv2d_direct" : "linear"));  // linear: over im2col's patches
}

TEST_CASE("conv2d_direct: its conv use gives each example's gradient, views of an example summed") {
  FastRng rng(38);
  const std::size_t B = 4, C = 2, F = 19, kh = 3, kw = 2;
  Pad2d p = resolve_padding(Padding::same(), 5, 6, kh, kw, 2, 1);
  A x = randn<double>({B, 5, 6, C}, rng), w = randn<double>({kh * kw * C, F}, rng), b = randn<double>({F}, rng);
  A u = randn<double>({B, 3, 6, F}, rng);
  // the reference: each image alone, its weight gradient from a backward of <u_n, y_n>
  std::vector<A> alone;
  for (std::size_t n = 0; n < B; ++n) {
    D wt = make_parameter<double>("w", w);
    TapeT<double> tape;
    RecordScope<double> scope(tape);
    A xn = xt::view(x, xt::range(n, n + 1));
    D y = conv2d_direct(D(xn), wt, D(b), kh, kw, 2, 1, p);
    A un = xt::view(u, xt::range(n, n + 1));
    tape.backward(y, un);
    alone.push_back(wt.grad());
  }
  for (std::size_t examples : {B, B / 2}) {  // B examples of one image, or B / 2 of two views each
    CAPTURE(examples);
    TapeT<double> tape;
    tape.record_uses(true, false);
    RecordScope<double> scope(tape);
    D wt = make_parameter<double>("conv.weight", w), bt = make_parameter<double>("conv.bias", b);
    D y = conv2d_direct(per_sample_input(x), wt, bt, kh, kw, 2, 1, p);
    tape.backward(y, u);
    const auto& groups = tape.uses();
    REQUIRE(groups.size() == 2);
    REQUIRE(groups[0].uses[0]->kind == UseKind::conv);
    CHECK(cheaper_norm_method(groups[0]) == NormMethod::materialise);
    A g = per_sample_gradients(groups[0], examples);
    REQUIRE(shape_of(g) == Shape{examples, kh * kw * C, F});
    const std::size_t views = B / examples;
    A want_norms = xt::zeros<double>({examples});
    for (std::size_t i = 0; i < examples; ++i) {
      A want = xt::zeros<double>({kh * kw * C, F});
      for (std::size_t v = 0; v < views; ++v) want += alone[i * views + v];
      A got = xt::view(g, i);
      DPGRAD_CHECK_CLOSE(got, want, 1e-12);
      want_norms(i) = xt::sum(want * want)();
    }
    for (NormMethod m : {NormMethod::automatic, NormMethod::ghost, NormMethod::materialise}) {
      A norms = per_sample_norms_squared(groups[0], examples, m);
      DPGRAD_CHECK_CLOSE(norms, want_norms, 1e-10);
    }
    A c = randn<double>({examples}, rng);
    A want_sum = xt::zeros<double>({kh * kw * C, F});
    for (std::size_t i = 0; i < examples; ++i) want_sum += c(i) * A(xt::view(g, i));
    DPGRAD_CHECK_CLOSE(weighted_gradient_sum(groups[0], c), want_sum, 1e-12);
    DPGRAD_CHECK_CLOSE(materialise_per_sample_gradients(groups[0], examples).weighted_sum(c), want_sum, 1e-12);
  }
}

TEST_CASE("conv2d: linear records the weight use with the patches as activations") {
  FastRng rng(35);
  std::size_t B = 3, C = 2, F = 4, kh = 3, kw = 2;
  A x = randn<double>({B, 5, 6, C}, rng), w = randn<double>({kh * kw * C, F}, rng), b = randn<double>({F}, rng);
  Pad2d p = resolve_padding(Padding::same(), 5, 6, kh, kw, 2, 2);  // Ho = 3, Wo = 3
  TapeT<double> tape;
  tape.record_uses(true);
  RecordScope<double> scope(tape);
  D wt = make_parameter<double>("conv.weight", w), bt = make_parameter<double>("conv.bias", b);
  D y = conv2d(D(x), wt, bt, kh, kw, 2, 2, p);
  CHECK(y.shape() == Shape{B, 3, 3, F});
  A u = randn<double>(y.shape(), rng);
  tape.backward(y, u);
  const auto& groups = tape.uses();
  REQUIRE(groups.size() == 2);
  REQUIRE(groups[0].uses.size() == 1);
  const ParamUse<double>& use = *groups[0].uses[0];
  CHECK(use.kind == UseKind::matmul);
  CHECK(shape_of(use.input->value) == Shape{B, 3, 3, kh * kw * C});
  REQUIRE(use.delta);
  CHECK(shape_of(*use.delta) == Shape{B, 3, 3, F});
  CHECK(groups[1].uses[0]->kind == UseKind::bias);
  // the per-sample gradients a_i^T delta_i sum to the weight gradient
  A total = xt::zeros<double>({kh * kw * C, F});
  for (std::size_t i = 0; i < B; ++i)
    for (std::size_t t = 0; t < 9; ++t)
      for (std::size_t d = 0; d < kh * kw * C; ++d)
        for (std::size_t q = 0; q < F; ++q)
          total(d, q) += use.input->value(i, t / 3, t % 3, d) * (*use.delta)(i, t / 3, t % 3, q);
  DPGRAD_CHECK_CLOSE(total, wt.grad(), 1e-12);
}

TEST_CASE("max_pool2d: values, gradient checks, ties") {
  FastRng rng(36);
  struct Case { Shape x; std::size_t kh, kw, sh, sw; };
  for (auto c : {Case{{1, 4, 4, 1}, 2, 2, 1, 1}, Case{{3, 5, 6, 2}, 2, 2, 2, 2}, Case{{3, 5, 5, 3}, 3, 3, 1, 1},
                 Case{{1, 4, 7, 2}, 2, 3, 1, 2}, Case{{3, 3, 3, 1}, 3, 3, 1, 1}, Case{{1, 2, 3, 1}, 1, 1, 1, 1}}) {
    CAPTURE(shape_text(c.x));
    A x = distinct_values(c.x, rng);
    {
      NoRecordScope<double> none;
      A got = max_pool2d(D(x), c.kh, c.kw, c.sh, c.sw).value();
      std::size_t ho = (c.x[1] - c.kh) / c.sh + 1, wo = (c.x[2] - c.kw) / c.sw + 1;
      REQUIRE(shape_of(got) == Shape{c.x[0], ho, wo, c.x[3]});
      A want = A::from_shape(shape_of(got));
      for (std::size_t b = 0; b < c.x[0]; ++b)
        for (std::size_t oy = 0; oy < ho; ++oy)
          for (std::size_t ox = 0; ox < wo; ++ox)
            for (std::size_t ch = 0; ch < c.x[3]; ++ch) {
              double m = -1e300;
              for (std::size_t i = 0; i < c.kh; ++i)
                for (std::size_t j = 0; j < c.kw; ++j) m = std::max(m, x(b, oy * c.sh + i, ox * c.sw + j, ch));
              want(b, oy, ox, ch) = m;
            }
      DPGRAD_CHECK_CLOSE(got, want, 0.0);
    }
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return max_pool2d(v[0], c.kh, c.kw, c.sh, c.sw); }, {x}));
  }
  // the cnn geometry: 2x2 windows at stride 1 overlap, gradients accumulate
  A x = distinct_values({2, 5, 5, 3}, rng);
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return max_pool2d(v[0], 2, 1); }, {x}));

  // ties: the first maximum (row-major in the window) takes the whole derivative
  A tie = A{{1.0, 3.0}, {3.0, 0.0}};  // 3 at (0, 1) and (1, 0)
  tie.reshape({1, 2, 2, 1});
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D t(tie, true);
  D y = max_pool2d(t, 2, 1);
  CHECK(y.value()(0, 0, 0, 0) == 3.0);
  tape.backward(sum(y));
  A want = A{{0.0, 1.0}, {0.0, 0.0}};
  want.reshape({1, 2, 2, 1});
  DPGRAD_CHECK_CLOSE(t.grad(), want, 0.0);
}

TEST_CASE("max_pool2d: a NaN first element is its window's output and argmax (no derivative is left unset)") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  A x = A{{nan, 3.0}, {1.0, 0.0}};
  x.reshape({1, 2, 2, 1});
  A dots = A{{5.0, 6.0}, {7.0, 8.0}};
  dots.reshape({1, 1, 2, 2, 1});  // one tangent
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D t(x, true);
  t.set_tangent(dots);
  D y = max_pool2d(t, 2, 1);
  CHECK(std::isnan(y.value()(0, 0, 0, 0)));
  CHECK(y.tangent()(0, 0, 0, 0, 0) == 5.0);  // the tangent at the NaN element, not whatever memory held
  tape.backward(sum(y));
  A want = A{{1.0, 0.0}, {0.0, 0.0}};
  want.reshape({1, 2, 2, 1});
  DPGRAD_CHECK_CLOSE(t.grad(), want, 0.0);
}

TEST_CASE("conv ops: bad geometry and shapes throw") {
  NoRecordScope<double> none;
  D x(A::from_shape({2, 5, 5, 3}));
  D flat(A::from_shape({2, 5, 5}));
  CHECK_THROWS_AS(im2col(flat, 3, 3, 1, 1), std::invalid_argument);          // not (B, H, W, C)
  CHECK_THROWS_AS(im2col(x, 0, 3, 1, 1), std::invalid_argument);            // empty kernel
  CHECK_THROWS_AS(im2col(x, 3, 3, 1, 0), std::invalid_argument);            // zero stride
  CHECK_THROWS_AS(im2col(x, 6, 3, 1, 1), std::invalid_argument);            // kernel taller than the image
  CHECK_NOTHROW(im2col(x, 6, 3, 1, 1, Pad2d{1, 0, 0, 0}));                   // unless padded
  CHECK_THROWS_AS(conv2d(x, D(A::from_shape({26, 4})), D{}, 3, 3, 1, 1), std::invalid_argument);  // not 3*3*3 rows
  CHECK_THROWS_AS(conv2d(x, D(A::from_shape({27})), D{}, 3, 3, 1, 1), std::invalid_argument);
  CHECK_THROWS_AS(conv2d(x, D(A::from_shape({27, 4})), D(A::from_shape({3})), 3, 3, 1, 1), std::invalid_argument);
  CHECK_THROWS_AS(max_pool2d(flat, 2, 1), std::invalid_argument);
  CHECK_THROWS_AS(max_pool2d(x, 6, 1), std::invalid_argument);
  CHECK_THROWS_AS(max_pool2d(x, 0, 1), std::invalid_argument);
  CHECK_THROWS_AS(max_pool2d(x, 2, 0), std::invalid_argument);
  try {
    im2col(x, 7, 2, 1, 1);
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    std::string msg = e.what();
    CHECK(msg.find("(2, 5, 5, 3)") != std::string::npos);
  }
}

TEST_CASE("avg_pool2d: values against a loop, gradient checks, padding and its divisor") {
  FastRng rng(9);
  struct Case {
    std::size_t kh, kw, sh, sw;
    Pad2d pad;
    bool include;
  };
  for (const Case& c : {Case{2, 2, 1, 1, {}, true}, Case{3, 2, 2, 1, {1, 1, 0, 1}, true},
                       Case{3, 3, 2, 2, {1, 1, 1, 1}, false}, Case{2, 3, 1, 2, {0, 1, 2, 0}, false}}) {
    CAPTURE(c.kh);
    CAPTURE(c.include);
    const A x = randn<double>({2, 5, 6, 3}, rng);
    A got;
    {
      NoRecordScope<double> none;
      got = avg_pool2d(D(x), c.kh, c.kw, c.sh, c.sw, c.pad, c.include).value();
    }
    const std::size_t ho = (5 + c.pad.top + c.pad.bottom - c.kh) / c.sh + 1;
    const std::size_t wo = (6 + c.pad.left + c.pad.right - c.kw) / c.sw + 1;
    REQUIRE(got.shape() == Shape{2, ho, wo, 3});
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t oy = 0; oy < ho; ++oy)
        for (std::size_t ox = 0; ox < wo; ++ox)
          for (std::size_t ch = 0; ch < 3; ++ch) {
            double s = 0;
            std::size_t n = 0;
            for (std::size_t i = 0; i < c.kh; ++i)
              for (std::size_t j = 0; j < c.kw; ++j) {
                const long y = long(oy * c.sh + i) - long(c.pad.top), z = long(ox * c.sw + j) - long(c.pad.left);
                if (y < 0 || z < 0 || y >= 5 || z >= 6) continue;
                s += x(b, std::size_t(y), std::size_t(z), ch);
                ++n;
              }
            CHECK(got(b, oy, ox, ch) == doctest::Approx(s / double(c.include ? c.kh * c.kw : n)).epsilon(1e-12));
          }
    DPGRAD_CHECK_GRADS(gradcheck(
        [&](const std::vector<D>& v) { return avg_pool2d(v[0], c.kh, c.kw, c.sh, c.sw, c.pad, c.include); }, {x}));
  }
  NoRecordScope<double> none;
  CHECK(avg_pool2d(per_sample_input(A(xt::zeros<double>({3, 4, 4, 2}))), 2, 2, 2, 2).samples() == Samples::at(0, 3));
  CHECK_THROWS_AS(avg_pool2d(D(A(xt::zeros<double>({4, 4}))), 2, 2, 1, 1), std::invalid_argument);
  CHECK_THROWS_AS(avg_pool2d(D(A(xt::zeros<double>({1, 4, 4, 1}))), 2, 2, 1, 1, Pad2d{2, 0, 0, 0}), std::invalid_argument);
}
