// check_per_sample on the library's models (every route agrees with the loop)
// and on a model that moves its samples (the routes refuse, and say so).
#include <string>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "layers/dense.hpp"
#include "layers/models.hpp"
#include "optim/clipping/check_per_sample.hpp"
#include "support/batches.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;

namespace {

BatchT<double> tokens(std::size_t b, std::size_t len, std::size_t classes, Rng& rng) {
  BatchT<double> batch;
  batch.tokens = xt::zeros<std::int32_t>({b, len});
  for (std::size_t i = 0; i < b; ++i) {
    std::size_t n = 1 + rng.below(len);
    for (std::size_t t = 0; t < n; ++t) batch.tokens(i, t) = std::int32_t(1 + rng.below(12));
    batch.lengths.push_back(std::int32_t(n));
    batch.labels.push_back(std::int32_t(rng.below(classes)));
  }
  return batch;
}

/// x (B, d) transposed to (d, B), then given to a Dense transposed back
/// (samples on axis 0 again), or, `moved`, reshaped to (B, d), whose rows then
/// hold pieces of several samples.
class Flip final : public ModelT<double> {
 public:
  Flip(Rng& rng, bool moved) : moved_(moved), dense_(6, 3, rng, "dense") {}
  D forward(const BatchT<double>& b) override {
    D x = transpose(per_sample_input(b.inputs), {1, 0});  // (d, B)
    const std::size_t B = b.inputs.shape()[0];
    return dense_.forward(moved_ ? reshape(x, {B, 6}) : transpose(x, {1, 0}));
  }
  std::vector<D> parameters() const override { return dense_.parameters(); }
  std::string name() const override { return "flip"; }

 private:
  bool moved_;
  DenseT<double> dense_;
};

}  // namespace

TEST_CASE("check_per_sample: every route agrees with the loop on the library's models") {
  FastRng init(1), data(2);
  SUBCASE("MLP") {
    auto model = make_mlp<double>({784, 16, 10}, Activation::tanh, init);
    PerSampleCheck c = check_per_sample(*model, test::image_batch(3, data));
    INFO(c.str());
    CHECK(c.agrees(1e-9));
    CHECK(c.routes.size() == 4);
    CHECK(c.naive_norms.size() == 3);
    CHECK(c.clip_norm > 0);
  }
  SUBCASE("cnn26k, with 2 views per example") {
    auto model = make_cnn26k<double>(Activation::tanh, init);
    BatchT<double> batch = test::image_batch(4, data);
    batch.views = 2;
    PerSampleCheck c = check_per_sample(*model, batch);
    INFO(c.str());
    CHECK(c.batch == 2);
    CHECK(c.agrees(1e-9));
  }
  SUBCASE("bilstm598k") {
    auto model = make_bilstm598k<double>(init);
    PerSampleCheck c = check_per_sample(*model, tokens(2, 5, 2, data));
    INFO(c.str());
    CHECK(c.agrees(1e-9));
  }
  SUBCASE("BiGRU over embeddings") {
    auto model = make_bigru<double>(init, 16, 5, 4, 3);
    PerSampleCheck c = check_per_sample(*model, tokens(3, 6, 3, data));
    INFO(c.str());
    CHECK(c.agrees(1e-9));
  }
}

TEST_CASE("check_per_sample: a model that moves its samples is refused by every route, never silently wrong") {
  FastRng init(3), data(4);
  BatchT<double> batch;
  batch.inputs = randn<double>({4, 6}, data);
  batch.labels = {0, 1, 2, 1};
  Flip back(init, false);  // transposed twice: samples back on axis 0, exact
  PerSampleCheck ok = check_per_sample(back, batch);
  INFO(ok.str());
  CHECK(ok.agrees(1e-9));
  Flip moved(init, true);  // (d, B) reshaped to (B, d): every row mixes samples
  PerSampleCheck c = check_per_sample(moved, batch);
  INFO(c.str());
  CHECK(c.never_silently_wrong(1e-9));
  CHECK_FALSE(c.agrees(1e-9));
  for (const auto& r : c.routes) {
    CAPTURE(r.name);
    CHECK(r.refused);
    CHECK(r.error.find("parameter 'dense.weight' is used by linear on an input that mixes samples") != std::string::npos);
  }
  CHECK(c.str().find("refused") != std::string::npos);
}

TEST_CASE("check_per_sample: needs two examples; restores the training mode") {
  FastRng init(5), data(6);
  auto model = make_mlp<double>({784, 4, 10}, Activation::tanh, init);
  test::check_error<std::invalid_argument>([&] { check_per_sample(*model, test::image_batch(1, data)); }, {"at least 2 examples"});
  model->set_training(true);
  check_per_sample(*model, test::image_batch(2, data));
  CHECK(model->training());
  for (const auto& p : model->parameters()) CHECK_FALSE(p.has_grad());
}

TEST_CASE("per_sample_gradient_norms and per_sample_gradients: each example's own, by any strategy") {
  FastRng rng(41);
  auto model = make_mlp<double>({6, 5, 3}, Activation::tanh, rng);
  const BatchT<double> batch = test::three_class_records(7, 6, 42);
  const std::vector<ArrayT<double>> g = per_sample_gradients(*model, batch);
  REQUIRE(g.size() == model->parameters().size());
  ArrayT<double> want = xt::zeros<double>({std::size_t(7)});
  for (std::size_t j = 0; j < g.size(); ++j) {
    CHECK(g[j].shape()[0] == 7);
    for (std::size_t i = 0; i < 7; ++i)
      for (std::size_t k = 0; k < g[j].size() / 7; ++k) want(i) += g[j].data()[i * (g[j].size() / 7) + k] * g[j].data()[i * (g[j].size() / 7) + k];
  }
  want = xt::sqrt(want);
  // each example's gradient is its own: the first example alone gives the first row
  const std::vector<ArrayT<double>> first = per_sample_gradients(*model, batch.select({0}));
  for (std::size_t j = 0; j < g.size(); ++j)
    for (std::size_t k = 0; k < first[j].size(); ++k) CHECK(first[j].data()[k] == g[j].data()[k]);
  for (const std::string s : {"naive", "vanilla", "ghost"}) {
    CAPTURE(s);
    const ArrayT<double> n = per_sample_gradient_norms(*model, batch, s);
    for (std::size_t i = 0; i < 7; ++i) CHECK(n(i) == doctest::Approx(want(i)).epsilon(1e-10));
  }
  // jl:K estimates: unbiased in the square, near with many directions
  const ArrayT<double> est = per_sample_gradient_norms(*model, batch, "jl:2000");
  for (std::size_t i = 0; i < 7; ++i) CHECK(est(i) == doctest::Approx(want(i)).epsilon(0.15));
  CHECK_THROWS_AS(per_sample_gradient_norms(*model, batch, "microbatch:2"), std::invalid_argument);
  CHECK_THROWS_AS(per_sample_gradient_norms(*model, batch, "none"), std::invalid_argument);
}
