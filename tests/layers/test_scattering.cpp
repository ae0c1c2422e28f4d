// The scattering transform: its filters (zero-mean wavelets, unit low-pass),
// its shape, what it gives on constant images, its covariance with shifts by
// 2^J, gradchecks of the modulus and through a small transform, and exact
// per-sample rules for a model that starts with it.
#include <cmath>
#include <numeric>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "layers/dense.hpp"
#include "layers/norm.hpp"
#include "layers/scattering.hpp"
#include "optim/clipping/check_per_sample.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;

namespace {

double sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

/// Scattering (J = 2, L = 4) -> GroupNorm -> dense, on 12 x 12 images.
class ScatterLinear final : public ModelT<double> {
 public:
  explicit ScatterLinear(Rng& rng) : scatter_(1, 2, 4), norm_(scatter_.coefficients(), 5, "gn"),
                                     out_(3 * 3 * scatter_.coefficients(), 3, rng, "out") {}
  D forward(const BatchT<double>& b) override {
    const std::size_t B = b.inputs.shape()[0];
    D h = norm_.forward(scatter_.forward(per_sample_input(b.inputs)));
    return out_.forward(reshape(h, {B, 3 * 3 * scatter_.coefficients()}));
  }
  std::vector<D> parameters() const override {
    std::vector<D> p = norm_.parameters();
    for (auto& q : out_.parameters()) p.push_back(q);
    return p;
  }
  std::string name() const override { return "scatter-linear"; }

 private:
  ScatteringT<double> scatter_;
  GroupNormT<double> norm_;
  DenseT<double> out_;
};

}  // namespace

TEST_CASE("scattering: Morlet wavelets have zero mean, the low-pass sums to 1, at every resolution") {
  for (int res = 0; res < 2; ++res)
    for (int j = res; j < 2; ++j)
      for (int l = 0; l < 8; ++l) {
        CAPTURE(res);
        CAPTURE(j);
        CAPTURE(l);
        const ScatteringFilter f = morlet_filter(j, l, 8, res);
        CHECK(std::abs(sum(f.re)) < 1e-12);
        CHECK(std::abs(sum(f.im)) < 1e-12);
        double energy = 0;
        for (std::size_t i = 0; i < f.re.size(); ++i) energy += std::hypot(f.re[i], f.im[i]);
        CHECK(energy > 0.3);  // a band-pass filter, not zero
      }
  for (int res = 0; res < 2; ++res) {
    const ScatteringFilter phi = lowpass_filter(2, res);
    CHECK(sum(phi.re) == doctest::Approx(1.0).epsilon(1e-3));
    CHECK(sum(phi.im) == 0.0);
  }
  // the angles are kymatio's: (L/2 - 1 - l) pi / L; the filter of angle 0 (l = 3 of 8)
  // oscillates along the rows only: its imaginary part is odd in the row offset
  const ScatteringFilter f = morlet_filter(0, 3, 8, 0);
  const std::size_t k = 2 * f.radius + 1, c = f.radius;
  CHECK(f.im[(c + 1) * k + c] == doctest::Approx(-f.im[(c - 1) * k + c]));
  CHECK(std::abs(f.im[c * k + c + 1]) < 1e-15);
}

TEST_CASE("scattering: shapes, constant images, and covariance with shifts by 2^J") {
  ScatteringT<double> s(1, 2, 8);
  CHECK(s.coefficients() == 81);
  CHECK(s.output_shape({5, 28, 28, 1}) == Shape{5, 7, 7, 81});
  ScatteringT<double> rgb(3, 2, 8);
  CHECK(rgb.output_shape({2, 32, 32, 3}) == Shape{2, 8, 8, 243});
  CHECK_THROWS_WITH_AS(s.output_shape({5, 28, 28, 3}), doctest::Contains("Scattering(1 channels)"),
                       std::invalid_argument);

  // a constant image: away from the border, S0 is the constant and every wavelet coefficient is 0
  A flat = xt::ones<double>({1, 64, 64, 1}) * 2.5;
  const A y = s.transform(flat);
  REQUIRE(shape_of(y) == Shape{1, 16, 16, 81});
  for (std::size_t i = 7; i <= 8; ++i)
    for (std::size_t j = 7; j <= 8; ++j) {
      CHECK(y(0, i, j, 0) == doctest::Approx(2.5).epsilon(1e-3));
      for (std::size_t k = 1; k < 81; ++k) CHECK(std::abs(y(0, i, j, k)) < 1e-9);
    }

  // shifting the image by 2^J = 4 pixels shifts the coefficients by one position (in the interior)
  FastRng data(1);
  A x = xt::zeros<double>({2, 48, 48, 1});
  const A patch = randn<double>({16, 16}, data);
  for (std::size_t i = 0; i < 16; ++i)
    for (std::size_t j = 0; j < 16; ++j) {
      x(0, 16 + i, 16 + j, 0) = patch(i, j);
      x(1, 20 + i, 16 + j, 0) = patch(i, j);  // 4 rows down
    }
  const A z = s.transform(x);
  double worst = 0;
  for (std::size_t i = 1; i + 2 < 12; ++i)
    for (std::size_t j = 0; j < 12; ++j)
      for (std::size_t k = 0; k < 81; ++k) worst = std::max(worst, std::abs(z(1, i + 1, j, k) - z(0, i, j, k)));
  CHECK(worst < 1e-9);
  double size = 0;
  for (auto v : z) size = std::max(size, std::abs(v));
  CHECK(size > 0.1);
}

