// LayerNorm and GroupNorm: their values, gradchecks through the layers' math,
// every exact per-sample route against the per-example loop, and jl:K's law
// on a normalised model.
#include <algorithm>
#include <cmath>
#include <vector>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "layers/conv.hpp"
#include "layers/dense.hpp"
#include "layers/models.hpp"
#include "layers/norm.hpp"
#include "optim/clipping/check_per_sample.hpp"
#include "optim/clipping/clipping.hpp"
#include "support/check.hpp"
#include "support/jl.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;

namespace {

/// Mean and variance of the values of x (B, ..., C) that sample b's group g holds.
std::pair<double, double> group_stats(const A& x, std::size_t b, std::size_t groups, std::size_t g) {
  const std::size_t c = x.shape().back(), per_sample = x.size() / x.shape()[0], width = c / groups;
  double s = 0, s2 = 0, n = 0;
  for (std::size_t k = 0; k < per_sample; ++k) {
    const std::size_t ch = k % c;
    if (ch / width != g) continue;
    const double v = x.data()[b * per_sample + k];
    s += v;
    s2 += v * v;
    ++n;
  }
  const double m = s / n;
  return {m, s2 / n - m * m};
}

/// x (B, 6, 6, 1) -> conv 3x3 to 4 channels -> GroupNorm (2 groups) -> tanh -> dense to 3 classes.
class ConvGroupNorm final : public ModelT<double> {
 public:
  explicit ConvGroupNorm(Rng& rng)
      : conv_(1, 4, 3, 3, 1, Padding::same(), rng, "conv"), norm_(4, 2, "gn"), out_(6 * 6 * 4, 3, rng, "out") {}
  D forward(const BatchT<double>& b) override {
    const std::size_t B = b.inputs.shape()[0];
    D h = tanh(norm_.forward(conv_.forward(per_sample_input(b.inputs))));
    return out_.forward(reshape(h, {B, 6 * 6 * 4}));
  }
  std::vector<D> parameters() const override {
    std::vector<D> p = conv_.parameters();
    for (auto& q : norm_.parameters()) p.push_back(q);
    for (auto& q : out_.parameters()) p.push_back(q);
    return p;
  }
  std::string name() const override { return "conv-groupnorm"; }

 private:
  Conv2dT<double> conv_;
  GroupNormT<double> norm_;
  DenseT<double> out_;
};

/// x (B, L, 5) -> dense to 4 -> LayerNorm -> tanh -> mean over L -> dense to 3.
class DenseLayerNorm final : public ModelT<double> {
 public:
  explicit DenseLayerNorm(Rng& rng) : in_(5, 4, rng, "in"), norm_(4, "ln"), out_(4, 3, rng, "out") {}
  D forward(const BatchT<double>& b) override {
    return out_.forward(mean(tanh(norm_.forward(in_.forward(per_sample_input(b.inputs)))), {1}));
  }
  std::vector<D> parameters() const override {
    std::vector<D> p = in_.parameters();
    for (auto& q : norm_.parameters()) p.push_back(q);
    for (auto& q : out_.parameters()) p.push_back(q);
    return p;
  }
  std::string name() const override { return "dense-layernorm"; }

 private:
  DenseT<double> in_;
  LayerNormT<double> norm_;
  DenseT<double> out_;
};

BatchT<double> batch_of(const Shape& s, Rng& rng) {
  BatchT<double> b;
  b.inputs = randn<double>(s, rng);
  for (std::size_t i = 0; i < s[0]; ++i) {
    b.labels.push_back(std::int32_t(rng.below(3)));
    b.ids.push_back(std::int64_t(i));
  }
  return b;
}

}  // namespace

TEST_CASE("norm: LayerNorm and GroupNorm normalise within each sample") {
  FastRng data(1);
  NoRecordScope<double> none;
  const A x = randn<double>({3, 4, 5, 6}, data) * 3.0 + 2.0;
  LayerNormT<double> ln(6);
  const A y = ln.forward(D(x)).value();
  for (std::size_t r = 0; r < y.size() / 6; ++r) {
    double s = 0, s2 = 0;
    for (std::size_t k = 0; k < 6; ++k) {
      s += y.data()[r * 6 + k];
      s2 += y.data()[r * 6 + k] * y.data()[r * 6 + k];
    }
    CHECK(s / 6 == doctest::Approx(0).epsilon(1e-12).scale(1));
    CHECK(s2 / 6 == doctest::Approx(1).epsilon(1e-4));  // var / (var + eps)
  }
  GroupNormT<double> gn(6, 3);
  const A z = gn.forward(D(x)).value();
  for (std::size_t b = 0; b < 3; ++b)
    for (std::size_t g = 0; g < 3; ++g) {
      const auto [m, v] = group_stats(z, b, 3, g);
      CHECK(std::abs(m) < 1e-12);
      CHECK(v == doctest::Approx(1).epsilon(1e-4));
    }
  // one group over all channels is a LayerNorm over all of a sample's values
  GroupNormT<double> one(6, 1);
  const A w = one.forward(D(x)).value();
  const auto [m0, v0] = group_stats(w, 1, 1, 0);
  CHECK(std::abs(m0) < 1e-12);
  CHECK(v0 == doctest::Approx(1).epsilon(1e-4));
  CHECK_THROWS_WITH_AS(GroupNormT<double>(6, 4), doctest::Contains("equal groups"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(ln.forward(D(randn<double>({2, 5}, data))), doctest::Contains("LayerNorm(6)"),
                       std::invalid_argument);
}

TEST_CASE("norm: gradchecks through the layers' math (input, gain and shift)") {
  FastRng data(2);
  // LayerNorm over the last axis of (2, 3, 4)
  {
    const std::vector<A> inputs{randn<double>({2, 3, 4}, data), randn<double>({4}, data), randn<double>({4}, data)};
    auto f = [](const std::vector<D>& v) { return add(mul(normalise(v[0], {2}, 1e-3), v[1]), v[2]); };
    DPGRAD_CHECK_GRADS(gradcheck(f, inputs));
  }
  // GroupNorm's grouping of (2, 3, 3, 4) into 2 groups of 2 channels
  {
    const std::vector<A> inputs{randn<double>({2, 3, 3, 4}, data), randn<double>({4}, data), randn<double>({4}, data)};
    auto f = [](const std::vector<D>& v) {
      D g = normalise(reshape(v[0], {2, 3, 3, 2, 2}), {1, 2, 4}, 1e-3);
      return add(mul(reshape(g, {2, 3, 3, 4}), v[1]), v[2]);
    };
    DPGRAD_CHECK_GRADS(gradcheck(f, inputs));
    // and the layer computes that function
    NoRecordScope<double> none;
    GroupNormT<double> gn(4, 2, "gn", 1e-3);
    gn.parameters()[0].mutable_value() = inputs[1];
    gn.parameters()[1].mutable_value() = inputs[2];
    std::vector<D> vs;
    for (const auto& a : inputs) vs.emplace_back(a);
    DPGRAD_CHECK_CLOSE(gn.forward(D(inputs[0])).value(), f(vs).value(), 1e-13);
  }
}

TEST_CASE("norm: every exact per-sample route agrees with the per-example loop") {
  FastRng init(3), data(4);
  SUBCASE("conv, GroupNorm, dense") {
    ConvGroupNorm model(init);
    const PerSampleCheck c = check_per_sample(model, batch_of({4, 6, 6, 1}, data));
    INFO(c.str());
    CHECK(c.routes.size() == 4);
    CHECK(c.agrees(1e-9));
  }
  SUBCASE("dense, LayerNorm over positions, dense") {
    DenseLayerNorm model(init);
    const PerSampleCheck c = check_per_sample(model, batch_of({5, 3, 5}, data));
    INFO(c.str());
    CHECK(c.agrees(1e-9));
  }
}

TEST_CASE("norm: jl:K norm estimates on a GroupNorm model follow chi2_K / K") {
  // M_i^2 / ||g_i||^2 ~ chi2_3 / 3: Kolmogorov-Smirnov at the 1% level, fixed seeds
  FastRng init(5), data(6), rng(7);
  ConvGroupNorm model(init);
  const BatchT<double> batch = batch_of({6, 6, 6, 1}, data);
  const test::JlLaw law = test::jl3_law(model, batch, rng);
  CHECK(law.ks < law.critical);
  CHECK(law.mean == doctest::Approx(1.0).epsilon(0.1));
}

TEST_CASE("norm: Centre takes a fixed vector from every sample; centred scatter heads keep every per-sample route") {
  FastRng init(11), data(12);
  const A centre = randn<double>({2, 3}, data);
  CentreT<double> layer(centre);
  CHECK(layer.parameters().empty());
  const A x = randn<double>({4, 2, 3}, data);
  const A y = layer.forward(D(x)).value();
  for (std::size_t i = 0; i < 4; ++i) DPGRAD_CHECK_CLOSE(A(xt::view(y, i)), A(xt::view(x, i) - centre), 0.0);
  CHECK_THROWS_WITH_AS(layer.forward(D(randn<double>({4, 3, 2}, data))), doctest::Contains("against a centre"),
                       std::invalid_argument);
  A bad = centre;
  bad(0, 0) = std::nan("");
  CHECK_THROWS_WITH_AS(CentreT<double>{bad}, doctest::Contains("non-finite"), std::invalid_argument);

  // what the centre is the mean of: the scatter heads' GroupNorm at initialisation, every sample within norm 63
  const A features = randn<double>({5, 7, 7, 81}, data) * 3.0 + 1.0;
  const A normalised = scattering_normalised(features);
  GroupNormT<double> gn(81, 27, "gn");
  NoRecordScope<double> none;
  DPGRAD_CHECK_CLOSE(normalised, gn.forward(D(features)).value(), 1e-12);
  for (std::size_t i = 0; i < 5; ++i) CHECK(std::sqrt(double(xt::sum(xt::square(xt::view(normalised, i)))())) <= 63.0 + 1e-9);

  // a centred head: the same parameters, outputs moved by the same amount for every sample
  const A m = randn<double>({7, 7, 81}, data);
  FastRng init_a(13), init_b(13);
  auto plain = make_scatter_linear<double>(init_a, 3);
  auto centred = make_scatter_linear<double>(init_b, 3, &m);
  CHECK(centred->parameter_count() == plain->parameter_count());
  BatchT<double> batch;
  batch.inputs = features;
  batch.labels = {0, 1, 2, 0, 1};
  batch.ids = {0, 1, 2, 3, 4};
  const A shift = centred->forward(batch).value() - plain->forward(batch).value();
  for (std::size_t i = 1; i < 5; ++i) DPGRAD_CHECK_CLOSE(A(xt::view(shift, i)), A(xt::view(shift, 0)), 1e-9);
  CHECK(double(xt::amax(xt::abs(shift))()) > 1e-3);
  const A wrong = randn<double>({7, 7, 80}, data);
  CHECK_THROWS_WITH_AS(make_scatter_linear<double>(init, 3, &wrong), doctest::Contains("must be (7, 7, 81)"),
                       std::invalid_argument);
}

TEST_CASE("norm: every exact per-sample route agrees with the per-example loop on centred scatter heads") {
  FastRng init(14), data(15);
  const A m = randn<double>({7, 7, 81}, data);
  BatchT<double> batch;
  batch.inputs = randn<double>({4, 7, 7, 81}, data);
  batch.labels = {0, 1, 2, 1};
  batch.ids = {0, 1, 2, 3};
  auto linear = make_scatter_linear<double>(init, 3, &m);
  const PerSampleCheck c = check_per_sample(*linear, batch);
  INFO(c.str());
  CHECK(c.routes.size() == 4);
  CHECK(c.agrees(1e-9));
  auto cnn = make_scatter_cnn<double>(Activation::tanh, init, 3, &m);
  const PerSampleCheck k = check_per_sample(*cnn, batch);
  INFO(k.str());
  CHECK(k.agrees(1e-9));
}

TEST_CASE("norm: jl:K norm estimates on a centred scatter head follow chi2_K / K") {
  FastRng init(16), data(17), rng(18);
  const A m = randn<double>({7, 7, 81}, data);
  auto model = make_scatter_linear<double>(init, 3, &m);
  BatchT<double> batch;
  batch.inputs = randn<double>({6, 7, 7, 81}, data);
  batch.labels = {0, 1, 2, 1, 0, 2};
  batch.ids = {0, 1, 2, 3, 4, 5};
  const test::JlLaw law = test::jl3_law(*model, batch, rng);
  CHECK(law.ks < law.critical);
  CHECK(law.mean == doctest::Approx(1.0).epsilon(0.1));
}