TEST_CASE("scattering: the reflected border is the zero-bordered transform of the mirrored image, cropped") {
  FastRng data(5);
  const A x = randn<double>({2, 20, 20, 1}, data);
  // mirror by hand: 4 = 2^J pixels on every side, the edge pixel not repeated
  A big = xt::zeros<double>({2, 28, 28, 1});
  auto mirror = [](long i, long n) { return i < 0 ? -i : (i >= n ? 2 * (n - 1) - i : i); };
  for (std::size_t b = 0; b < 2; ++b)
    for (long i = -4; i < 24; ++i)
      for (long j = -4; j < 24; ++j)
        big(b, std::size_t(i + 4), std::size_t(j + 4), 0) = x(b, std::size_t(mirror(i, 20)), std::size_t(mirror(j, 20)), 0);
  ScatteringT<double> reflected(1, 2, 8, ScatteringBorder::reflect), zero(1, 2, 8);
  const A r = reflected.transform(x), z = zero.transform(big), plain = zero.transform(x);
  REQUIRE(shape_of(r) == Shape{2, 5, 5, 81});
  REQUIRE(shape_of(z) == Shape{2, 7, 7, 81});
  double worst = 0, border = 0;
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t i = 0; i < 5; ++i)
      for (std::size_t j = 0; j < 5; ++j)
        for (std::size_t k = 0; k < 81; ++k) {
          worst = std::max(worst, std::abs(r(b, i, j, k) - z(b, i + 1, j + 1, k)));
          border = std::max(border, std::abs(r(b, i, j, k) - plain(b, i, j, k)));
        }
  CHECK(worst < 1e-12);
  CHECK(border > 1e-3);  // the border matters: zero padding gives other coefficients
  ScatteringT<double> tiny(1, 2, 8, ScatteringBorder::reflect);
  CHECK_THROWS_WITH_AS(tiny.transform(A(xt::zeros<double>({1, 4, 9, 1}))), doctest::Contains("larger than 2^J"),
                       std::invalid_argument);
}

TEST_CASE("scattering: gradchecks of the modulus and through a small transform") {
  FastRng data(2);
  {
    const std::vector<A> inputs{randn<double>({3, 4}, data), randn<double>({3, 4}, data)};
    auto f = [](const std::vector<D>& v) { return complex_abs(v[0], v[1]); };
    DPGRAD_CHECK_GRADS(gradcheck(f, inputs));
  }
  {
    ScatteringT<double> s(1, 1, 2);
    const std::vector<A> inputs{randn<double>({2, 6, 6, 1}, data)};
    auto f = [&](const std::vector<D>& v) { return s.forward(v[0]); };
    DPGRAD_CHECK_GRADS(gradcheck(f, inputs));
  }
  // the modulus at 0: derivative 0, value 0
  D re(A{0.0, 3.0}, true), im(A{0.0, 4.0}, true);
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  const D m = complex_abs(re, im);
  CHECK(m.value()(1) == doctest::Approx(5.0));
  tape.backward(sum(m));
  CHECK(re.grad()(0) == 0.0);
  CHECK(re.grad()(1) == doctest::Approx(0.6));
  CHECK(im.grad()(1) == doctest::Approx(0.8));
}

TEST_CASE("scattering: a model that starts with it keeps exact per-sample rules") {
  FastRng init(3), data(4);
  ScatterLinear model(init);
  BatchT<double> batch;
  batch.inputs = randn<double>({4, 12, 12, 1}, data);
  for (std::size_t i = 0; i < 4; ++i) {
    batch.labels.push_back(std::int32_t(data.below(3)));
    batch.ids.push_back(std::int64_t(i));
  }
  const PerSampleCheck c = check_per_sample(model, batch);
  INFO(c.str());
  CHECK(c.routes.size() == 4);
  CHECK(c.agrees(1e-9));
}
